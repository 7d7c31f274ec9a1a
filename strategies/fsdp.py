"""FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters, gradients and optimizer state
sharded over ranks; each block's parameters are all-gathered for its forward and backward
and its gradients reduce-scattered.

- `fsdp`: `reshard_after_forward=True`, parameters freed after each block's forward and
  gathered again for backward (ZeRO-3-like: least memory, one more all-gather).
- `fsdp_zero2`: `reshard_after_forward=False`, parameters stay gathered from forward to
  backward (ZeRO-2-like: more memory between the passes, less communication).

Precision: bf16/fp16 use FSDP's own `MixedPrecisionPolicy` (parameters cast for compute,
gradients reduced in fp32, BatchNorm layers and the model's output in fp32), not
autocast; fp16 keeps the GradScaler. The BatchNorm layers are one fp32 unit together
(`--set norm_units=layer`: a unit each; see `FSDP2.shard`). Under --channels-last only the
inputs are NHWC: fully_shard refuses non-contiguous parameters. Accumulation uses
`set_requires_gradient_sync(False)` on all micro-batches but the last.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from bench.workload.models import meta_model, norm_layers
from strategies import precision as prec
from strategies.base import Variant
from strategies.ddp import TorchDistributed, flag


def blocks(model: nn.Module) -> list[nn.Module]:
    """The units sharded one by one: a model's `blocks` or `layers` if it lists them (a
    transformer), else its top-level children that hold parameters."""
    for name in ("blocks", "layers"):
        seq = getattr(model, name, None)
        if isinstance(seq, nn.ModuleList | nn.Sequential):
            return list(seq)
    return [m for m in model.children() if any(True for _ in m.parameters())]


def units(model: nn.Module, low: bool) -> tuple[list[nn.Module], list[nn.Module]]:
    """What fully_shard is applied to before the root, in that order: in bf16/fp16 (`low`)
    the BatchNorm layers with parameters, kept in fp32 (one unit together, or a unit each:
    `FSDP2.shard`); then the blocks (`blocks`) that hold parameters besides those, but for
    a block that shares one with any module outside it (tied weights: an embedding and an
    output layer of one matrix, in two blocks or one block and the root), which fully_shard
    refuses in two units: the root's unit holds it."""
    norms = [m for m in norm_layers(model) if any(True for _ in m.parameters())] if low else []
    taken = {id(p) for m in norms for p in m.parameters()}
    rest = [b for b in blocks(model) if any(id(p) not in taken for p in b.parameters())]
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))

    def tied_outside(block: nn.Module) -> bool:
        inside = Counter(id(p) for _, p in block.named_parameters(remove_duplicate=False))
        return any(uses[i] > n for i, n in inside.items())

    return norms, [b for b in rest if not tied_outside(b)]


def ungroupable(model: nn.Module, norms: list[nn.Module]) -> str | None:
    """Why `norms` (BatchNorm layers) cannot be one FSDP unit together, or None. A group's
    gradients are reduced once, when backward reaches the input of the first of them that
    ran: every other must have had its gradients by then, so each must run once a forward
    and depend on the first one's output. Read off the forward's traced graph (torch.fx,
    the BatchNorm layers kept whole, subclasses too); a forward that cannot be traced
    cannot be shown safe. Conservative: a rejection costs speed (a unit each), not
    correctness. Tracing runs the forward's Python once, on proxies, not on data."""
    if len(norms) < 2:  # none, or one: a unit of its own either way
        return None
    import torch.fx

    leaves = {id(m) for m in norms}

    class Tracer(torch.fx.Tracer):
        def is_leaf_module(self, m: nn.Module, name: str) -> bool:
            return id(m) in leaves or super().is_leaf_module(m, name)

    try:
        graph = Tracer().trace(model)
    except Exception as exc:  # control flow on values, unsupported ops: fx's many errors
        return f"its forward cannot be traced ({type(exc).__name__})"
    names = {id(m): name for name, m in model.named_modules()}
    wanted = {names[id(m)] for m in norms}
    calls = [n for n in graph.nodes if n.op == "call_module" and n.target in wanted]
    if len(calls) != len(wanted) or len({n.target for n in calls}) != len(calls):
        return "not every BatchNorm runs exactly once a forward"
    first, after = calls[0], {calls[0]}
    for node in graph.nodes:
        if any(a in after for a in node.all_input_nodes):
            after.add(node)
    for call in calls[1:]:
        if call not in after:
            return f"{call.target} does not take the first BatchNorm's ({first.target}) output"
    return None


def rebuild(optimizer: torch.optim.Optimizer, params) -> torch.optim.Optimizer:
    """The same optimizer over new parameter objects (sharding replaces them)."""
    return type(optimizer)(params, **optimizer.defaults)


class FSDP2(TorchDistributed):
    variants = {
        "fsdp": Variant(
            "torchrun", "FSDP2 fully_shard per block: params, grads, optimizer state sharded"
        ),
        "fsdp_zero2": Variant(
            "torchrun",
            "FSDP2 with reshard_after_forward=False (ZeRO-2-like)",
            {"reshard_after_forward": "false"},
        ),
    }
    accepts = {"reshard_after_forward": bool, "norm_units": ("group", "layer")}
    collective_eval = True
    contiguous_params = "fully_shard refuses non-contiguous parameters"
    #: what shard() applied fully_shard to before the root (compiled compiles the blocks)
    sharded_blocks: Sequence[nn.Module] = ()
    sharded_norms: Sequence[nn.Module] = ()

    @classmethod
    def unsupported(cls, setting, device):
        if setting.cuda_graphs:  # (its blocks compiled apart: FSDP2.compiled)
            return (
                "torch.compile's CUDA-graph modes are not wired for FSDP, whose blocks are "
                "compiled apart with its hooks eager between them"
            )
        return super().unsupported(setting, device)

    @classmethod
    def idle_options(cls, cfg, setting, options):
        # norm_units places the BatchNorm layers kept in fp32 under bf16/fp16 (`units`):
        # in fp32, or on a model without them, fsdp [norm_units=layer] ran fsdp's steps
        if "norm_units" not in options:
            return {}
        if setting.precision not in ("bf16", "fp16"):
            return {
                "norm_units": "it sets how bf16/fp16 shard the BatchNorm layers they keep in "
                f"fp32, and in {setting.precision} those shard with their blocks"
            }
        if not units(meta_model(cfg), low=True)[0]:
            return {
                "norm_units": f"model {cfg.model} has no BatchNorm layers with weights to shard"
            }
        return {}

    @classmethod
    def traffic(cls, options, world_size, shape, precision):
        # per unit: an all-gather of its parameters for forward, again for backward when it
        # was resharded after forward, and a reduce-scatter of its gradients (reduced in fp32)
        # (the root keeps its parameters gathered from forward to backward: once). In
        # bf16/fp16 the BatchNorm layers stay fp32: one unit gathered once (`shard`), or a
        # unit each (`norm_units=layer`, and a model.json that does not count them).
        low = precision in ("bf16", "fp16")
        half = 0.5 if low else 1.0
        if low and shape.low_units:
            n, root, norm_bytes = shape.low_units, shape.low_root_bytes, shape.norm_bytes
        else:
            n, root, norm_bytes = shape.units, shape.root_bytes, 0
        blocks = shape.param_bytes - root - norm_bytes
        gathers = 2 if flag(options.get("reshard_after_forward", "true")) else 1
        norms = shape.norm_layers if low else 0
        rooted = 1 if root else 0  # a root without parameters of its own issues nothing
        if norms and options.get("norm_units", "group") == "group":
            n -= norms  # the blocks; then the BatchNorm unit, gathered once, and the root
            return [
                (
                    "all_gather",
                    half * (gathers * blocks + root) + norm_bytes,
                    gathers * n + 1 + rooted,
                ),
                ("reduce_scatter", float(shape.param_bytes), n + 1 + rooted),
            ]
        return [
            (
                "all_gather",
                half * (gathers * blocks + root) + gathers * norm_bytes,
                gathers * n + rooted,
            ),
            ("reduce_scatter", float(shape.param_bytes), n + rooted),
        ]

    def make_precision(self, name: str) -> prec.Precision:
        if name == "fp32":
            return prec.Precision(self.ctx.device.type)
        return prec.ParamDtype(self.ctx.device.type, name)

    def numerics(self) -> tuple[str, ...]:
        p = self.precision_plugin
        return () if p.dtype is None else (f"params_{p.name}",)

    @property
    def reshard(self) -> bool:
        return flag(self.options.get("reshard_after_forward", "true"))

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(self.ctx.device.type, (self.ctx.world_size,))
        return self.shard(model, optimizer, mesh)

    def shard(self, model: nn.Module, optimizer: torch.optim.Optimizer, mesh):
        """fully_shard each block, then the root, over `mesh` (1-D: the ranks it shards over).

        In bf16/fp16 the BatchNorm layers are sharded first, with fp32 parameters (batch norm
        takes low-precision inputs with fp32 weights and running statistics, not
        low-precision weights with fp32 statistics). `norm_units=group` (the default): one
        unit together, kept gathered from forward to backward (a few KiB of weights a
        layer). Its gradients are reduced once, when backward reaches the input of the first
        BatchNorm that ran, so it assumes that one comes before all the others and that each
        runs once a forward: true of a CNN whose stem has a BatchNorm, as in every
        torchvision one; `ungroupable` checks it on the traced forward and, where it fails,
        each layer gets a unit of its own, as under `norm_units=layer`.

        Why group: with a unit each, on one H100, resnet50 (53 BatchNorm units, 59 in all
        against 7 in fp32) trained at 2,145 images/s in bf16 + channels-last against single's
        3,928, forward and backward each about 1.8x single's, while in fp32 it matched
        single; each unit's hooks and per-unit work are the likely cost (not yet measured on
        a GPU with the group). On the project's 2-core CPU, resnet18's 20 units added 16 ms
        a step, one group 1.5 ms.

        The root returns fp32 outputs, so the loss is computed in fp32: the gradient of an
        fp16 loss is the GradScaler's scale (65536 at first) in fp16, past its largest value
        (65504), so every step would be skipped until the scale came down."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dtype = self.precision_plugin.dtype
        fp32 = MixedPrecisionPolicy()
        if dtype is None:
            policy = root = fp32
        else:
            policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
            root = MixedPrecisionPolicy(
                param_dtype=dtype, reduce_dtype=torch.float32, output_dtype=torch.float32
            )
        norms, rest = units(model, low=dtype is not None)
        grouped = self.options.get("norm_units", "group") == "group"
        why = ungroupable(model, norms) if grouped else None
        grouped = grouped and not why
        if norms and grouped:
            fully_shard(norms, mesh=mesh, reshard_after_forward=False, mp_policy=fp32)
        elif norms:
            for norm in norms:
                fully_shard(norm, mesh=mesh, reshard_after_forward=self.reshard, mp_policy=fp32)
        for block in rest:
            fully_shard(block, mesh=mesh, reshard_after_forward=self.reshard, mp_policy=policy)
        self.sharded_blocks, self.sharded_norms = rest, norms
        # The root's parameters are needed again at once by backward: keep them gathered.
        fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=root)
        self.notes.append(
            f"fully_shard on {len(rest)} blocks + root, reshard_after_forward={self.reshard}"
            + (
                f", MixedPrecisionPolicy(param_dtype={self.precision}, fp32 outputs)"
                + (
                    f", {len(norms)} BatchNorm layers as "
                    + ("one fp32 unit" if grouped else "fp32 units, one each")
                    + (f" (not one unit: {why})" if why else "")
                    if norms
                    else ""
                )
                if dtype
                else ""
            )
        )
        return model, rebuild(optimizer, model.parameters())

    def compiled(self, model: nn.Module, mode: str | None) -> nn.Module:
        """Each block's own forward compiled, as torchtitan compiles its blocks: the sharded
        model compiled whole traced nothing (on torch 2.15 dynamo skips fully_shard's hooks,
        and with them the whole forward of every sharded module), so a compiled cell ran its
        steps eager under a compiled label. The hooks (all-gather, reduce-scatter) run eager
        around each block's graph, as do the root's own layers (a stem, a head)."""
        # a model with no block (its parameters all its own): the root's forward, whole
        units = self.sharded_blocks or [model]
        for unit in units:
            unit.forward = torch.compile(unit.forward, mode=mode)
        inside = {id(m) for unit in units for m in unit.modules()}
        breaks = sum(id(norm) in inside for norm in self.sharded_norms)
        self.notes.append(
            (
                f"torch.compile of each of the {len(units)} blocks' forward (FSDP's hooks and "
                "the root's own layers eager)"
                if self.sharded_blocks
                else "torch.compile of the root's forward (no block to shard apart)"
            )
            + (
                f"; the graphs break at each of the {breaks} BatchNorm layers in them, sharded "
                "apart in fp32 (their hooks eager)"
                if breaks
                else ""
            )
        )
        return model

    def fsdp_module(self) -> nn.Module:
        assert self.model is not None
        return self.model

    def release(self) -> None:
        # the units sharded are the model's: kept here, they held it (and its mesh) alive
        self.sharded_blocks = self.sharded_norms = ()
        super().release()

    _grad_sync = True  # what no_sync() restores: it nests (the ablation around accumulation)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        module = self.fsdp_module()
        before = self._grad_sync
        module.set_requires_gradient_sync(False)
        self._grad_sync = False
        try:
            yield
        finally:
            module.set_requires_gradient_sync(before)
            self._grad_sync = before

    #: without sync the gradients stay on the unsharded parameters: nothing to step with
    sync_off_steps_optimizer = False
    ablation_keeps = "FSDP's parameter all-gathers"
    #: each micro-batch gathers the parameters anew (resharded after its backward); only
    #: the reduce-scatter waits for the last one
    per_micro_batch = ("all_gather",)

    def sync_off(self) -> contextlib.AbstractContextManager:
        # the gradients' reduce-scatter stops; the parameters' all-gathers cannot (they are
        # how a sharded model computes at all), so they stay in forward and backward
        return self.no_sync()

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model  # never wrapped: compiled block by block (compiled)

    def eval_module(self) -> nn.Module:
        return self.fsdp_module()  # every rank runs it: each forward all-gathers

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.fsdp_module(), options=opts)
