"""Precision as a plugin beside the strategy (the shape of Lightning Fabric's precision plugins).

A strategy says how gradients, parameters and optimizer state are distributed; the
precision it trains in is a run option (`--precision fp32,bf16,fp16`) applied through one
of these objects, so no strategy branches on precision and no "amp_<strategy>" subclass is
needed. Hooks: `autocast()` around the forward, `backward(loss)`, `unscale(optimizer)` and
`step(optimizer)`. A strategy with a precision of its own (FSDP's MixedPrecisionPolicy,
apex.amp) asks `dtype` and does it its way.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

#: precision axis values: fp32, and autocast in bf16 or fp16 (fp16 with dynamic loss scaling)
PRECISIONS = ("fp32", "bf16", "fp16")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """fp32: no autocast, no scaling."""

    name = "fp32"
    dtype: torch.dtype | None = None

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type

    @property
    def scaling(self) -> bool:
        return False

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale(self, optimizer: Any) -> None:
        """Gradients to their true scale before anything reads them (clipping, Horovod)."""

    def step(self, optimizer: Any) -> None:
        optimizer.step()

    def notes(self) -> list[str]:
        """What the rows' notes say of this precision, read after training."""
        return []


class Autocast(Precision):
    """torch.autocast in bf16 or fp16; fp16 adds a GradScaler, since its range underflows
    small gradients (bf16 has fp32's exponent range and needs none)."""

    def __init__(self, device_type: str, name: str) -> None:
        super().__init__(device_type)
        self.name = name
        self.dtype = DTYPES[name]
        self.scaler = torch.amp.GradScaler(device_type, enabled=self.dtype == torch.float16)
        self.start_scale = self.scaler.get_scale()  # its initial scale: no tensor exists yet
        self.steps = 0

    @property
    def scaling(self) -> bool:
        return self.scaler.is_enabled()

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def unscale(self, optimizer: Any) -> None:
        if self.scaling:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: Any) -> None:
        self.scaler.step(optimizer)
        self.scaler.update()
        self.steps += 1

    def notes(self) -> list[str]:
        """How many optimizer steps fp16's loss scaling skipped (gradients with inf or nan:
        the step ran, its update did not, and it was timed like the rest). Counted from the
        scale at the end, never per step (reading it synchronises with the device): each
        skip multiplies it by the backoff factor, each growth_interval clean steps in a row
        by the growth factor, so with fewer steps than that the count is exact; with more,
        the notes give the scale's path and the least number skipped."""
        if not self.scaling or not self.steps:
            return []
        end = self.scaler.get_scale()
        steps = (
            f"{self.steps} optimizer steps since the cell began (warm-up and any probes' included)"
        )
        if not (0 < end < math.inf):  # every step skipped, long enough to halve it to 0
            return [
                f"fp16 loss scaling: scale {self.start_scale:g} -> {end:g} over {steps}: from "
                "some step on, every update was skipped on inf/nan gradients"
            ]
        falls = math.log(end / self.start_scale) / math.log(self.scaler.get_backoff_factor())
        skipped = max(0, round(falls))
        scale = f"scale {self.start_scale:g} -> {end:g}"
        if self.steps < self.scaler.get_growth_interval():  # it never grew: exact
            return [f"fp16 loss scaling skipped {skipped} of {steps} on inf/nan gradients, {scale}"]
        least = f", so at least {skipped} skipped" if skipped else ""
        return [
            f"fp16 loss scaling over {steps}: {scale} (a skip on inf/nan gradients backs it "
            f"off, {self.scaler.get_growth_interval()} clean steps in a row grow it){least}"
        ]


class ParamDtype(Autocast):
    """Parameters held in the low dtype by the strategy itself (FSDP's MixedPrecisionPolicy):
    no autocast around the forward, but the same loss scaling for fp16."""

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


def make(name: str, device_type: str) -> Precision:
    if name == "fp32":
        return Precision(device_type)
    if name in DTYPES:
        return Autocast(device_type, name)
    raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {name!r}")
