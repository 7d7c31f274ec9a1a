"""Native mixed precision (torch.autocast + GradScaler) with torch DDP.

What apex.amp's deprecation points to. bf16 by default on CPU, fp16 with loss scaling
on CUDA; `--set amp_dtype=bf16|fp16` chooses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch

from strategies.base import RankContext, Variant
from strategies.ddp import DistributedDataParallel

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class AmpDDP(DistributedDataParallel):
    variants = {
        "amp_ddp": Variant("torchrun", "native AMP (autocast + GradScaler) with DDP, torchrun"),
    }
    precision = "amp"
    accepts = {"amp_dtype": tuple(DTYPES)}

    def __init__(self, ctx: RankContext, options: Mapping[str, str] | None = None) -> None:
        super().__init__(ctx, options)
        name = self.options.get("amp_dtype") or ("fp16" if ctx.device.type == "cuda" else "bf16")
        if name not in DTYPES:
            raise ValueError(f"amp_dtype must be one of {', '.join(DTYPES)}, got {name!r}")
        self.dtype = DTYPES[name]
        self.precision = f"amp_{name}"
        # Loss scaling only matters for fp16, whose range underflows small gradients.
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=self.dtype == torch.float16)

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.ctx.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def optimizer_step(self, optimizer) -> None:
        self.scaler.step(optimizer)
        self.scaler.update()
