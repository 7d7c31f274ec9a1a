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


class Autocast(Precision):
    """torch.autocast in bf16 or fp16; fp16 adds a GradScaler, since its range underflows
    small gradients (bf16 has fp32's exponent range and needs none)."""

    def __init__(self, device_type: str, name: str) -> None:
        super().__init__(device_type)
        self.name = name
        self.dtype = DTYPES[name]
        self.scaler = torch.amp.GradScaler(device_type, enabled=self.dtype == torch.float16)

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
