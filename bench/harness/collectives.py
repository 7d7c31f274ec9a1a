"""Measure collectives and fit a latency-bandwidth (alpha-beta) model to the times.

`measure` starts `world_size` fresh ranks, times all_reduce / all_gather / reduce_scatter
over a range of buffer sizes and returns one row per (op, size): the median over calls of
the slowest rank's time. `fit` fits

    seconds = alpha + bus_factor(op, p) * bytes / busbw

to each op's rows by least squares, and `predict_seconds` carries a fit to another world
size or another link with the ring model (see its docstring). "bytes" is always the full
buffer n, as in nccl-tests: the reduced buffer for all_reduce, the gathered output for
all_gather and the input of reduce_scatter; each rank's chunk is n / p.

    .venv/bin/python -m bench.harness.collectives --world-size 2 --backend gloo \
        --out collectives.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench import ROOT
from bench.harness.proc import HARNESS_VAR

OPS = ("all_reduce", "all_gather", "reduce_scatter")

#: nccl-tests' bus factors, f(p): busbw = algbw * f(p) = n / t * f(p) for a buffer of n bytes
BUS_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
}

#: latency hops of the ring algorithm, h(p): all_reduce is a reduce-scatter then an all-gather;
#: a broadcast is pipelined down the ring, p - 1 hops from the root to the last rank
RING_HOPS = {
    "all_reduce": lambda p: 2 * (p - 1),
    "all_gather": lambda p: p - 1,
    "reduce_scatter": lambda p: p - 1,
    "broadcast": lambda p: p - 1,
}

DEFAULT_SIZES = tuple(4096 * 4**k for k in range(6))  # 4 KiB .. 4 MiB
DEFAULT_REPS = 15
DEFAULT_WARMUP = 3
ELEMENT_SIZE = 4  # float32


def bus_factor(op: str, p: int) -> float:
    """nccl-tests' bus factor of `op` on `p` ranks (busbw = algbw * bus factor)."""
    try:
        return float(BUS_FACTOR[op](p))
    except KeyError:
        raise ValueError(f"unknown collective {op!r}; known: {', '.join(BUS_FACTOR)}") from None


def hops(op: str, p: int) -> int:
    """Ring steps of `op` on `p` ranks: 2(p-1) for all_reduce, p-1 for the others."""
    try:
        return RING_HOPS[op](p)
    except KeyError:
        raise ValueError(f"no ring model for {op!r}; known: {', '.join(RING_HOPS)}") from None


# ---------------------------------------------------------------- measurement


def _element_count(nbytes: int, p: int) -> int:
    """float32 elements of an n-byte buffer, rounded down to a multiple of p (at least p)."""
    return max(p, nbytes // ELEMENT_SIZE // p * p)


def measure(
    world_size: int = 2,
    backend: str = "gloo",
    device: str = "cpu",
    sizes: Sequence[int] = DEFAULT_SIZES,
    ops: Sequence[str] = OPS,
    reps: int = DEFAULT_REPS,
    warmup: int = DEFAULT_WARMUP,
    timeout_s: float = 60,
) -> list[dict[str, Any]]:
    """Time `ops` on `world_size` fresh ranks for each buffer size in `sizes` (bytes).

    Each rank makes `warmup` untimed then `reps` timed calls per (op, size), after a barrier;
    a row's "seconds" is the median over the calls of the slowest rank's time for that call.
    Sizes are rounded down to a whole number of float32 elements per rank; "bytes" in the
    rows is the size measured. Every rank is gone when this returns; a rank that fails or a
    run longer than `timeout_s` kills them all and raises RuntimeError.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if reps < 1 or warmup < 0:
        raise ValueError(f"need reps >= 1 and warmup >= 0, got reps={reps}, warmup={warmup}")
    for op in ops:
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    counts = sorted({_element_count(int(s), world_size) for s in sizes})
    spec = {
        "world_size": world_size,
        "backend": backend,
        "device": device,
        "counts": counts,
        "ops": list(ops),
        "reps": reps,
        "warmup": warmup,
        "timeout_s": timeout_s,
    }
    with tempfile.TemporaryDirectory(prefix="parabench-collectives-") as tmp:
        per_rank = _run_ranks(spec, Path(tmp), timeout_s)
    rows = []
    for op in ops:
        for count in counts:
            calls = [r[op][str(count)] for r in per_rank]
            slowest = [max(ts) for ts in zip(*calls, strict=True)]
            rows.append(
                {
                    "op": op,
                    "backend": backend,
                    "device": device,
                    "world_size": world_size,
                    "bytes": count * ELEMENT_SIZE,
                    "seconds": statistics.median(slowest),
                    "calls": len(slowest),
                }
            )
    return rows


def _run_ranks(spec: dict[str, Any], tmp: Path, timeout_s: float) -> list[dict[str, Any]]:
    """Start the ranks, wait for them all, and return each rank's times."""
    import torch.distributed as dist

    p = spec["world_size"]
    # the parent only hosts the rendezvous store; port 0: the OS picks a free port
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        p,
        is_master=True,
        timeout=dt.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    # a rank that starts as this process is killed dies with it (proc.die_with_parent)
    env = {**os.environ, "OMP_NUM_THREADS": "1", HARNESS_VAR: str(os.getpid())}
    if "lo" in {name for _, name in socket.if_nameindex()}:
        # gloo picks the interface of the host name, which may not route on a sandboxed host
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    root = str(ROOT)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    procs: list[subprocess.Popen] = []
    errs = []
    try:
        for rank in range(p):
            err = open(tmp / f"rank{rank}.err", "wb")  # noqa: SIM115 - closed below
            errs.append(err)
            cmd = [sys.executable, "-m", "bench.harness.collectives", "--worker", json.dumps(spec)]
            cmd += ["--rank", str(rank), "--port", str(store.port), "--result", str(tmp)]
            procs.append(
                subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
            )
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [proc.poll() for proc in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                raise RuntimeError(
                    f"collectives measurement failed: rank {rank} exited with code {code}"
                    f": {_last_line(tmp / f'rank{rank}.err')}"
                )
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                running = [r for r, c in enumerate(codes) if c is None]
                raise RuntimeError(
                    f"collectives measurement timed out after {timeout_s:g} s"
                    f" (ranks {running} still running; killed)"
                )
            time.sleep(0.02)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.wait()
        for err in errs:
            err.close()
        del store
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(p)]


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    return lines[-1].strip() if lines else "no error output"


def _worker(spec: dict[str, Any], rank: int, port: int, result_dir: Path) -> None:
    """One rank: time every (op, size) and write the per-call times to rank<r>.json."""
    from bench.harness.proc import die_with_parent

    die_with_parent()  # a parent killed with SIGKILL leaves no rank behind
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    p = spec["world_size"]
    timeout = dt.timedelta(seconds=spec["timeout_s"])
    if spec["device"].startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(f"rank {rank}: no CUDA device visible")
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device(spec["device"])
    store = dist.TCPStore("127.0.0.1", port, p, is_master=False, timeout=timeout)
    dist.init_process_group(
        spec["backend"],
        store=store,
        rank=rank,
        world_size=p,
        timeout=timeout,
        device_id=dev if dev.type == "cuda" else None,
    )

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    times: dict[str, dict[str, list[float]]] = {}
    for op in spec["ops"]:
        times[op] = {}
        for count in spec["counts"]:
            call = _collective(op, count, p, dev)
            dist.barrier()
            for _ in range(spec["warmup"]):
                call()
            sync()
            ts = []
            for _ in range(spec["reps"]):
                t0 = time.perf_counter()
                call()
                sync()
                ts.append(time.perf_counter() - t0)
            times[op][str(count)] = ts
            del call
    dist.barrier()
    dist.destroy_process_group()
    out = result_dir / f"rank{rank}.json"
    tmp = out.with_suffix(".part")
    tmp.write_text(json.dumps(times))
    tmp.replace(out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skips a second or so of module teardown


def _collective(op: str, count: int, p: int, dev: Any):
    """A no-argument call of `op` on a buffer of `count` float32 elements (chunk count/p)."""
    import torch
    import torch.distributed as dist

    # Both tensor forms run on gloo with torch 2.15 (checked), so no list-form fallback.
    if op == "all_reduce":
        buf = torch.zeros(count, device=dev)
        return lambda: dist.all_reduce(buf)
    if op == "all_gather":
        inp, out = torch.zeros(count // p, device=dev), torch.zeros(count, device=dev)
        return lambda: dist.all_gather_into_tensor(out, inp)
    if op == "reduce_scatter":
        inp, out = torch.zeros(count, device=dev), torch.zeros(count // p, device=dev)
        return lambda: dist.reduce_scatter_tensor(out, inp)
    raise ValueError(f"unknown collective {op!r}")


# ---------------------------------------------------------------- model


def fit(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Least-squares alpha-beta fit per "op/backend/world_size" of measured rows.

    Fits seconds = alpha + bus_factor(op, p) * bytes / busbw. Each entry: op, backend,
    world_size, alpha_us, busbw_GBps (1e9 bytes/s), r2, points and note. note is None for
    a good fit; otherwise it says why the numbers are partial: with fewer than 2 distinct
    sizes alpha, busbw and r2 are nan; when the times do not grow with size (slope <= 0)
    busbw is inf and alpha is the mean time (a latency-bound fit); a latency that comes out
    below 0 is not resolved (nan: the noise is larger than it), busbw the least-squares fit
    through the origin and r2 that line's.
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        key = f"{row['op']}/{row['backend']}/{row['world_size']}"
        groups.setdefault(key, []).append(row)
    fits = {}
    for key, group in groups.items():
        op, backend, p = group[0]["op"], group[0]["backend"], int(group[0]["world_size"])
        x = np.array([bus_factor(op, p) * float(r["bytes"]) for r in group])
        y = np.array([float(r["seconds"]) for r in group])
        entry: dict[str, Any] = {
            "op": op,
            "backend": backend,
            "world_size": p,
            "alpha_us": math.nan,
            "busbw_GBps": math.nan,
            "r2": math.nan,
            "points": len(group),
            "note": None,
        }
        fits[key] = entry
        if len(set(x.tolist())) < 2:
            entry["note"] = "fewer than 2 distinct sizes: alpha and busbw undetermined"
            continue
        (alpha, slope), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(x), x]), y, rcond=None)
        if slope <= 0:
            alpha, slope = float(y.mean()), 0.0
            entry["note"] = "non-positive slope: time does not grow with size, busbw unresolved"
        elif alpha < 0:  # noise on the large sizes tilts the line below zero at zero bytes
            # no latency is negative, nor 0: it is smaller than the noise, and said so, not
            # written as a latency of 0 us that a prediction would carry to more ranks
            entry["note"] = (
                f"latency not resolved: the line fitted crosses zero bytes at "
                f"{alpha * 1e6:.0f} us (noise); busbw from the best line through the origin"
            )
            alpha, slope = math.nan, float(x @ y / (x @ x))  # least squares through the origin
        pred = (0.0 if math.isnan(alpha) else alpha) + slope * x
        ss_res = float(((y - pred) ** 2).sum())
        ss_tot = float(((y - y.mean()) ** 2).sum())
        entry["alpha_us"] = float(alpha) * 1e6
        entry["busbw_GBps"] = 1 / float(slope) / 1e9 if slope > 0 else math.inf
        entry["r2"] = 1 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else math.nan)
    return fits


#: a fit whose line explains less of its times' variance than this is rough
ROUGH_R2 = 0.8


def said(fit: dict[str, Any]) -> str:
    """A fit in words for the run's line: its latency and bus bandwidth, or why either is
    missing (predict uses neither), and its r2 where the fit is rough. A latency not
    resolved is not "0 us": the noise hid it, and the line said a latency of nothing."""
    alpha, bw, r2 = fit["alpha_us"], fit["busbw_GBps"], float(fit.get("r2", math.nan))
    if not math.isfinite(bw):
        # a fit whose times did not grow with size has no bandwidth (inf in the file): "inf
        # GB/s" read as a link without limit, where the machine was too noisy to tell
        latency = f"latency {alpha:.0f} us" if math.isfinite(alpha) else "no latency"
        return f"{fit['op']} {latency}, no bus bandwidth ({fit['note']}; predict does not use it)"
    if not math.isfinite(alpha):
        return (
            f"{fit['op']} latency not resolved (the line fitted to its times crosses zero "
            f"bytes below 0 us: noise), bus bandwidth {bw:.2f} GB/s through the origin, "
            f"r² {r2:.2f}; predict does not use this fit"
        )
    rough = f", a rough fit (r² {r2:.2f})" if r2 < ROUGH_R2 else ""
    return f"{fit['op']} latency {alpha:.0f} us, bus bandwidth {bw:.2f} GB/s{rough}"


def predict_seconds(
    model: dict[str, Any],
    op: str,
    nbytes: float,
    world_size: int,
) -> float:
    """Time of `op` on an `nbytes` buffer over `world_size` ranks, from a `fit` entry.

    The ring (alpha-beta) model of Thakur, Rabenseifner and Gropp, "Optimization of
    Collective Communication Operations in MPICH" (2005), written with nccl-tests' bus
    bandwidth:

        all_reduce:                   t = 2(p-1) * a + 2(p-1)/p * n / B
        all_gather, reduce_scatter:   t =  (p-1) * a +  (p-1)/p * n / B
        broadcast (pipelined):        t =  (p-1) * a +           n / B

    a is the latency of one ring step and B the bus bandwidth, both properties of the link
    and so carried over from the fit: a = alpha_fit / h(p_fit), where h is the fitted op's
    step count (2(p-1) for all_reduce, p-1 for the others), and B is the fitted busbw (a
    what-if link is a fit with its figures in place: bench.analysis.predict). `op` may
    differ from the fitted op. One rank moves nothing: p == 1 gives 0.0.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if world_size == 1:
        return 0.0
    p_fit = int(model["world_size"])
    if p_fit < 2:
        raise ValueError("a fit on one rank has no per-step latency to carry over")
    alpha_step = model["alpha_us"] * 1e-6 / hops(model["op"], p_fit)
    busbw = model["busbw_GBps"]
    transfer = bus_factor(op, world_size) * nbytes / (busbw * 1e9) if busbw != math.inf else 0.0
    return hops(op, world_size) * alpha_step + transfer


# ---------------------------------------------------------------- files and CLI


def save(path: str | Path, rows: list[dict], fits: dict[str, dict], meta: dict) -> None:
    """Write rows, fits and meta as JSON (nan / inf as NaN / Infinity, as json does)."""
    from bench.harness.results import write_whole

    # whole or not at all: a run's --resume measures again only where there is none
    write_whole(Path(path), json.dumps({"rows": rows, "fits": fits, "meta": meta}, indent=1))


def load(path: str | Path) -> dict[str, Any]:
    """{"rows", "fits", "meta"} as written by `save`."""
    data = json.loads(Path(path).read_text())
    missing = {"rows", "fits", "meta"} - set(data)
    if missing:
        raise ValueError(f"{path}: not a collectives file (missing {', '.join(sorted(missing))})")
    return data


def _table(rows: list[dict], fits: dict[str, dict]) -> str:
    lines = [f"{'op':<16}{'bytes':>10}{'time (us)':>12}{'algbw (GB/s)':>14}{'busbw (GB/s)':>14}"]
    for r in rows:
        algbw = r["bytes"] / r["seconds"] / 1e9
        busbw = algbw * bus_factor(r["op"], r["world_size"])
        lines.append(
            f"{r['op']:<16}{r['bytes']:>10}{r['seconds'] * 1e6:>12.1f}{algbw:>14.3f}{busbw:>14.3f}"
        )
    lines.append("")
    lines.append(f"{'fit':<24}{'alpha (us)':>12}{'busbw (GB/s)':>14}{'r2':>8}  note")
    for key, f in fits.items():
        lines.append(
            f"{key:<24}{f['alpha_us']:>12.1f}{f['busbw_GBps']:>14.3f}{f['r2']:>8.3f}"
            f"  {f['note'] or ''}".rstrip()
        )
    return "\n".join(lines)


def _check_args(cli: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Bad input is one line and exit 2 before any rank starts: a timeout of 0 reached
    torch's store as a C++ stack trace, and an --out folder that is not there lost the
    measurement, after it ran, to a traceback."""
    if a.world_size < 2:
        cli.error(f"--world-size: a collective needs at least 2 ranks, got {a.world_size}")
    if a.reps < 1 or a.warmup < 0:
        cli.error(f"need --reps >= 1 and --warmup >= 0, got {a.reps} and {a.warmup}")
    if any(s < 1 for s in a.sizes):
        cli.error(f"--sizes are buffer sizes in bytes, at least 1, got {a.sizes}")
    if not (a.timeout > 0 and math.isfinite(a.timeout)):
        cli.error(f"--timeout must be a positive number of seconds, got {a.timeout}")
    # an unknown device, or NCCL off CUDA, failed in each rank once started (exit 1)
    if a.device not in ("cpu", "cuda"):
        cli.error(f"--device: cpu or cuda, got {a.device!r}")
    if a.backend == "nccl" and a.device != "cuda":
        cli.error("--backend nccl moves CUDA tensors only: pass --device cuda")
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            cli.error("--device cuda: no CUDA device is visible here")
        # each rank takes GPU rank % GPUs (_worker): past them two ranks share one, which
        # NCCL refuses ("Duplicate GPU detected") in every rank, once they have started
        gpus = torch.cuda.device_count()
        if a.backend == "nccl" and a.world_size > gpus:
            cli.error(
                f"--backend nccl: one GPU per rank, and --world-size {a.world_size} needs "
                f"{a.world_size}; {gpus} visible here (NCCL refuses two ranks on one GPU; "
                "gloo shares one)"
            )
    if a.out:
        out = Path(a.out)
        if out.is_dir():
            cli.error(f"--out {a.out} is a folder; name the JSON file to write")
        if not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
            cli.error(f"--out {a.out}: {out.parent} is not a folder this process can write to")


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(
        prog=".venv/bin/python -m bench.harness.collectives",
        description="time collectives on fresh ranks and fit latency + bus bandwidth",
    )
    cli.add_argument("--world-size", type=int, default=2)
    cli.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    cli.add_argument("--device", default="cpu", help="cpu, or cuda (a GPU per rank)")
    cli.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    cli.add_argument("--sizes", nargs="+", type=int, default=list(DEFAULT_SIZES), help="bytes")
    cli.add_argument("--reps", type=int, default=DEFAULT_REPS)
    cli.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    cli.add_argument("--timeout", type=float, default=60, help="seconds for the whole run")
    cli.add_argument("--out", help="write rows, fits and meta to this JSON file")
    # one rank of a measurement, started by measure()
    cli.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)
    cli.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    cli.add_argument("--port", type=int, help=argparse.SUPPRESS)
    cli.add_argument("--result", help=argparse.SUPPRESS)
    a = cli.parse_args(argv)
    if a.worker:
        _worker(json.loads(a.worker), a.rank, a.port, Path(a.result))
        return 0
    _check_args(cli, a)
    t0 = time.perf_counter()
    try:
        rows = measure(
            a.world_size, a.backend, a.device, a.sizes, a.ops, a.reps, a.warmup, a.timeout
        )
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - t0
    fits = fit(rows)
    print(_table(rows, fits))
    print(f"\n{a.world_size} ranks, {a.backend} on {a.device}: measured in {elapsed:.1f} s")
    if a.out:
        import torch

        meta = {
            "torch": torch.__version__,
            "host": socket.gethostname(),
            "reps": a.reps,
            "warmup": a.warmup,
            "elapsed_s": elapsed,
            "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
        save(a.out, rows, fits, meta)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
