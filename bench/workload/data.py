"""Datasets: MNIST from its idx files, an ImageNet subset as an ImageFolder tree, synthetic
images or tokens, the Python standard library's source as byte-level text
(`python-source`), and a user's own data set from a factory (bench.workload.plugins).

Each loader returns a `DataBundle`: a training set, a held-out set and a sentence that
says exactly what was used (which split, how the held-out part was made), which lands
in every result row. Nothing is substituted silently: missing data is a ConfigError.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import math
import os
import sys
import sysconfig
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, Subset, TensorDataset

from bench.config import CPU_SYNTHETIC_IMAGE_SIZE, ConfigError, RunConfig, either, one_line
from bench.workload import models, plugins
from bench.workload.models import InputSpec, input_shape

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class DataBundle:
    train: Dataset
    held_out: Dataset
    num_classes: int  # or vocabulary, for token data
    description: str  # e.g. "mnist test split (10000), train 9000 / held-out 1000"
    #: one sample's input (None: the model's own, as built-in image models take it)
    spec: InputSpec | None = None


def load(cfg: RunConfig) -> DataBundle:
    if cfg.dataset == "mnist":
        return _mnist(cfg)
    if cfg.dataset == "imagenet-subset":
        return _imagenet_subset(cfg)
    if cfg.dataset == "python-source":
        return _python_source(cfg)
    if cfg.dataset == "synthetic":
        return _synthetic(cfg)
    return _plugin(cfg)


def check(cfg: RunConfig) -> str:
    """Fail fast, before any process starts, if the data is missing or the model cannot
    take it; say what will be used."""
    return checked(cfg)[0]


def checked(cfg: RunConfig) -> tuple[str, int]:
    """`check`, and the training samples the run will have."""
    takes_tokens = bool(models.spec(cfg).vocab)
    if cfg.dataset in ("mnist", "imagenet-subset") and takes_tokens:
        raise ConfigError(
            f"model {cfg.model} takes token sequences and {cfg.dataset} is images; use "
            "--dataset python-source or synthetic"
        )
    if cfg.dataset == "python-source":
        if not takes_tokens:
            raise ConfigError(
                f"python-source is text (byte tokens) and model {cfg.model} takes images; "
                "use --model lm, or a token model of your own"
            )
        bundle = _python_source(cfg)
        _enough(cfg, len(bundle.train))
        assert bundle.spec is not None
        _check_layout(cfg, bundle.spec)
        models.check_forward(cfg, bundle.spec, bundle.num_classes)
        return bundle.description, len(bundle.train)
    if cfg.dataset not in ("mnist", "imagenet-subset", "synthetic"):
        bundle = _plugin(cfg)
        if cfg.data_feed == "device" and not in_memory(bundle.train):
            raise ConfigError(
                f"--data-path device needs data held in memory as tensors; {cfg.dataset} "
                "returned a Dataset, read sample by sample: return (inputs, targets) tensors "
                "for that, or use --data-path loader or auto"
            )
        if cfg.workers is not None and in_memory(bundle.train):  # given: as unused_options
            _no_loader_workers(cfg)
        _enough(cfg, len(bundle.train))  # type: ignore[arg-type]
        assert bundle.spec is not None
        _check_layout(cfg, bundle.spec)
        models.check_forward(cfg, bundle.spec, bundle.num_classes)
        return bundle.description, len(bundle.train)  # type: ignore[arg-type]
    # does the model take this data? (a built-in one: at this image size)
    if models.is_plugin(cfg.model) and cfg.dataset == "mnist":
        models.check_forward(cfg, InputSpec((1, 28, 28)), 10)
    if cfg.dataset == "mnist":
        if (
            not models.is_plugin(cfg.model)
            and input_shape(cfg.model, cfg.image_size, cfg.dataset)[0] != 1
        ):
            raise ConfigError(
                f"model {cfg.model} takes 3-channel images and MNIST is 1-channel; "
                "use --model mnist_cnn or transformer, or --dataset imagenet-subset / synthetic"
            )
        split, present = _mnist_split(cfg)
        counts = {k: _idx_header(files[0])[0] for k, files in present.items()}
        for files in present.values():
            _idx_header(files[1])
        # as _mnist splits it: the test split held out, else the last images of the one split
        n, held = counts[split], 0
        if not (split == "train" and "test" in present):
            held = min(cfg.eval_samples, n // 10)
        n = _limited(cfg.limit, n - held, f"mnist {split} split", held)
        _enough(cfg, n)
        return f"mnist {split} split", n
    if cfg.dataset == "imagenet-subset":
        if cfg.model == "mnist_cnn":
            raise ConfigError(
                "mnist_cnn takes 28x28 1-channel images; use a torchvision model "
                "(e.g. --model resnet18) with imagenet-subset"
            )
        root = _imagenet_root(cfg.data_path)
        subset = _imagenet_subset(cfg)  # lists the files, decodes none
        image = InputSpec((3, cfg.image_size, cfg.image_size))
        models.check_forward(cfg, image, subset.num_classes)
        _enough(cfg, len(subset.train))
        _open_images(cfg, subset)
        return f"imagenet-subset at {root}", len(subset.train)
    spec = models.spec(cfg)  # synthetic: what _synthetic makes, without making it
    check_fits(cfg, spec)
    _check_layout(cfg, spec)
    models.check_forward(cfg, spec, _synthetic_classes(cfg, spec))
    _enough(cfg, synthetic_samples(cfg))
    return "synthetic", synthetic_samples(cfg)


def _check_layout(cfg: RunConfig, spec: InputSpec) -> None:
    """--channels-last lays out image batches (N, C, H, W); on other inputs its cells would
    be the NCHW cells again under another name. (MNIST and the ImageNet subset are images.)"""
    if True in cfg.channels_last and (spec.vocab or len(spec.shape) != 3):
        raise ConfigError(
            f"--channels-last lays out image batches (N, C, H, W); {cfg.dataset} with model "
            f"{cfg.model} is fed samples of {spec.describe()}: leave it out"
        )


#: built-in data sets held in memory: `--data-path auto` (or device) indexes them on the device
IN_MEMORY = ("mnist", "synthetic", "python-source")


def unused_options(cfg: RunConfig, image_size: bool, seq_len: bool, workers: bool = False) -> None:
    """--image-size and --seq-len, where given (the flags say which), must change what the
    run's model is fed: a run that would ignore one is refused, so no row is read as
    trained at a size it was not. So must --workers (`workers`: given) change how it is
    fed: in-memory data indexed on the device has no DataLoader to run workers in."""
    if workers and cfg.dataset in IN_MEMORY:
        _no_loader_workers(cfg)
    for flag, given, field, other in (
        ("--image-size", image_size, "image_size", 32),
        ("--seq-len", seq_len, "seq_len", 64),
    ):
        if not given:
            continue
        why = _ignores(cfg, field, other)
        if why:
            raise ConfigError(
                f"{flag} {getattr(cfg, field)} does nothing here: {why}; leave it out"
            )


def _no_loader_workers(cfg: RunConfig) -> None:
    """--workers (given) on data held in memory, which is indexed on the device unless
    --data-path loader: no DataLoader runs its workers."""
    if cfg.data_feed != "loader":
        raise ConfigError(
            f"--workers {cfg.workers} does nothing here: {cfg.dataset} is held in memory and "
            f"its batches are indexed on the device (--data-path {cfg.data_feed}), with no "
            "DataLoader; leave it out, or add --data-path loader to time a DataLoader"
        )


def _ignores(cfg: RunConfig, field: str, other: int) -> str:
    """Why the run's data and model do not depend on `field` (image_size or seq_len), or ''."""
    if cfg.dataset == "mnist":
        return "MNIST is 1 x 28 x 28 images"
    if cfg.dataset == "imagenet-subset":
        return "" if field == "image_size" else "the ImageNet subset is images, not tokens"
    if cfg.dataset == "python-source":
        return "" if field == "seq_len" else "python-source is text, its samples --seq-len bytes"
    if cfg.dataset != "synthetic":
        return f"your data set {cfg.dataset} makes its own samples (size them with --dataset-arg)"
    spec = models.spec(cfg)
    if other == getattr(cfg, field):
        other += 1
    if models.spec(cfg.replace(**{field: other})).shape != spec.shape:
        return ""
    return f"synthetic data is what model {cfg.model} takes, {spec.describe()}, at any size"


def _enough(cfg: RunConfig, train_samples: int) -> None:
    """A full step, and an epoch long enough for the warm-up and (--target-precision) the
    timed steps it needs."""
    if cfg.global_batch > train_samples:
        raise ConfigError(
            f"global batch {cfg.global_batch} is larger than the {train_samples} training "
            "samples: no full step; lower --global-batch"
        )
    steps = train_samples // cfg.global_batch
    if cfg.max_steps:
        steps = min(steps, cfg.max_steps)
    epoch = f"an epoch has {steps} steps ({train_samples} samples / global batch {cfg.global_batch}"
    epoch += f", --max-steps {cfg.max_steps})" if cfg.max_steps == steps else ")"
    more = (
        "raise --max-steps or lower --warmup-steps"
        if cfg.max_steps and cfg.max_steps < train_samples // cfg.global_batch
        # a --limit past the data's samples is refused: name it where it can give more
        else "raise --limit or lower --global-batch or --warmup-steps"
        if cfg.limit or cfg.dataset == "synthetic"
        else "lower --global-batch or --warmup-steps"
    )
    if cfg.warmup_steps >= steps:
        raise ConfigError(
            f"--warmup-steps {cfg.warmup_steps} leaves no step to time: {epoch}; {more}"
        )
    if steps - cfg.warmup_steps < cfg.min_timed_steps:
        raise ConfigError(
            f"--target-precision checks from the {cfg.min_timed_steps}th timed step on, and "
            f"{epoch} less {cfg.warmup_steps} of warm-up leaves {steps - cfg.warmup_steps}; {more}"
        )


# ---------------------------------------------------------------- MNIST
_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _mnist_raw_dirs(root: Path) -> list[Path]:
    return [root / "MNIST" / "raw", root / "mnist" / "MNIST" / "raw", root / "raw", root]


def _find(raw: Path, stem: str) -> Path | None:
    for p in (raw / stem, raw / f"{stem}.gz"):
        if p.is_file():
            return p
    return None


def _mnist_split(cfg: RunConfig) -> tuple[str, dict[str, tuple[Path, Path]]]:
    """Which split trains, and the files of every split present."""
    root = cfg.data_path
    found = _mnist_present(root)
    if found is None and cfg.download:
        _download_mnist(root)
        found = _mnist_present(root)
    if found is not None:
        return found
    alone = _mnist_half(root)
    if alone:  # "not found" would send the user looking for a file that is there
        raise ConfigError(
            f"MNIST under {root} is incomplete: {alone}"
            + either(
                "pass --download on a machine with internet",
                "copy the missing file there",
                form="; {}",
            )
        )
    raise ConfigError(
        f"MNIST not found under {root} (looked for MNIST/raw/*-idx?-ubyte[.gz])"
        + either(
            "pass --download on a machine with internet",
            "point --data-root at it",
            "use --dataset synthetic",
            form="; {}",
        )
    )


def _mnist_half(root: Path) -> str:
    """Where no split of MNIST is whole: the first file found whose partner (the images' labels,
    or the labels' images) is missing, said as such; else ''."""
    for raw in _mnist_raw_dirs(root):
        for files in _MNIST_FILES.values():
            for have, lack in (files, files[::-1]):
                found = _find(raw, have)
                if found and not _find(raw, lack):
                    return f"{found} is there, but not {raw / lack}[.gz]"
    return ""


def _mnist_present(root: Path) -> tuple[str, dict[str, tuple[Path, Path]]] | None:
    for raw in _mnist_raw_dirs(root):
        present = {}
        for split, (img, lab) in _MNIST_FILES.items():
            i, lbl = _find(raw, img), _find(raw, lab)
            if i and lbl:
                present[split] = (i, lbl)
        if present:
            return ("train" if "train" in present else "test"), present
    return None


def _download_mnist(root: Path) -> None:
    from torchvision.datasets import MNIST

    try:
        for train in (True, False):
            MNIST(str(root), train=train, download=True)
    except Exception as exc:
        raise ConfigError(f"MNIST download into {root} failed: {exc}".splitlines()[0]) from exc


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _idx_header(path: Path, data: bytes | None = None) -> tuple[int, ...]:
    """The dimensions an idx file of unsigned bytes declares; ConfigError if it is not one."""
    if data is None:
        try:
            with _open(path) as f:
                data = f.read(4 + 4 * 4)
        except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
            raise ConfigError(f"{path} cannot be read: {exc}") from exc
    if (
        len(data) < 4
        or data[0] != 0
        or data[1] != 0
        or data[2] != 0x08
        or len(data) < 4 + 4 * data[3]
    ):
        raise ConfigError(f"{path} is not an idx file of unsigned bytes (MNIST's format)")
    return tuple(int(d) for d in np.frombuffer(data, dtype=">i4", count=data[3], offset=4))


def _read_idx(path: Path) -> np.ndarray:
    try:
        with _open(path) as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as exc:  # a .gz cut short (a partial download)
        raise ConfigError(f"{path} cannot be read: {exc}") from exc
    dims = _idx_header(path, data)
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * len(dims))
    if body.size != int(np.prod(dims)):
        raise ConfigError(
            f"{path} is truncated: expected {int(np.prod(dims))} values, found {body.size}"
        )
    return body.reshape(tuple(int(d) for d in dims))


def _mnist_tensors(files: tuple[Path, Path]) -> TensorDataset:
    images = torch.from_numpy(_read_idx(files[0]).copy()).float().div_(255)
    labels = torch.from_numpy(_read_idx(files[1]).astype(np.int64))
    if len(images) != len(labels):
        raise ConfigError(
            f"{files[0]} has {len(images)} images but {files[1]} has {len(labels)} labels"
        )
    images = images.sub_(MNIST_MEAN).div_(MNIST_STD).unsqueeze(1)
    return TensorDataset(images, labels)


def _mnist(cfg: RunConfig) -> DataBundle:
    split, present = _mnist_split(cfg)
    train = _mnist_tensors(present[split])
    if split == "train" and "test" in present:
        held = _mnist_tensors(present["test"])
        held = Subset(held, range(min(cfg.eval_samples, len(held))))
        whole = len(train)
        train = _limit(train, cfg.limit, "mnist train split")
        desc = f"mnist train split ({_first(train, whole)}), held-out: test split ({len(held)})"
    else:
        # Only one split is here: hold out its last `eval_samples` images.
        n_eval = min(cfg.eval_samples, len(train) // 10)
        held = Subset(train, range(len(train) - n_eval, len(train)))
        train = Subset(train, range(len(train) - n_eval))
        whole = len(train)
        train = _limit(train, cfg.limit, f"mnist {split} split", n_eval)
        desc = (
            f"mnist {split} split only ({whole + n_eval}): train {_first(train, whole)} / "
            f"held-out last {n_eval}"
        )
    return DataBundle(train, held, 10, desc)


def _first(train: Dataset, whole: int) -> str:
    """The training samples, and where --limit kept fewer, of how many."""
    n = len(train)  # type: ignore[arg-type]
    return str(n) if n == whole else f"first {n} of {whole} (--limit)"


def _limit(ds: Dataset, limit: int | None, what: str, held: int = 0) -> Dataset:
    n = len(ds)  # type: ignore[arg-type]
    if _limited(limit, n, what, held) == n:
        return ds
    return Subset(ds, range(limit))  # type: ignore[arg-type]


def _limited(limit: int | None, n: int, what: str, held: int = 0) -> int:
    """The training samples --limit keeps of the `n` that `what` has besides the `held`
    it holds out. A limit above them would keep them all, and its rows would record a cap
    that changed nothing: refused."""
    if limit is None:
        return n
    if limit > n:
        besides = f" (and {held} held out)" if held else ""
        raise ConfigError(
            f"--limit {limit}: {what} has {n} training samples{besides}; lower it or leave it out"
        )
    return limit


# ---------------------------------------------------------------- ImageNet subset
def _hidden(p: Path) -> bool:
    """A name starting with '.' (`.ipynb_checkpoints`, `.cache`, macOS's `._x.JPEG`): no class
    folder or image of the tree, though ImageFolder would take it for one."""
    return p.name.startswith(".")


def _class_folders(p: Path) -> list[Path]:
    return [c for c in p.iterdir() if c.is_dir() and not _hidden(c)]


def _is_class_tree(p: Path) -> bool:
    return p.is_dir() and bool(_class_folders(p))


def _holds_image(folder: Path) -> bool:
    """Whether a class folder holds a visible image at any depth, as ImageFolder reads it:
    Tiny ImageNet's are `train/<class>/images/*.JPEG` beside a `<class>_boxes.txt`, and its
    tree was refused as none where only a class folder's own files were looked at."""
    from torchvision.datasets.folder import IMG_EXTENSIONS  # the files ImageFolder takes

    for _, dirs, files in os.walk(folder, followlinks=True):  # the folder's own files first
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if any(f.lower().endswith(IMG_EXTENSIONS) and not f.startswith(".") for f in files):
            return True
    return False


def _imagenet_root(root: Path) -> Path:
    for cand in (  # the folders named for it before the root, which may hold other data
        root / "train",
        root / "imagenet-sample",
        root / "imagenet-subset",
        root / "imagenet" / "train",
        root,
    ):
        if cand.is_dir() and _is_class_tree(cand) and cand.name != "MNIST":
            # A tree of class folders, most of them holding images (not the data root holding
            # 'mnist/', 'imagenet-sample/' and a folder with a picture in it); a class folder
            # left empty is named below (_image_folder)
            folders = _class_folders(cand)
            if 2 * sum(map(_holds_image, folders)) > len(folders):
                return cand
    raise ConfigError(
        f"no ImageFolder tree under {root} (expected <root>/<class>/*.JPEG or <root>/train/<class>/...)"
        + either("point --data-root at it", "use --dataset synthetic", form="; {}")
    )


def _read_image(path: str) -> Any:
    """ImageFolder's own loader (PIL, as RGB), whose error names the file: PIL's "image file
    is truncated" does not say which of the tree's images it was."""
    from PIL import Image

    try:
        with open(path, "rb") as f:
            image = Image.open(f)
            if image.mode.startswith("I;16"):
                # 16-bit grayscale (a PNG's or TIFF's): PIL's conversion to RGB clips each
                # value at 255, which read all but the darkest 1/256 of the range as white
                image = Image.fromarray((np.asarray(image) >> 8).astype(np.uint8), "L")
            return image.convert("RGB")
    except MemoryError:
        raise
    except Exception as exc:
        raise OSError(f"{path} cannot be read as an image ({one_line(exc)})") from None


def _visible_image(root: Path, path: str) -> bool:
    """An image file of the tree under no hidden folder and not hidden itself."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    hidden = any(part.startswith(".") for part in Path(path).relative_to(root).parts)
    return not hidden and path.lower().endswith(IMG_EXTENSIONS)


#: the most image files `_open_images` opens before a run: the first the run reads
OPENED_IMAGES = 20_000


def _open_images(cfg: RunConfig, bundle: DataBundle) -> None:
    """Open each image file the run reads (its header alone, about 0.1 ms a file, where a
    cell decodes it in several) before anything starts: the training samples of every
    epoch's steps, in the order the cells read them (single's, whose samples every layout
    reads at the same step), then the held-out ones, at most OPENED_IMAGES. A file that is
    no image (a web page saved as .JPEG, an empty file, a link to nothing) failed every
    cell at the step that read it, after its start-up and steps. (A file cut short is found
    only where it is decoded: the row of the cell that reads it says which.)"""
    from PIL import Image
    from torch.utils.data import DistributedSampler

    train, held = bundle.train, bundle.held_out
    steps = len(train) // cfg.global_batch  # type: ignore[arg-type]
    steps = min(steps, cfg.max_steps or steps)
    read: dict[tuple[bool, int], None] = {}
    for epoch in range(cfg.epochs):
        if len(read) >= OPENED_IMAGES:  # (90 epochs of ImageNet's 1.28 million: none past)
            break
        order = DistributedSampler(train, num_replicas=1, rank=0, seed=cfg.seed, drop_last=True)
        order.set_epoch(epoch)
        read |= dict.fromkeys((False, i) for i in itertools.islice(order, steps * cfg.global_batch))
    read |= dict.fromkeys((True, i) for i in range(len(held)))  # type: ignore[arg-type]
    for held_out, i in list(read)[:OPENED_IMAGES]:
        path = _image_path(held if held_out else train, i)
        try:
            seen = (path, *_stamp(path))
            if seen in _OPENED:
                continue
            with Image.open(path):
                pass
        except MemoryError:
            raise
        except Exception as exc:
            said = OSError(f"{path} cannot be read as an image ({one_line(exc)})")
            raise unreadable(cfg.dataset, i, said, held_out) from None
        _OPENED.add(seen)


#: the image files this process has opened (_open_images), as they were then (_stamp: inode,
#: size, modification and change times): a run plans twice (the CLI's check, then the
#: run's), verify more, and each opened and parsed up to OPENED_IMAGES headers again
_OPENED: set[tuple[str, int, int, int, int]] = set()


def _stamp(path: str) -> tuple[int, int, int, int]:
    # the change time too: a file put back as it was (cp -p, rsync -t, tar) keeps its mtime
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _image_path(ds: Any, i: int) -> str:
    """The file of sample `i` of an ImageFolder tree's data set (through its Subsets)."""
    while not hasattr(ds, "samples"):
        ds, i = (ds.ds, i) if isinstance(ds, SeededSamples) else (ds.dataset, ds.indices[i])
    return ds.samples[i][0]


def _image_folder(root: Path, transform: Any) -> Any:
    """ImageFolder's dataset of the tree, less its hidden folders and files (`_hidden`): left
    as classes, one such folder would shift every label, and refuse the tree as empty."""
    from torchvision.datasets import ImageFolder
    from torchvision.datasets.folder import IMG_EXTENSIONS

    tree = ImageFolder(
        str(root),
        transform=transform,
        loader=_read_image,
        is_valid_file=functools.partial(_visible_image, root),
        allow_empty=True,  # a hidden folder holds no image (said here of the others)
    )
    shown = [c for c in tree.classes if not c.startswith(".")]
    number = {tree.class_to_idx[c]: i for i, c in enumerate(shown)}
    tree.classes, tree.class_to_idx = shown, {c: i for i, c in enumerate(shown)}
    tree.samples = tree.imgs = [(path, number[c]) for path, c in tree.samples]
    tree.targets = [c for _, c in tree.samples]
    empty = sorted(set(tree.classes) - {tree.classes[c] for c in set(tree.targets)})
    if empty:
        raise ConfigError(
            f"imagenet-subset {root}: found no valid file for the classes {', '.join(empty)} "
            f"(supported extensions: {', '.join(IMG_EXTENSIONS)}); remove the empty class "
            "folders, or add images to them"
        )
    return tree


def _imagenet_subset(cfg: RunConfig) -> DataBundle:
    from torchvision import transforms

    root = _imagenet_root(cfg.data_path)
    norm = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
    size = cfg.image_size
    train_tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            norm,
        ]
    )
    eval_tf = transforms.Compose(
        [
            transforms.Resize(int(size * 256 / 224)),
            transforms.CenterCrop(size),
            transforms.ToTensor(),
            norm,
        ]
    )
    if cfg.no_augment:  # parity (verify): every layout reads the same pixels
        train_tf = eval_tf
    train_full = _image_folder(root, train_tf)
    eval_full = _image_folder(root, eval_tf)
    classes = len(train_full.classes)
    if classes < 2:
        raise ConfigError(
            f"imagenet-subset {root}: one class folder ({train_full.classes[0]}); a classifier "
            "needs at least 2"
        )
    if cfg.max_classes is not None and cfg.max_classes > classes:
        raise ConfigError(
            f"--max-classes {cfg.max_classes}: {root} has {classes} class folders; lower it "
            "or leave it out"
        )
    keep = list(range(len(train_full)))
    if cfg.max_classes is not None and cfg.max_classes < classes:
        classes = cfg.max_classes
        keep = [i for i, (_, c) in enumerate(train_full.samples) if c < classes]
    # Every 10th image is held out (deterministic), capped at eval_samples.
    held_idx = keep[9::10][: cfg.eval_samples]
    held_set = set(held_idx)
    train_idx = [i for i in keep if i not in held_set]
    train = _limit(
        Subset(train_full, train_idx), cfg.limit, f"imagenet-subset {root}", len(held_idx)
    )
    if not cfg.no_augment:
        train = SeededSamples(train, cfg.seed)
    labels = train_full.targets
    trained = {labels[i] for i in train_idx[: len(train)]}  # type: ignore[arg-type]
    unseen = sum(labels[i] not in trained for i in held_idx)
    desc = f"imagenet-subset {root} ({classes} classes): train {_first(train, len(train_idx))}"
    if len(trained) < classes:
        desc += f", of {len(trained)} classes"
    desc += f" / held-out {len(held_idx)}"
    if held_idx:
        capped = len(keep[9::10]) > len(held_idx)
        desc += f" (every 10th image{': the first --eval-samples' if capped else ''})"
    if unseen:  # as in the sample, of one image per class: its accuracy cannot be read
        desc += f", {unseen} of them of classes with no training image"
    if cfg.no_augment:
        desc += ", training images center-cropped (no random crop or flip)"
    return DataBundle(train, Subset(eval_full, held_idx), classes, desc)


class SeededSamples(Dataset):
    """A data set whose samples are randomly transformed (the ImageNet subset's crops and
    flips), each sample's draws seeded by the run's seed, the epoch and its index: drawn
    from torch's generator of whichever process read the sample (a rank's, or a loader
    worker's, seeded alike on every rank), the crops followed the rank layout, so that each
    rank of a DDP cell repeated the others' crops and flips (its batch's share of a step
    held 1/world of the distinct crops a single process drew) and no two layouts trained on
    the same pixels at step k. The epoch comes with the index as the key `(epoch, i)` that
    `EpochKeys` makes of a sampler's indices (a persistent loader worker keeps its own copy
    of the data set, which no epoch set here would reach); a plain index is epoch 0's."""

    def __init__(self, ds: Dataset, seed: int) -> None:
        self.ds, self.seed = ds, seed

    def __len__(self) -> int:
        return len(self.ds)  # type: ignore[arg-type]

    def __getitem__(self, key: int | tuple[int, int]) -> Any:
        epoch, i = key if isinstance(key, tuple) else (0, key)
        seed = _mix(_mix(_mix(self.seed) ^ epoch) ^ int(i))
        # the CPU generator alone (torch.manual_seed seeds every backend's: 0.5 ms a sample
        # here), and the reader's own draws go on as they were
        state = torch.get_rng_state()
        try:
            torch.default_generator.manual_seed(seed)
            return self.ds[i]
        finally:
            torch.set_rng_state(state)


def _mix(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit integers whose outputs for neighbouring
    inputs share no bits' pattern (a sample's seed, from the run's seed, epoch and index)."""
    x = (x + 0x9E3779B97F4A7C15) % 2**64
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 % 2**64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB % 2**64
    return x ^ (x >> 31)


class EpochKeys(Sampler):
    """A sampler's indices as `(epoch, index)` keys of a `SeededSamples` (its epoch set by
    `set_epoch`, which goes on to the sampler)."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler, self.epoch = sampler, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch
        return ((epoch, int(i)) for i in self.sampler)


def keyed(ds: Dataset, sampler: Sampler) -> Sampler:
    """The sampler a DataLoader of `ds` takes: its indices with their epoch, where `ds`
    seeds each sample's draws by them (SeededSamples), else itself."""
    return EpochKeys(sampler) if isinstance(ds, SeededSamples) else sampler


# ---------------------------------------------------------------- synthetic
class SyntheticImages(Dataset):
    """Random images of the model's input shape; a small pool reused, so no I/O and little CPU."""

    def __init__(
        self,
        n: int,
        shape: tuple[int, ...],
        num_classes: int,
        seed: int,
        pool: int = 64,
        dtype: torch.dtype = torch.float32,
    ):
        g = torch.Generator().manual_seed(seed)
        self.n = n
        self.images = torch.randn((min(pool, n), *shape), generator=g).to(dtype)
        self.labels = torch.randint(0, num_classes, (n,), generator=g)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[i % len(self.images)], self.labels[i]


# ---------------------------------------------------------------- data on the device
Take = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def in_memory(ds: Dataset) -> bool:
    """Whether `on_device` can hold `ds` on a device: asked of it on the CPU, where its
    tensors already are (nothing is copied), so the two never disagree."""
    return on_device(ds, torch.device("cpu")) is not None


def _reads_as(ds: Dataset, kind: type) -> bool:
    """Whether `ds` is a `kind` that reads its samples as `kind` does: a subclass with its
    own __getitem__ (one that scales or crops what it reads) is read through it, sample by
    sample, or its rows would train on the stored tensors instead."""
    return isinstance(ds, kind) and type(ds).__getitem__ is kind.__getitem__


def on_device(ds: Dataset, device: torch.device) -> Take | None:
    """Move an in-memory data set to `device` once; return a function from a tensor of
    sample indices to that batch (images, labels), indexed there: no per-sample
    __getitem__, no collate, no copy per step. None if `ds` is not held in memory (the
    ImageNet subset is decoded from files: it keeps the DataLoader)."""
    if _reads_as(ds, Subset):
        idx, base = torch.as_tensor(list(ds.indices), dtype=torch.long), ds.dataset
        while _reads_as(base, Subset):  # a --limit of a split's training part: one index
            idx, base = torch.as_tensor(list(base.indices), dtype=torch.long)[idx], base.dataset
        if device.type != "cpu" and _reads_as(base, TensorDataset) and len(base.tensors) == 2:
            # only the samples it trains on go to the device, whose memory the row reports
            # (not the held-out ones, nor the 60,000 MNIST images a --limit 1000 leaves out);
            # on the CPU the tensors are in memory already and nothing is copied
            return on_device(TensorDataset(*(t[idx] for t in base.tensors)), device)
        inner = on_device(base, device)
        if inner is None:
            return None
        idx = idx.to(device)
        return lambda i: inner(idx[i])
    if _reads_as(ds, TensorDataset) and len(ds.tensors) == 2:
        x, y = (t.to(device) for t in ds.tensors)
        return lambda i: (x[i], y[i])
    if isinstance(ds, SyntheticImages):  # the pool generated once, then on the device
        x, y = ds.images.to(device), ds.labels.to(device)
        return lambda i: (x[i % len(x)], y[i])
    return None


class DeviceBatches:
    """Batches of a data set that lives on the training device, in the order `sampler`
    gives (a DistributedSampler, as the DataLoader path uses: every strategy sees the same
    samples at step k whichever path feeds it). Drops the last partial batch."""

    def __init__(self, take: Take, sampler: Sampler, batch_size: int, device: torch.device):
        self.take, self.sampler, self.batch_size, self.device = take, sampler, batch_size, device

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # one host-to-device copy of the epoch's order; batches are slices of it
        order = torch.as_tensor(list(iter(self.sampler)), dtype=torch.long).to(self.device)
        for b in range(len(self)):
            yield self.take(order[b * self.batch_size : (b + 1) * self.batch_size])


def synthetic_samples(cfg: RunConfig) -> int:
    """Synthetic training samples: --limit, else 50 global batches, or with
    --target-precision the warm-up and twice the timed steps of its first check (so
    it can stop at any of six checks)."""
    if cfg.limit:
        return cfg.limit
    if cfg.target_precision is None:
        return 50 * cfg.global_batch
    return (cfg.warmup_steps + 2 * cfg.min_timed_steps) * cfg.global_batch


def synthetic_bytes(cfg: RunConfig, spec: InputSpec) -> int:
    """The memory `_synthetic` fills, from the options alone: token data is every training
    and held-out sequence (one token longer, for the targets) as int64; images are a pool
    of at most 64 and a label per sample."""
    n, held = synthetic_samples(cfg), max(cfg.eval_samples, 1)
    if spec.vocab:
        return (n + held) * (spec.tokens + 1) * 8
    pool = (min(64, n) + min(64, held)) * math.prod(spec.shape) * 4
    return pool + (n + held) * 8


def check_fits(cfg: RunConfig, spec: InputSpec, copies: int = 1) -> None:
    """Synthetic data larger than the memory this machine has free is refused before any of
    it is made: made, it takes a while (15 million sequences of 128 tokens, 14.4 GiB: most
    of a minute) and then fails an allocation or wakes the kernel's OOM killer, which may
    pick another process than this one. `copies`: the processes of a cell on one machine,
    each making its own (runner.plan, once the cells that run are known)."""
    need = synthetic_bytes(cfg, spec) * copies
    free = psutil.virtual_memory().available
    if need <= free:
        return
    what = f"synthetic {'tokens ' if spec.vocab else ''}{spec.describe()}"
    n, held = synthetic_samples(cfg), max(cfg.eval_samples, 1)
    lower = ["--limit" if n >= held else "--eval-samples"]
    if spec.vocab and not _ignores(cfg, "seq_len", 64):
        lower.append("--seq-len")
    each = f", a copy in each of {copies} ranks," if copies > 1 else ""
    raise ConfigError(
        f"{what} x {n} training and {held} held-out samples take {need / 2**30:.1f} GiB of "
        f"memory{each} and this machine has {free / 2**30:.1f} GiB free; lower "
        f"{' or '.join(lower)}"
    )


def _synthetic(cfg: RunConfig) -> DataBundle:
    spec = models.spec(cfg)
    check_fits(cfg, spec)
    classes = _synthetic_classes(cfg, spec)
    n = synthetic_samples(cfg)
    if spec.vocab:  # random token sequences; the targets are the next tokens
        g = torch.Generator().manual_seed(cfg.seed)
        seqs = torch.randint(
            0, spec.vocab, (n + max(cfg.eval_samples, 1), spec.tokens + 1), generator=g
        )
        x, y = seqs[:, :-1].reshape(-1, *spec.shape), seqs[:, 1:].reshape(-1, *spec.shape)
        train, held = TensorDataset(x[:n], y[:n]), TensorDataset(x[n:], y[n:])
        return DataBundle(
            train, held, spec.vocab, f"synthetic tokens {spec.describe()} x {n}", spec
        )
    train = SyntheticImages(n, spec.shape, classes, cfg.seed, dtype=spec.dtype)
    held = SyntheticImages(
        max(cfg.eval_samples, 1), spec.shape, classes, cfg.seed + 1, dtype=spec.dtype
    )
    size = ""
    # said only where the model's input follows --image-size (mnist_cnn's is 28 px at any),
    # and where 64 px is the run's default: on a GPU, whose default is 224, it was asked for
    cpu_default = cfg.image_size == cfg.default_image_size() == CPU_SYNTHETIC_IMAGE_SIZE
    if cpu_default and not _ignores(cfg, "image_size", 32):
        size = f" ({cfg.image_size} px: the CPU default; --image-size sets it)"
    desc = f"synthetic {spec.shape} x {n}, {classes} classes{size}"
    return DataBundle(train, held, classes, desc, spec)


def _synthetic_classes(cfg: RunConfig, spec: InputSpec) -> int:
    """Classes of synthetic labels: the model's (a user's model states them, or they are
    read off its output on the meta device), else the built-in default."""
    if spec.vocab:
        return spec.vocab
    if not models.is_plugin(cfg.model):
        return models.default_classes(cfg) or 1000
    stated = models.stated_classes(models.meta_model(cfg))
    return stated or models.output_classes(cfg, spec) or 1000  # check_forward says what is wrong


# ---------------------------------------------------------------- python-source
#: text read for python-source when --limit does not say: about 2 MiB of source
PYTHON_SOURCE_BYTES = 2 << 20


def python_source_files() -> list[Path]:
    """The standard library's own .py files (no site-packages), in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(
        (p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file()),
        key=lambda p: p.relative_to(root).as_posix(),
    )


def _python_source(cfg: RunConfig) -> DataBundle:
    """Byte-level text that every machine has without a download: the Python standard
    library's source files, concatenated in path order and cut into sequences of
    seq_len + 1 bytes (input: the first seq_len, target: the last seq_len). The last
    sequences are held out."""
    t = cfg.seq_len
    held_n = cfg.eval_samples  # 0: none held out, as of the other data sets
    want = (cfg.limit or PYTHON_SOURCE_BYTES // (t + 1)) + held_n
    chunks, size, used = [], 0, 0
    for path in python_source_files():
        try:
            chunks.append(path.read_bytes())
        except OSError:
            continue
        size += len(chunks[-1])
        used += 1
        if size >= want * (t + 1):
            break
    n = size // (t + 1)
    if n < 2:
        raise ConfigError(
            f"python-source: no Python source found under {sysconfig.get_paths()['stdlib']} "
            "(this Python ships its standard library compiled only)"
            + either("use --dataset synthetic", form="; {}")
        )
    text = np.frombuffer(b"".join(chunks), dtype=np.uint8)[: n * (t + 1)]
    seqs = torch.from_numpy(text.astype(np.int64)).view(n, t + 1)
    held_n = min(held_n, n // 10) if n >= 20 else 0
    x, y = seqs[:, :-1], seqs[:, 1:]
    train = TensorDataset(x[: n - held_n], y[: n - held_n])
    held = TensorDataset(x[n - held_n :], y[n - held_n :])
    train = _limit(train, cfg.limit, f"python-source (sequences of {t})")
    spec = InputSpec((t,), torch.long, models.BYTE_VOCAB)
    ver = ".".join(map(str, sys.version_info[:2]))
    # a --limit of a few hundred sequences reads tens of KiB: "0.0 MiB" would say none
    read = f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"
    desc = (
        f"python-source: {used} files of the Python {ver} standard library "
        f"({read}, bytes as tokens), sequences of {t}: "
        f"train {len(train)} / held-out {held_n}"
    )
    return DataBundle(train, held, models.BYTE_VOCAB, desc, spec)


# ---------------------------------------------------------------- a user's data set
def unreadable(dataset: str, i: int, exc: BaseException, held_out: bool = False) -> ConfigError:
    """The one line for a sample of `dataset` that cannot be read (an image file that does
    not decode, a data set's __getitem__ that raises): the data is to blame, not the model
    or its step, and every cell would read it."""
    mend = (
        "replace or remove the file"
        if dataset == "imagenet-subset"
        else "mend the data set's __getitem__"
    )
    return ConfigError(
        f"data {dataset}: {'held-out' if held_out else 'training'} sample {i} cannot be read, "
        f"and every cell would read it: {one_line(exc)}; {mend}"
    )


def _integer_targets(name: str, dtype: torch.dtype) -> None:
    """Cross-entropy takes class labels (or next tokens) as integers: float targets (a
    regression's, or labels stored as floats) fail in the first step, bool ones too."""
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise ConfigError(f"{name}: targets must be integer class labels, not {dtype}")


def _plugin(cfg: RunConfig) -> DataBundle:
    """A user's data set: its factory returns a map-style Dataset of (input, target)
    samples that states its classes (`num_classes`, `classes` or, for token data,
    `vocab_size`), or a tuple of tensors (inputs, targets[, classes]) whose classes are
    read off the targets when not given. Targets of a sample's own shape (not a single
    label) make it token data: next-token targets, counted in tokens/s. The last tenth
    (at most --eval-samples) is held out."""
    name = cfg.dataset
    got = plugins.call(name, plugins.DATASET_GROUP, cfg.dataset_kwargs)
    classes: Any = None
    if (
        isinstance(got, tuple)
        and 2 <= len(got) <= 3
        and all(isinstance(t, torch.Tensor) for t in got[:2])
    ):
        x, y = got[0], got[1]
        if len(x) != len(y):
            raise ConfigError(f"{name}: {len(x)} inputs but {len(y)} targets")
        classes = got[2] if len(got) == 3 else None
        ds: Dataset = TensorDataset(x, y)
    elif isinstance(got, IterableDataset):
        # a stream has no sample i to hand a rank: said as such, where one without len()
        # read as any other return and one with len() as a __getitem__ to mend
        raise ConfigError(
            f"{name} returned an IterableDataset ({type(got).__name__}); every strategy gives "
            "each rank its own indices of one sample order (its sampler), which needs a "
            "map-style Dataset with len() and dataset[i]: return one, or (inputs, targets) "
            "tensors"
        )
    elif isinstance(got, Dataset) and hasattr(got, "__len__"):
        ds = got
        classes = getattr(got, "vocab_size", None) or getattr(got, "num_classes", None)
        if classes is None:
            classes = getattr(got, "classes", None)
            classes = len(classes) if isinstance(classes, list | tuple) else classes
        if classes is None:
            raise ConfigError(
                f"{name}: the data set does not say how many classes it has: give it a "
                "num_classes (or vocab_size) attribute, or return (inputs, targets) tensors"
            )
    else:
        raise ConfigError(
            f"{name} returned {type(got).__name__}; a data-set factory returns a map-style "
            "torch Dataset with len(), or (inputs, targets) tensors"
        )
    n = len(ds)  # type: ignore[arg-type]
    if n < 1:
        raise ConfigError(f"{name}: the data set is empty")
    try:
        sample = ds[0]
    except Exception as exc:  # the data is what fails, not the sample's form
        raise unreadable(name, 0, exc) from None
    try:
        x0, y0 = sample
        listed = [type(v).__name__ for v in (x0, y0) if isinstance(v, list | tuple)]
        if listed:  # the DataLoader batches a list as a list of tensors, not as a tensor
            raise TypeError(f"a Python {listed[0]} (return tensors)")
        x0, y0 = torch.as_tensor(x0), torch.as_tensor(y0)
    except Exception as exc:
        raise ConfigError(
            f"{name}: its first sample is not a pair of tensors (input, target): {one_line(exc)}"
        ) from None
    _integer_targets(name, y0.dtype)  # a Dataset's read off its first sample
    # token data: a target per input position (next tokens), not one label per sample
    tokens = y0.dim() > 0 and y0.shape == x0.shape
    if y0.numel() != 1 and not tokens:
        raise ConfigError(
            f"{name}: a target of shape {tuple(y0.shape)} for an input of {tuple(x0.shape)}; "
            "give one class label per sample, or next tokens shaped like the input"
        )
    if classes is None:  # tensors without a stated count: read off the targets
        assert isinstance(ds, TensorDataset)
        top = ds.tensors[1].max()
        if tokens:
            top = torch.maximum(top, ds.tensors[0].max())
        classes = int(top) + 1
    try:
        classes = int(classes)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{name}: its number of classes must be an int, not {classes!r}"
        ) from None
    if classes < 2:
        raise ConfigError(f"{name}: {classes} class(es); a classifier needs at least 2")
    if _reads_as(ds, TensorDataset):  # in memory: every label checked, not a first batch's
        low, high = int(ds.tensors[1].min()), int(ds.tensors[1].max())
        if low < 0 or high >= classes:
            raise ConfigError(
                f"{name}: targets from {low} to {high}, out of range for {classes} classes "
                f"(labels 0 to {classes - 1})"
            )
    spec = InputSpec(tuple(x0.shape), x0.dtype, classes if tokens else 0)
    n_eval = min(cfg.eval_samples, n // 10)
    train = _limit(Subset(ds, range(n - n_eval)), cfg.limit, name, n_eval)
    held = Subset(ds, range(n - n_eval, n))
    # a token model's classes are its vocabulary ("32 tokens" read as each sample's length)
    kind = f"a vocabulary of {classes}" if tokens else f"{classes} classes"
    desc = (
        f"{name}: {n} samples of {spec.describe()}, {kind}: train {len(train)} / held-out {n_eval}"
    )
    return DataBundle(train, held, classes, desc, spec)
