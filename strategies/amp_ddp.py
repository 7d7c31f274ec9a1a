"""Native mixed precision (torch.autocast + GradScaler) with torch DDP: the seed's `amp_ddp` row.

Precision is an axis beside every strategy (`--precision bf16` on `ddp_torchrun` trains
the same way); this name keeps the seed's row: DDP whose default precision is autocast,
fp16 with loss scaling on CUDA and bf16 on CPU. `--set amp_dtype=bf16|fp16` chooses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strategies.base import Variant
from strategies.ddp import DistributedDataParallel


class AmpDDP(DistributedDataParallel):
    variants = {
        "amp_ddp": Variant(
            "torchrun",
            "native AMP with DDP (autocast: fp16 + GradScaler on CUDA, bf16 on CPU), torchrun",
        ),
    }
    accepts = {**DistributedDataParallel.accepts, "amp_dtype": ("fp16", "bf16")}
    precisions = ("bf16", "fp16")

    @classmethod
    def default_precision(cls, device: str, options: Mapping[str, str]) -> str:
        return options.get("amp_dtype") or ("fp16" if device == "cuda" else "bf16")

    @classmethod
    def unsuitable(cls, cfg: Any, world_size: int, options: Mapping[str, str]) -> str | None:
        if cfg.precisions and "amp_dtype" in options:
            return (
                f"amp_dtype chooses amp_ddp's precision where --precision does not; with "
                f"--precision {','.join(cfg.precisions)} it would change nothing: give one of them"
            )
        return super().unsuitable(cfg, world_size, options)
