"""Model FLOPs and utilisation (MFU): what one training step of the run's model costs in
FLOPs, what the device could do at most, and the fraction of that a row reached.

Model FLOPs are counted, not estimated from parameters: `torch.utils.flop_counter`'s
`FlopCounterMode` watches one forward and backward on a batch of two samples. It counts
the matrix products and convolutions (2 * M * N * K for an M x K by K x N product, and
the same per output element of a convolution) and nothing else: normalisation,
activations, softmax, the loss and the optimizer step count zero. That is the usual
"model FLOPs" of MFU (PaLM, torchtitan), not the FLOPs the hardware executes: activation
recomputation (checkpointing), padding and the work a strategy adds (tensor-parallel
collectives, pipeline bubbles) are excluded, so MFU is comparable across strategies.

The peak is a datasheet figure per GPU and precision (`PEAK_TFLOPS`, `peak_for`), dense
(without structured sparsity, whose 2x NVIDIA's headline figures include), or on a CPU a
figure measured with a square matrix product (`measured_cpu_peak`)."""

from __future__ import annotations

import inspect
import math
import re
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.config import RunConfig
from bench.workload import models
from bench.workload.models import InputSpec

#: samples in the batch the FLOPs are counted on (a batch of one hides batch-size bugs in
#: a user's model and is what BatchNorm refuses in training mode)
COUNT_BATCH = 2

#: (model, its arguments, image size, dataset, seq_len, classes, input) -> FLOPs per
#: sample of one training step and the convolutions' share of them, or None where they
#: could not be counted
_CACHE: dict[tuple[Any, ...], tuple[float, float] | None] = {}


def train_flops_per_sample(
    cfg: RunConfig, num_classes: int | None, spec: InputSpec | None = None
) -> float | None:
    """Model FLOPs of one training step (forward and backward) per sample of the run's
    model, fed `spec` (None: what it is fed on synthetic data) with `num_classes` classes
    (a token model: vocabulary; None: the run's default).

    Counted with `FlopCounterMode` on a batch of two samples, the model built on the meta
    device (no memory, no weights; shapes are all the count needs) or, where an operation
    has no meta kernel, on the CPU; total / 2. Only matrix products and convolutions count
    (2*M*N*K): the "model FLOPs" of MFU (PaLM, torchtitan), not hardware FLOPs, without
    recomputation. The backward costs 2x the forward for a layer whose input needs a
    gradient (input and weight gradients), 1x for the first layer (weight gradient only).
    Attention: on the meta device scaled_dot_product_attention runs as its two batched
    products (the backward 2x those); on the CPU it is the fused kernel, which the
    counter charges 2.5x in the backward (the score recomputation of flash attention),
    under 1 % more for the `lm` at 128 tokens. Causal masking is not discounted.

    None, never an exception, where counting fails on both devices (a user's model may do
    anything) or counts nothing at all (no product or convolution the counter knows).
    Cached per (model, its arguments, input, classes)."""
    counted = _counted(cfg, num_classes, spec)
    return None if counted is None else counted[0]


def conv_share(cfg: RunConfig, num_classes: int | None, spec: InputSpec | None = None) -> float:
    """The share of the model FLOPs of a training step that are convolutions (forward and
    backward), counted as `train_flops_per_sample` counts (and cached with it); 0 where
    nothing could be counted. resnet50: nearly all; a vision transformer: its patch
    embedding's, under 1 %; a language model: none."""
    counted = _counted(cfg, num_classes, spec)
    return 0.0 if counted is None else counted[1]


def _counted(
    cfg: RunConfig, num_classes: int | None, spec: InputSpec | None
) -> tuple[float, float] | None:
    try:
        key: tuple[Any, ...] | None = _key(cfg, num_classes, spec)
        hash(key)
    except Exception:
        key = None  # an unhashable --model-arg: count, do not cache
    if key is not None and key in _CACHE:
        return _CACHE[key]
    result = _per_sample(cfg, num_classes, spec)
    if key is not None:
        _CACHE[key] = result
    return result


def _key(cfg: RunConfig, num_classes: int | None, spec: InputSpec | None) -> tuple[Any, ...]:
    kwargs = tuple(sorted((str(k), repr(v)) for k, v in cfg.model_kwargs.items()))
    given = None if spec is None else (tuple(spec.shape), str(spec.dtype), spec.vocab)
    return (cfg.model, kwargs, cfg.image_size, cfg.dataset, cfg.seq_len, num_classes, given)


def _per_sample(
    cfg: RunConfig, num_classes: int | None, spec: InputSpec | None
) -> tuple[float, float] | None:
    try:
        if num_classes is None:
            num_classes = models.default_classes(cfg)
        if spec is None:
            spec = models.spec(cfg)
    except Exception:
        return None
    for device in ("meta", "cpu"):
        try:
            counts = step_flop_counts(cfg, num_classes, spec, device)
        except Exception:
            continue
        total = sum(counts.values())
        if total <= 0:
            return None
        conv = sum(n for op, n in counts.items() if "convolution" in op)
        return total / COUNT_BATCH, conv / total
    return None


def step_flops(
    cfg: RunConfig, num_classes: int | None, spec: InputSpec, device: str = "meta"
) -> int:
    """FLOPs `FlopCounterMode` counts for one forward and backward of the run's model
    (`step_flop_counts`, summed)."""
    return sum(step_flop_counts(cfg, num_classes, spec, device).values())


def step_flop_counts(
    cfg: RunConfig, num_classes: int | None, spec: InputSpec, device: str = "meta"
) -> dict[str, int]:
    """FLOPs `FlopCounterMode` counts for one forward and backward of the run's model, by
    operation (e.g. `aten.convolution.default`, `aten.mm.default`),
    built on `device`, on a batch of `COUNT_BATCH` samples of `spec` under the model's
    loss (`models.loss_of`): class indices as targets, or for a token model next tokens
    shaped like the input. Raises whatever the model raises. The global RNG is left as it
    was (building a model on the CPU draws its initial weights)."""
    with torch.random.fork_rng(devices=[]):
        model = models.build_on(device, cfg, num_classes, spec)
        with torch.device(device):
            if spec.vocab:
                x = torch.randint(0, spec.vocab, (COUNT_BATCH, *spec.shape))
            else:
                x = torch.randn((COUNT_BATCH, *spec.shape)).to(spec.dtype)
        model.train()
        loss_fn = models.loss_of(model)
        with (
            torch.inference_mode(False),
            torch.enable_grad(),
            _counter() as counter,
        ):
            out = model(x)
            classes = _classes(out, spec, num_classes)
            shape = (COUNT_BATCH, *spec.shape) if spec.vocab else (COUNT_BATCH,)
            target = torch.randint(0, classes, shape, device=device)
            loss_fn(out, target).backward()
    return {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}


def _counter() -> FlopCounterMode:
    # skip_unsupported (newer torch): a higher-order op without a formula runs uncounted
    # instead of failing the count
    if "skip_unsupported" in inspect.signature(FlopCounterMode).parameters:
        return FlopCounterMode(display=False, skip_unsupported=True)
    return FlopCounterMode(display=False)


def _classes(out: Any, spec: InputSpec, num_classes: int | None) -> int:
    """The range of the targets: the scores per sample (or token) the model gives."""
    if isinstance(out, torch.Tensor) and out.ndim >= 1 and out.shape[-1] > 0:
        return int(out.shape[-1])
    return int(spec.vocab or num_classes or 2)


# --- peak FLOP/s --------------------------------------------------------------------------

#: dense (no structured sparsity) peak TFLOP/s per GPU: "fp32" on the CUDA cores, "tf32"
#: and "bf16"/"fp16" on the tensor cores with FP32 accumulation (what cuBLAS uses for
#: torch.autocast). NVIDIA's headline tensor-core figures for Ampere and later are WITH 2:4
#: sparsity, marked "*" on the datasheets: halved here. A precision the GPU has no tensor
#: cores for (tf32 before Ampere, bf16 on V100/T4) is absent.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # H100 datasheet (SXM5): FP32 67, TF32 989*, BF16 1979*, FP16 1979*; the Hopper
    # whitepaper's dense figures: TF32 494.7, BF16/FP16 989.4
    "H100 SXM": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    # H100 datasheet (PCIe): FP32 51, TF32 756*, BF16 1513*, FP16 1513*
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5},
    # H100 datasheet (NVL, per GPU): FP32 60, TF32 835*, BF16 1671*, FP16 1671*
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    # H200 datasheet (SXM): FP32 67, TF32 989*, BF16 1979*, FP16 1979* (H100 SXM's core)
    "H200": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    # H200 datasheet (NVL): FP32 60, TF32 835*, BF16 1671*, FP16 1671*
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    # A100 datasheet: the same for 40 GB and 80 GB, SXM and PCIe: FP32 19.5, TF32 156
    # (312*), BF16 312 (624*), FP16 312 (624*)
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    # A10 datasheet: FP32 31.2, TF32 62.5 (125*), BF16 125 (250*), FP16 125 (250*)
    "A10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    # A10G (AWS G5 only): NVIDIA publishes no datasheet; AWS's figures: FP32 35, tensor
    # TF32 35 and BF16/FP16 70 dense (80 SMs at 1.71 GHz, tensor cores at the GeForce
    # GA102 rate with FP32 accumulation); the least certain row of the table
    "A10G": {"fp32": 35.0, "tf32": 35.0, "bf16": 70.0, "fp16": 70.0},
    # L4 datasheet: FP32 30.3, TF32 120*, BF16 242*, FP16 242*
    "L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0},
    # L40S datasheet: FP32 91.6, TF32 183 (366*), BF16 362.05 (733*), FP16 362.05 (733*)
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05},
    # V100 datasheet (SXM2): FP32 15.7, tensor (FP16, FP32 accumulate) 125; no TF32/BF16
    "V100 SXM2": {"fp32": 15.7, "fp16": 125.0},
    # V100 datasheet (PCIe): FP32 14, tensor 112
    "V100 PCIe": {"fp32": 14.0, "fp16": 112.0},
    # V100S datasheet (PCIe): FP32 16.4, tensor 130
    "V100S": {"fp32": 16.4, "fp16": 130.0},
    # T4 datasheet: FP32 8.1, mixed precision FP16/FP32 65; no TF32/BF16
    "T4": {"fp32": 8.1, "fp16": 65.0},
    # Ada whitepaper, appendix (GeForce RTX 4090): FP32 82.6, TF32 82.6 (165.2*), BF16 and
    # FP16 with FP32 accumulate 165.2 (330.4*); 330.3 dense is FP16 with FP16 accumulate
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
    # GA102 whitepaper, appendix A (GeForce RTX 3090): FP32 35.6, TF32 35.6 (71*), BF16 and
    # FP16 with FP32 accumulate 71 (142*); 142 dense is FP16 with FP16 accumulate
    "RTX 3090": {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0},
}

#: CUDA device names (torch.cuda.get_device_name) -> row, first match wins: the more
#: specific variants first; names of variants whose figures differ (laptop GPUs, the RTX
#: 4090 D, 3090 Ti, V100 SXM3, H800, GH200) match no row
_NAMES: tuple[tuple[str, str], ...] = (
    (r"\bH100\b.*\bNVL\b", "H100 NVL"),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe"),
    (r"\bH100\b", "H100 SXM"),  # "NVIDIA H100 80GB HBM3"
    (r"\bH200\b.*\bNVL\b", "H200 NVL"),
    (r"\bH200\b", "H200"),
    (r"\bA100\b", "A100"),  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"
    (r"\bA10G\b", "A10G"),
    (r"\bA10\b", "A10"),
    (r"\bL40S\b", "L40S"),
    (r"\bL4\b", "L4"),
    (r"\bV100S\b", "V100S"),
    (r"\bV100-SXM2\b", "V100 SXM2"),  # "Tesla V100-SXM2-16GB"
    (r"\bV100-PCIE\b", "V100 PCIe"),
    (r"\bT4\b", "T4"),  # "Tesla T4"
    (r"\bGeForce RTX 4090$", "RTX 4090"),
    (r"\bGeForce RTX 3090$", "RTX 3090"),
)


def datasheet_row(device_name: str) -> str | None:
    """The `PEAK_TFLOPS` row of a CUDA device name, or None."""
    name = str(device_name).strip()
    for pattern, row in _NAMES:
        if re.search(pattern, name, re.IGNORECASE):
            return row
    return None


def peak_for(device_name: str, precision: str, tf32: bool = False) -> tuple[float | None, str]:
    """Dense peak TFLOP/s of the GPU named `device_name` (as CUDA names it) for training in
    `precision` ("fp32", "bf16", "fp16"; "tf32" also taken), and where the figure comes
    from: (TFLOP/s, "datasheet: <row>"), or (None, why not). fp32 runs its products on the
    tensor cores in TF32 only where torch lets it (`tf32`: the caller's reading of
    torch.backends.cuda.matmul.allow_tf32; convolutions follow
    torch.backends.cudnn.allow_tf32, True by default); before Ampere there is no TF32 and
    fp32 is fp32. Never raises."""
    row = datasheet_row(device_name)
    if row is None:
        return None, f"no datasheet figure for {device_name}"
    figures = PEAK_TFLOPS[row]
    key = str(precision).lower()
    if key == "fp32" and tf32 and "tf32" in figures:
        key = "tf32"
    if key not in figures:
        return None, f"no datasheet figure for {device_name} in {precision}"
    return figures[key], f"datasheet: {row}"


def blended_peak(device_name: str, tf32_share: float) -> tuple[float | None, str]:
    """The fp32 peak of a step whose FLOPs run `tf32_share` on the tensor cores in TF32
    and the rest on the CUDA cores in fp32: the rate at which the step's FLOPs could be
    done at best, total / (tf32 part / TF32 peak + fp32 part / fp32 peak). As `peak_for`."""
    fp32, why = peak_for(device_name, "fp32")
    tf32, _ = peak_for(device_name, "fp32", tf32=True)
    if fp32 is None or tf32 is None or tf32 == fp32 or tf32_share <= 0:
        return fp32, why
    share = min(1.0, tf32_share)
    peak = 1 / (share / tf32 + (1 - share) / fp32)
    return round(peak, 1), f"{why}; TF32 for {share:.0%} of the FLOPs"


def measured_cpu_peak(
    threads: int, dtype: torch.dtype = torch.float32, seconds: float = 0.3, max_size: int = 2048
) -> float:
    """TFLOP/s of a square matrix product in `dtype` on `threads` CPU threads: the best of
    repeated timings within about `seconds` of wall time (a little more at most: the last
    product started before the deadline finishes). The size starts at 128 and doubles (each
    new size's first product is its warm-up) while a product of the next size would take
    under an eighth of `seconds`, up to `max_size`: 1024 for fp32 on a small CPU, 256 for
    bf16 where the CPU has no bf16 instructions (a hundred times slower). torch's thread
    count is set for the measurement and restored after; the global RNG is not touched."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        deadline = time.perf_counter() + seconds
        gen = torch.Generator().manual_seed(0)

        def operands(n: int) -> tuple[torch.Tensor, torch.Tensor]:
            return (
                torch.randn(n, n, generator=gen).to(dtype),
                torch.randn(n, n, generator=gen).to(dtype),
            )

        with torch.no_grad():
            n = 128
            a, b = operands(n)
            best = _timed(a, b)
            while 2 * n <= max_size and 8 * best < seconds / 8:
                n *= 2
                a, b = operands(n)
                best = _timed(a, b)
            timed = 0
            while timed < 2 or time.perf_counter() < deadline:
                best = min(best, _timed(a, b))
                timed += 1
        return 2 * n**3 / best / 1e12
    finally:
        torch.set_num_threads(old)


def _timed(a: torch.Tensor, b: torch.Tensor) -> float:
    start = time.perf_counter()
    torch.mm(a, b)
    return max(time.perf_counter() - start, 1e-9)


#: CPU flags (Linux /proc/cpuinfo) of units that multiply in a precision natively
CPU_UNITS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}


def cpu_has_units(precision: str, cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies in `precision` natively (bf16/fp16 instructions); without
    them torch computes through fp32, and a matmul timed in that precision is slower than
    any model reaches (an MFU over 100 %)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set(cpuinfo.split())
    return any(f in flags for f in CPU_UNITS.get(precision, ()))


def mfu(
    flops_per_sample: float | None,
    samples_per_s_per_device: float | None,
    peak_tflops: float | None,
) -> float:
    """Model FLOPs utilisation, a fraction: flops_per_sample * samples/s (per device) over
    the device's peak (TFLOP/s). NaN where any of them is missing, not a number, not
    finite or not positive."""
    try:
        values = [float(v) for v in (flops_per_sample, samples_per_s_per_device, peak_tflops)]
    except (TypeError, ValueError):
        return math.nan
    if not all(math.isfinite(v) and v > 0 for v in values):
        return math.nan
    flops, rate, peak = values
    return flops * rate / (peak * 1e12)
