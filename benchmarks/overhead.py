"""Harness overhead: parabench's `single` and `ddp_spawn` against minimal hand-written
loops doing the same work (same model, data, global batch, optimizer, threads, steps),
in the same run, interleaved so drift in the machine hits both alike.

    .venv/bin/python benchmarks/overhead.py [--steps 120] [--rounds 3] [--data-root DIR]

Prints samples/s of each and the ratio harness / hand-written (aim: within 2 %).
Each side runs in a fresh process; only the timed steps after warm-up are counted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# ------------------------------------------------------------------ the hand-written side
def _hand_rank(rank: int, world: int, args: dict, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler

    from bench.config import RunConfig
    from bench.data import load
    from bench.models import MnistCNN

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world))
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    data = load(RunConfig(dataset="mnist", data_root=args["data_root"])).train
    torch.manual_seed(0)
    model = MnistCNN()
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=args["batch"] // world, sampler=sampler, drop_last=True)
    it = iter(loader)
    warm, steps = args["warmup"], args["steps"]
    for i in range(warm + steps):
        if i == warm:
            t0 = time.perf_counter()
        x, y = next(it)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    elapsed = time.perf_counter() - t0
    Path(f"{out}.{rank}").write_text(
        json.dumps({"samples": steps * (args["batch"] // world), "s": elapsed})
    )
    if world > 1:
        dist.destroy_process_group()


def hand(world: int, args: dict) -> float:
    import torch.multiprocessing as mp

    from bench.proc import free_port

    with tempfile.TemporaryDirectory() as d:
        out = f"{d}/r"
        mp.spawn(_hand_rank, args=(world, args, free_port(), out), nprocs=world, join=True)
        parts = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    return sum(p["samples"] for p in parts) / max(p["s"] for p in parts)


# ------------------------------------------------------------------ the harness side
def harness(strategy: str, world: int, args: dict, out_dir: str, tag: str) -> float:
    from bench.config import RunConfig
    from bench.runner import run_matrix

    cfg = RunConfig(
        strategies=(strategy,),
        world_sizes=(world,),
        dataset="mnist",
        data_root=args["data_root"],
        global_batch=args["batch"],
        max_steps=args["warmup"] + args["steps"],
        warmup_steps=args["warmup"],
        eval_samples=0,
        device="cpu",
        out_dir=out_dir,
        run_id=tag,
    )
    _, rows = run_matrix(cfg, echo=lambda m: None)
    row = rows[0]
    if row["status"] != "ok":
        raise SystemExit(f"harness {strategy} failed: {row['reason']}")
    return float(row["samples_per_s"])


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    default_root = os.environ.get("PARABENCH_DATA_ROOT", str(ROOT.parent / "shared" / "data"))
    p.add_argument("--data-root", default=default_root)
    a = p.parse_args()
    args = {"steps": a.steps, "warmup": a.warmup, "batch": a.batch, "data_root": a.data_root}
    pairs = [("single", 1), ("ddp_spawn", 2)]
    got: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as out_dir:
        for r in range(a.rounds):
            for strategy, world in pairs:
                # alternate which side goes first, so neither always runs on a warmer machine
                order = ["hand", "harness"] if r % 2 == 0 else ["harness", "hand"]
                for side in order:
                    sps = (
                        hand(world, args)
                        if side == "hand"
                        else harness(strategy, world, args, out_dir, f"{strategy}-{r}")
                    )
                    got.setdefault(f"{side}:{strategy}", []).append(sps)
                    print(
                        f"round {r} {side:<8} {strategy:<10} ws={world} {sps:9.1f} samples/s",
                        flush=True,
                    )
    print(
        f"\n{'strategy':<10} {'ws':>3} {'hand samples/s':>15} {'harness samples/s':>18} {'ratio':>7}"
    )
    for strategy, world in pairs:
        h = statistics.median(got[f"hand:{strategy}"])
        b = statistics.median(got[f"harness:{strategy}"])
        print(f"{strategy:<10} {world:>3} {h:>15.1f} {b:>18.1f} {b / h:>7.3f}")
    print(
        f"(medians of {a.rounds} rounds, {a.steps} timed steps after {a.warmup} warm-up, "
        f"global batch {a.batch}, MNIST CNN, CPU)"
    )


if __name__ == "__main__":
    main()
