"""Model FLOPs counted per training sample, datasheet peaks by CUDA device name, a measured
CPU peak, and MFU's arithmetic."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest
import torch

from bench.config import RunConfig
from bench.workload import flops, models

MLP = """
class MLP(nn.Module):
    input_shape = (8,)

    def __init__(self, num_classes=4):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, num_classes)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def build(num_classes=4):
    return MLP(num_classes)


class Broken(nn.Module):
    input_shape = (8,)

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        raise RuntimeError("this model cannot run")


def broken():
    return Broken()


def fails_to_build():
    raise RuntimeError("no model today")
"""


def _plugin(tmp_path: Path, factory: str) -> RunConfig:
    path = tmp_path / f"flops_model_{factory}.py"
    path.write_text("import torch\nfrom torch import nn\n" + textwrap.dedent(MLP))
    return RunConfig(model=f"{path}:{factory}", dataset="synthetic", device="cpu")


def test_a_two_layer_mlp_counts_its_matmuls_by_hand(tmp_path):
    cfg = _plugin(tmp_path, "build")
    spec = models.spec(cfg)
    assert spec.shape == (8,) and not spec.vocab
    forward = 2 * 8 * 16 + 2 * 16 * 4  # 2 * in * out per sample and layer
    # fc2: input and weight gradients (2x its forward); fc1: its input (the data) needs
    # no gradient, so only the weight gradient (1x its forward)
    backward = 2 * (2 * 16 * 4) + 2 * 8 * 16
    assert forward + backward == 896
    assert flops.train_flops_per_sample(cfg, 4, spec) == 896
    for device in ("meta", "cpu"):
        assert flops.step_flops(cfg, 4, spec, device) == flops.COUNT_BATCH * 896


def test_the_mnist_cnn_counts_the_same_on_meta_and_cpu():
    cfg = RunConfig(dataset="mnist", device="cpu")
    spec = models.spec(cfg)
    meta = flops.step_flops(cfg, 10, spec, "meta")
    cpu = flops.step_flops(cfg, 10, spec, "cpu")
    assert meta == cpu > 0
    per_sample = flops.train_flops_per_sample(cfg, 10, spec)
    assert per_sample == meta / flops.COUNT_BATCH
    convs = 2 * (26 * 26 * 32 * 9) + 2 * (24 * 24 * 64 * 32 * 9)  # conv1, conv2 forward
    linears = 2 * 9216 * 128 + 2 * 128 * 10
    first = 2 * (26 * 26 * 32 * 9)  # conv1 has no input gradient to compute
    assert per_sample == 3 * (convs + linears) - first == 71_565_312
    assert flops.train_flops_per_sample(cfg, None) == per_sample  # mnist_cnn: 10 classes


def test_counts_are_cached_and_leave_the_global_rng_alone(tmp_path, monkeypatch):
    cfg = _plugin(tmp_path, "build")
    state = torch.get_rng_state()
    flops.step_flops(cfg, 3, models.spec(cfg), "cpu")  # draws initial weights on the CPU
    assert torch.equal(torch.get_rng_state(), state)
    first = flops.train_flops_per_sample(cfg, 3)
    monkeypatch.setattr(flops, "step_flops", lambda *a: pytest.fail("counted again"))
    assert flops.train_flops_per_sample(cfg, 3) == first == 2 * 8 * 16 * 2 + 3 * 2 * 16 * 3


@pytest.mark.parametrize("factory", ["broken", "fails_to_build"])
def test_a_model_that_cannot_run_gives_none(tmp_path, factory):
    cfg = _plugin(tmp_path, factory)
    spec = models.InputSpec((8,))
    with pytest.raises(Exception, match="this model cannot run|no model today"):
        flops.step_flops(cfg, 4, spec, "cpu")
    assert flops.train_flops_per_sample(cfg, 4, spec) is None


def test_peak_for_matches_cuda_device_names():
    assert flops.peak_for("NVIDIA H100 80GB HBM3", "bf16") == (989.4, "datasheet: H100 SXM")
    assert flops.peak_for("NVIDIA H100 80GB HBM3", "fp32") == (67.0, "datasheet: H100 SXM")
    assert flops.peak_for("NVIDIA H100 80GB HBM3", "fp32", tf32=True)[0] == 494.7
    assert flops.peak_for("NVIDIA H100 PCIe", "bf16")[1] == "datasheet: H100 PCIe"
    assert flops.peak_for("NVIDIA A100-SXM4-80GB", "bf16") == (312.0, "datasheet: A100")
    assert flops.peak_for("NVIDIA A100-SXM4-80GB", "fp32") == (19.5, "datasheet: A100")
    assert flops.peak_for("NVIDIA A100-SXM4-40GB", "fp32", tf32=True)[0] == 156.0
    assert flops.peak_for("NVIDIA A10G", "fp16")[1] == "datasheet: A10G"
    assert flops.peak_for("NVIDIA L4", "bf16")[1] == "datasheet: L4"
    assert flops.peak_for("NVIDIA L40S", "bf16")[1] == "datasheet: L40S"
    assert flops.peak_for("NVIDIA GeForce RTX 4090", "bf16")[1] == "datasheet: RTX 4090"
    # no TF32 before Ampere: fp32 stays fp32; no bf16 tensor cores on a V100
    assert flops.peak_for("Tesla V100-SXM2-16GB", "fp32", tf32=True) == (
        15.7,
        "datasheet: V100 SXM2",
    )
    assert flops.peak_for("Tesla V100-SXM2-16GB", "fp16")[0] == 125.0
    value, why = flops.peak_for("Tesla V100-SXM2-16GB", "bf16")
    assert value is None and "bf16" in why
    assert flops.peak_for("Tesla T4", "fp16")[0] == 65.0


def test_the_fp32_peak_weighs_tf32_by_the_convolutions_share(tmp_path):
    """In fp32 on an Ampere or later GPU, cuDNN runs convolutions in TF32 by default while
    matrix products stay fp32: a CNN's peak is near TF32's, a vision transformer's (one
    convolution, its patch embedding) near fp32's, a transformer's fp32's."""
    share = {
        model: flops.conv_share(
            RunConfig(out_dir=tmp_path, model=model, dataset="synthetic", image_size=224), None
        )
        for model in ("resnet50", "vit_b_16", "lm")
    }
    assert share["resnet50"] > 0.99 and 0 < share["vit_b_16"] < 0.01 and share["lm"] == 0
    h100 = "NVIDIA H100 80GB HBM3"
    assert flops.blended_peak(h100, 0.0) == (67.0, "datasheet: H100 SXM")
    assert flops.blended_peak(h100, 1.0)[0] == 494.7
    peak, why = flops.blended_peak(h100, 0.5)  # half the FLOPs at each rate
    assert peak == pytest.approx(2 / (1 / 494.7 + 1 / 67.0), abs=0.1) and "50%" in why
    assert flops.blended_peak("Tesla V100-SXM2-16GB", 1.0)[0] == 15.7  # no TF32 before Ampere


@pytest.mark.parametrize(
    "name",
    ["Some Future GPU 9000", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GH200 480GB", ""],
)
def test_peak_for_an_unknown_or_different_gpu_is_none_with_a_reason(name):
    value, why = flops.peak_for(name, "bf16")
    assert value is None and why == f"no datasheet figure for {name}"
    assert flops.peak_for("NVIDIA H100 80GB HBM3", "fp8")[0] is None  # no such precision


def test_the_datasheet_table_is_complete_and_dense():
    rows = {row for _, row in flops._NAMES}
    assert rows == set(flops.PEAK_TFLOPS)
    for row, figures in flops.PEAK_TFLOPS.items():
        assert {"fp32", "fp16"} <= set(figures) <= {"fp32", "tf32", "bf16", "fp16"}, row
        assert all(0 < v < 1000 for v in figures.values()), row  # sparse figures reach 1979
        assert figures.get("tf32", figures["fp32"]) >= figures["fp32"], row


def test_measured_cpu_peak_is_positive_and_restores_the_threads():
    before = torch.get_num_threads()
    for dtype in (torch.float32, torch.bfloat16):
        peak = flops.measured_cpu_peak(1, dtype, seconds=0.05)
        assert math.isfinite(peak) and peak > 0
        assert torch.get_num_threads() == before
    with pytest.raises(ValueError):
        flops.measured_cpu_peak(0)


def test_mfu():
    assert flops.mfu(1e9, 100.0, 1.0) == pytest.approx(0.1)  # 1e11 of 1e12 FLOP/s
    assert flops.mfu(6e9, 50.0, 312.0) == pytest.approx(6e9 * 50 / 312e12)
    for bad in (None, 0, -1.0, math.nan, math.inf, "fast"):
        assert math.isnan(flops.mfu(bad, 100.0, 1.0))
        assert math.isnan(flops.mfu(1e9, bad, 1.0))
        assert math.isnan(flops.mfu(1e9, 100.0, bad))


def test_cpu_units_read_from_the_flags() -> None:
    from bench.workload.flops import cpu_has_units

    assert cpu_has_units("bf16", "flags : fpu avx2 avx512_bf16 fma")
    assert not cpu_has_units("bf16", "flags : fpu avx2 fma")
    assert cpu_has_units("fp16", "flags : amx_fp16") and not cpu_has_units("fp32", "x")


def test_a_peak_measured_low_gives_no_mfu_and_says_why() -> None:
    from bench.harness.runner import mfu_columns

    info = {"flops_per_sample": 1e9, "peaks": {"fp32/2t": (2e-4, "measured: fp32 matmul")}}
    row = {"threads_per_rank": "2", "precision": "fp32", "samples_per_s_per_device": "1000"}
    cols = mfu_columns(info, "cpu", row)  # 1 TFLOP/s achieved against a peak of 0.0002
    assert math.isnan(cols["mfu_pct"])
    assert cols["peak_source"] == "measured: fp32 matmul; not used: the cell ran at 500000 % of it"
    info["peaks"]["fp32/2t"] = (10.0, "measured: fp32 matmul")
    cols = mfu_columns(info, "cpu", row)
    assert cols["mfu_pct"] == pytest.approx(10.0) and cols["peak_source"] == "measured: fp32 matmul"


def test_apex_rows_take_the_peak_of_the_precision_their_products_run_in() -> None:
    """apex.amp's rows say `apex_O1` etc., not a value of the precision axis: their MFU is
    against fp16's peak (O1 to O3) or fp32's (O0), where it was once blank and unexplained."""
    from bench.harness.runner import mfu_columns

    info = {
        "flops_per_sample": 1e9,
        "peaks": {"fp16": (100.0, "datasheet: H100 SXM"), "fp32": (50.0, "datasheet: H100 SXM")},
    }
    row = {"threads_per_rank": "", "precision": "apex_O2", "samples_per_s_per_device": "1000"}
    cols = mfu_columns(info, "cuda", row)  # 1 TFLOP/s achieved
    assert cols["mfu_pct"] == pytest.approx(1.0)
    assert cols["peak_source"] == "apex_O2 computes in fp16: datasheet: H100 SXM"
    cols = mfu_columns(info, "cuda", {**row, "precision": "apex_O0"})
    assert cols["mfu_pct"] == pytest.approx(2.0)
    assert mfu_columns({"flops_per_sample": 1e9}, "cuda", row)["peak_source"] == ""  # no peaks
    del info["peaks"]["fp16"]  # a run whose peaks left it out says so, not a blank
    cols = mfu_columns(info, "cuda", row)
    assert (
        math.isnan(cols["mfu_pct"])
        and cols["peak_source"] == "no fp16 peak was measured for this run"
    )


def test_a_cpu_peak_of_several_threads_is_at_least_one_threads(tmp_path, data_root, monkeypatch):
    """On a machine where another process holds a core, a 2-thread product waits on its
    slowest thread: its measured peak once came out 400x under one thread's."""
    import json

    from bench.harness import runner
    from tests.conftest import small_config

    def busy(threads, dtype=torch.float32, **_):
        return 0.1 if threads == 1 else 0.00022  # the 2-thread figure a busy machine gave

    monkeypatch.setattr(flops, "measured_cpu_peak", busy)
    cfg = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1,))
    cfg = cfg.replace(scaling_model=True, threads_per_rank=2)
    cells = runner.plan(cfg)
    (tmp_path / "r").mkdir()
    runner.measure_flops(cfg, cells, tmp_path / "r", echo=lambda m: None)
    peaks = json.loads((tmp_path / "r" / "model.json").read_text())["peaks"]
    assert peaks["fp32/2t"] == [
        0.1,
        "measured: fp32 matmul on 1 thread (on 2 it measured less: a busy machine)",
    ]


def test_an_fp32_gpu_row_says_which_products_run_in_tf32():
    """An fp32 cell on a GPU notes what torch runs in TF32 there: cuDNN's convolutions by
    default (a model with none: nothing to say), matrix products where allowed."""
    import torch

    from bench.harness.worker import tf32_note

    conv = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(8, 2))
    cudnn, cublas = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = cudnn.allow_tf32, cublas.allow_tf32  # (torch's own properties: set back by hand)
    try:
        cudnn.allow_tf32, cublas.allow_tf32 = True, False
        assert tf32_note(conv).startswith("fp32 convolutions in TF32")
        assert tf32_note(torch.nn.Linear(8, 2)) == ""
        cublas.allow_tf32 = True
        assert tf32_note(conv).startswith("fp32 convolutions and matrix products in TF32")
        cudnn.allow_tf32 = False
        assert tf32_note(conv).startswith("fp32 matrix products in TF32")
    finally:
        cudnn.allow_tf32, cublas.allow_tf32 = saved


def test_a_gpu_older_than_ampere_notes_no_tf32(monkeypatch):
    """TF32 runs on tensor cores of compute capability 8 and later: on a V100 (7.0) or a T4
    (7.5) fp32 is fp32 whatever allow_tf32 says, and the row says nothing of TF32 (its MFU
    peak is fp32's already)."""
    import torch

    from bench.harness.worker import tf32_note

    conv = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(8, 2))
    gpu = torch.device("cuda", 0)
    cudnn, cublas = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = cudnn.allow_tf32, cublas.allow_tf32
    asked = []

    def capability(device=None):
        asked.append(device)
        return major, 0

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    try:
        cudnn.allow_tf32 = cublas.allow_tf32 = True
        major = 7
        assert tf32_note(conv, gpu) == ""
        major = 8
        assert tf32_note(conv, gpu).startswith("fp32 convolutions and matrix products in TF32")
        assert asked == [gpu, gpu]
    finally:
        cudnn.allow_tf32, cublas.allow_tf32 = saved


def test_a_cpu_runs_one_thread_peak_is_one_figure(tmp_path, data_root, monkeypatch):
    """A busy 2-core machine: the one-process cells' 2-thread peak fell back on one thread's
    product (0.105 TFLOP/s), then the 2-rank cells' one thread was timed again (0.053), and
    ddp_spawn at 2 ranks read 35 % MFU against 10 % at one, half of it the two timings. One
    thread's peak is timed once for the run and both rest on it."""
    import json

    from bench.harness import runner
    from tests.conftest import small_config

    timed: list[int] = []

    def busy(threads, dtype=torch.float32, **_):
        timed.append(threads)
        if threads > 1:
            return 0.00022  # under one thread's: a busy machine
        return 0.105 if timed.count(1) == 1 else 0.053  # each timing of one thread its own

    monkeypatch.setattr(flops, "measured_cpu_peak", busy)
    monkeypatch.setattr(runner, "rank_threads", lambda cfg, cell: 2 // cell.world_size)
    cfg = small_config(tmp_path, data_root, strategies=("ddp_spawn",), world_sizes=(1, 2))
    cfg = cfg.replace(scaling_model=True)
    (tmp_path / "r").mkdir()
    runner.measure_flops(cfg, runner.plan(cfg), tmp_path / "r", echo=lambda m: None)
    info = json.loads((tmp_path / "r" / "model.json").read_text())
    peaks = info["peaks"]
    assert peaks["fp32/1t"][0] == peaks["fp32/2t"][0] == 0.105
    assert timed.count(1) == 1
    assert info["busy_peaks"] == ["fp32/2t"]  # what predict.busy_line reads
