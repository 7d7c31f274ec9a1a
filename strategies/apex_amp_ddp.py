"""NVIDIA apex.amp with apex.parallel.DistributedDataParallel, as NVIDIA's examples used them.

apex.amp and apex.parallel exist up to apex 25.05 (removed in 25.07), need CUDA, and
apex is not on PyPI (the PyPI project named `apex` is an unrelated web toolkit): build
NVIDIA's repository at tag 25.05 (README, "Optional strategies"). Options:
`--set opt_level=O1|O2` (default O1), `--set ddp=apex|torch` (default apex).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata

import torch
from torch import nn

from strategies import precision as prec
from strategies.base import Variant
from strategies.ddp import TorchDistributed

INSTALL = (
    "build NVIDIA apex at tag 25.05 (the last with apex.amp): see README, 'Optional strategies'"
)


def apex_problem() -> str | None:
    """Why apex.amp cannot be imported here, or None."""
    try:
        import apex  # noqa: F401
    except ImportError:
        return f"NVIDIA apex is not installed; {INSTALL}"
    try:
        from apex import (
            amp,  # noqa: F401
            parallel,  # noqa: F401
        )
    except ImportError as exc:
        try:
            version = metadata.version("apex")
        except metadata.PackageNotFoundError:
            version = "?"
        return (
            f"the installed apex ({version}) has no apex.amp/apex.parallel ({exc}); they were removed "
            f"in apex 25.07, and PyPI's 'apex' is an unrelated package; {INSTALL}"
        )
    return None


def fused_scaler() -> bool:
    """Whether apex's CUDA extension for the loss scaler (amp_C) is built."""
    try:
        import amp_C  # noqa: F401
    except ImportError:
        return False
    return True


class ApexAmpDDP(TorchDistributed):
    variants = {
        "apex_amp_ddp": Variant(
            "torchrun", "NVIDIA apex.amp (O1) + apex DistributedDataParallel, torchrun"
        ),
    }
    accepts = {"opt_level": ("O0", "O1", "O2", "O3"), "ddp": ("apex", "torch")}
    shares_gpu = True  # its DDPs all-reduce, which gloo does on CUDA tensors
    replicated = True
    #: apex.amp is its own mixed precision (by opt_level), not a value of the precision axis
    precisions = ("apex",)
    no_compile = "apex.amp patches torch functions at run time; torch.compile is not used with it"
    no_accumulate = (
        "apex.parallel.DistributedDataParallel has no no_sync(); accumulation is not wired for apex"
    )

    @classmethod
    def default_precision(cls, device: str, options: Mapping[str, str]) -> str:
        return "apex"

    def make_precision(self, name: str) -> prec.Precision:
        return prec.Precision(self.ctx.device.type)  # amp.initialize and amp.scale_loss do it

    def numerics(self) -> tuple[str, ...]:
        return ("apex",)

    @classmethod
    def unavailable(cls, device: str) -> str | None:
        if device != "cuda":
            return f"apex.amp needs CUDA (device is {device})"
        return apex_problem()

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        from apex import amp

        opt_level = self.options.get("opt_level", "O1")
        if opt_level not in ("O0", "O1", "O2", "O3"):
            raise ValueError(f"opt_level must be O0..O3, got {opt_level!r}")
        self.precision = f"apex_{opt_level}"
        model, optimizer = amp.initialize(model, optimizer, opt_level=opt_level, verbosity=0)
        if opt_level != "O0" and not fused_scaler():
            self.notes.append(
                "apex built Python-only (no amp_C): its loss scaler checks each gradient for "
                "overflow with a host read, one synchronisation per parameter a step; a CUDA "
                "build of apex checks them in fused kernels, so this row is slower than apex is"
            )
        if self.options.get("ddp", "apex") == "torch":
            from torch.nn.parallel import DistributedDataParallel

            self.notes.append("torch DDP")
            return DistributedDataParallel(model, device_ids=[self.ctx.device.index]), optimizer
        from apex.parallel import DistributedDataParallel

        self.notes.append("apex.parallel.DistributedDataParallel")
        return DistributedDataParallel(model), optimizer

    def unwrap(self, model: nn.Module) -> nn.Module:
        # apex's DistributedDataParallel, whose `module` is the model, told by its module's
        # name: apex is imported only where it is installed
        inner = super().unwrap(model)
        return inner.module if type(inner).__module__.startswith("apex.parallel") else inner

    def optimizer_states(self):
        """The optimizer's state, and with master weights (O2) the fp32 copies apex puts in
        its parameter groups in place of the model's fp16 parameters, with their gradients:
        state this rank holds beside the model, which the model-state probe missed (O2 read
        as lighter than DDP, where it holds more)."""
        assert self.model is not None and self.optimizer is not None
        held = {id(p) for p in self.unwrap(self.model).parameters()}
        masters = [
            {"master_weight": p, "master_grad": p.grad}
            for group in self.optimizer.param_groups
            for p in group["params"]
            if id(p) not in held
        ]
        return [*super().optimizer_states(), *masters]

    def zero_grad(self, optimizer) -> None:
        # With master weights (O2) apex replaces zero_grad by one that takes no arguments.
        optimizer.zero_grad()

    def backward(self, loss: torch.Tensor) -> None:
        from apex import amp

        with amp.scale_loss(loss, self.optimizer) as scaled:
            scaled.backward()
