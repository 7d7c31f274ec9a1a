"""DDP gradient-communication hooks: compress what the all-reduce moves.

- `ddp_fp16_hook`, `ddp_bf16_hook`: each bucket is cast to fp16 / bf16, all-reduced, and
  cast back (torch's `default_hooks`): half the bytes on the wire, rounding in the gradients.
- `ddp_powersgd`: PowerSGD (Vogels et al., 2019) all-reduces a rank-r factorisation of each
  gradient matrix, with error feedback; lossy by design. `--set powersgd_rank=R`
  (default 1) and `--set powersgd_start=N` (the step from which it compresses; the steps
  before it are plain all-reduce; default 2, the earliest torch allows with error feedback).

PowerSGD on gloo: torch's hook issues its second all-reduce (of the Q factors) from a
callback of the first one's future. With more than one bucket in flight, those callbacks
run on different threads and the ranks can issue the collectives of two buckets in a
different order; gloo pairs collectives by order, so one rank's P all-reduce meets the
other's Q all-reduce and gloo aborts ("Received data size doesn't match expected size").
NCCL's per-stream ordering hides this on GPUs. On gloo we wait for each bucket's hook to
finish before returning, so every rank runs bucket after bucket in DDP's bucket order: the
same numbers, less overlap of communication with backward (the row's notes say so).
Measured on a 2-bucket MNIST CNN, 2 ranks: torch's hook aborted 5 of 5 runs, the serialised
one passed 10 of 10 with identical parameters on both ranks. No torch issue names this
case; pytorch/pytorch#58467 (PowerSGD's DDP parity test disabled on gloo) is the nearest,
and gloo's message means a collective mismatch (pytorch/gloo#456).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from strategies.base import Variant
from strategies.ddp import DistributedDataParallel


def serialised(hook: Callable, state: Any) -> Callable:
    """`hook`, finished before it returns: one bucket's collectives at a time, in DDP's order."""

    # No annotations: DDP checks them and wants exactly dist.GradBucket / Future[Tensor].
    def run(_state, bucket):  # noqa: ANN001, ANN202
        result = hook(state, bucket).wait()
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(result)
        return done

    return run


#: the hooks that cast each bucket to a 16-bit float before the all-reduce
CASTS = ("fp16", "bf16")


class DDPCommHook(DistributedDataParallel):
    variants = {
        "ddp_fp16_hook": Variant(
            "torchrun", "DDP, gradients all-reduced in fp16 (comm hook)", {"comm_hook": "fp16"}
        ),
        "ddp_bf16_hook": Variant(
            "torchrun", "DDP, gradients all-reduced in bf16 (comm hook)", {"comm_hook": "bf16"}
        ),
        "ddp_powersgd": Variant(
            "torchrun",
            "DDP with PowerSGD low-rank gradient compression (lossy), comm hook",
            {"comm_hook": "powersgd"},
        ),
    }
    #: the hook is the variant's (comm_hook), so the PowerSGD options are ddp_powersgd's alone
    accepts = {**DistributedDataParallel.accepts, "powersgd_rank": int, "powersgd_start": int}
    #: ddp_powersgd's PowerSGDState once set up (the state it holds beside the model's)
    powersgd_state: Any = None

    @classmethod
    def accepted(cls, variant_options):
        if variant_options.get("comm_hook") == "powersgd":
            return dict(cls.accepts)
        return {k: v for k, v in cls.accepts.items() if not k.startswith("powersgd_")}

    @classmethod
    def unsuitable(cls, cfg, world_size, options):
        if options.get("comm_hook") == "powersgd":
            start = int(options.get("powersgd_start", 2))  # (--set checked it is positive)
            if start < 2:
                return (
                    f"powersgd_start {start}: torch's PowerSGD with error feedback compresses "
                    "from step 2 at the earliest"
                )
            # steps 0 .. start-1 all-reduce in full: timed, they would make a ddp_powersgd
            # row a mix of plain DDP's steps and PowerSGD's (verify times nothing: its steps
            # are compared, not timed, and it has no warm-up)
            if not cfg.save_params and start > cfg.warmup_steps:
                return (
                    f"PowerSGD compresses from step {start} (powersgd_start), after "
                    f"--warmup-steps {cfg.warmup_steps}: timed steps would all-reduce "
                    f"uncompressed; give --warmup-steps {start} or more"
                )
            # verify: step i's loss follows the updates of steps before it, so the losses it
            # compares follow a compressed step only from step start+1: before that, a
            # PowerSGD that never ran would pass
            steps = cfg.max_steps
            if cfg.save_params and steps is not None and start > steps - 2:
                return (
                    f"PowerSGD compresses from step {start} (powersgd_start): no loss of the "
                    f"{steps} steps compared would follow a compressed step; give --steps "
                    f"{start + 2} or more"
                )
        return super().unsuitable(cfg, world_size, options)

    @staticmethod
    def hook_of(options) -> str:
        """The comm hook these options choose (every variant names one; fp16 where none)."""
        return options.get("comm_hook", "fp16")

    @classmethod
    def traffic(cls, options, world_size, shape, precision):
        if cls.hook_of(options) == "powersgd":
            return "PowerSGD sends low-rank factors whose size depends on each layer's shape: not modelled"
        return super().traffic(options, world_size, shape, precision)

    @property
    def hook(self) -> str:
        return self.hook_of(self.options)

    @classmethod
    def compresses(cls, options) -> str:
        hook = cls.hook_of(options)
        return hook if hook in CASTS else ""

    def numerics(self) -> tuple[str, ...]:
        part = "powersgd" if self.hook == "powersgd" else f"grad_{self.hook}"
        return (*super().numerics(), part)

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        model, optimizer = super().setup(model, optimizer)
        if self.hook in CASTS:
            fn = getattr(default_hooks, f"{self.hook}_compress_hook")
            model.register_comm_hook(None, fn)  # state None: the default process group
            self.notes.append(f"{self.hook}_compress_hook")
            return model, optimizer
        rank = int(self.options.get("powersgd_rank", 1))  # checked by unsuitable
        start = int(self.options.get("powersgd_start", 2))
        state = powersgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=rank,
            start_powerSGD_iter=start,
            random_seed=self.ctx.seed,
        )
        self.powersgd_state = state
        if self.backend == "gloo":
            model.register_comm_hook(state, serialised(powersgd.powerSGD_hook, state))
            self.notes.append(
                f"PowerSGD rank {rank} from step {start}; buckets serialised on gloo (see module doc)"
            )
        else:
            model.register_comm_hook(state, powersgd.powerSGD_hook)
            self.notes.append(f"PowerSGD rank {rank} from step {start}")
        return model, optimizer

    def run_notes(self) -> list[str]:
        # PowerSGD keeps, per rank and per bucket, its error feedback (the bucket's size: a
        # second copy of the gradients) and its low-rank factors, from the step it starts
        # compressing on. That is training state the model-state columns (parameters,
        # gradients, optimizer state) do not count: said here, or the row would read as
        # light as plain DDP's.
        notes = super().run_notes()
        state = self.powersgd_state
        if state is None:
            return notes
        held = [
            t
            for d in (state.error_dict, state.p_memory_dict, state.q_memory_dict)
            for t in d.values()
        ]
        mib = sum(t.numel() * t.element_size() for t in held) / 2**20
        if mib:
            notes.append(
                f"PowerSGD holds {mib:.2f} MiB a rank beside the model state (error feedback, "
                "low-rank factors)"
            )
        return notes
