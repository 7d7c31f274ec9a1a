"""Per-rank entry point: `python -m bench.harness.worker [--spawn] CELL_SPEC.json`.

Every launcher (in-process, mp.spawn, torchrun, horovodrun) ends up here, so a rank's
work is the same whoever started it: read the cell spec, build data, model and
strategy with the cell's seed, run the epochs, and (rank 0 only) append one JSON
record per epoch to the cell directory. An exception is written to `error-rank<r>.json`
first, so the harness can say in one line why a cell failed.
"""

from __future__ import annotations

from bench.harness import proc

if __name__ in ("__main__", "__mp_main__"):  # a rank (or mp.spawn's): not the harness
    # before torch's imports, seconds long: a launcher killed during them (its harness
    # SIGKILLed as the cell started) left its ranks running on, since a parent already
    # gone when a process asks sends it no signal
    proc.die_with_parent()

import json
import math
import os
import random
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parameter import is_lazy
from torch.utils.data import DataLoader

import strategies
from bench.config import RunConfig
from bench.harness import results, slurm
from bench.harness.probes import reset_peaks
from bench.harness.progress import StepReporter
from bench.workload import data, models
from bench.workload.models import without_dropout
from strategies.base import ModelShape, RankContext, Setting, Strategy

OPTIMIZERS = {
    "sgd": lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9),
    "adam": lambda params, lr: torch.optim.Adam(params, lr=lr),
    "adamw": lambda params, lr: torch.optim.AdamW(params, lr=lr),
}


def rank_context(
    cfg: RunConfig, world_size: int, device_type: str, multiprocess: bool, shares: bool = False
) -> RankContext:
    """Local rank i drives GPU i modulo the GPUs this process sees: all of the host's, or
    only its own where the launcher binds one to each task (SLURM's --gpus-per-task or
    --gpu-bind, where every rank sees its GPU as cuda:0). `shares`: more ranks than GPUs on
    this host (--oversubscribe)."""
    env = os.environ
    rank = int(env.get("RANK", env.get("HOROVOD_RANK", 0)))
    local = int(env.get("LOCAL_RANK", env.get("HOROVOD_LOCAL_RANK", rank)))
    size = int(env.get("WORLD_SIZE", env.get("HOROVOD_SIZE", 1)))
    if multiprocess and size != world_size:
        raise RuntimeError(f"launcher started {size} ranks, the cell asked for {world_size}")
    if device_type == "cuda":
        device = torch.device(f"cuda:{local % max(1, torch.cuda.device_count())}")
    else:
        device = torch.device("cpu")
    return RankContext(
        rank=rank,
        local_rank=local,
        world_size=world_size,
        device=device,
        seed=cfg.seed,
        shares_device=shares,
    )


def multiprocess(spec: dict[str, Any]) -> bool:
    return strategies.get(spec["strategy"]).cls.multiprocess


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


#: the evaluation's batch (bench.harness.estimate times a forward at it)
EVAL_BATCH = 256


def evaluate(strategy: Strategy, dataset: Any, batch: int = EVAL_BATCH) -> dict[str, float]:
    """Held-out loss (per sample, with the training loss) and accuracy (argmax over the
    last dimension: per sample, or per token for a token model). The random state is left as
    it was: only some strategies evaluate on every rank (collective_eval), and a draw on one
    rank (the DataLoader takes a seed from torch's generator) would give its next epoch
    other dropout masks and loader seeds than the same rank has under another strategy."""
    model = strategy.eval_module()
    if model is None:
        return {}
    model.eval()
    correct, scored, loss_sum, n = 0, 0, 0.0, 0
    cuda = [d for d in strategy.devices() if d.type == "cuda"]
    with torch.no_grad(), torch.random.fork_rng(devices=cuda):
        for x, y in DataLoader(dataset, batch_size=batch):
            x, y = x.to(strategy.ctx.device), y.to(strategy.ctx.device)
            with strategy.autocast():
                out = model(x)
            loss_sum += strategy.loss_fn(out.float(), y).item() * len(y)
            n += len(y)
            if out.shape[:-1] != y.shape and out.shape[:-1].numel() == y.numel():
                y = y.reshape(out.shape[:-1])  # a label of shape (1,) per sample
            if out.shape[:-1] == y.shape:
                correct += (out.argmax(-1) == y).sum().item()
                scored += y.numel()
    model.train()
    # no held-out sample (a data set of fewer than 10): nothing measured, not a loss of 0
    accuracy = correct / scored if scored else float("nan")
    return {"eval_loss": loss_sum / n if n else float("nan"), "eval_accuracy": accuracy}


def run(spec: dict[str, Any]) -> None:
    cfg = RunConfig.from_dict(spec["config"])
    cell_dir = Path(spec["dir"])
    ws, device_type = spec["world_size"], spec["device"]
    ctx = rank_context(cfg, ws, device_type, multiprocess(spec), spec.get("shares_gpu", False))
    try:
        _run(cfg, spec, ctx, cell_dir)
    except BaseException as exc:
        write_error(cell_dir, ctx.rank, exc)
        raise


def write_error(cell_dir: Path, rank: int, exc: BaseException) -> None:
    """`error-rank<r>.json`: what this rank raised, and when. Written as it is raised, before
    the rank's teardown: a teardown that never ended (destroying a process group whose
    collective a peer never joined) left no word of the error, and the cell read as a hang
    at its --timeout. The first error a rank met is kept, not one its teardown raised
    after it."""
    path = cell_dir / f"error-rank{rank}.json"
    if path.exists():
        return
    err = {
        "rank": rank,
        "time": time.time(),
        "type": type(exc).__name__,
        "message": proc.first_line(exc),
        "oom": proc.is_oom(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }
    path.write_text(json.dumps(err))


def _run(cfg: RunConfig, spec: dict[str, Any], ctx: RankContext, cell_dir: Path) -> None:
    # start-up phases on the wall clock, against the harness's launch (PARABENCH_CELL_T0):
    # launch (launcher, interpreter, imports), rendezvous, setup (data, model, wrapping)
    marks = {"t0": float(os.environ.get("PARABENCH_CELL_T0", "nan")), "worker": time.time()}
    threads = spec["threads"]  # decided by the harness, which also set OMP_NUM_THREADS
    torch.set_num_threads(threads)
    seed_everything(cfg.seed)
    setting = Setting(**spec["setting"])
    strategy = strategies.get(spec["strategy"]).create(ctx, spec["options"], setting)
    strategy.setup_distributed()
    marks["rendezvous"] = time.time()
    try:
        _train(cfg, spec, ctx, cell_dir, strategy, marks)
    except BaseException as exc:
        write_error(cell_dir, ctx.rank, exc)  # before the teardown, which may not end
        # its traceback would keep _train's model alive through teardown: the frames' locals
        # go (the message and the traceback's lines stay)
        traceback.clear_frames(exc.__traceback__)
        raise
    finally:
        # _train's model, optimizer and loader are gone, and release drops the strategy's:
        # what holds the process group goes before the group does
        try:
            strategy.release()
        finally:
            strategy.teardown()


def train_loader(
    train: Any, sampler: Any, batch: int, workers: int, device: torch.device, seed: int
) -> DataLoader:
    """The training DataLoader of a rank whose data is not held on its device: `batch`
    samples a step in `sampler`'s order (with their epoch, where each sample's random
    transforms are seeded by it: data.keyed)."""
    return DataLoader(
        train,
        batch_size=batch,
        sampler=data.keyed(train, sampler),
        num_workers=workers,
        pin_memory=device.type == "cuda",
        drop_last=True,
        persistent_workers=workers > 0,
        # its workers' seeds from the run's seed, as the sampler's order is: drawn from
        # torch's generator, they would give the model other dropout masks than the
        # same samples get from --data-path device
        generator=torch.Generator().manual_seed(seed),
    )


#: the layers cuDNN runs as convolutions (in TF32 by default for fp32 on Ampere and later)
CONVS = tuple(getattr(torch.nn, f"Conv{t}{d}d") for t in ("", "Transpose") for d in (1, 2, 3))


def tf32_note(model: torch.nn.Module, device: torch.device | None = None) -> str:
    """What of an fp32 cell's products run in TF32 on a GPU, as torch is set now: cuDNN's
    convolutions by default, matrix products where allowed (not by default); "" where none
    does. Its row's fp32 is then TF32's 10-bit mantissa there (verify turns TF32 off).
    `device`: the cell's GPU; one older than Ampere (compute capability 8) has no TF32, and
    torch's allow_tf32 flags change nothing there (its MFU peak is fp32's: flops.peak_for)."""
    if device is not None and torch.cuda.get_device_capability(device)[0] < 8:
        return ""
    convs = any(isinstance(m, CONVS) for m in model.modules())
    parts = ["convolutions"] if convs and torch.backends.cudnn.allow_tf32 else []
    parts += ["matrix products"] if torch.backends.cuda.matmul.allow_tf32 else []
    return f"fp32 {' and '.join(parts)} in TF32 (torch.backends' allow_tf32)" if parts else ""


def _train(
    cfg: RunConfig,
    spec: dict[str, Any],
    ctx: RankContext,
    cell_dir: Path,
    strategy: Strategy,
    marks: dict[str, float],
) -> None:
    threads = spec["threads"]
    bundle = data.load(cfg)
    seed_everything(cfg.seed)  # identical initial weights for every strategy and rank
    fed = bundle.spec or models.spec(cfg)  # what one sample of input is
    model = models.build(cfg, bundle.num_classes, fed)
    # the whole model's, counted before a strategy shards or splits it: its runs.csv column
    # (none for a model with lazy layers, whose sizes its first batch decides)
    params = list(model.parameters())
    n_params = "" if any(is_lazy(p) for p in params) else sum(p.numel() for p in params)
    del params
    strategy.loss_fn = models.loss_of(model)
    if cfg.no_dropout:
        without_dropout(model)
    if cfg.no_tf32 and ctx.device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        strategy.notes.append("TF32 off: fp32 convolutions and matrix products in fp32")
    elif (
        ctx.device.type == "cuda"
        and strategy.setting.precision == "fp32"
        and (note := tf32_note(model, ctx.device))
    ):
        strategy.notes.append(note)
    model = model.to(ctx.device)
    optimizer = OPTIMIZERS[cfg.optimizer](model.parameters(), cfg.lr)
    strategy.attach(model, optimizer)
    # the model as built and its first optimizer: where the strategy made parameters of its
    # own (FSDP's and tensor parallel's shards, a pipeline rank's stages), held here they
    # kept the whole model on every rank through the epochs, in its memory figures (an FSDP
    # rank held its shard and the full model besides)
    del model, optimizer
    if cfg.save_params:
        _save_params(strategy, cell_dir / "params_init.pt")
    per_rank = strategy.per_rank_batch(cfg.global_batch)
    take = data.on_device(bundle.train, ctx.device) if cfg.data_feed != "loader" else None
    workers = 0 if take else spec["workers_per_device"] * len(strategy.devices())
    loader: Any
    if take is not None:  # in memory: on the device once, batches indexed there
        loader = data.DeviceBatches(take, strategy.sampler(bundle.train), per_rank, ctx.device)
    else:
        sampler = strategy.sampler(bundle.train)
        loader = train_loader(bundle.train, sampler, per_rank, workers, ctx.device, cfg.seed)
    if len(loader) == 0:
        raise ValueError(
            f"global batch {cfg.global_batch} is larger than the {len(bundle.train)} training samples"
        )
    steps = min(len(loader), cfg.max_steps or len(loader))
    report = StepReporter(cell_dir, cfg.epochs, steps) if ctx.rank == 0 else None
    marks["ready"] = time.time()
    for epoch in range(cfg.epochs):
        reset_peaks(strategy.devices())
        if report is not None:
            report.start_epoch(epoch)
        stats = strategy.train_epoch(
            loader,
            epoch,
            max_steps=cfg.max_steps,
            warmup_steps=cfg.warmup_steps,
            on_step=report.step if report is not None else None,
            precision=cfg.target_precision,
            step_timing=cfg.step_timing,
        )
        extra, extra_error = _cell_metrics(strategy, stats.warmup_steps)
        _peers_past_metrics(strategy, epoch, extra_error)
        probe = _probe(strategy, cfg, cell_dir) if epoch == cfg.epochs - 1 else {}
        evaluates = ctx.rank == 0 or strategy.collective_eval
        try:
            metrics = evaluate(strategy, bundle.held_out) if evaluates and cfg.eval_samples else {}
        except Exception as exc:
            # the timed steps are measured: keep them and say what failed, where rank 0
            # evaluates alone, or has alone since its last collective (a pipeline's, after
            # the weights' gather); where every rank takes part, one that failed alone would
            # leave the others waiting in the evaluation's collectives: the cell fails
            if strategy.collective_eval and not strategy.evaluating_alone:
                raise
            metrics = {"eval_error": proc.one_line(exc), "eval_oom": proc.is_oom(exc)}
            if strategy.model is not None:
                strategy.model.train()
        ranks = strategy.gather(
            {
                "rank": ctx.rank,
                "host": _host(),
                "devices": device_names(strategy.devices()),
                "samples": stats.samples,
                "timed_s": stats.timed_s,
                "step_ms_p50": _median(stats.step_times_ms[stats.warmup_steps :]),
                **stats.memory,
                **stats.model_state,
                # every rank's: a leak on one rank alone (its own buffers) is one too
                "held_growth_mib": results.held_growth(stats.held_mib, stats.warmup_steps),
                # on a CPU: what of that growth glibc's malloc holds free, no tensor's
                "malloc_free_mib": (stats.malloc_free_mib or (math.nan,))[-1],
                "malloc_free_growth_mib": results.held_growth(
                    stats.malloc_free_mib, stats.warmup_steps
                ),
                "metrics_error": extra_error,
            }
        )
        if ctx.rank == 0:
            # the first rank's failure of cell_metrics, where any rank's failed
            failed = next((r for r in ranks if r.get("metrics_error")), None)
            record = {
                "epoch": epoch,
                "steps": stats.steps,
                "warmup_steps": stats.warmup_steps,
                "step_times_ms": stats.step_times_ms,
                "data_wait_ms": stats.data_wait_ms,
                "held_mib": stats.held_mib,
                "phase_ms": stats.phase_ms,
                "probe": probe,
                "losses": stats.losses,
                "ranks": ranks,
                "per_rank_batch": per_rank,
                "tokens_per_sample": fed.tokens,
                "model_params": n_params,
                "micro_batch": strategy.micro_batch(cfg.global_batch),
                "data_ranks": strategy.data_ranks()[0],
                "extra": extra,
                "numerics": "+".join(strategy.numerics()) or "exact",
                "loader_workers": workers,
                "threads_per_rank": threads,
                "backend": getattr(strategy, "backend", ""),
                "precision": strategy.precision,
                "notes": _notes(strategy),
                "data": bundle.description,
                "data_path": "device" if take is not None else "loader",
                "startup": marks,
                "written": time.time(),
                **metrics,
            }
            if failed is not None:
                record["metrics_error"] = f"rank {failed['rank']}: {failed['metrics_error']}"
            with open(cell_dir / "epochs.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
    if cfg.save_params:
        _save_params(strategy, cell_dir / "params.pt")
        _save_replica_gaps(strategy, cell_dir / "replicas.json")
    strategy.barrier()


def _notes(strategy: Strategy) -> str:
    """The row's notes. A run_notes that raises (a plug-in's bug, or a private torch API
    that moved) costs the notes, not the steps measured before it: rank 0 alone asks,
    with no peer waiting on it, and the notes then say what it raised."""
    try:
        return "; ".join(strategy.run_notes())
    except Exception as exc:
        return strategies.raised(strategy.run_notes, exc)


def _cell_metrics(strategy: Strategy, warmup_steps: int) -> tuple[dict[str, Any], str]:
    """The strategy's own measurements of the timed steps (Strategy.cell_metrics), and what
    it raised ("" where nothing): a cell_metrics that raises (a plug-in's bug, or a
    private torch API that moved) fails the row, with its reason, and the measured steps
    are kept; where it raised on some ranks only, before a collective of its own, the cell
    ends within PEERS_PAST_S instead (_peers_past_metrics)."""
    try:
        return strategy.cell_metrics(warmup_steps), ""
    except Exception as exc:
        return {}, strategies.raised(strategy.cell_metrics, exc)


#: how long a rank whose cell_metrics raised waits to hear that every peer is past its own:
#: the ranks leave the timed steps together (their last collective), and cell_metrics is
#: small; a peer not past it by then waits in a collective of it that this rank skipped
PEERS_PAST_S = 20.0


class PeersLeftWaiting(RuntimeError):
    """A rank's cell_metrics raised where its peers wait in a collective of it."""


def _peers_past_metrics(strategy: Strategy, epoch: int, error: str) -> None:
    """Every rank says in the process group's store that it is past cell_metrics; one whose
    cell_metrics raised goes on (its row failed, the steps kept) only once every peer is
    past it too. Where one is not (it waits in a collective of cell_metrics' that this rank
    skipped, as a pipeline's gather of its bubble), going on would pair this rank's next
    collectives with the wrong ones of its peers and hang the cell to its --timeout: it
    raises instead, and the cell fails within PEERS_PAST_S with what cell_metrics raised.
    Ranks with no such store (Horovod's, one process's DataParallel) go on as they were."""
    import datetime

    import torch.distributed as dist

    if strategy.ctx.world_size < 2:
        return
    try:  # torch.distributed's ranks: the store they met through
        store = dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return
    store.set(f"parabench/cell_metrics/{epoch}/{strategy.ctx.rank}", "past")
    if not error:
        return
    peers = [f"parabench/cell_metrics/{epoch}/{r}" for r in range(strategy.ctx.world_size)]
    try:
        store.wait(peers, datetime.timedelta(seconds=PEERS_PAST_S))
    except (RuntimeError, dist.DistError):  # (DistStoreError: the wait timed out)
        raise PeersLeftWaiting(
            f"{error} (a peer, not past it within {PEERS_PAST_S:g} s, waits in a collective "
            "of it: the cell ends here)"
        ) from None


def _median(values: Any) -> float:
    return float(np.median(values)) if len(values) else float("nan")


def _probe(strategy: Strategy, cfg: RunConfig, cell_dir: Path) -> dict[str, Any]:
    """The communication probe after the last epoch's timed steps (bench.harness.breakdown): where
    ranks synchronise (more than one process), or where a trace was asked for."""
    ranks = strategy.processes(strategy.ctx.world_size)
    if strategy.last_batch is None:
        return {}
    out: dict[str, Any] = {}
    keep = cell_dir / "trace.json" if cfg.profile and strategy.ctx.rank == 0 else None
    # the timed steps are measured: a probe that fails loses only itself (where it fails on
    # one rank only, its peers wait in a collective until the process-group timeout)
    try:
        # (not under torch.compile: every batch size of the curve would be compiled anew,
        # minutes on a GPU, and then timed with the dynamic-shape kernels that follow)
        if (
            ranks == 1
            and cfg.scaling_model
            and _modelled(strategy)
            and not strategy.setting.compile
        ):
            out["compute_curve"] = strategy.compute_curve()
        if ranks > 1 or cfg.profile:
            out |= strategy.probe(cfg.probe_pairs if ranks > 1 else 0, cfg.profile_steps, keep)
    except Exception as exc:
        out["error"] = proc.one_line(exc)
    if keep is not None and keep.exists():
        out["trace"] = keep.name
    return out


def _modelled(strategy: Strategy) -> bool:
    """Whether the scaling predictor models this strategy's communication. A traffic() that
    raises (a plug-in's bug) models none, as predict then says: raised here, it read as the
    one-process row's probe failing, a probe such a row does not run."""
    shape = ModelShape(param_bytes=1, tensors=1, units=1)
    traffic = strategies.answer(strategy.traffic, strategy.options, 2, shape, strategy.precision)
    return not isinstance(traffic, str) and type(strategy).multiprocess


def _save_params(strategy: Strategy, path: Path) -> None:
    state = strategy.full_state_dict()  # on every rank: a sharded model gathers its weights
    if strategy.ctx.rank == 0:
        torch.save({k: v.detach().cpu() for k, v in state.items()}, path)


def _save_replica_gaps(strategy: Strategy, path: Path) -> None:
    """Where every rank holds the same weights (Strategy.replicated), how far each rank's
    parameters ended from rank 0's, ||w_rank - w_0|| by rank (collective): verify compares
    rank 0's with the baseline, and these say whether the others trained the same. Rank 0's
    weights reach every rank one parameter at a time, as the mean of its own (times the
    world size, in float64: exact) and everyone else's zeros; no rank holds a whole copy
    more, nor rank 0 one of each rank's."""
    if not (type(strategy).replicated and strategy.ctx.world_size > 1):
        return
    assert strategy.model is not None
    ws, first = strategy.ctx.world_size, strategy.ctx.rank == 0
    gap = 0.0
    for p in strategy.unwrap(strategy.model).parameters():
        mine = p.detach().double()
        w0 = strategy.all_mean(mine * ws if first else torch.zeros_like(mine))
        gap += (mine - w0).pow(2).sum().item()
    gaps = strategy.gather(math.sqrt(gap))
    if first:
        results.write_whole(path, json.dumps({"param_gap_by_rank": gaps}))


def _spawn_entry(index: int, spec: dict[str, Any], store: str) -> None:
    os.environ.update(
        RANK=str(index),
        LOCAL_RANK=str(index),
        WORLD_SIZE=str(spec["world_size"]),
        PARABENCH_STORE=store,
    )
    proc.die_with_parent()
    run(spec)
    _exit_now()


def _exit_now() -> None:
    """Leave without the interpreter's teardown (torch's modules take about a second to
    unload, paid by every rank of every cell): everything is written and the process group
    left by now."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def device_names(devices: list[torch.device]) -> list[str]:
    """The devices a rank drove, as its row counts them (results.measure: ranks on one
    device count it once). A GPU is named with its UUID beside its index: where the
    launcher binds one GPU to each task (SLURM's --gpus-per-task), every rank of a node sees
    its own as cuda:0, and by that name alone four ranks on four GPUs were counted as one
    GPU, their per-device throughput (and MFU) four times what each GPU did."""
    names = []
    for d in devices:
        uuid = getattr(torch.cuda.get_device_properties(d), "uuid", "") if d.type == "cuda" else ""
        names.append(f"{d} {uuid}" if uuid else str(d))
    return names


def _host() -> str:
    """This rank's host: the node the launcher says (a torchrun agent's --hosts entry,
    horovodrun's -H entry where it spans hosts, the SLURM node), else the machine's name."""
    across = int(os.environ.get("HOROVOD_CROSS_SIZE") or 1) > 1
    horovod = os.environ.get("HOROVOD_HOSTNAME", "") if across else ""
    return os.environ.get("PARABENCH_NODE") or horovod or socket.gethostname()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    spawn = argv[0] == "--spawn"
    spec = json.loads(Path(argv[-1]).read_text())
    proc.die_with_parent()
    slurm.ranks_from_slurm()  # a rank srun started: its rank from SLURM's variables
    if spawn:
        import torch.multiprocessing as mp

        # the ranks meet at a file, not a port: a free port picked here was released before
        # rank 0 bound it, and another run's process could take it in between (two runs at
        # once: a rank of either failed with "address already in use")
        with tempfile.TemporaryDirectory(prefix="parabench-spawn-") as tmp:
            store = str(Path(tmp) / "store")
            mp.spawn(_spawn_entry, args=(spec, store), nprocs=spec["world_size"], join=True)
    else:
        run(spec)
    _exit_now()


if __name__ == "__main__":
    main()
