"""What a step of the run's model moves rather than computes: its parameters' bytes and
tensors, and the units FSDP shards it into (strategies/fsdp.py's own grouping), saved in
model.json beside the FLOPs as the input of `parabench predict`'s traffic model. It sits
with the harness, not with the FLOPs in the workload, because it asks a strategy."""

from __future__ import annotations

from typing import Any

from bench.workload import models
from strategies.base import ModelShape
from strategies.fsdp import ungroupable, units


def model_shape(cfg: Any, num_classes: int | None):
    """Parameter bytes, tensors, FSDP units and the root's own bytes of the run's model,
    built on the meta device (no memory, no weights)."""
    model = models.meta_model(cfg, num_classes)
    params = [p for p in model.parameters() if p.requires_grad]

    def layout(low: bool) -> tuple[int, int, int, int]:
        """(units with a unit per BatchNorm, the root's bytes, the BatchNorm layers' bytes,
        how many BatchNorm layers FSDP can group in one unit: 0 where it cannot) as FSDP
        shards the model."""
        norms, rest = units(model, low)
        inside = {id(p) for u in (*norms, *rest) for p in u.parameters()}
        norm_params = {id(p) for m in norms for p in m.parameters()}
        return (
            len(norms) + len(rest),
            sum(p.numel() * 4 for p in params if id(p) not in inside),
            sum(p.numel() * 4 for p in params if id(p) in norm_params),
            0 if ungroupable(model, norms) else len(norms),
        )

    # every BatchNorm, parameters or not: --sync-bn converts each (its statistics synced)
    norms = models.norm_layers(model)
    n, root, _, _ = layout(low=False)
    n_low, root_low, norm_bytes, n_norms = layout(low=True)
    return ModelShape(
        param_bytes=sum(p.numel() * 4 for p in params),
        tensors=len(params),
        units=n,
        root_bytes=root,
        low_units=n_low,
        low_root_bytes=root_low,
        norm_bytes=norm_bytes,
        norm_layers=n_norms,
        batch_norms=len(norms),
        batch_norm_channels=sum(m.num_features for m in norms),
        param_sizes=[p.numel() * 4 for p in params],
        # every buffer, as DDP's broadcast takes them (persistent or not)
        buffer_sizes=[
            [str(b.dtype).removeprefix("torch."), b.numel() * b.element_size()]
            for b in model.buffers()
        ],
    )
