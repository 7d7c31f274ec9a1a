from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest
import torch

from bench.config import ConfigError, RunConfig
from bench.workload import data


def test_mnist_uses_the_split_present_and_says_which(data_root):
    b = data.load(RunConfig(dataset="mnist", data_root=str(data_root)))
    # ../shared/data holds only the 10,000-image test split: train on 9,000, hold out 1,000.
    assert "test split only" in b.description
    assert len(b.train) == 9000 and len(b.held_out) == 1000
    x, y = b.train[0]
    assert x.shape == (1, 28, 28) and x.dtype == torch.float32
    assert 0 <= int(y) <= 9
    # normalised with MNIST's mean/std: roughly zero mean, unit spread
    xs = torch.stack([b.train[i][0] for i in range(500)])
    assert abs(xs.mean().item()) < 0.2 and 0.8 < xs.std().item() < 1.2


def test_mnist_limit_and_check(data_root):
    cfg = RunConfig(dataset="mnist", data_root=str(data_root), limit=100, warmup_steps=0)
    bundle = data.load(cfg)
    assert len(bundle.train) == 100
    assert data.check(cfg) == "mnist test split"
    # the rows' data column says how many samples trained, not the split's size
    assert "train first 100 of 9000 (--limit) / held-out last 1000" in bundle.description
    assert "train 9000 / held-out" in data.load(cfg.replace(limit=None)).description
    # above the 9000 training images, a --limit would cap nothing: refused, the count named
    with pytest.raises(ConfigError, match="--limit 9001: mnist test split has 9000 training"):
        data.check(cfg.replace(limit=9001))
    with pytest.raises(ConfigError, match="--limit 9001: mnist test split has 9000 training"):
        data.load(cfg.replace(limit=9001))
    # so an epoch too short for the warm-up does not ask for more of what the data lacks
    with pytest.raises(ConfigError, match=r"\(9000 samples / global batch 64\); lower --global"):
        data.check(cfg.replace(limit=None, warmup_steps=140))
    with pytest.raises(ConfigError, match="; raise --limit or lower --global-batch"):
        data.check(cfg.replace(limit=640, warmup_steps=10))


def test_missing_mnist_names_the_alternatives(tmp_path):
    with pytest.raises(ConfigError, match="MNIST not found.*--download.*synthetic"):
        data.check(RunConfig(dataset="mnist", data_root=str(tmp_path)))


def test_an_mnist_file_without_its_partner_is_named(tmp_path, data_root):
    """Images with no labels (a download cut off between the two) are not 'MNIST not found':
    the line names the file that is there and the one that is missing."""
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    shutil.copy(data_root / "mnist" / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz", raw)
    with pytest.raises(ConfigError, match="incomplete") as err:
        data.check(RunConfig(dataset="mnist", data_root=str(tmp_path)))
    assert f"{raw / 't10k-images-idx3-ubyte.gz'} is there, but not " in str(err.value)
    assert f"{raw / 't10k-labels-idx1-ubyte'}[.gz]" in str(err.value)


def test_truncated_idx_file_is_reported(tmp_path, data_root):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    src = data_root / "mnist" / "MNIST" / "raw"
    shutil.copy(src / "t10k-labels-idx1-ubyte.gz", raw)
    with gzip.open(src / "t10k-images-idx3-ubyte.gz") as f:
        head = f.read(5000)
    (raw / "t10k-images-idx3-ubyte").write_bytes(head)
    with pytest.raises(ConfigError, match="truncated"):
        data.load(RunConfig(dataset="mnist", data_root=str(tmp_path)))


def test_imagenet_subset_with_class_limit(data_root):
    cfg = RunConfig(
        dataset="imagenet-subset", data_root=str(data_root), max_classes=20, image_size=64
    )
    b = data.load(cfg)
    assert b.num_classes == 20
    assert len(b.train) + len(b.held_out) == 20  # one image per class in the sample
    x, y = b.train[0]
    assert x.shape == (3, 64, 64) and 0 <= int(y) < 20


def test_imagenet_root_found_from_the_data_root_or_the_tree_itself(data_root):
    a = data.check(RunConfig(dataset="imagenet-subset", data_root=str(data_root)))
    b = data.check(
        RunConfig(dataset="imagenet-subset", data_root=str(data_root / "imagenet-sample"))
    )
    assert a == b and a.endswith("imagenet-sample")


def test_a_picture_beside_the_data_sets_does_not_make_the_root_a_class_tree(tmp_path, data_root):
    """A data root holding mnist/, imagenet-sample/ and a folder with one picture in it:
    the sample is the tree, not the root (whose 'classes' would be mnist, notes...)."""
    root = tmp_path / "root"
    root.mkdir()
    for name in ("mnist", "imagenet-sample"):
        (root / name).symlink_to(data_root / name)
    (root / "notes").mkdir()
    shutil.copy(next((data_root / "imagenet-sample").rglob("*.JPEG")), root / "notes" / "a.JPEG")
    found = data.check(RunConfig(dataset="imagenet-subset", data_root=str(root)))
    assert found.endswith(f" {root / 'imagenet-sample'}")
    (root / "imagenet-sample").unlink()  # the root alone: one folder of three with pictures
    with pytest.raises(ConfigError, match="no ImageFolder tree"):
        data.check(RunConfig(dataset="imagenet-subset", data_root=str(root)))


def test_imagenet_missing_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no ImageFolder tree"):
        data.check(RunConfig(dataset="imagenet-subset", data_root=str(tmp_path)))


def test_synthetic_matches_the_model_input():
    b = data.load(RunConfig(dataset="synthetic", model="mnist_cnn", global_batch=8, device="cpu"))
    assert b.train[3][0].shape == (1, 28, 28) and b.num_classes == 10
    # 28 px whatever --image-size says (which is refused for it): no '64 px: the CPU default'
    assert b.description == "synthetic (1, 28, 28) x 400, 10 classes"
    b = data.load(RunConfig(dataset="synthetic", model="resnet18", global_batch=8, device="cpu"))
    assert b.description.endswith("(64 px: the CPU default; --image-size sets it)")
    # on a GPU 64 px is no default (224 is) but what --image-size asked for: the rows' `data`
    # called it the CPU default
    gpu = RunConfig(
        dataset="synthetic",
        model="resnet18",
        image_size=64,
        limit=16,
        global_batch=8,
        device="cuda",
    )
    assert data.load(gpu).description == "synthetic (3, 64, 64) x 16, 1000 classes"
    b = data.load(
        RunConfig(dataset="synthetic", model="resnet18", image_size=32, limit=16, global_batch=8)
    )
    assert b.train[3][0].shape == (3, 32, 32) and len(b.train) == 16


def test_python_source_says_how_much_text_it_read_in_kib_below_a_mib():
    """A --limit of a few hundred sequences reads some KiB of source: "0.0 MiB" said none."""
    small = data.load(RunConfig(dataset="python-source", seq_len=32, limit=64, eval_samples=8))
    read = float(small.description.split(" standard library (")[1].split(" KiB,")[0])
    assert 64 * 33 <= read * 1024 and "0.0 MiB" not in small.description
    default = data.load(RunConfig(dataset="python-source", seq_len=32, eval_samples=8))
    assert "MiB, bytes as tokens" in default.description  # about 2 MiB read


def test_a_model_that_computes_its_shape_with_tensors_is_built_on_the_meta_device():
    """RegNet reads its block widths back from tensors, which a meta tensor cannot give: it
    is built with that arithmetic on the CPU and its weights on the meta device, so the
    checks before a run cost no memory (the largest, regnet_y_128gf, would take 2.6 GB)."""
    from torch import nn

    from bench.workload import flops, models

    cfg = RunConfig(dataset="synthetic", model="regnet_x_400mf", image_size=32, global_batch=8)
    register = nn.Module.register_parameter
    model = models.meta_model(cfg)
    assert nn.Module.register_parameter is register  # put back
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}
    assert sum(p.numel() for p in model.parameters()) == 5_495_976  # torchvision's count
    assert data.check(cfg) == "synthetic"
    assert flops.step_flops(cfg, 1000, models.spec(cfg)) > 0
    assert nn.Linear(2, 2).weight.device.type == "cpu"
    with models._registered_on_meta():  # one parameter registered twice stays one
        shared, m = nn.Parameter(torch.empty(3, 3)), nn.Module()
        m.a, m.b = shared, shared
    assert m.a is m.b and m.a.device.type == "meta" and len(list(m.parameters())) == 1


def test_synthetic_data_leaves_target_precision_room_to_stop():
    """--target-precision checks every 10 timed steps from the 50th: default synthetic data
    (50 batches) could not reach its first check after the warm-up, so it holds the warm-up
    and 100 timed steps; --limit still decides where given."""
    cfg = RunConfig(dataset="synthetic", model="mnist_cnn", global_batch=8, target_precision=5)
    assert data.synthetic_samples(cfg) == (5 + 100) * 8
    assert data.check(cfg) == "synthetic"
    assert data.synthetic_samples(cfg.replace(target_precision=None)) == 50 * 8
    with pytest.raises(ConfigError, match="leaves 45; raise --limit"):
        data.check(cfg.replace(limit=400))


def test_resnet_on_mnist_is_refused(data_root):
    with pytest.raises(ConfigError, match="3-channel"):
        data.check(RunConfig(dataset="mnist", model="resnet18", data_root=str(data_root)))


@pytest.mark.parametrize("dataset", ["mnist", "synthetic"])
def test_device_batches_are_the_loaders_batches(data_root, dataset):
    """The device path feeds exactly what the DataLoader path feeds, batch for batch, in
    the DistributedSampler's order, for each rank of two and across epochs."""
    from torch.utils.data import DataLoader, DistributedSampler

    cfg = RunConfig(dataset=dataset, data_root=str(data_root), limit=256, image_size=32)
    train = data.load(cfg).train
    take = data.on_device(train, torch.device("cpu"))
    assert take is not None
    for rank in (0, 1):
        fast, slow = (
            DistributedSampler(train, num_replicas=2, rank=rank, shuffle=True, seed=3)
            for _ in range(2)
        )
        device = data.DeviceBatches(take, fast, 16, torch.device("cpu"))
        loader = DataLoader(train, batch_size=16, sampler=slow, drop_last=True)
        assert len(device) == len(loader) == 256 // 2 // 16
        for epoch in (0, 1):
            fast.set_epoch(epoch)
            slow.set_epoch(epoch)
            for (xa, ya), (xb, yb) in zip(device, loader, strict=True):
                torch.testing.assert_close(xa, xb, rtol=0, atol=0)
                assert torch.equal(ya, yb)


def test_only_the_samples_trained_on_are_moved_to_the_device(data_root, monkeypatch):
    """A GPU row's peak memory includes the data held there: --limit 100 of MNIST's split
    holds 100 images, not the 10,000 of the split with its held-out part. (The meta device
    stands in for a GPU: a device other than the CPU, where the tensors already are.)"""
    moved: list[tuple[int, ...]] = []
    to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        out = to(self, *args, **kwargs)
        if out.device.type == "meta" and self.device.type != "meta":
            moved.append(tuple(self.shape))
        return out

    monkeypatch.setattr(torch.Tensor, "to", spy)
    cfg = RunConfig(dataset="mnist", data_root=str(data_root), limit=100, warmup_steps=0)
    take = data.on_device(data.load(cfg).train, torch.device("meta"))
    assert take is not None
    assert sorted(moved) == [(100,), (100, 1, 28, 28)]
    x, y = take(torch.arange(10, device="meta"))
    assert x.shape == (10, 1, 28, 28) and y.shape == (10,)


def test_files_on_disk_keep_the_loader(data_root):
    cfg = RunConfig(dataset="imagenet-subset", model="resnet18", data_root=str(data_root))
    assert data.on_device(data.load(cfg).train, torch.device("cpu")) is None
    with pytest.raises(ConfigError, match="--data-path device needs data held in memory"):
        RunConfig(dataset="imagenet-subset", data_feed="device")


#: a user's data set that subclasses TensorDataset: images stored as bytes, scaled to
#: [0, 1] as they are read
SCALED = """
import torch
from torch.utils.data import TensorDataset


class Scaled(TensorDataset):
    num_classes = 4

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return x.float() / 255, y


def build():
    x = torch.arange(40 * 3 * 4 * 4).remainder(256).to(torch.uint8).view(40, 3, 4, 4)
    return Scaled(x, torch.arange(40) % 4)
"""


def test_a_tensor_data_set_with_its_own_getitem_is_read_through_it(tmp_path):
    """The device path indexes the stored tensors: for a TensorDataset whose __getitem__
    changes what it reads, every cell trained on the raw bytes (here: failed, a float model
    fed uint8), or on other data than the loader path reads. It keeps the DataLoader."""
    (tmp_path / "scaled.py").write_text(SCALED)
    cfg = RunConfig(dataset=f"{tmp_path}/scaled.py:build", model="resnet18")
    train = data.load(cfg).train
    assert data.on_device(train, torch.device("cpu")) is None
    assert not data.in_memory(train)
    x, _ = train[5]
    assert x.dtype == torch.float32 and float(x.max()) <= 1.0
    with pytest.raises(ConfigError, match="--data-path device needs data held in memory"):
        data.check(cfg.replace(data_feed="device"))


class _BrokenAt(torch.utils.data.Dataset):
    """Raises `message` on sample 3, as a user's data set with one bad record would."""

    def __init__(self, message: str = "record 3 has no label") -> None:
        self.message = message

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        if i == 3:
            raise ValueError(self.message)
        return torch.zeros(2), 0


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize(
    ("message", "said"),
    [
        ("record 3 has no label", "record 3 has no label"),
        ("record 3:\nno label", "record 3:"),  # its first line, as any message's
        ("", ""),  # none: the type, once
    ],
)
def test_a_sample_that_raises_in_a_loader_worker_is_named_in_one_line(workers, message, said):
    # in a worker process the DataLoader raises it again as "Caught ValueError in DataLoader
    # worker process 0." plus the worker's traceback: a cell's reason names the cause
    from bench.harness import proc

    loader = torch.utils.data.DataLoader(_BrokenAt(message), batch_size=2, num_workers=workers)
    with pytest.raises(ValueError) as caught:
        list(loader)
    where = " (DataLoader worker process 0)" if workers else ""
    assert proc.one_line(caught.value) == f"ValueError{': ' if said else ''}{said}{where}"
    assert proc.first_line(caught.value) == f"{said or 'ValueError'}{where}"


def test_a_long_message_from_a_loader_worker_is_cut_not_the_worker_it_names():
    from bench.harness import proc

    loader = torch.utils.data.DataLoader(_BrokenAt("y" * 400), batch_size=2, num_workers=1)
    with pytest.raises(ValueError) as caught:
        list(loader)
    line = proc.one_line(caught.value, limit=120)
    assert len(line) == 120 and line.startswith("ValueError: yyy")
    assert line.endswith("y (DataLoader worker process 0)")


def test_a_loader_worker_killed_during_the_evaluation_is_told_as_in_training():
    """A training DataLoader worker the kernel kills after the timed steps: its death is
    raised in the rank where it is then, the evaluation. The row keeps its figures and is
    not ok; as for a death in the timed steps, it is `oom` where the kernel's log names the
    worker, and says what the kernel does say otherwise."""
    from bench.harness.proc import OomKills
    from bench.harness.runner import _epoch_status

    said = "RuntimeError: DataLoader worker (pid 4321) is killed by signal: Killed."
    failed = f"evaluation after the timed steps failed: {said}"
    line = "Out of memory: Killed process 4321 (pt_data_worker) total-vm:9kB, anon-rss:8kB"
    logged = OomKills(frozenset({4300}), 1, (line,), True)
    assert _epoch_status(None, said, False, logged) == {
        "status": "oom",
        "reason": f"{failed}; the kernel's OOM killer killed one of the cell's processes (its "
        "log: Out of memory: Killed process 4321 (pt_data_worker))",
    }
    assert _epoch_status(None, said, False, OomKills(frozenset({4300}), 0)) == {
        "status": "failed",
        "reason": f"{failed} (not the kernel's OOM killer: it killed no process on this "
        "machine while the cell ran (/proc/vmstat oom_kill))",
    }
    # another error of the evaluation says nothing of the OOM killer
    other = _epoch_status(None, "ValueError: bad label", False, logged)
    assert other == {
        "status": "failed",
        "reason": "evaluation after the timed steps failed: ValueError: bad label",
    }


def _image_tree(tmp_path, data_root, classes: int = 3):
    """The first `classes` class folders of the ImageNet sample, copied (one image each)."""
    src = data_root / "imagenet-sample"
    for folder in sorted(src.iterdir())[:classes]:
        shutil.copytree(folder, tmp_path / "tree" / folder.name)
    return tmp_path / "tree"


def test_an_image_that_cannot_be_decoded_is_named(tmp_path, data_root):
    tree = _image_tree(tmp_path, data_root)
    bad = next((tree / sorted(p.name for p in tree.iterdir())[1]).iterdir())
    bad.write_bytes(bad.read_bytes()[:2000])  # a truncated JPEG: PIL fails on decoding
    b = data.load(RunConfig(dataset="imagenet-subset", data_root=str(tree), image_size=32))
    b.train[0]  # the others decode
    with pytest.raises(OSError, match=f"{bad} cannot be read as an image .*truncated"):
        b.train[1]
    # in a loader worker too, the cell's one line names the file
    from bench.harness import proc

    loader = torch.utils.data.DataLoader(b.train, batch_size=3, num_workers=1)
    with pytest.raises(OSError) as caught:
        list(loader)
    assert f"{bad} cannot be read as an image" in proc.one_line(caught.value)


@pytest.mark.parametrize("empty", [0, 1])
def test_an_empty_class_folder_is_named_in_one_line(tmp_path, data_root, empty):
    tree = _image_tree(tmp_path, data_root)
    folder = sorted(tree.iterdir())[empty]  # the first folder too: the tree is still found
    for f in folder.iterdir():
        f.unlink()
    with pytest.raises(ConfigError, match=f"no valid file for the classes {folder.name}.*empty"):
        data.check(RunConfig(dataset="imagenet-subset", data_root=str(tree), image_size=32))


def test_hidden_folders_and_files_of_an_image_tree_are_skipped(tmp_path, data_root):
    """A notebook's `.ipynb_checkpoints` beside the class folders and in one, a `.cache` and
    `.git`, macOS's `._x.JPEG`: no classes or images of the tree, though torchvision's
    ImageFolder takes them for both (and, one sorting first, would shift every label)."""
    tree = _image_tree(tmp_path, data_root)
    cfg = RunConfig(dataset="imagenet-subset", data_root=str(tree), image_size=32)
    plain = data.load(cfg)
    for name in (".ipynb_checkpoints", ".cache", ".git"):  # as many as the class folders
        (tree / name).mkdir()
    image = next(tree.glob("[!.]*/*"))
    (image.parent / ".ipynb_checkpoints").mkdir()
    shutil.copy(image, image.parent / ".ipynb_checkpoints" / image.name)
    (image.parent / f"._{image.name}").write_bytes(bytes(4096))  # no image
    b = data.load(cfg)  # the tree found, though half the folders in it are hidden
    assert b.num_classes == 3 and b.description == plain.description
    assert [int(y) for _, y in b.train] == [int(y) for _, y in plain.train]


def test_a_tree_of_one_class_is_refused(tmp_path, data_root):
    tree = _image_tree(tmp_path, data_root, classes=1)
    with pytest.raises(ConfigError, match="one class folder .*at least 2"):
        data.check(RunConfig(dataset="imagenet-subset", data_root=str(tree), image_size=32))


def test_verify_reads_the_imagenet_subset_without_random_crops(data_root):
    # parity compares layouts on the held-out images' center crops, without augmentation
    from bench.analysis import verify

    cfg = RunConfig(dataset="imagenet-subset", data_root=str(data_root), max_classes=4)
    parity = verify.parity_config(cfg.replace(image_size=32), 3)
    assert parity.no_augment and parity.no_tf32 and not cfg.no_tf32
    b = data.load(parity)
    torch.manual_seed(1)
    first = b.train[0][0]
    torch.manual_seed(2)
    assert torch.equal(first, b.train[0][0])
    assert "no random crop" in b.description
    b = data.load(cfg.replace(image_size=32))  # a run's own: augmented, each epoch anew
    assert not torch.equal(first, b.train[0][0])
    assert not torch.equal(b.train[(0, 0)][0], b.train[(1, 0)][0])


def test_the_imagenet_description_says_which_images_are_held_out(tmp_path, data_root):
    cfg = RunConfig(dataset="imagenet-subset", image_size=32, max_classes=20, global_batch=4)
    # the sample has one image per class: every 10th image held out leaves its class
    # untrained, so its accuracy is 0 for any model, and the rows say so
    desc = data.load(cfg.replace(data_root=str(data_root))).description
    assert desc.endswith(
        "(20 classes): train 18, of 18 classes / held-out 2 (every 10th image), "
        "2 of them of classes with no training image"
    )
    desc = data.load(cfg.replace(data_root=str(data_root), limit=4)).description
    assert "train first 4 of 18 (--limit), of 4 classes / held-out 2" in desc
    tree = _image_tree(tmp_path, data_root, classes=10)
    for image in list(tree.glob("*/*")):  # two images a class: both held out are trained
        shutil.copy(image, image.with_name("b" + image.name))
    desc = data.load(cfg.replace(data_root=str(tree), max_classes=None)).description
    assert desc.endswith("(10 classes): train 18 / held-out 2 (every 10th image)")


def test_an_image_tree_of_any_format_imagefolder_reads_is_found(tmp_path, data_root):
    from PIL import Image

    tree = _image_tree(tmp_path, data_root)
    for image in list(tree.glob("*/*")):
        Image.open(image).convert("RGB").resize((40, 30)).save(image.with_suffix(".bmp"))
        image.unlink()
    cfg = RunConfig(dataset="imagenet-subset", data_root=str(tree), image_size=32)
    b = data.load(cfg)
    assert len(b.train) == 3 and b.train[2][0].shape == (3, 32, 32)


def test_more_max_classes_than_the_tree_has_is_refused(tmp_path, data_root):
    tree = _image_tree(tmp_path, data_root)
    cfg = RunConfig(dataset="imagenet-subset", data_root=str(tree), max_classes=5)
    with pytest.raises(ConfigError, match="--max-classes 5: .* has 3 class folders"):
        data.check(cfg)
    assert data.load(cfg.replace(max_classes=3)).num_classes == 3


def test_the_loader_and_the_device_path_train_alike_with_dropout(tmp_path, data_root) -> None:
    """The training DataLoader takes its workers' seeds from a generator of the run's seed,
    as the sampler takes its order, not from torch's: a draw there gave the model other
    dropout masks from step 0 on than the same samples get from --data-path device (the
    MNIST CNN drops out), over two epochs (each draws again)."""
    import csv

    from bench.harness.runner import run_matrix
    from tests.conftest import small_config

    losses = {}
    for feed in ("loader", "device"):
        cfg = small_config(
            tmp_path, data_root, strategies=("single",), world_sizes=(1,), run_id=feed,
            data_feed=feed, epochs=2, max_steps=4, eval_samples=0,
        )  # fmt: skip
        run_dir, rows = run_matrix(cfg, echo=lambda m: None)
        assert [r["status"] for r in rows] == ["ok", "ok"], rows
        steps = (run_dir / "steps.csv").read_text().splitlines()
        losses[feed] = [r["loss"] for r in csv.DictReader(steps)]
    assert len(losses["loader"]) == 8 and losses["loader"] == losses["device"]


def test_synthetic_data_larger_than_free_memory_is_refused_before_it_is_made(
    tmp_path, monkeypatch, capsys
):
    """Synthetic data whose size the options give (tokens: every sequence, as int64) and
    that is more than the memory free here is one line and exit 2 before any of it is made:
    made, it is most of a minute before an allocation fails or the kernel's OOM killer
    wakes. Here 2 million sequences of 128 tokens (2.0 GB) against 1 GiB free."""
    import collections

    import psutil

    from bench.cli import main

    free = collections.namedtuple("svmem", "available")(1 << 30)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: free)

    real = torch.randint

    def randint(low, high, size, **kw):  # the checks' own small batches are made
        assert torch.Size(size).numel() < 1 << 20, "the synthetic data was made"
        return real(low, high, size, **kw)

    monkeypatch.setattr(torch, "randint", randint)
    cfg = RunConfig(dataset="synthetic", model="lm", limit=2_000_000, seq_len=128)
    with pytest.raises(ConfigError) as refused:
        data.load(cfg)
    assert str(refused.value) == (
        "synthetic tokens (128,) token ids < 256 x 2000000 training and 1000 held-out samples "
        "take 1.9 GiB of memory and this machine has 1.0 GiB free; lower --limit or --seq-len"
    )
    assert data.synthetic_bytes(cfg, data.models.spec(cfg)) == (2_000_000 + 1000) * 129 * 8
    # each rank of a cell makes its own copy: 0.6 GiB fits once, not in each of 2 ranks
    # (checked before any starts), nor past the cores unless oversubscribed; a one-process
    # strategy makes one whatever its world size
    from bench.harness.runner import plan

    monkeypatch.setattr("bench.harness.runner.device_count", lambda device: 2)  # 2 cores
    monkeypatch.setattr("bench.harness.runner.cpu_cores", lambda: 2)
    two = cfg.replace(limit=600_000, world_sizes=(1, 2), device="cpu", strategies=("ddp_spawn",))
    with pytest.raises(ConfigError, match="GiB of memory, a copy in each of 2 ranks, and"):
        plan(two)
    # a 4-rank cell skipped (past the cores) makes none: the most a cell makes is one copy
    assert {c.world_size: c.status for c in plan(two.replace(world_sizes=(1, 4)))} == {
        1: "",
        4: "skipped",
    }
    assert plan(two.replace(strategies=("dp",), world_sizes=(1,)))  # one process: one copy
    # held-out samples past the training ones name their own option
    with pytest.raises(ConfigError, match="lower --eval-samples or --seq-len$"):
        data.load(cfg.replace(limit=64, eval_samples=2_000_000))
    # images: a pool of 64 and a label per sample (here 200 million, 1.5 GiB)
    with pytest.raises(
        ConfigError, match=r"synthetic \(1, 28, 28\) float32 x 200000000 .*--limit$"
    ):
        data.load(RunConfig(dataset="synthetic", model="mnist_cnn", limit=200_000_000))
    out = tmp_path / "out"
    argv = ["run", "--dataset", "synthetic", "--model", "lm", "--model-arg", "size=tiny"]
    argv += ["--limit", "2000000", "--strategies", "single", "--world-sizes", "1"]
    argv += ["--device", "cpu", "--out-dir", str(out), "--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("parabench: error: synthetic tokens (128,)"), err
    assert not out.exists()


def test_class_folders_whose_images_are_nested_are_a_tree(tmp_path, data_root):
    """Tiny ImageNet's layout: `<root>/train/<class>/images/*.JPEG` beside a
    `<class>_boxes.txt`, and a val/ of one flat folder. ImageFolder reads the nested images
    as the class's; the tree was refused as none (exit 2, 'no ImageFolder tree')."""
    flat = _image_tree(tmp_path, data_root)
    root = tmp_path / "tiny-imagenet-200"
    for folder in sorted(flat.iterdir()):
        shutil.copytree(folder, root / "train" / folder.name / "images")
        (root / "train" / folder.name / f"{folder.name}_boxes.txt").write_text("0 0 1 1\n")
    shutil.copytree(next(flat.iterdir()), root / "val" / "images")
    (root / "val" / "val_annotations.txt").write_text("\n")
    plain = data.load(RunConfig(dataset="imagenet-subset", data_root=str(flat), image_size=32))
    for given in (root, root / "train"):
        b = data.load(RunConfig(dataset="imagenet-subset", data_root=str(given), image_size=32))
        assert b.description.startswith(f"imagenet-subset {root / 'train'} (3 classes)")
        assert b.num_classes == 3 and len(b.train) == 3
        assert [int(y) for _, y in b.train] == [int(y) for _, y in plain.train]


def test_every_rank_layout_crops_and_flips_a_sample_alike(data_root):
    """The ImageNet subset's random crops and flips are drawn per sample, from the seed, the
    epoch and its index: drawn from the generator of the process that read them (a rank's,
    or a loader worker's, seeded alike on every rank), each DDP rank repeated the others'
    crops, and step k of world size 2 trained on other pixels than single's."""
    from torch.utils.data import DistributedSampler

    from bench.harness.worker import train_loader

    cfg = RunConfig(
        dataset="imagenet-subset", data_root=str(data_root), max_classes=18, image_size=16
    )
    train = data.load(cfg).train  # 16 images (every 10th held out)

    def steps(ws: int, rank: int, workers: int, epoch: int) -> list[torch.Tensor]:
        sampler = DistributedSampler(train, num_replicas=ws, rank=rank, seed=0, drop_last=True)
        loader = train_loader(train, sampler, 8 // ws, workers, torch.device("cpu"), 0)
        loader.sampler.set_epoch(epoch)  # as train_epoch does
        torch.manual_seed(0)  # every rank's generator, as the worker seeds it
        return [x for x, _ in loader]

    for epoch, workers in ((0, 0), (1, 1)):  # a loader worker's reads: the epoch's too
        single = steps(1, 0, 0, epoch)
        ranks = [steps(2, r, workers, epoch) for r in (0, 1)]
        for k, whole in enumerate(single):  # rank r's share: every other sample
            assert all(torch.equal(ranks[r][k], whole[r::2]) for r in (0, 1)), (epoch, k)
    # a sample's draws are its epoch's: another epoch crops it anew
    assert not torch.equal(train[(0, 3)][0], train[(1, 3)][0])
    assert torch.equal(train[3][0], train[(0, 3)][0])


def test_a_16_bit_grayscale_image_reads_as_its_8_bit_equal(tmp_path):
    """A 16-bit grayscale PNG (PIL's I;16) read as PIL converts it to RGB, clipped at 255:
    all but the darkest 1/256 of its range white. Read as ImageFolder's tree is, it is the
    8-bit image of its top byte."""
    import numpy as np
    from PIL import Image

    from bench.workload.data import _read_image

    wide = np.arange(0, 65536, 257, dtype=np.uint16).reshape(16, 16)  # 0 to 65535
    Image.fromarray(wide).save(tmp_path / "wide.png")
    Image.fromarray((wide >> 8).astype(np.uint8)).save(tmp_path / "narrow.png")
    assert Image.open(tmp_path / "wide.png").mode == "I;16"
    got = np.asarray(_read_image(str(tmp_path / "wide.png")))
    assert got.shape == (16, 16, 3)
    assert np.array_equal(got, np.asarray(_read_image(str(tmp_path / "narrow.png"))))


def test_a_file_that_is_no_image_is_refused_before_the_run(tmp_path, data_root):
    """A web page saved as .JPEG, or an empty file, among the images the run reads: every
    cell failed at the step that read it, after its start-up. The files are opened (their
    headers) before anything starts: one line naming the file, training or held-out."""
    tree = _image_tree(tmp_path, data_root)
    for image in sorted(tree.glob("*/*")):
        for copy in "bc":
            shutil.copy(image, image.with_name(copy + image.name))
    shutil.copy(image, image.with_name("d" + image.name))  # 10: the last one held out
    cfg = RunConfig(
        dataset="imagenet-subset", data_root=str(tree), image_size=32, global_batch=3,
        warmup_steps=1,
    )  # fmt: skip
    data.check(cfg)
    files = sorted(tree.glob("*/*"))
    for bad, said in ((files[4], "training sample 4"), (files[-1], "held-out sample 0")):
        good = bad.read_bytes()
        bad.write_text("<html>Not Found</html>")
        with pytest.raises(ConfigError) as err:
            data.check(cfg)
        assert str(err.value).startswith(
            f"data imagenet-subset: {said} cannot be read, and every cell would read it: "
            f"OSError: {bad} cannot be read as an image (UnidentifiedImageError: "
        ), str(err.value)
        assert str(err.value).endswith("; replace or remove the file")
        bad.write_bytes(good)


def test_a_run_opens_each_image_once_however_often_it_plans(tmp_path, data_root, monkeypatch):
    """The CLI checks the data, then the run plans again (verify more often): each check
    opened and parsed the header of every file again, up to 20,000. A file opened before,
    unchanged since, is not opened again; one rewritten since is."""
    from PIL import Image

    tree = _image_tree(tmp_path, data_root)
    cfg = RunConfig(
        dataset="imagenet-subset", data_root=str(tree), image_size=32, global_batch=1,
        warmup_steps=1,
    )  # fmt: skip
    opened: list[str] = []
    real = Image.open

    def counted(fp, *args, **kwargs):
        opened.append(str(fp))
        return real(fp, *args, **kwargs)

    monkeypatch.setattr(Image, "open", counted)
    data.check(cfg)
    first = len(opened)
    assert first > 0
    data.check(cfg)
    assert len(opened) == first
    changed = Path(opened[0])
    changed.write_bytes(changed.read_bytes() + b"\0")
    data.check(cfg)
    assert opened[first:] == [str(changed)]
    # rewritten as the same size with its times put back (cp -p, rsync -t, tar): the change
    # time, which no one can set, tells it
    was = changed.stat()
    changed.write_bytes(b"\1" * was.st_size)
    os.utime(changed, ns=(was.st_atime_ns, was.st_mtime_ns))
    with pytest.raises(ConfigError, match="cannot be read as an image"):
        data.check(cfg)
