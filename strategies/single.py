"""The baseline: one process, one device, no wrapper. Every speed-up is measured against it.

`--set shares=R` makes it the baseline of a data-parallel run of a model with BatchNorm
(what `parabench verify` checks such a run against): each step's global batch is cut into
the R shares R ranks would get from their samplers (rank r: samples r, r+R, ...), each
share's forward normalises over that share alone, and the gradients are averaged over the
shares, as DDP averages them over ranks. Running statistics follow rank 0's rule (DDP
broadcasts rank 0's buffers, and every other strategy saves rank 0's): only the first
share's forwards update them. Accumulation (`--accumulate K`) cuts each share into K
micro-batches, as it does on each rank.

`--set perturb=N` (N = 1..4; 0: none) starts from the same weights each moved by one unit in the last
place (fp32), in directions drawn with seed N: a twin of the baseline that differs only
by rounding, which `parabench verify` uses to measure how far rounding alone carries a
model within its steps (see bench.analysis.verify.conditioning).

`--set compress=fp16|bf16` rounds each step's gradients to that dtype before the optimizer
step, as a compressed all-reduce does: at one share, the whole gradient once (a DDP fp16/bf16
comm hook at world size 1); with `shares=R`, as the hooks do at R ranks, each share's
gradient (of its mean loss) rounded to the dtype, divided by R there and the R summed in the
dtype. `parabench verify` runs it as the reference of the cells whose gradients are
compressed, at their world size; `--set compress_divide=after_sum` divides the sum instead, as
Horovod does (Strategy.compressed_divide).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from strategies.base import Strategy, Variant, buffers_kept
from strategies.precision import DTYPES


class Single(Strategy):
    variants = {"single": Variant("inprocess", "one device, no wrapper (the baseline)")}
    #: perturb: 0 (none) or the seed of a twin's one-ulp moves
    accepts = {
        "shares": int,
        "perturb": ("0", "1", "2", "3", "4"),
        "compress": ("none", "fp16", "bf16"),
        "compress_divide": ("before_sum", "after_sum"),
    }

    @classmethod
    def idle_options(cls, cfg, setting, options):
        # compress_divide places the division of rounded shares: with nothing rounded, or
        # the whole gradient rounded once, single [compress_divide=after_sum] ran the steps
        # of the cell without it
        if "compress_divide" not in options:
            return {}
        if options.get("compress", "none") == "none":
            return {
                "compress_divide": "it says where the shares of a gradient rounded by compress "
                "are divided, and compress=none rounds nothing"
            }
        if int(options.get("shares", 1)) == 1:
            return {
                "compress_divide": "with one share the whole gradient is rounded once, and "
                "there are no shares to divide it among"
            }
        return {}

    @classmethod
    def unsuitable(cls, cfg, world_size, options) -> str | None:
        r = int(options.get("shares", 1))
        if r < 1:
            return f"shares must be at least 1, got {r}"
        if cfg.global_batch % r:
            return f"global batch {cfg.global_batch} does not split into {r} equal shares"
        # each share is cut into the cell's micro-batches: an uneven cut would scale the
        # loss and gradients (one share, the whole batch, is the runner's check of every
        # cell's micro-batches)
        for k in cfg.accumulate:  # the cell's alone (runner.plan)
            if r > 1 and (cfg.global_batch // r) % k:
                return (
                    f"a share of {cfg.global_batch // r} samples ({r} shares of global batch "
                    f"{cfg.global_batch}) does not split into {k} equal micro-batches"
                )
        return None

    @property
    def shares(self) -> int:
        return int(self.options.get("shares", 1))

    @property
    def compress(self) -> str:
        return self.options.get("compress", "none")

    def numerics(self) -> tuple[str, ...]:
        extra = () if self.compress == "none" else (f"grad_{self.compress}",)
        return (*super().numerics(), *extra)

    def optimizer_step(self, optimizer) -> None:
        if self.compress != "none" and self.shares == 1:  # (else rounded share by share)
            dtype = DTYPES[self.compress]
            with torch.no_grad():
                for group in optimizer.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p.grad.copy_(p.grad.to(dtype))
        super().optimizer_step(optimizer)

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        seed = int(self.options.get("perturb", 0))
        if seed:
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for p in model.parameters():
                    if p.is_floating_point():
                        sign = torch.randint(0, 2, p.shape, generator=g).to(p) * 2 - 1
                        p.mul_(1 + sign * torch.finfo(torch.float32).eps)
            self.notes.append(f"twin of the baseline: weights moved by one ulp (seed {seed})")
        return model, optimizer

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        r = self.shares
        if r == 1:
            return super().forward_backward(x, y)
        assert self.model is not None
        k = self.setting.accumulate
        total = torch.zeros((), device=x.device)
        # compressed: each share's gradient apart, as a rank's own before its all-reduce
        rounded = self.compress != "none"
        summed: dict[nn.Parameter, torch.Tensor] = {}
        for share in range(r):
            with buffers_kept(self.model) if share else contextlib.nullcontext():
                for xm, ym in zip(x[share::r].chunk(k), y[share::r].chunk(k), strict=True):
                    loss = self.forward_loss(xm, ym)
                    self.clock.lap("forward")
                    # the mean over ranks of each rank's mean (compressed: the rank's mean,
                    # divided by the ranks once rounded)
                    self.backward(loss / (k if rounded else r * k))
                    self.clock.lap("backward")
                    total += loss.detach().float()
            if rounded:
                self._fold_share(summed, r)
        after = self.options.get("compress_divide") == "after_sum"
        for p, g in summed.items():
            p.grad = (g.mul_(1 / r) if after else g).to(p.dtype)  # (Horovod's postscale)
        return total / (r * k)

    def _fold_share(self, summed: dict[nn.Parameter, torch.Tensor], r: int) -> None:
        """Add one share's gradient to `summed` as a 16-bit compressed all-reduce does (torch's
        fp16/bf16 comm hooks): rounded to the dtype, divided by the ranks there (or, with
        compress_divide=after_sum, the sum, by forward_backward), summed there; the
        parameters' gradients are cleared for the next share."""
        assert self.model is not None
        dtype = DTYPES[self.compress]
        after = self.options.get("compress_divide") == "after_sum"
        with torch.no_grad():
            for p in self.model.parameters():
                if p.grad is not None:
                    share = p.grad.to(dtype) if after else p.grad.to(dtype).div_(r)
                    summed[p] = summed[p].add_(share) if p in summed else share
                    p.grad = None

    def run_notes(self) -> list[str]:
        notes = super().run_notes()
        if self.shares > 1:
            notes.append(
                f"baseline of {self.shares} ranks' shares: each share's forward on its own, "
                "gradients averaged; running statistics from the first share only (rank 0's)"
                + (
                    f"; each share's gradient rounded to {self.compress} before the sum, "
                    + (
                        "the sum divided by the shares (Horovod's average)"
                        if self.options.get("compress_divide") == "after_sum"
                        else "each divided by the shares first (torch's hooks)"
                    )
                    if self.compress != "none"
                    else ""
                )
            )
        return notes
