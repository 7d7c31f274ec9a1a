"""Harness overhead: parabench's `single` and `ddp_spawn` against minimal hand-written
loops doing the same work (same model, data, global batch, optimizer, threads, steps).

    .venv/bin/python benchmarks/overhead.py [--steps 120] [--min-rounds 6] [--max-minutes 20]
                                            [--width 0.02] [--data-root DIR] [--download]
                                            [--csv FILE]
                                            [--device cpu|cuda] [--data-path device|loader]

The hand-written side feeds data as the harness's row does: `--data-path device` (the
default, as the harness's `auto` for MNIST) moves the training set to the device once and
takes each batch by indexing it with the epoch's DistributedSampler order; `loader` is a
plain DataLoader (pinned memory on CUDA). On CUDA (`--device cuda`) the pairs are `single`
and `ddp_spawn` at world size 1 over nccl (two ranks on one GPU are refused by nccl; with
two GPUs or more, `ddp_spawn` runs at world size 2, one GPU per rank), and the hand-written
loop synchronises once, before its clock stops, while the harness synchronises around each
step to time it: the ratio is what that per-step timing costs. `--step-timing events` times
the harness with CUDA events instead (no synchronisation inside its loop).

Paired rounds: in each round, for each strategy, the hand-written loop and the harness run
back to back (which goes first alternates by round), and the round's ratio harness / hand
(samples/s: below 1, the harness is slower) is one sample: a machine that drifts over
minutes moves both sides of a pair alike, which unpaired medians cannot cancel. The figure
is the median ratio over rounds with its 95 % distribution-free interval (order statistics,
bench.harness.stats.median_interval; at least 6 rounds). Rounds go on until every interval
is no wider than --width (0.02: two points of ratio) or --max-minutes have passed; a line
then says the interval this machine reached. The --min-rounds come first whatever the
deadline (a line says so where it passes before them).
Each side runs in a fresh process; only the timed steps after warm-up are counted.

Last, in one process, what the harness's loop adds to every step: its loop and a bare one on
a model too small to hide either (microseconds a step, per step timing on CUDA, and as a
share of the hand-written MNIST step; the median of paired rounds with its 95 % interval,
which on a busy machine can hold zero or less), then the per-step parts of it (a step
timer's marks, the phase clock's laps, the held-memory read: microseconds a call, alone),
and what the loop adds with the laps, the held read and both switched off inside it (a part
timed alone can read far less than it costs in the loop). `--loop-cost-only` prints only
that (15 s on a 2-core CPU). On a GPU a launch-bound step shows the harness's host work one
for one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# ------------------------------------------------------------------ the hand-written side
def _hand_rank(rank: int, world: int, args: dict, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler

    from bench.config import RunConfig
    from bench.workload.data import load
    from bench.workload.models import MnistCNN

    cuda = args["device"] == "cuda"
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world))
    if args["ddp"]:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    # the harness's training set: none held out (its eval_samples=0), so both sides take
    # the same batches, and a --batch the harness's check lets through fits in this one too
    data = load(RunConfig(dataset="mnist", data_root=args["data_root"], eval_samples=0)).train
    torch.manual_seed(0)
    model = MnistCNN().to(device)
    if args["ddp"]:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if cuda else None
        )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0, drop_last=True)
    per = args["batch"] // world

    def batches():
        """Endless batches, epoch after epoch, in the sampler's order."""
        if args["feed"] == "device":  # the whole set on the device once; a batch is an index
            xs, ys = zip(*(data[i] for i in range(len(data))), strict=True)
            x_all = torch.stack(xs).to(device)
            y_all = torch.stack([torch.as_tensor(y) for y in ys]).to(device)
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            if args["feed"] == "device":
                order = torch.as_tensor(list(sampler), dtype=torch.long).to(device)
                for b in range(len(order) // per):
                    i = order[b * per : (b + 1) * per]
                    yield x_all[i], y_all[i]
            else:
                loader = DataLoader(
                    data, batch_size=per, sampler=sampler, drop_last=True, pin_memory=cuda
                )
                for x, y in loader:
                    yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            epoch += 1

    it = batches()
    warm, steps = args["warmup"], args["steps"]
    for i in range(warm + steps):
        if i == warm:
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
        x, y = next(it)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    Path(f"{out}.{rank}").write_text(json.dumps({"samples": steps * per, "s": elapsed}))
    if args["ddp"]:
        dist.destroy_process_group()


def hand(strategy: str, world: int, args: dict) -> float:
    import torch.multiprocessing as mp

    from bench.harness.proc import free_port

    args = args | {"ddp": strategy != "single"}
    with tempfile.TemporaryDirectory() as d:
        out = f"{d}/r"
        ranks = mp.spawn(_hand_rank, args=(world, args, free_port(), out), nprocs=world, join=False)
        try:
            while not ranks.join():
                pass
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM: the ranks stop too, not after their steps
            for rank in ranks.processes:
                rank.kill()
                rank.join()
            raise
        parts = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    return sum(p["samples"] for p in parts) / max(p["s"] for p in parts)


# ------------------------------------------------------------------ the harness side
def harness_config(strategy: str, world: int, args: dict, out_dir: str, tag: str) -> Any:
    """The harness's RunConfig for one side of a round."""
    from bench.config import RunConfig

    return RunConfig(
        strategies=(strategy,),
        world_sizes=(world,),
        dataset="mnist",
        data_root=args["data_root"],
        download=args.get("download", False),  # in the options' check, before any round
        global_batch=args["batch"],
        max_steps=args["warmup"] + args["steps"],
        warmup_steps=args["warmup"],
        eval_samples=0,
        device=args["device"],
        data_feed=args["feed"],
        workers=0,  # as the hand-written loop's DataLoader (the CUDA default is 4)
        step_timing=args["step_timing"],
        out_dir=out_dir,
        run_id=tag,
        # what the hand-written loop does not do either: no probes after the timed steps
        probe_pairs=0,
        profile_steps=0,
        scaling_model=False,
    )


def check(args: dict) -> str | None:
    """What is wrong with the options, as the harness says it (ConfigError: a negative
    --warmup, a batch the ranks cannot share or larger than the data, no data under
    --data-root), and more steps than an epoch has, before any round: the hand-written
    side, which goes first, would fail in its ranks with a traceback, or loop for ever on a
    batch larger than the data."""
    from bench.config import ConfigError, without_options
    from bench.harness.runner import plan
    from bench.workload.data import checked

    try:
        # the harness's advice less the options this script lacks: it times MNIST alone
        # (--dataset), and ranks past the cores time nothing worth a ratio (--oversubscribe)
        with without_options("--dataset", "--oversubscribe"):
            cfgs = {
                pair: harness_config(*pair, args, "", "check") for pair in pairs(args["device"])
            }
            # every pair trains on the same data at the same --batch: its size read once
            samples = checked(next(iter(cfgs.values())))[1]
            for (strategy, world), cfg in cfgs.items():
                plan(cfg)
                # the harness's cell stops at the epoch's end, the hand-written loop goes on into
                # the next: past it they would time different steps (the summary names --steps)
                per = args["batch"] // world
                epoch = samples // world // per
                if args["warmup"] + args["steps"] > epoch:
                    return (
                        f"--warmup {args['warmup']} + --steps {args['steps']} is more than the "
                        f"{epoch} steps of an epoch at --batch {args['batch']} ({strategy} at world "
                        f"size {world}), where the harness's cell stops; use --steps "
                        f"{max(epoch - args['warmup'], 1)} or fewer"
                    )
    except ConfigError as exc:  # in this script's words: its names for the harness's options
        said = str(exc).replace("--warmup-steps", "--warmup")
        return said.replace("--global-batch", "--batch").replace("global batch", "--batch")
    return None


def harness(strategy: str, world: int, args: dict, out_dir: str, tag: str) -> float:
    from bench.harness.runner import run_matrix

    cfg = harness_config(strategy, world, args, out_dir, tag)
    _, rows = run_matrix(cfg, echo=lambda m: None)
    row = rows[0]
    if row["status"] != "ok":
        raise SystemExit(f"harness {strategy} failed: {row['reason']}")
    return float(row["samples_per_s"])


# ------------------------------------------------------- the loop's own cost, per step
def loop_cost(
    device: str, timing: str, steps: int = 400, rounds: int = 15, without: tuple[str, ...] = ()
) -> tuple[float, float, float, float, float]:
    """Microseconds a step: as the harness's loop reports it (`Strategy.train_epoch` of
    `single`, its timer and phase laps included; the timed steps' sum over their count, the
    figure its samples/s come from) and as a bare loop doing the same work takes on the wall
    clock, in this process, on a model too small to hide either (Linear(8, 2), batch 4, the
    batch already on the device): the difference is what the harness adds to every step,
    free of the between-process drift that the paired rounds must average out. Medians over
    `rounds`, the two loops back to back in each (which goes first alternating): harness,
    bare, and the median of the rounds' differences with its 95 % interval (low, high).
    `without`: parts of the harness's loop switched off in its rounds (SWITCHABLE)."""
    import statistics

    import torch
    import torch.nn.functional as F

    from bench.harness.stats import median_interval
    from strategies.base import RankContext, Setting
    from strategies.single import Single

    dev = torch.device(device)
    torch.manual_seed(0)
    batches = [(torch.randn(4, 8, device=dev), torch.randint(0, 2, (4,), device=dev))] * steps

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def harness() -> float:
        ctx = RankContext(rank=0, local_rank=0, world_size=1, device=dev, seed=0)
        strategy = Single(ctx, {}, Setting())
        model = torch.nn.Linear(8, 2).to(dev)
        strategy.attach(model, torch.optim.SGD(model.parameters(), lr=0.01))
        stats = strategy.train_epoch(batches, 0, warmup_steps=1, step_timing=timing)
        return stats.timed_s / (stats.steps - stats.warmup_steps)

    def bare() -> float:
        model = torch.nn.Linear(8, 2).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i, (x, y) in enumerate(batches):
            if i == 1:  # as the harness: the first step is warm-up
                sync()
                t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        sync()
        return (time.perf_counter() - t0) / (steps - 1)

    times: dict[str, list[float]] = {"harness": [], "bare": []}
    with switched_off(without):
        harness(), bare()  # warm: the first of each pays for lazy initialisation
        for r in range(rounds):
            for name, fn in (("harness", harness), ("bare", bare))[:: 1 if r % 2 == 0 else -1]:
                times[name].append(fn() * 1e6)
    added, low, high = median_interval(
        [a - b for a, b in zip(times["harness"], times["bare"], strict=True)]
    )
    return statistics.median(times["harness"]), statistics.median(times["bare"]), added, low, high


#: parts of the harness's loop that can be switched off inside it, to see what each costs
#: there: timed alone (loop_parts) they can read far less (the held-memory read on an H100:
#: 18-34 us alone, about 100 us a step in the loop, 2026-11-26)
SWITCHABLE = ("phase laps", "held-memory read")


@contextlib.contextmanager
def switched_off(parts: tuple[str, ...]) -> Iterator[None]:
    """The harness's loop with `parts` (of SWITCHABLE) doing nothing, for this block: the
    phase clock's laps record no mark (each step's phases read 0), the held-memory read
    reads nothing (NaN)."""
    from bench.harness import probes

    unknown = set(parts) - set(SWITCHABLE)
    if unknown:
        raise ValueError(f"cannot switch off {sorted(unknown)}: only {SWITCHABLE}")
    saved = {name: getattr(probes.PhaseClock, name) for name in ("begin", "lap", "steps")} | {
        "held_mib": probes.held_mib
    }
    if "phase laps" in parts:

        def begin(self: Any) -> None:
            self._steps.append(None)

        def steps(self: Any) -> list[dict[str, float]]:
            return [dict.fromkeys(probes.PHASES, 0.0) for _ in self._steps]

        probes.PhaseClock.begin, probes.PhaseClock.steps = begin, steps
        probes.PhaseClock.lap = lambda self, phase: None
    if "held-memory read" in parts:
        probes.held_mib = lambda device: math.nan
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(probes if name == "held_mib" else probes.PhaseClock, name, fn)


#: what the loop does in every step beside the step's own work: (part, calls a step)
LOOP_PARTS = (("step-timer mark", 3), ("phase-clock mark", 5), ("held-memory read", 1))


def timed_parts(device: str, timing: str) -> set[str]:
    """The LOOP_PARTS inside a step's timing: all but the held-memory read, which falls
    between one step's end and the next's start, except timing by events on CUDA (a step
    there is the stream's time from its start to the next step's)."""
    every = {part for part, _ in LOOP_PARTS}
    return every if device == "cuda" and timing == "events" else every - {"held-memory read"}


def loop_parts(device: str, timing: str, calls: int = 2000, rounds: int = 7) -> dict[str, float]:
    """Microseconds one call of each of the loop's per-step parts (LOOP_PARTS) takes, alone
    in a tight loop on an idle device, the median of `rounds`: a step timer's mark (under
    "sync" on CUDA, a synchronisation with nothing queued: its latency, not the overlap a
    real step loses), a lap of the phase clock (on CUDA an event created and recorded), the
    held-memory read. Which of them the loop's added microseconds are, and what is left
    (Python around them; under "sync", the queue drained at each mark)."""
    import statistics

    import torch

    from bench.harness.probes import PhaseClock, StepTimer, held_mib

    dev = torch.device(device)
    timer, clock = StepTimer(dev, timing), PhaseClock(dev)
    clock.begin()
    parts = {
        "step-timer mark": timer.start,
        "phase-clock mark": lambda: clock.lap("forward"),
        "held-memory read": lambda: held_mib(dev),
    }
    out = {}
    for name, fn in parts.items():
        fn()  # the first call pays for lazy set-up (a file opened, CUDA's first event)
        per = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            per.append((time.perf_counter() - t0) / calls * 1e6)
        out[name] = statistics.median(per)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return out


def print_loop_cost(device: str, timings: tuple[str, ...], hand_step_us: float | None) -> None:
    """Three lines per step timing: what the harness's loop adds to each step (loop_cost),
    the per-step parts it is made of, each timed alone (loop_parts), and what it adds with
    each SWITCHABLE part, then all of them, switched off inside the loop."""
    from bench.harness.probes import SPARSE_EVERY_S

    for timing in timings:
        mine, bare, added, low, high = loop_cost(device, timing)
        each = loop_parts(device, timing)
        share = (
            f", {100 * added / hand_step_us:.1f} % of the hand-written MNIST step "
            f"above ({hand_step_us:.0f} us)"
            if hand_step_us
            else ""
        )
        print(
            f"loop cost ({device}, step timing {timing}): harness {mine:.0f} us a step, bare loop "
            f"{bare:.0f} us; the harness adds {added:.0f} us a step (median of paired "
            f"rounds, 95 % interval {low:.0f} to {high:.0f} us){share}",
            flush=True,
        )
        inside = timed_parts(device, timing)
        calls: dict[str, float] = dict(LOOP_PARTS)
        if device == "cuda" and timing == "events":  # a step ends where the next starts
            calls["step-timer mark"] = 2
        shown = {part: f"{calls[part]:g} x {part} {each[part]:.1f} us" for part, _ in LOOP_PARTS}
        every = SPARSE_EVERY_S.get(device, 0.0)
        if every * 1e6 > mine:  # lapped and read at most every `every` s: 1 step in so many
            for part in ("phase-clock mark", "held-memory read"):
                calls[part] *= mine / (every * 1e6)
                shown[part] += f" in 1 of {every * 1e6 / mine:.0f} steps"
            shown["held-memory read"] += f" (both at most every {every * 1e3:g} ms)"
        said = sum(each[part] * calls[part] for part in calls if part in inside)
        outside = [text for part, text in shown.items() if part not in inside]
        print(
            "  of which, per step: "
            + ", ".join(text for part, text in shown.items() if part in inside)
            + f" = {said:.0f} us; the rest, {added - said:.0f} us: Python around them"
            + (", and the queue each mark drains" if timing == "sync" and device == "cuda" else "")
            + (f"; between the steps' timing: {', '.join(outside)}" if outside else ""),
            flush=True,
        )
        offs = [(part,) for part in SWITCHABLE] + [SWITCHABLE]
        said = []
        for off in offs:
            _, _, left, lo, hi = loop_cost(device, timing, without=off)
            said.append(f"without {' and '.join(off)} {left:.0f} us ({lo:.0f} to {hi:.0f})")
        print("  switched off inside the loop, the harness adds: " + "; ".join(said), flush=True)


def pairs(device: str) -> tuple[tuple[str, int], ...]:
    """The (strategy, world size) pairs timed: ddp_spawn at world size 2 on a CPU and
    where there are two GPUs; on one GPU at world size 1 (nccl refuses two ranks on one)."""
    if device == "cuda":
        import torch

        return (("single", 1), ("ddp_spawn", 2 if torch.cuda.device_count() >= 2 else 1))
    return (("single", 1), ("ddp_spawn", 2))


def wide(ratios: list[float], width: float) -> bool:
    """Whether the interval is not there yet or wider than `width`."""
    from bench.harness.stats import median_interval

    _, low, high = median_interval(ratios)
    return not high - low <= width  # nan: not yet


@contextlib.contextmanager
def stop_said(
    p: argparse.ArgumentParser, rows: list[dict] | None, csv_path: str, where: str = ""
) -> Iterator[None]:
    """Ctrl-C or SIGTERM (a command limit) in the rounds, or in the loop cost after them
    (`where`): one line saying what was kept, exit 130, where it was a KeyboardInterrupt
    traceback from inside the harness, or from the loop cost's training loops. `rows`
    None: no rounds were asked for (--loop-cost-only), so none are counted."""
    from bench.harness.proc import sigterm_as_interrupt

    try:
        with sigterm_as_interrupt():
            yield
    except KeyboardInterrupt:
        kept = f"; their figures are in {csv_path}" if csv_path and rows else ""
        timed = "" if rows is None else f"; {len(rows)} pair(s) of sides timed{kept}"
        p.exit(130, f"{p.prog}: stopped{where}{timed}\n")


def write_csv(path: str, rows: list[dict]) -> None:
    """Every round's figures so far, the file rewritten whole (a few rows a round), as the
    harness writes its tables: a stop while writing leaves the rounds before it."""
    import csv

    from bench.harness.results import written_whole

    with written_whole(Path(path), newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main() -> None:
    from bench.harness.stats import median_interval

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--min-rounds", type=int, default=6, help="at least 6 give an interval")
    p.add_argument("--max-rounds", type=int, default=40)
    p.add_argument("--max-minutes", type=float, default=20.0)
    p.add_argument("--width", type=float, default=0.02, help="widest interval accepted")
    p.add_argument("--csv", default="", help="also write every round's figures here")
    default_root = os.environ.get("PARABENCH_DATA_ROOT", str(ROOT.parent / "shared" / "data"))
    p.add_argument("--data-root", default=default_root)
    p.add_argument(
        "--download", action="store_true", help="fetch MNIST into --data-root where it is not"
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--data-path",
        dest="feed",
        choices=("device", "loader"),
        default="device",
        help="how both sides feed batches (the harness's --data-path)",
    )
    p.add_argument(
        "--step-timing",
        choices=("sync", "events"),
        default="sync",
        help="the harness's --step-timing (on CUDA, events leaves out its per-step syncs)",
    )
    p.add_argument(
        "--loop-cost-only",
        action="store_true",
        help="only what the harness's loop adds to each step, in one process (seconds)",
    )
    a = p.parse_args()
    if a.min_rounds < 1 or a.max_rounds < a.min_rounds or a.steps < 1 or not a.width > 0:
        p.error("need 1 <= --min-rounds <= --max-rounds, --steps >= 1 and --width > 0")
    if not a.max_minutes >= 0:  # nan: no deadline ever passed, every round to --max-rounds
        p.error(f"--max-minutes must be 0 or more, got {a.max_minutes:g}")
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: torch sees no CUDA device here")
    # on a CPU both timings read the host clock: one line says it all
    timings = ("sync", "events") if a.device == "cuda" else ("sync",)
    if a.loop_cost_only:
        with stop_said(p, None, "", " in the loop cost"):
            print_loop_cost(a.device, timings, None)
        return
    args = {"steps": a.steps, "warmup": a.warmup, "batch": a.batch, "data_root": a.data_root}
    args |= {"device": a.device, "feed": a.feed, "step_timing": a.step_timing}
    args["download"] = a.download
    if (problem := check(args)) is not None:
        p.exit(2, f"{p.prog}: error: {problem}\n")
    if a.csv:  # a path that cannot be written is said now, not after the first round's minutes
        try:
            Path(a.csv).parent.mkdir(parents=True, exist_ok=True)
            with open(a.csv, "a"):
                pass
        except OSError as exc:
            p.exit(2, f"{p.prog}: error: --csv {a.csv}: {exc.strerror or exc}\n")
    timed = pairs(a.device)
    ratios: dict[str, list[float]] = {s: [] for s, _ in timed}
    rows: list[dict] = []
    deadline = time.monotonic() + 60 * a.max_minutes
    with (
        stop_said(p, rows, a.csv),
        tempfile.TemporaryDirectory() as out_dir,
    ):
        r = 0
        late = False  # said that the deadline passed before the rounds an interval needs
        while r < a.max_rounds:
            if r < a.min_rounds and not late and time.monotonic() > deadline:
                late = True
                print(
                    f"--max-minutes {a.max_minutes:g} passed after {r} round(s); going on to "
                    f"--min-rounds {a.min_rounds} first",
                    flush=True,
                )
            if r >= a.min_rounds and (
                time.monotonic() > deadline or not any(wide(v, a.width) for v in ratios.values())
            ):
                break
            for strategy, world in timed:
                if r >= a.min_rounds and not wide(ratios[strategy], a.width):
                    continue  # this one is precise enough: spend the time on the other
                # alternate which side goes first, so neither always runs on a warmer machine
                order = ["hand", "harness"] if r % 2 == 0 else ["harness", "hand"]
                got = {}
                for side in order:
                    got[side] = (
                        hand(strategy, world, args)
                        if side == "hand"
                        else harness(strategy, world, args, out_dir, f"{strategy}-{r}")
                    )
                ratio = got["harness"] / got["hand"]
                ratios[strategy].append(ratio)
                rows.append(
                    {"round": r, "strategy": strategy, "world_size": world, "first": order[0]}
                    | {f"{k}_samples_per_s": round(v, 2) for k, v in got.items()}
                    | {"ratio": round(ratio, 4)}
                )
                if a.csv:  # after every pair: a later round that fails or is cut off keeps these
                    write_csv(a.csv, rows)
                print(
                    f"round {r:>2} {strategy:<10} ws={world} hand {got['hand']:8.1f}  harness "
                    f"{got['harness']:8.1f} samples/s  ratio {ratio:.3f}  ({order[0]} first)",
                    flush=True,
                )
            r += 1
    print(
        f"\n{'strategy':<10} {'ws':>3} {'rounds':>6} {'median ratio':>12} {'95% interval':>16} {'width':>6}"
    )
    for strategy, world in timed:
        med, low, high = median_interval(ratios[strategy])
        band = f"{low:.3f}-{high:.3f}" if low == low else "n/a (< 6 rounds)"
        print(
            f"{strategy:<10} {world:>3} {len(ratios[strategy]):>6} {med:>12.3f} {band:>16} "
            f"{high - low:>6.3f}"
        )
        if low != low:  # nan: fewer rounds than an interval needs
            print(f"  {strategy}: no interval from {len(ratios[strategy])} rounds (it needs 6)")
        elif not high - low <= a.width:
            print(
                f"  {strategy}: this machine did not narrow the interval to {a.width:g} in "
                f"{len(ratios[strategy])} rounds (--max-minutes {a.max_minutes:g}, "
                f"--max-rounds {a.max_rounds}): the rounds' ratios scatter more than that, so "
                "the ratio is known only to within this interval"
            )
    print(
        "(ratio: the harness's samples/s over the hand-written loop's, the two back to back "
        "in each round; below 1 the harness is slower, 0.98 = 2 % fewer samples/s; "
        f"{a.steps} timed steps after "
        f"{a.warmup} warm-up, global batch {a.batch}, MNIST CNN, {a.device}, data path {a.feed}, "
        f"harness step timing {a.step_timing})"
    )
    hand_single = [row["hand_samples_per_s"] for row in rows if row["strategy"] == "single"]
    per = a.batch  # single: the whole global batch a step
    hand_step_us = 1e6 * per / sorted(hand_single)[len(hand_single) // 2] if hand_single else None
    with stop_said(p, rows, a.csv, " in the loop cost"):
        print_loop_cost(a.device, timings, hand_step_us)


if __name__ == "__main__":
    main()
