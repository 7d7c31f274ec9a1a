"""Your own model and data: factories from files, modules and entry points; every way a
factory can be wrong is one line and exit 2 before anything starts; the language-model
workload; and parity of a BatchNorm model against the baseline cut into the same shares."""

from __future__ import annotations

import json
import math
import re
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pandas as pd
import pytest
import torch

from bench.analysis import report
from bench.analysis.verify import table, verify
from bench.cli import main
from bench.config import ConfigError, RunConfig
from bench.harness.runner import run_matrix
from bench.workload import data, models, plugins
from tests.conftest import faulty_strategies

ROOT = Path(__file__).resolve().parent.parent
MODEL = f"{ROOT / 'examples' / 'own_model.py'}:build"
DATASET = "examples.own_data:shapes"


def _cli(capsys, tmp_path, *args: str) -> tuple[int, str]:
    out = tmp_path / "out"
    code = main(
        [
            "run",
            "--device",
            "cpu",
            "--out-dir",
            str(out),
            "--max-steps",
            "2",
            "--warmup-steps",
            "1",
            *args,
        ]
    )
    err = capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir()), "a run started despite bad input"
    return code, err


def _file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "user_model.py"
    path.write_text("import torch\nfrom torch import nn\n" + textwrap.dedent(body))
    return str(path)


BAD_MODELS = {
    "missing module": ("no_such_pkg.models:build", "cannot import no_such_pkg.models"),
    "missing file": ("no/such/file.py:build", "no such file"),
    "missing attribute": (f"{ROOT / 'examples' / 'own_model.py'}:nope", "has no attribute 'nope'"),
    "not a function": ("FILE:WIDTH", "is of type int, not a function"),
    "returns something else": ("FILE:returns_int", "returned int, not a torch.nn.Module"),
    "raises": ("FILE:raises", "raised RuntimeError: broken on purpose"),
    "forward fails on its stated input": ("FILE:wrong_input", "forward on a batch of (7,)"),
    "exits": ("FILE:exits", "exits (SystemExit(3)): a plug-in must not exit; command-line"),
}
USER_FILE = """
WIDTH = 3
def returns_int(num_classes=10):
    return 42
def raises():
    raise RuntimeError("broken on purpose")
class Wrong(nn.Linear):
    input_shape = (7,)
def wrong_input(num_classes=10):
    return Wrong(5, num_classes)
def ten_classes():
    return nn.Sequential(nn.Flatten(), nn.Linear(32 * 32, 10))
def exits(num_classes=10):
    import sys
    sys.exit(3)
"""


@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_a_bad_model_factory_is_one_line_and_exit_2(capsys, tmp_path, case):
    spec, expected = BAD_MODELS[case]
    spec = spec.replace("FILE", _file(tmp_path, USER_FILE))
    code, err = _cli(capsys, tmp_path, "--dataset", "synthetic", "--model", spec)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("parabench: error: "), err
    assert "Traceback" not in err and expected in err, err
    assert spec.split(":")[0].split("/")[-1] in err  # names the factory


def test_a_model_with_the_wrong_number_of_classes_for_the_data_is_exit_2(capsys, tmp_path):
    spec = _file(tmp_path, USER_FILE) + ":ten_classes"
    code, err = _cli(capsys, tmp_path, "--dataset", DATASET, "--model", spec)
    assert code == 2 and err.count("\n") == 1, err
    assert "output of shape (2, 10)" in err and "the data has 4 classes" in err, err


DATA_FILE = """
from torch.utils.data import Dataset
class NoClasses(Dataset):
    def __len__(self):
        return 10
    def __getitem__(self, i):
        return torch.zeros(3), 0
def no_classes():
    return NoClasses()
def a_list():
    return [1, 2, 3]
def float_targets():
    return torch.zeros(8, 3), torch.zeros(8)
def bad_count():
    return torch.zeros(8, 3), torch.zeros(8, dtype=torch.long), "many"
def wrong_target_shape():
    return torch.zeros(8, 3), torch.zeros(8, 2, dtype=torch.long)
class Samples(Dataset):
    num_classes = 4
    def __init__(self, sample):
        self.sample = sample
    def __len__(self):
        return 10
    def __getitem__(self, i):
        return self.sample
def float_labels_dataset():
    return Samples((torch.zeros(1, 32, 32), 1.0))
def lists_dataset():
    return Samples(([[0.0] * 32] * 32, 1))
def labels_out_of_range():
    return torch.zeros(8, 1, 32, 32), torch.tensor([0, 1, 2, 3, 4, 0, 1, 2]), 4
def exits():
    raise SystemExit(3)
class Unreadable(Samples):
    def __getitem__(self, i):
        raise OSError(f"record {i} is on a disk that is gone")
def unreadable():
    return Unreadable(None)
class Stream(torch.utils.data.IterableDataset):
    num_classes = 4
    def __iter__(self):
        return iter([(torch.zeros(1, 32, 32), 1)] * 10)
class SizedStream(Stream):
    def __len__(self):
        return 10
def stream():
    return Stream()
def sized_stream():
    return SizedStream()
"""
BAD_DATA = {
    "missing module": ("no_such_pkg.data:load", "cannot import no_such_pkg.data"),
    "returns something else": ("FILE:a_list", "returned list; a data-set factory returns"),
    "states no classes": ("FILE:no_classes", "does not say how many classes"),
    "float targets": ("FILE:float_targets", "targets must be integer class labels"),
    "a count that is not a number": ("FILE:bad_count", "number of classes must be an int"),
    "targets neither a label nor tokens": ("FILE:wrong_target_shape", "a target of shape (2,)"),
    # a Dataset's first target is checked as the tensors' are
    "float labels in a Dataset": (
        "FILE:float_labels_dataset",
        "targets must be integer class labels, not torch.float32",
    ),
    "samples that are lists": ("FILE:lists_dataset", "first sample is not a pair of tensors"),
    # the data is to blame, named as the estimate's step names a later sample it cannot read
    "a first sample that cannot be read": (
        "FILE:unreadable",
        "training sample 0 cannot be read, and every cell would read it: OSError: record 0 is "
        "on a disk that is gone; mend the data set's __getitem__",
    ),
    "labels past the classes": ("FILE:labels_out_of_range", "targets from 0 to 4, out of range"),
    "exits": ("FILE:exits", "exits (SystemExit(3)): a plug-in must not exit"),
    # a stream, not indexed: said as such, where it read as any other return (and one with
    # len() as a __getitem__ to mend)
    **{
        f"an IterableDataset{extra}": (
            f"FILE:{factory}",
            f"returned an IterableDataset ({cls}); every strategy gives each rank its own "
            "indices of one sample order (its sampler), which needs a map-style Dataset",
        )
        for extra, factory, cls in (
            ("", "stream", "Stream"),
            (" with len()", "sized_stream", "SizedStream"),
        )
    },
}


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_a_bad_dataset_factory_is_one_line_and_exit_2(capsys, tmp_path, case):
    spec, expected = BAD_DATA[case]
    spec = spec.replace("FILE", _file(tmp_path, DATA_FILE))
    code, err = _cli(capsys, tmp_path, "--dataset", spec, "--model", MODEL)
    assert code == 2 and err.count("\n") == 1, err
    assert "Traceback" not in err and expected in err, err


STEP_FILE = """
from torch.utils.data import Dataset
class Net(nn.Sequential):
    input_shape = (8,)
def plain(num_classes=4):
    return Net(nn.Linear(8, num_classes))
def frozen(num_classes=4):
    net = plain(num_classes)
    for p in net.parameters():
        p.requires_grad_(False)
    return net
class Buffers(nn.Module):
    input_shape = (8,)
    def __init__(self, num_classes):
        super().__init__()
        self.register_buffer("w", torch.randn(8, num_classes))
    def forward(self, x):
        return x @ self.w
def buffers_only(num_classes=4):
    return Buffers(num_classes)
class Rounds(nn.Linear):
    input_shape = (8,)
    def forward(self, x):
        return super().forward(x).long()
def long_output(num_classes=4):
    return Rounds(8, num_classes)
def vectors():
    return torch.randn(64, 8), torch.arange(64) % 4
def doubles():
    return torch.randn(64, 8, dtype=torch.float64), torch.arange(64) % 4
class Samples(Dataset):
    num_classes = 4
    def __init__(self, sample):
        self.sample = sample
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return self.sample(i)
def labels_past_classes():  # a Dataset: only a step sees its labels
    return Samples(lambda i: (torch.randn(8), 4 + i))
def ragged():
    return Samples(lambda i: (torch.randn(8 + i % 2), i % 4))
"""
CANNOT_TRAIN = {
    "no parameter takes a gradient": ("frozen", "vectors", "element 0 of tensors does not"),
    "buffers only": ("buffers_only", "vectors", "optimizer got an empty parameter list"),
    "an output of dtype long": ("long_output", "vectors", "RuntimeError: element 0"),
    "labels past the classes": ("plain", "labels_past_classes", "IndexError: Target"),
    "inputs of another dtype": ("plain", "doubles", "Double and Float"),
    "samples of different shapes": ("plain", "ragged", "stack expects each tensor"),
}


@pytest.mark.parametrize("case", sorted(CANNOT_TRAIN))
def test_a_model_or_data_that_cannot_take_a_step_is_one_line_and_exit_2(capsys, tmp_path, case):
    """The meta forward passes; the estimate's training step (before anything starts) is
    the first to fail: one line naming the model, the data and the cause, not a traceback."""
    model, dataset, cause = CANNOT_TRAIN[case]
    path = _file(tmp_path, STEP_FILE)
    args = ("--dry-run", "--model", f"{path}:{model}", "--dataset", f"{path}:{dataset}")
    code, err = _cli(capsys, tmp_path, *args, "--global-batch", "8", "--strategies", "single")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"parabench: error: model {path}:{model} on data {path}:{dataset}")
    assert "a training step" in err and cause in err, err


def test_verify_dry_run_refuses_a_model_that_cannot_take_a_step(capsys, tmp_path):
    path = _file(tmp_path, STEP_FILE)
    code = main(
        ["verify", "--dry-run", "--device", "cpu", "--out-dir", str(tmp_path / "out")]
        + ["--model", f"{path}:frozen", "--dataset", f"{path}:vectors", "--global-batch", "8"]
        + ["--strategies", "ddp_spawn", "--world-sizes", "2", "--steps", "2"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "does not require grad" in err, err


def test_a_plugin_that_parses_the_command_line_at_import_is_one_line(capsys, tmp_path):
    """A script's `parse_args()` outside `if __name__ == '__main__':` meets parabench's own
    command line: one line saying so, not argparse's usage line (read as parabench's) and
    exit 2 from inside the import."""
    path = _file(
        tmp_path,
        """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--config", required=True)
        args = parser.parse_args()
        def build(num_classes=10):
            return nn.Linear(3, num_classes)
        """,
    )
    code, err = _cli(capsys, tmp_path, "--dataset", "synthetic", "--model", f"{path}:build")
    assert code == 2 and err.count("\n") == 1 and not err.startswith("usage"), err
    assert "parses the command line (argparse:" in err and "--config" in err, err
    assert "belongs under `if __name__ == '__main__':`" in err


def test_a_factory_may_parse_strings_of_its_own(tmp_path):
    """argparse inside a factory, on a string of its own, catching its refusal as argparse
    documents (SystemExit): it works as it would outside parabench."""
    from bench.workload import plugins

    path = _file(
        tmp_path,
        """
        import argparse
        def build(num_classes=10, spec="--width x"):
            parser = argparse.ArgumentParser(prog="build")
            parser.add_argument("--width", type=int, default=8)
            try:
                width = parser.parse_args(spec.split()).width
            except SystemExit:
                width = 8  # a bad spec: its default
            return nn.Linear(3, width)
        """,
    )
    model = plugins.call(f"{path}:build", "parabench.models", {})
    assert model.out_features == 8


def test_a_dataset_read_sample_by_sample_is_not_held_on_the_device(capsys, tmp_path):
    path = _file(tmp_path, STEP_FILE)
    args = ("--model", f"{path}:plain", "--dataset", f"{path}:labels_past_classes")
    code, err = _cli(capsys, tmp_path, *args, "--data-path", "device")
    assert code == 2 and err.count("\n") == 1, err
    assert "--data-path device needs data held in memory as tensors" in err
    assert "return (inputs, targets) tensors" in err and "--data-path loader or auto" in err
    # tensors are held there; a Dataset takes the DataLoader
    cfg = RunConfig(model=f"{path}:plain", dataset=f"{path}:vectors", device="cpu")
    data.check(cfg.replace(data_feed="device", global_batch=8))
    data.check(cfg.replace(dataset=f"{path}:ragged", data_feed="loader", global_batch=8))


@pytest.mark.parametrize("feed", ["auto", "device"])
def test_workers_on_a_users_tensors_held_on_the_device_are_refused(capsys, tmp_path, feed):
    """As for MNIST and synthetic data: tensors are indexed on the device, no DataLoader
    runs the workers, so no row may claim them."""
    path = _file(tmp_path, STEP_FILE)
    args = ("--model", f"{path}:plain", "--dataset", f"{path}:vectors", "--global-batch", "8")
    code, err = _cli(capsys, tmp_path, *args, "--workers", "2", "--data-path", feed)
    assert code == 2 and err.count("\n") == 1, err
    assert f"--workers 2 does nothing here: {path}:vectors is held in memory" in err
    assert f"(--data-path {feed})" in err and "add --data-path loader" in err
    # a DataLoader runs them: through --data-path loader, or for a Dataset read sample by sample
    cfg = RunConfig(model=f"{path}:plain", dataset=f"{path}:vectors", global_batch=8, workers=2)
    data.check(cfg.replace(data_feed="loader"))
    data.check(cfg.replace(dataset=f"{path}:ragged"))


def test_model_args_named_like_build_models_own_reach_the_factory(tmp_path):
    """`model`, `shape` and `num_classes` are build_model's own parameters (positional only),
    so --model-arg keys of those names are the factory's."""
    path = _file(
        tmp_path,
        """
        class Got(nn.Linear):
            pass
        def build(model="mlp", shape=(8,), num_classes=10):
            net = Got(shape[0], num_classes)
            net.got = (model, shape, num_classes)
            return net
        """,
    )
    spec = f"{path}:build"
    net = models.build_model(spec, 4, (3,), model="wide", shape=(5,))
    assert net.got == ("wide", (5,), 4)
    assert models.build_model(spec, 4, None, num_classes=7).got == ("mlp", (8,), 7)
    cfg = RunConfig(model=spec, dataset="synthetic", model_kwargs={"model": "deep"})
    assert models.meta_model(cfg).got[0] == "deep"


LAYERS_FILE = """
class Blocks(nn.Module):  # its blocks in a submodule named `layers`, as many models have
    input_shape = (8,)
    def __init__(self, num_classes=4):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, num_classes))
    def forward(self, x):
        return self.layers(x)
def blocks(num_classes=4):
    return Blocks(num_classes)
class Headless(nn.Module):  # layers() leaves the head out
    input_shape = (8,)
    def __init__(self, num_classes=4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, num_classes)
    def forward(self, x):
        return self.head(self.body(x))
    def layers(self):
        return list(self.body)
def headless(num_classes=4):
    return Headless(num_classes)
class Tied(nn.Module):  # its output layer shares the input layer's weight
    input_shape = (8,)
    def __init__(self, num_classes=8):
        super().__init__()
        self.embed, self.mid = nn.Linear(8, 8), nn.ReLU()
        self.head = nn.Linear(8, num_classes)
        self.head.weight = self.embed.weight
    def forward(self, x):
        return self.head(self.mid(self.embed(x)))
    def layers(self):
        return [self.embed, self.mid, self.head]
def tied(num_classes=8):
    return Tied(num_classes)
class Twice(nn.Module):  # one layer applies one weight twice
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.b.weight = self.a.weight
    def forward(self, x):
        return self.b(torch.relu(self.a(x)))
class TiedWithin(nn.Module):
    input_shape = (8,)
    def __init__(self, num_classes=4):
        super().__init__()
        self.embed, self.twice = nn.Linear(8, 8), Twice()
        self.head = nn.Linear(8, num_classes)
    def forward(self, x):
        return self.head(self.twice(self.embed(x)))
    def layers(self):
        return [self.embed, self.twice, self.head]
def tied_within(num_classes=4):
    return TiedWithin(num_classes)
class Normalised(nn.Module):  # its last layer has no parameters
    input_shape = (8,)
    def __init__(self, num_classes=4):
        super().__init__()
        self.fc, self.norm = nn.Linear(8, num_classes), nn.LogSoftmax(dim=-1)
    def forward(self, x):
        return self.norm(self.fc(x))
    def layers(self):
        return [self.fc, self.norm]
def normalised(num_classes=4):
    return Normalised(num_classes)
class Odd(nn.Module):  # layers() returns one module, or raises
    input_shape = (8,)
    def __init__(self, num_classes=4, broken=False):
        super().__init__()
        self.fc, self.broken = nn.Linear(8, num_classes), broken
    def forward(self, x):
        return self.fc(x)
    def layers(self):
        if self.broken:
            raise RuntimeError("no layers here")
        return self.fc
def odd(num_classes=4, broken=False):
    return Odd(num_classes, broken)
class Scores(nn.Module):  # fixed scores, rebuilt with the model and never saved
    def __init__(self, scores):
        super().__init__()
        self.register_buffer("scores", torch.tensor(scores), persistent=False)
    def forward(self, x):
        return x[:, :1] * 0 + self.scores
class Unsaved(nn.Module):
    input_shape = (8,)
    def __init__(self, num_classes=4):
        super().__init__()
        self.fc, self.fixed = nn.Linear(8, 8), Scores([0.0, 0.0, 5.0, 0.0])
        self.register_buffer("version", torch.tensor(3))  # in no layer
    def forward(self, x):
        return self.fixed(self.fc(x))
    def layers(self):
        return [self.fc, self.fixed]
def unsaved(num_classes=4):
    return Unsaved(num_classes)
def twos():
    return torch.randn(80, 8), torch.full((80,), 2), 4
"""


def test_a_submodule_named_layers_is_not_a_layers_method(tmp_path):
    """A model whose blocks are its attribute `layers` (an nn.Sequential) does not list its
    forward: the pipelines say what would (a layers() method), instead of calling the
    Sequential with no input."""
    import strategies

    cfg = RunConfig(model=f"{_file(tmp_path, LAYERS_FILE)}:blocks", dataset="synthetic")
    assert models.sequence(models.meta_model(cfg)) is None
    pipe = strategies.get("pipeline_gpipe")
    why = pipe.unsuitable(cfg.replace(global_batch=8), 2, pipe.variant.options)
    assert why.startswith(f"model {cfg.model} does not list its forward as a sequence"), why
    assert "a `layers()` method" in why and "its attribute `layers` is a submodule" in why


def test_a_layers_method_that_fails_is_named_not_the_pipeline(tmp_path):
    """A layers() that returns one module, or raises, is the model's fault: it read
    "Pipeline.unsuitable() raised TypeError: 'Linear' object is not iterable", a bug of
    parabench's strategy to the reader."""
    import strategies

    pipe = strategies.get("pipeline_gpipe")
    cfg = RunConfig(model=f"{_file(tmp_path, LAYERS_FILE)}:odd", dataset="synthetic")
    why = pipe.unsuitable(cfg.replace(global_batch=8), 2, pipe.variant.options)
    assert why == (
        f"model {cfg.model}: its layers() returned a Linear, not a list of its modules in "
        "forward order"
    )
    broken = cfg.replace(global_batch=8, model_kwargs={"broken": True})
    why = pipe.unsuitable(broken, 2, pipe.variant.options)
    assert why == f"model {cfg.model}: its layers() raised RuntimeError: no layers here"


def test_a_pipeline_refuses_layers_that_leave_out_parameters(tmp_path):
    """Checked on the meta model before anything starts: a module with parameters left out
    of layers() would be trained by no stage, and the cell fail at evaluation after its
    steps."""
    import strategies

    pipe = strategies.get("pipeline_gpipe")
    options = pipe.variant.options
    cfg = RunConfig(model=f"{_file(tmp_path, LAYERS_FILE)}:headless", dataset="synthetic")
    why = pipe.unsuitable(cfg.replace(global_batch=8), 2, options)
    assert "layers() leaves out parameters of its own (head.weight, head.bias)" in why, why
    for whole in (RunConfig(model=MODEL, dataset=DATASET), RunConfig(model="mnist_cnn")):
        assert pipe.unsuitable(whole.replace(global_batch=8), 2, options) is None
    lm = RunConfig(model="lm", dataset="python-source", seq_len=16, global_batch=8)
    assert pipe.unsuitable(lm, 2, options) is None


def test_tp_reads_the_heads_off_a_users_attention(tmp_path):
    """A model of Attention blocks need not say its heads (the built-in ones' `heads`):
    two heads over 4 ranks passed, and the cell failed at its first step ("shape ... is
    invalid for input of size"), each rank's share of q a half head."""
    import strategies

    body = """
        from bench.workload.models import Attention
        class Net(nn.Module):
            input_shape = (4, 64)
            def __init__(self, num_classes=4):
                super().__init__()
                self.attn, self.fc = Attention(64, 2), nn.Linear(64, num_classes)
            def forward(self, x):
                return self.fc(self.attn(x).mean(dim=1))
        def build(num_classes=4):
            return Net(num_classes)
        """
    cfg = RunConfig(model=f"{_file(tmp_path, body)}:build", dataset="synthetic")
    tp = strategies.get("tp")
    assert tp.unsuitable(cfg, 2, {}) is None
    why = tp.unsuitable(cfg, 4, {})
    assert why == "2 attention heads cannot be split over 4 tensor-parallel ranks"


def test_tensor_parallel_refuses_an_mlp_its_ranks_cannot_divide(tmp_path):
    """An MLP whose hidden units the ranks do not divide (sized apart from the heads, which
    do divide) ran, and its cell failed in the first step: "a and b must have same
    reduction dim, but got [128, 6] X [7, 8]"."""
    import strategies

    body = """
        from bench.workload.models import MLP, Attention
        class Net(nn.Module):
            input_shape = (4, 8)
            def __init__(self, num_classes=4, hidden=7):
                super().__init__()
                self.attn, self.mlp = Attention(8, 2), MLP(8, hidden)
                self.fc = nn.Linear(8, num_classes)
            def forward(self, x):
                return self.fc(self.mlp(self.attn(x)).mean(dim=1))
        def build(num_classes=4, hidden=7):
            return Net(num_classes, hidden)
        """
    cfg = RunConfig(model=f"{_file(tmp_path, body)}:build", dataset="synthetic")
    tp = strategies.get("tp")
    why = tp.unsuitable(cfg, 2, {})
    assert (
        why
        == "an MLP of 7 hidden units cannot be split over 2 tensor-parallel ranks (they must divide it)"
    )
    assert tp.unsuitable(cfg.replace(model_kwargs={"hidden": 6}), 2, {}) is None


def test_tp_splits_a_users_model_of_mlp_blocks_alone(tmp_path):
    """tp splits each MLP as it does an attention (README: blocks built from Attention /
    MLP): a model of MLP blocks without attention was refused as having "no attention or
    MLP blocks"; one with neither is told what to build them of."""
    import strategies

    body = """
        from bench.workload.models import MLP
        class Net(nn.Module):
            input_shape = (16,)
            def __init__(self, num_classes=4):
                super().__init__()
                self.mlp, self.fc = MLP(16, 64), nn.Linear(16, num_classes)
            def forward(self, x):
                return self.fc(x + self.mlp(x))
        def build(num_classes=4):
            return Net(num_classes)
        def plain(num_classes=4):
            return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, num_classes))
        """
    path = _file(tmp_path, body)
    tp = strategies.get("tp")
    assert tp.unsuitable(RunConfig(model=f"{path}:build", dataset="synthetic"), 2, {}) is None
    why = tp.unsuitable(RunConfig(model=f"{path}:plain", dataset="synthetic"), 2, {})
    assert "build yours of bench.workload.models.Attention / MLP" in why, why


def test_a_pipeline_refuses_layers_that_share_a_parameter(tmp_path):
    """Tied weights in two layers: the stages on two ranks cannot share them, and the cell
    failed at evaluation after its steps ('Missing key(s) in state_dict'). Checked on the
    meta model (which keeps the tie) before anything starts."""
    import strategies

    pipe = strategies.get("pipeline_gpipe")
    cfg = RunConfig(model=f"{_file(tmp_path, LAYERS_FILE)}:tied", dataset="synthetic")
    why = pipe.unsuitable(cfg.replace(global_batch=8), 2, pipe.variant.options)
    assert why == (
        f"model {cfg.model}'s layers() 0 and 2 share a parameter (embed.weight is "
        "head.weight): pipeline stages cannot share a tensor between ranks; untie it, or "
        "list the layers that share it as one module"
    )


def _pipeline_run(
    tmp_path: Path, factory: str, dataset: str = "", strategy: str = "pipeline_gpipe"
) -> dict:
    """The one row of `strategy` at 2 ranks for two steps on a model of LAYERS_FILE (on
    synthetic data, or its `dataset` factory's)."""
    path = _file(tmp_path, LAYERS_FILE)
    cfg = RunConfig(
        model=f"{path}:{factory}",
        dataset=f"{path}:{dataset}" if dataset else "synthetic",
        strategies=(strategy,),
        world_sizes=(2,),
        device="cpu",
        global_batch=8,
        max_steps=2,
        warmup_steps=1,
        limit=64,
        eval_samples=16,
        out_dir=str(tmp_path),
        timeout_s=240,
        probe_pairs=0,
        profile_steps=0,
        scaling_model=False,
    )
    run_dir, _ = run_matrix(cfg, echo=lambda m: None)
    (row,) = pd.read_csv(run_dir / "runs.csv").to_dict("records")
    return row


def test_a_pipeline_trains_and_evaluates_a_weight_tied_within_one_layer(tmp_path):
    """What the refusal above suggests: the tied weight in one layer, so one stage. The
    trained model is put back together under each of the weight's names; one name left out
    failed the cell at evaluation ('Missing key(s) in state_dict'), its steps lost."""
    row = _pipeline_run(tmp_path, "tied_within")
    assert row["status"] == "ok", row["reason"]
    assert 0 <= row["eval_accuracy"] <= 1


def test_fsdp_trains_a_model_whose_blocks_share_a_weight(tmp_path):
    """An embedding and an output layer of one matrix, each a block FSDP sharded apart:
    fully_shard refused the second ('shared with a parameter already managed by another
    FSDP group') and the cell failed. The two are left to the root's unit."""
    from torch import nn

    from strategies.fsdp import units

    model = models.build_model(f"{_file(tmp_path, LAYERS_FILE)}:tied", None)
    assert units(model, low=False) == ([], [])  # (its ReLU holds no parameter)
    # a block tied to a layer outside every block (the root's head) is the root's too
    rooted = nn.Module()
    rooted.blocks = nn.ModuleList([nn.Embedding(10, 4), nn.Linear(4, 4)])
    rooted.head = nn.Linear(4, 10, bias=False)
    rooted.head.weight = rooted.blocks[0].weight
    assert units(rooted, low=False) == ([], [rooted.blocks[1]])
    row = _pipeline_run(tmp_path, "tied", strategy="fsdp")
    assert row["status"] == "ok", row["reason"]
    assert 0 <= row["eval_accuracy"] <= 1


def test_a_pipeline_rank_whose_stage_has_no_parameters_trains(tmp_path):
    """Stages balance parameters, so a rank may get only layers without (here the log-softmax;
    mnist_cnn's ReLU at 4 ranks interleaved): it steps an optimizer over none, where torch's
    refusal of an empty parameter list failed the cell."""
    row = _pipeline_run(tmp_path, "normalised")
    assert row["status"] == "ok", row["reason"]
    assert row["model_state_mib_lightest"] == 0 < row["model_state_mib"]


def test_a_pipeline_evaluates_with_the_buffers_no_stage_saves(tmp_path):
    """The evaluation's copy of the model was filled from the stages' state dicts alone: a
    non-persistent buffer (a causal mask, a rotary table) kept whatever memory held (an
    eval loss of 1e20 where the training was fine), and a buffer in no layer failed the
    cell after its steps ('Missing key(s) in state_dict'). Fixed scores of every label 2:
    the eval loss is known."""
    row = _pipeline_run(tmp_path, "unsaved", "twos")
    assert row["status"] == "ok", row["reason"]
    assert row["eval_loss"] == pytest.approx(math.log(3 + math.exp(5)) - 5, rel=1e-5)
    assert row["eval_accuracy"] == 1


@pytest.fixture
def user_files(tmp_path):
    """The import path and modules as they were, after a test that imports files of its
    own under tmp_path (by their own names)."""
    import sys

    path = list(sys.path)
    yield tmp_path
    sys.path[:] = path
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "") or "").startswith(str(tmp_path)):
            del sys.modules[name]


def test_a_model_file_imports_the_modules_beside_it(user_files, monkeypatch):
    """As `python net.py` would: the file's folder is on the import path, here and in a
    rank (another process, started in another directory)."""
    tmp_path = user_files
    import subprocess
    import sys

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "parabench_sibling_width.py").write_text("WIDTH = 5\n")
    (lib / "net.py").write_text(
        "from torch import nn\n"
        "from parabench_sibling_width import WIDTH\n"
        "def build(num_classes=3):\n"
        "    return nn.Sequential(nn.Linear(8, WIDTH), nn.Linear(WIDTH, num_classes))\n"
    )
    monkeypatch.setattr(sys, "path", list(sys.path))  # what the import adds goes after
    monkeypatch.chdir(tmp_path)
    cfg = RunConfig(model="lib/net.py:build", dataset="synthetic")  # made absolute
    try:
        assert models.build(cfg, 3)[0].out_features == 5
    finally:
        sys.modules.pop("parabench_sibling_width", None)
    rank = (
        "from bench.config import RunConfig; from bench.workload import models; "
        f"print(models.build(RunConfig(model={cfg.model!r}), 3)[0].out_features)"
    )
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", rank], cwd="/", env=env, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == "5", out.stderr[-2000:]


def test_evaluation_without_held_out_samples_is_nan_and_scores_labels_of_shape_1():
    from torch import nn
    from torch.utils.data import TensorDataset

    from bench.harness.worker import evaluate
    from strategies.base import RankContext
    from strategies.single import Single

    ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), seed=0)
    single = Single(ctx, {})
    torch.manual_seed(0)
    net = nn.Linear(3, 4)
    single.attach(net, torch.optim.SGD(net.parameters(), lr=0.1))
    single.loss_fn = models.cross_entropy
    empty = evaluate(single, TensorDataset(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)))
    assert math.isnan(empty["eval_loss"]) and math.isnan(empty["eval_accuracy"])  # not 0
    x, y = torch.randn(20, 3), torch.randint(0, 4, (20,))
    flat = evaluate(single, TensorDataset(x, y))
    column = evaluate(single, TensorDataset(x, y[:, None]))  # a label of shape (1,) each
    expected = (net(x).argmax(-1) == y).float().mean().item()
    assert flat["eval_accuracy"] == pytest.approx(expected)
    assert column["eval_accuracy"] == pytest.approx(expected)
    assert column["eval_loss"] == pytest.approx(flat["eval_loss"])


class _Backbone(torch.nn.Module):
    """A user's model that keeps its backbone as `self.module`, with a head beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.module = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.module(x))


@pytest.mark.parametrize("name", ["single", "ddp_torchrun", "dp"])
def test_a_models_own_submodule_named_module_is_not_taken_for_a_wrapper(one_rank, name):
    """Only DDP's and DataParallel's `module` is the model under them: taken from a plain
    model, `single` evaluated its backbone alone (MNIST accuracy 0.001 beside DDP's 0.76) and
    its model state left out the head. Evaluation, parity and the model state see it whole."""
    from torch.utils.data import TensorDataset

    import strategies
    from bench.harness.probes import model_state_mib
    from bench.harness.worker import evaluate

    torch.manual_seed(0)
    net = _Backbone()
    strategy = strategies.get(name).cls(one_rank, {})
    strategy.attach(net, torch.optim.Adam(net.parameters()))
    strategy.loss_fn = models.cross_entropy
    x, y = torch.randn(20, 3), torch.randint(0, 4, (20,))
    expected = (net(x).argmax(-1) == y).float().mean().item()
    assert evaluate(strategy, TensorDataset(x, y))["eval_accuracy"] == pytest.approx(expected)
    assert set(strategy.full_state_dict()) == set(net.state_dict())
    whole = sum(p.numel() for p in net.parameters()) * 4 / 2**20
    state = model_state_mib(strategy.unwrap(strategy.model).parameters(), [])
    assert state["param_mib"] == pytest.approx(whole)
    assert strategy.unwrap(strategy.model) is net


def test_evaluation_leaves_the_random_state_for_the_next_epoch_as_it_was():
    """DDP evaluates on rank 0 alone, FSDP on every rank: a draw from torch's generator in
    evaluation gave rank 0 other dropout masks in epoch 2 under DDP than under FSDP."""
    from torch import nn
    from torch.utils.data import TensorDataset

    from bench.harness.worker import evaluate
    from strategies.base import RankContext
    from strategies.single import Single

    ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), seed=0)
    single = Single(ctx, {})
    net = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5))
    single.attach(net, torch.optim.SGD(net.parameters(), lr=0.1))
    single.loss_fn = models.cross_entropy
    held_out = TensorDataset(torch.randn(20, 3), torch.randint(0, 4, (20,)))
    before = torch.get_rng_state()
    evaluate(single, held_out)
    assert torch.equal(torch.get_rng_state(), before)
    assert net.training  # back to training


def test_a_factory_that_requires_num_classes_is_given_it(tmp_path):
    spec = _file(tmp_path, "def build(num_classes):\n    return nn.Linear(6, num_classes)\n")
    cfg = RunConfig(model=f"{spec}:build", dataset=DATASET, device="cpu")
    assert models.meta_model(cfg).out_features == 1000  # no data said: ImageNet's
    cfg = cfg.replace(dataset="synthetic", global_batch=8, limit=64, image_size=32)
    with pytest.raises(ConfigError, match=r"forward on a batch of \(3, 32, 32\) float32 fails"):
        data.check(cfg)  # no input_shape stated: fed images, and a Linear(6) cannot take them


def test_a_users_token_data_says_its_vocabulary_not_a_count_of_tokens(tmp_path):
    """A user's token data was described as "(16,) token ids < 32, 32 tokens", which reads
    as each sample's length."""
    path = tmp_path / "user_tokens.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch
            def seqs():
                x = torch.randint(0, 32, (200, 17), generator=torch.Generator().manual_seed(0))
                return x[:, :-1].contiguous(), x[:, 1:].contiguous(), 32
            """
        )
    )
    cfg = RunConfig(model="lm", dataset=f"{path}:seqs", device="cpu", global_batch=8)
    desc = data.load(cfg).description
    assert desc.endswith(
        ": 200 samples of (16,) token ids < 32, a vocabulary of 32: train 180 / held-out 20"
    )


def test_the_language_model_is_checked_against_its_data(capsys, tmp_path):
    code, err = _cli(
        capsys, tmp_path, "--dataset", "python-source", "--model-arg", "vocab_size=100"
    )
    assert code == 2 and "the data has a vocabulary of 256, so 256 scores per token" in err, err
    code, err = _cli(capsys, tmp_path, "--dataset", "python-source", "--model-arg", "seq_len=64")
    assert code == 2 and "--seq-len" in err, err


def test_a_users_dataset_needs_a_model_named(capsys, tmp_path):
    code, err = _cli(capsys, tmp_path, "--dataset", DATASET)
    assert code == 2 and "name the model to train on it with --model" in err


def test_token_and_image_models_refuse_each_others_data(capsys, tmp_path):
    code, err = _cli(capsys, tmp_path, "--dataset", "mnist", "--model", "lm")
    assert code == 2 and "takes token sequences" in err
    code, err = _cli(capsys, tmp_path, "--dataset", "python-source", "--model", "resnet18")
    assert code == 2 and "python-source is text" in err


def test_a_model_file_is_found_from_any_directory_and_gets_the_classes(tmp_path, monkeypatch):
    cfg = RunConfig(model="examples/own_model.py:build", dataset="synthetic", device="cpu")
    monkeypatch.chdir(tmp_path)  # where a rank may start: the path was made absolute
    model = models.build(cfg, 4)
    assert Path(cfg.model.split(":")[0]).is_absolute()
    assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 4)  # num_classes was passed
    assert models.spec(cfg).shape == (1, 32, 32)  # the model states its input
    bundle = data.load(cfg.replace(limit=64, global_batch=8))
    assert bundle.num_classes == 10  # what the model states (its default num_classes)
    assert bundle.train[0][0].shape == (1, 32, 32)


def test_models_registered_under_the_entry_point_group_are_listed_and_built(monkeypatch):
    eps = [EntryPoint("shapes_net", "examples.own_model:build", plugins.MODEL_GROUP)]
    monkeypatch.setattr(plugins, "entry_points", lambda group: eps if "models" in group else [])
    plugins.registered.cache_clear()
    try:
        assert "shapes_net" in models.model_names()
        net = models.build_model("shapes_net", 3, width=4)
        assert net(torch.zeros(1, 1, 32, 32)).shape == (1, 3)
    finally:
        plugins.registered.cache_clear()  # read the real entry points again


def test_an_entry_point_named_as_a_built_in_is_not_used_and_list_says_so(
    monkeypatch, capsys, tmp_path
):
    eps = {
        plugins.DATASET_GROUP: [EntryPoint("mnist", DATASET, plugins.DATASET_GROUP)],
        plugins.MODEL_GROUP: [EntryPoint("mnist_cnn", "examples.own_model:build", "")],
    }
    monkeypatch.setattr(plugins, "entry_points", lambda group: eps[group])
    assert set(plugins.BUILT_IN[plugins.MODEL_GROUP]) == set(models.OWN_MODELS)
    plugins.registered.cache_clear()
    try:
        # the built-in MNIST loads: a --dataset-arg for the package's would be lost
        code, err = _cli(capsys, tmp_path, "--dataset", "mnist", "--dataset-arg", "n=64")
        assert code == 2 and "mnist is built in and takes none" in err
        assert models.model_names().count("mnist_cnn") == 1
        assert main(["list", "--device", "cpu"]) == 0
        out = capsys.readouterr().out
        assert "datasets: mnist, imagenet-subset, synthetic, python-source, or" in out
        assert "mnist_cnn        registered by a package: examples.own_model:build, not used" in out
        assert "parabench's own data set's" in out
    finally:
        plugins.registered.cache_clear()  # read the real entry points again


def test_a_users_tensors_and_dataset_become_bundles_with_their_classes():
    cfg = RunConfig(model=MODEL, dataset=DATASET, device="cpu", eval_samples=100)
    bundle = data.load(cfg)
    assert bundle.num_classes == 4 and len(bundle.held_out) == 100
    assert len(bundle.train) == 4096 - 100 and bundle.spec.shape == (1, 32, 32)
    assert DATASET in bundle.description and "4 classes" in bundle.description


def test_python_source_is_next_byte_prediction_on_the_standard_library():
    cfg = RunConfig(dataset="python-source", seq_len=32, limit=512, eval_samples=50)
    bundle = data.load(cfg)
    x, y = bundle.train[3]
    assert x.dtype == torch.long and x.shape == y.shape == (32,)
    assert torch.equal(x[1:], y[:-1])  # the target is the input moved on by one byte
    assert bundle.num_classes == 256 and int(x.max()) < 256
    text = bytes(x.tolist()).decode("utf-8", "replace")
    assert text.isprintable() or "\n" in text  # source code, not noise
    assert len(bundle.train) == 512 and len(bundle.held_out) == 50
    assert bundle.spec.tokens == 32
    # --eval-samples 0 evaluates nothing: no sequence is kept from training for it
    whole = data.load(cfg.replace(limit=None, eval_samples=0))
    assert len(whole.held_out) == 0 and whole.description.endswith("/ held-out 0")


def test_language_model_sizes_and_loss_over_every_position():
    counts = {}
    for size in models.LM_SIZES:
        with torch.device("meta"):
            counts[size] = sum(p.numel() for p in models.LanguageModel(size=size).parameters())
    assert counts["tiny"] < 1e6 < counts["small"] < 2e7 < counts["base"] < 1e8 < counts["medium"]
    lm = models.build_model("lm", 256, (16,), size="tiny")
    x = torch.randint(0, 256, (2, 16))
    out = lm(x)
    assert out.shape == (2, 16, 256)
    # causal: changing the last token changes no earlier position's prediction
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] + 1) % 256
    assert torch.allclose(lm(x2)[:, :-1], out[:, :-1], atol=1e-6)
    loss = models.cross_entropy(out, x)
    assert math.isclose(loss.item(), math.log(256), rel_tol=0.1)  # untrained: about uniform


# ---------------------------------------------------------------- runs (slow)
@pytest.mark.slow
def test_a_users_model_and_data_run_and_verify_against_the_share_baseline(tmp_path, data_root):
    cfg = RunConfig(
        model=MODEL,
        dataset=DATASET,
        strategies=("ddp_spawn", "test_nosync", "test_extra_forward"),
        world_sizes=(2,),  # the baselines (single, whole and in 2 shares) run apart
        device="cpu",
        global_batch=32,  # verify's own batch and steps, as the README's example runs
        limit=512,
        out_dir=str(tmp_path),
        timeout_s=240,
    )
    with faulty_strategies():
        run_dir, parity = verify(cfg, steps=8, echo=lambda m: None)
    print(table(parity))
    by = {(p.strategy, p.world_size): p for p in parity}
    good, bad = by[("ddp_spawn", 2)], by[("test_nosync", 2)]
    assert good.status == "pass" and good.baseline == "single, 2 shares", good
    assert good.buffer_abs <= 1e-5  # running statistics follow rank 0's rule
    assert bad.status == "FAIL" and bad.baseline == "single, 2 shares", bad
    # weights exact, running statistics updated twice a step: a FAIL that says so
    twice = by[("test_extra_forward", 2)]
    assert twice.status == "FAIL" and twice.param_rel <= 1e-4, twice
    assert "num_batches_tracked" in twice.reason, twice
    # the share baseline computed with the cells' threads per rank: a convolution's
    # gradient depends on how many threads reduce it (at 2 threads against the ranks' 1,
    # this correct ddp_spawn once FAILed by step 8)
    rows = pd.read_csv(run_dir / "runs.csv")
    (apart,) = (run_dir / "baselines").glob("shares2-acc1*")  # (-tN: on N threads)
    shares = pd.read_csv(apart / "runs.csv")
    assert set(shares["threads_per_rank"]) == set(rows["threads_per_rank"])
    assert (run_dir / "conditioning.txt").read_text().startswith("conditioning: the baseline")
    rows = pd.read_csv(run_dir / "runs.csv")
    ran = rows[rows["status"] == "ok"]
    assert set(rows["model"]) == {cfg.model} and ran["data"].str.contains(DATASET).all()


@pytest.mark.slow
def test_the_language_model_reports_tokens_per_second_and_shards_with_fsdp(tmp_path):
    cfg = RunConfig(
        dataset="python-source",
        model_kwargs={"size": "tiny"},
        seq_len=32,
        strategies=("ddp_spawn", "fsdp"),
        world_sizes=(2,),
        device="cpu",
        global_batch=8,
        max_steps=4,
        warmup_steps=1,
        limit=256,
        eval_samples=16,
        out_dir=str(tmp_path),
        timeout_s=240,
        # the collectives' measurement, the probes and the profile: none asserted here
        scaling_model=False,
        probe_pairs=0,
        profile_steps=0,
    )
    run_dir, rows = run_matrix(cfg, echo=lambda m: None)
    df = pd.read_csv(run_dir / "runs.csv")
    ok = df[df["status"] == "ok"].set_index(["strategy", "world_size"])
    assert len(ok) == 2, df[["strategy", "world_size", "status", "reason"]]
    assert (ok["tokens_per_s"] / ok["samples_per_s"]).round(6).eq(32).all()
    assert ok["eval_accuracy"].between(0, 1).all()  # per-token accuracy
    state = ok["model_state_mib"]
    assert state[("fsdp", 2)] < 0.6 * state[("ddp_spawn", 2)]


def test_runs_csv_tells_language_models_of_different_sizes_apart(tmp_path):
    # runs.csv of several runs concatenated: `model` is `lm` in each, whatever its size
    cfg = RunConfig(
        model="lm",
        dataset="synthetic",
        model_kwargs={"size": "tiny", "depth": 1},
        seq_len=16,
        strategies=("single",),
        world_sizes=(1,),
        device="cpu",
        global_batch=4,
        max_steps=2,
        warmup_steps=1,
        limit=64,
        eval_samples=0,
        scaling_model=False,
        out_dir=str(tmp_path),
    )
    run_dir, _ = run_matrix(cfg, echo=lambda m: None)
    row = pd.read_csv(run_dir / "runs.csv").iloc[0]
    assert row["status"] == "ok", row["reason"]
    built = models.build_model("lm", 256, (16,), size="tiny", depth=1)
    assert row["model_params"] == sum(p.numel() for p in built.parameters())
    assert row["seq_len"] == 16
    # given size first, written sorted: another order of the same arguments reads the same
    assert row["model_args"] == '{"depth": 1, "size": "tiny"}'
    assert json.loads(row["dataset_args"]) == {}
    # a runs.csv from before these columns still reads, with them empty
    reference = Path(__file__).parents[1] / "results" / "reference"
    old = report.load_run(reference / "cpu-2core-transformer-20261127")
    assert old.runs["model_params"].isna().all() and old.runs["seq_len"].isna().all()


def test_a_config_error_names_the_bad_model_arg_for_the_language_model():
    with pytest.raises(ConfigError, match="unknown size 'huge'"):
        models.check_model_args(RunConfig(dataset="python-source", model_kwargs={"size": "huge"}))


def test_a_value_the_language_model_refuses_is_not_called_an_argument_it_does_not_take():
    cfg = RunConfig(dataset="python-source", model_kwargs={"size": "tiny", "dropout": 2})
    with pytest.raises(ConfigError, match="dropout=2: lm refuses a value given \\(dropout prob"):
        models.check_model_args(cfg)
    # a value of a type it cannot compute with is a TypeError, but still a value refused;
    # a name it has no parameter for is the one it does not take
    for kw, said in (
        ({"replace_stride_with_dilation": 5}, "resnet18 refuses a value given (object of type"),
        ({"foo": 1}, "resnet18 does not take it (ResNet.__init__() got an unexpected keyword"),
    ):
        with pytest.raises(ConfigError, match=re.escape(said)):
            models.check_model_args(RunConfig(model="resnet18", model_kwargs=kw))


def test_the_share_baseline_normalises_each_share_apart_and_keeps_rank_0s_statistics():
    from torch import nn

    from strategies.base import RankContext
    from strategies.single import Single

    ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), seed=0)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    # by hand: each rank's share (samples r, r+2, ...) on its own, gradients averaged
    ref = [_copy(net) for _ in range(2)]
    grads = []
    for r, m in enumerate(ref):
        models.cross_entropy(m(x[r::2]), y[r::2]).backward()
        grads.append([p.grad for p in m.parameters()])
    single = Single(ctx, {"shares": "2"})
    single.attach(_copy(net), torch.optim.SGD(net.parameters(), lr=0.1))
    loss = single.forward_backward(x, y)
    for p, g0, g1 in zip(single.model.parameters(), *grads, strict=True):
        assert torch.allclose(p.grad, (g0 + g1) / 2, atol=1e-6)
    bn, bn0 = single.model[1], ref[0][1]
    assert torch.equal(bn.running_mean, bn0.running_mean)  # share 0's update only
    assert int(bn.num_batches_tracked) == 1
    whole = models.cross_entropy(_copy(net)(x), y)
    assert not torch.isclose(loss, whole)  # per-share BatchNorm is another computation


def _copy(module):
    import copy

    return copy.deepcopy(module)


SQUARES = (
    "import torch\n"
    "class Squares(torch.utils.data.Dataset):\n"
    "    num_classes = 2\n"
    "    def __len__(self):\n"
    "        return 8\n"
    "    def __getitem__(self, i):\n"
    "        return torch.full((1, 4, 4), float(i)), i % 2\n"
    "def build():\n"
    "    return Squares()\n"
)


def test_a_second_file_of_the_same_name_hides_nothing_from_loader_workers(user_files):
    """Data from b/net.py, then a model from a/net.py: a spawned worker still finds the
    data set's module by its name (a/'s folder put first on the path once hid it)."""
    from torch.utils.data import DataLoader

    from bench.workload import plugins

    for folder in ("a", "b"):
        (user_files / folder).mkdir()
    (user_files / "b" / "net.py").write_text(SQUARES)
    (user_files / "a" / "net.py").write_text(  # a model, no data set of that name
        "import torch\ndef build(num_classes=2):\n    return torch.nn.Linear(16, num_classes)\n"
    )
    data = plugins.call(f"{user_files / 'b' / 'net.py'}:build", "parabench.datasets", {})
    plugins.call(f"{user_files / 'a' / 'net.py'}:build", "parabench.models", {})
    loader = DataLoader(data, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    assert next(iter(loader))[1].tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize("stem", ["shapes", "bench"])
@pytest.mark.parametrize("start", ["spawn", "forkserver"])
def test_a_data_set_from_a_file_reaches_loader_workers_started_afresh(user_files, start, stem):
    """DataLoader workers started by spawn or forkserver (Python 3.14's default on Linux)
    receive the data set pickled: its class must be importable there by name, which a
    file imported under a made-up module name was not; so must it be where the file's own
    name is taken (`bench.py`: parabench's package), imported under another."""
    import multiprocessing

    from torch.utils.data import DataLoader

    from bench.workload import plugins

    if start not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {start} here")
    path = user_files / start / f"{stem}.py"
    path.parent.mkdir()
    path.write_text(SQUARES)
    data = plugins.call(f"{path}:build", "parabench.datasets", {})
    loader = DataLoader(data, batch_size=4, num_workers=1, multiprocessing_context=start)
    x, y = next(iter(loader))
    assert x.shape == (4, 1, 4, 4) and y.tolist() == [0, 1, 0, 1]
