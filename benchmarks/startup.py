"""What the harness adds to a cell's start-up and teardown, over the bare launcher.

    .venv/bin/python benchmarks/startup.py [--world-size 2] [--repeats 3]
                                           [--out results/startup] [--timeout 300]

For each launcher (in-process, mp.spawn, torchrun, horovodrun where built) it times, on
the wall clock, a bare script that only imports torch, joins a gloo process group and
leaves it, and a harness cell of the same launcher that trains one step of the MNIST CNN
on synthetic data; the harness's share is its launch + rendezvous + teardown (the rows'
`startup_launch_s`, `startup_rendezvous_s`, `teardown_s`), without the data and model
set-up and the step, which any training script pays too. Prints a table and writes it as
startup.csv.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import psutil

BARE = """
import os, sys
import torch
import torch.distributed as dist

def join(rank, world):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mode, world = sys.argv[1], int(sys.argv[2])
    if mode == "spawn":
        import torch.multiprocessing as mp
        os.environ["MASTER_PORT"] = sys.argv[3]
        mp.spawn(join, args=(world,), nprocs=world, join=True)
    elif mode == "torchrun":
        join(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    elif mode == "horovodrun":
        import horovod.torch as hvd
        hvd.init()
        hvd.shutdown()
"""


def bare(launcher: str, world: int, script: Path, timeout_s: float = 300.0) -> float:
    from bench.harness import launchers, proc
    from bench.harness.runner import launcher_free, on_loopback

    py = sys.executable
    argv = {
        "inprocess": [py, "-c", "import torch"],
        "spawn": [py, str(script), "spawn", str(world), str(proc.free_port())],
        "torchrun": [py, "-m", "torch.distributed.run", "--standalone", "--nnodes=1"]
        + [f"--nproc-per-node={world}", str(script), "torchrun", str(world)],
    }
    if launcher == "horovodrun":
        exe = launchers.horovodrun_path()
        argv["horovodrun"] = [exe, "--gloo", "-np", str(world), "-H", f"localhost:{world}"]
        argv["horovodrun"] += [py, str(script), "horovodrun", str(world)]
    # as the harness's cells: no rendezvous variables of the user's (a MASTER_ADDR of a
    # cluster's would have the bare ranks meet there), gloo on the loopback
    env = on_loopback(launcher_free(os.environ))
    t0 = time.time()
    # In a session of its own, so a launcher that hangs (ranks that never meet) is killed
    # with its ranks after timeout_s, as a harness cell is, and an interrupt leaves none
    launched = subprocess.Popen(
        argv[launcher],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = launched.communicate(timeout=timeout_s)
    except BaseException as exc:
        stdout, stderr = _kill(launched)
        if not isinstance(exc, subprocess.TimeoutExpired):
            raise
        raise SystemExit(
            f"bare {launcher} did not finish in {timeout_s:g} s (killed; --timeout): "
            f"{_why(stderr + stdout)}"
        ) from None
    elapsed = time.time() - t0
    if launched.returncode != 0:  # as a harness cell that fails: why, in one line
        raise SystemExit(
            f"bare {launcher} failed (exit {launched.returncode}): {_why(stderr + stdout)}"
        )
    return elapsed


def _kill(launched: subprocess.Popen) -> tuple[str, str]:
    """Kill the launcher and every process under it (torchrun starts each rank in a session
    of its own, which killing the launcher's session would miss); what they had written."""
    from bench.harness import proc

    with contextlib.suppress(psutil.Error):
        for p in psutil.Process(launched.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                p.kill()
    proc.signal_group(launched.pid, signal.SIGKILL)
    try:
        return launched.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # a grandchild holding the pipes, past our reach
        launched.kill()
        return "", ""


def _why(text: str) -> str:
    """The last Python error the ranks wrote (torchrun closes with a summary of rules and
    fields after it; horovodrun prefixes a rank's lines), else their last line."""
    errors = re.findall(r"^(?:\[\d+,\d+\]<\w+>:)?\s*([\w.]+(?:Error|Exception): \S.*)$", text, re.M)
    lines = text.strip().splitlines()
    return errors[-1].strip() if errors else lines[-1] if lines else "no output"


STRATEGY = {
    "inprocess": "single",
    "spawn": "ddp_spawn",
    "torchrun": "ddp_torchrun",
    "horovodrun": "horovod",
}


def harness_config(launcher: str, world: int, out: Path, repeats: int) -> Any:
    from bench.config import RunConfig

    ranks = 1 if launcher == "inprocess" else world
    batch = 4 * max(2, ranks)  # 4 samples a rank: every world size shares it evenly
    return RunConfig(
        strategies=(STRATEGY[launcher],),
        world_sizes=(ranks,),
        dataset="synthetic",
        model="mnist_cnn",
        global_batch=batch,
        max_steps=1,
        warmup_steps=0,
        eval_samples=0,
        limit=8 * batch,
        repeats=repeats,
        device="cpu",
        out_dir=str(out),
    )


def harness(launcher: str, world: int, out: Path, repeats: int) -> pd.DataFrame:
    from bench.harness.runner import run_matrix

    run_dir, _ = run_matrix(harness_config(launcher, world, out, repeats), echo=lambda m: None)
    rows = pd.read_csv(run_dir / "runs.csv")
    ok = rows[rows["status"] == "ok"]
    if ok.empty:  # no figure to take: say why, not a row of NaN
        raise SystemExit(f"harness cell of {launcher} failed: {rows['reason'].iloc[0]}")
    return ok


def main(argv: list[str] | None = None) -> int:
    import strategies

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="results/startup")
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds a bare launcher may take before it is killed with its ranks (default 300)",
    )
    a = p.parse_args(argv)
    if not a.timeout > 0:
        p.exit(2, f"{p.prog}: error: --timeout must be more than 0 seconds, got {a.timeout:g}\n")
    for name, value in (("--world-size", a.world_size), ("--repeats", a.repeats)):
        if value < 1:
            p.exit(2, f"{p.prog}: error: {name} must be at least 1, got {value}\n")
    out = Path(a.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        p.exit(2, f"{p.prog}: error: --out {a.out}: {exc.strerror or exc}\n")
    launchers = ["inprocess", "spawn", "torchrun"]
    if strategies.get("horovod").unavailable("cpu") is None:
        launchers.append("horovodrun")
    from bench.config import ConfigError, without_options
    from bench.harness.runner import plan

    # what the harness would refuse (a world size past the cores), before any timing, less
    # its advice of --oversubscribe, an option not here
    try:
        with without_options("--oversubscribe"):
            for launcher in launchers:
                plan(harness_config(launcher, a.world_size, out, a.repeats))
    except ConfigError as exc:
        p.exit(2, f"{p.prog}: error: {exc}\n")
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "bare.py"
        script.write_text(BARE)
        for launcher in launchers:
            world = 1 if launcher == "inprocess" else a.world_size
            bare_s = statistics.median(
                bare(launcher, world, script, a.timeout) for _ in range(a.repeats)
            )
            rows = harness(launcher, a.world_size, out / "runs", a.repeats)
            own = rows["startup_launch_s"] + rows["startup_rendezvous_s"] + rows["teardown_s"]
            table.append(
                {
                    "launcher": launcher,
                    "world_size": world,
                    "bare_s": bare_s,
                    "harness_launch_s": rows["startup_launch_s"].median(),
                    "harness_rendezvous_s": rows["startup_rendezvous_s"].median(),
                    "harness_teardown_s": rows["teardown_s"].median(),
                    "harness_s": own.median(),
                    "harness_over_bare_s": own.median() - bare_s,
                    "setup_s": rows["startup_setup_s"].median(),
                    "cell_wall_s": rows["cell_wall_s"].median(),
                }
            )
    df = pd.DataFrame(table)
    df.to_csv(out / "startup.csv", index=False)
    print(df.round(2).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
