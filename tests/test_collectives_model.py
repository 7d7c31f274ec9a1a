"""bench.harness.collectives: the alpha-beta fit and the ring model on synthetic times, then one
real 2-rank gloo measurement."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from pathlib import Path

import numpy as np
import pytest

from bench.harness import collectives as C

SIZES = [4096 * 4**k for k in range(6)]
ALPHA_US, BUSBW_GBPS = 25.0, 3.0


def _rows(op: str, p: int, alpha_us=ALPHA_US, busbw=BUSBW_GBPS, noise=0.0, seed=0, sizes=SIZES):
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        t = alpha_us * 1e-6 + C.bus_factor(op, p) * n / (busbw * 1e9)
        t *= 1 + rng.uniform(-noise, noise)
        rows.append({"op": op, "backend": "gloo", "device": "cpu", "world_size": p,
                     "bytes": n, "seconds": t, "calls": 10})  # fmt: skip
    return rows


def test_bus_factors() -> None:
    assert C.bus_factor("all_reduce", 2) == 1.0
    assert C.bus_factor("all_reduce", 8) == 1.75
    assert C.bus_factor("all_gather", 8) == C.bus_factor("reduce_scatter", 8) == 0.875
    assert C.bus_factor("broadcast", 8) == 1.0
    with pytest.raises(ValueError, match="unknown collective"):
        C.bus_factor("all_to_all", 2)


@pytest.mark.parametrize("p", [2, 8])
@pytest.mark.parametrize("op", C.OPS)
def test_fit_recovers_exact_model(op: str, p: int) -> None:
    fits = C.fit(_rows(op, p))
    f = fits[f"{op}/gloo/{p}"]
    assert f["alpha_us"] == pytest.approx(ALPHA_US, rel=1e-6)
    assert f["busbw_GBps"] == pytest.approx(BUSBW_GBPS, rel=1e-9)
    assert f["r2"] == pytest.approx(1.0)
    assert (f["op"], f["backend"], f["world_size"], f["points"], f["note"]) == (
        op, "gloo", p, len(SIZES), None)  # fmt: skip


@pytest.mark.parametrize("noise, tol", [(0.02, 0.05), (0.05, 0.12)])
@pytest.mark.parametrize("p", [2, 8])
@pytest.mark.parametrize("op", C.OPS)
def test_fit_with_noise(op: str, p: int, noise: float, tol: float) -> None:
    # +-noise (uniform) on each time; over 500 seeds the worst errors of busbw and alpha
    # were 3 % / 4 % at 2 % noise and 8 % / 9 % at 5 %
    rows = _rows(op, p, alpha_us=200.0, noise=noise, seed=p)
    f = C.fit(rows)[f"{op}/gloo/{p}"]
    assert f["busbw_GBps"] == pytest.approx(BUSBW_GBPS, rel=tol)
    assert f["alpha_us"] == pytest.approx(200.0, rel=tol)
    assert f["r2"] > 0.99


def test_fit_keys_split_ops_backends_and_world_sizes() -> None:
    rows = _rows("all_reduce", 2) + _rows("all_gather", 2) + _rows("all_reduce", 8, busbw=1.0)
    rows += [dict(r, backend="nccl") for r in _rows("all_reduce", 2, busbw=100.0)]
    fits = C.fit(rows)
    assert set(fits) == {"all_reduce/gloo/2", "all_gather/gloo/2", "all_reduce/gloo/8",
                         "all_reduce/nccl/2"}  # fmt: skip
    assert fits["all_reduce/gloo/8"]["busbw_GBps"] == pytest.approx(1.0)
    assert fits["all_reduce/nccl/2"]["busbw_GBps"] == pytest.approx(100.0)


def test_fit_guards() -> None:
    one = C.fit(_rows("all_reduce", 2, sizes=[4096, 4096, 4096]))["all_reduce/gloo/2"]
    assert math.isnan(one["alpha_us"]) and math.isnan(one["busbw_GBps"])
    assert "fewer than 2 distinct sizes" in one["note"]
    assert one["points"] == 3

    rows = _rows("all_gather", 2)
    times = sorted(r["seconds"] for r in rows)
    for r, t in zip(rows, reversed(times), strict=True):  # the bigger the buffer, the faster
        r["seconds"] = t
    flat = C.fit(rows)["all_gather/gloo/2"]
    assert flat["busbw_GBps"] == math.inf
    assert flat["alpha_us"] == pytest.approx(np.mean(times) * 1e6)
    assert "non-positive slope" in flat["note"]
    # a latency-only model still predicts: every size costs the latency
    assert C.predict_seconds(flat, "all_gather", 1 << 30, 2) == pytest.approx(np.mean(times))

    # noise that tilts the line below zero at zero bytes (a loaded machine read -543 us):
    # no latency is negative, nor 0 (the run said "latency 0 us"): it is not resolved (nan),
    # and the bandwidth the best line through the origin, with that line's r2
    rows = _rows("all_reduce", 2, alpha_us=0.0)
    rows[0]["seconds"] *= 0.2  # the smallest size ran fast, the largest slow
    rows[-1]["seconds"] *= 1.3
    tilted = C.fit(rows)["all_reduce/gloo/2"]
    assert math.isnan(tilted["alpha_us"]) and "latency not resolved" in tilted["note"]
    assert "crosses zero bytes at -" in tilted["note"]
    x = np.array([float(r["bytes"]) for r in rows])
    y = np.array([r["seconds"] for r in rows])
    slope = (x @ y) / (x @ x)
    assert tilted["busbw_GBps"] == pytest.approx(1 / slope / 1e9)
    r2 = 1 - ((y - slope * x) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    assert tilted["r2"] == pytest.approx(r2)
    assert math.isnan(C.predict_seconds(tilted, "all_reduce", 0, 2))  # no latency to carry


@pytest.mark.parametrize("op", C.OPS)
def test_predict_at_fitted_world_size_reproduces_the_model(op: str) -> None:
    for p in (2, 8):
        model = C.fit(_rows(op, p))[f"{op}/gloo/{p}"]
        for n in (0, 4096, 10**8):
            expected = ALPHA_US * 1e-6 + C.bus_factor(op, p) * n / (BUSBW_GBPS * 1e9)
            assert C.predict_seconds(model, op, n, p) == pytest.approx(expected, rel=1e-6)


def test_predict_hand_computed() -> None:
    # all_reduce fitted on 2 ranks: alpha 20 us = 2(2-1) steps of 10 us, busbw 2 GB/s.
    # 8 ranks, 8 MB: 2*7 steps * 10 us = 140 us, plus 2*7/8 * 8e6 B / 2e9 B/s = 7000 us
    model = C.fit(_rows("all_reduce", 2, alpha_us=20.0, busbw=2.0))["all_reduce/gloo/2"]
    assert C.predict_seconds(model, "all_reduce", 8e6, 8) == pytest.approx(7140e-6)
    # all_gather on 8 ranks from the same link: 7 steps * 10 us + 7/8 * 8e6 / 2e9 = 3570 us
    assert C.predict_seconds(model, "all_gather", 8e6, 8) == pytest.approx(3570e-6)
    # all_gather fitted on 4 ranks: alpha 30 us = 3 steps of 10 us -> all_reduce on 8 ranks
    ag4 = dict(model, op="all_gather", world_size=4, alpha_us=30.0)
    assert C.predict_seconds(ag4, "all_reduce", 8e6, 8) == pytest.approx(7140e-6)


def test_predict_busbw_override_and_one_rank() -> None:
    model = {"op": "all_reduce", "backend": "gloo", "world_size": 2,
             "alpha_us": 20.0, "busbw_GBps": 2.0}  # fmt: skip
    # a 10x faster link: the bandwidth term shrinks 10x, the latency stays
    faster = dict(model, busbw_GBps=20.0)
    assert C.predict_seconds(faster, "all_reduce", 8e6, 8) == pytest.approx(140e-6 + 700e-6)
    assert C.predict_seconds(model, "all_reduce", 8e6, 1) == 0.0
    assert C.predict_seconds(model, "reduce_scatter", 1 << 30, 1) == 0.0
    with pytest.raises(ValueError):
        C.predict_seconds(dict(model, world_size=1), "all_reduce", 8e6, 4)


def test_save_load_roundtrip(tmp_path: Path) -> None:
    rows = _rows("all_reduce", 2) + _rows("reduce_scatter", 2, sizes=[4096])
    fits = C.fit(rows)
    C.save(tmp_path / "c.json", rows, fits, {"torch": "x"})
    data = C.load(tmp_path / "c.json")
    assert data["rows"] == rows and data["meta"] == {"torch": "x"}
    assert data["fits"]["all_reduce/gloo/2"] == fits["all_reduce/gloo/2"]
    assert math.isnan(data["fits"]["reduce_scatter/gloo/2"]["busbw_GBps"])
    (tmp_path / "bad.json").write_text('{"rows": []}')
    with pytest.raises(ValueError, match="missing fits, meta"):
        C.load(tmp_path / "bad.json")


def _children() -> set[int]:
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            pids.update(int(p) for p in (task / "children").read_text().split())
    return pids


@pytest.mark.timeout(60)
def test_measure_gloo_two_ranks() -> None:
    before = _children()
    sizes = [4096, 64 << 10]
    rows = C.measure(2, "gloo", "cpu", sizes=sizes, reps=3, warmup=1, timeout_s=45)
    assert _children() == before, "a rank outlived measure()"
    assert [(r["op"], r["bytes"]) for r in rows] == [(op, n) for op in C.OPS for n in sizes]
    for r in rows:
        assert r["seconds"] > 0 and r["calls"] == 3
        assert (r["backend"], r["device"], r["world_size"]) == ("gloo", "cpu", 2)
    assert set(C.fit(rows)) == {f"{op}/gloo/2" for op in C.OPS}


def test_measure_timeout_kills_the_ranks() -> None:
    before = _children()
    # the ranks are still importing torch after half a second
    with pytest.raises(RuntimeError, match=r"timed out after 0.5 s \(ranks \[0, 1\]"):
        C.measure(2, "gloo", "cpu", sizes=[4096], reps=1, timeout_s=0.5)
    assert _children() == before


@pytest.mark.parametrize(
    "args, said",
    [
        (["--world-size", "0"], "at least 2 ranks, got 0"),
        (["--world-size", "1"], "at least 2 ranks, got 1"),
        (["--reps", "0"], "need --reps >= 1"),
        (["--warmup", "-1"], "need --reps >= 1 and --warmup >= 0"),
        (["--sizes", "-5", "4096"], "--sizes are buffer sizes in bytes"),
        (["--timeout", "0"], "--timeout must be a positive number of seconds, got 0.0"),
        (["--timeout", "nan"], "--timeout must be a positive number of seconds, got nan"),
        (["--out", "/nonexistent-parabench/c.json"], "is not a folder this process can write"),
        (["--out", "/"], "is a folder; name the JSON file to write"),
        (["--backend", "mpi"], "invalid choice: 'mpi'"),
        (["--device", "tpu"], "--device: cpu or cuda, got 'tpu'"),
        (["--backend", "nccl"], "--backend nccl moves CUDA tensors only"),
    ],
)
def test_standalone_bad_input_is_one_line_before_any_rank(args, said, capsys) -> None:
    """`python -m bench.harness.collectives` with bad input: one line and exit 2, and no
    rank started (a timeout of 0 reached torch's store as a C++ stack trace; a missing --out
    folder lost the measurement to a traceback once it had run)."""
    before = _children()
    with pytest.raises(SystemExit) as bad:
        C.main([*args, "--reps", "1"] if "--reps" not in args else args)
    assert bad.value.code == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err
    assert _children() == before


def test_nccl_ranks_past_the_gpus_are_one_line_before_any_rank(monkeypatch, capsys) -> None:
    """`--backend nccl --world-size 2` on one GPU: each rank takes GPU rank % GPUs, so both
    took GPU 0, which NCCL refuses in each rank once started (exit 1, its last log line);
    now one line and exit 2 before any rank, and gloo (which shares a GPU) still passes."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cli = argparse.ArgumentParser()
    args = ["--world-size", "2", "--device", "cuda", "--reps", "1"]
    before = _children()
    with pytest.raises(SystemExit) as bad:
        C.main([*args, "--backend", "nccl"])
    assert bad.value.code == 2
    err = capsys.readouterr().err
    assert "--world-size 2 needs 2; 1 visible here" in err and "Traceback" not in err, err
    assert _children() == before
    gloo = argparse.Namespace(
        world_size=2, backend="gloo", device="cuda", reps=1, warmup=0, sizes=[4096],
        timeout=60.0, out=None,
    )  # fmt: skip
    C._check_args(cli, gloo)  # no exit: gloo runs two ranks on one GPU


def test_rough_fits_are_named_with_their_r2(tmp_path: Path) -> None:
    """Predictions stand on each op's fit: one whose times scatter about its line (as
    gloo's do on a busy CPU: the committed reference's all_reduce, r² 0.41) is named with
    its r², where nothing said so; a clean fit, a fit with no bandwidth (not used) and a run
    without the file say nothing."""
    from bench.analysis import predict

    assert predict.rough_fits(tmp_path) == ""  # no collectives.json
    clean = _rows("all_reduce", 2)
    C.save(tmp_path / "collectives.json", clean, C.fit(clean), {})
    assert predict.rough_fits(tmp_path) == ""
    noisy = _rows("all_gather", 2, noise=0.9, seed=3, sizes=[4096, 8192, 16384] * 4)
    flat = _rows("reduce_scatter", 2, sizes=[4096])  # one size: no bandwidth, never used
    fits = C.fit(clean + noisy + flat)
    r2 = fits["all_gather/gloo/2"]["r2"]
    assert r2 < predict.ROUGH_R2
    # the run's line says so too, where it said a latency and a bandwidth as any other's
    assert C.said(fits["all_gather/gloo/2"]).endswith(f", a rough fit (r² {r2:.2f})")
    assert "rough" not in C.said(fits["all_reduce/gloo/2"])
    # one size: neither figure, and no "latency nan us"
    assert C.said(fits["reduce_scatter/gloo/2"]).startswith(
        "reduce_scatter no latency, no bus bandwidth ("
    ), C.said(fits["reduce_scatter/gloo/2"])
    C.save(tmp_path / "collectives.json", clean + noisy + flat, fits, {})
    assert predict.rough_fits(tmp_path) == (
        f"Rough fits: all_gather (gloo, 2 ranks) r² {r2:.2f}: their measured times scatter "
        "about the latency-bandwidth line the communication is predicted from, so that part "
        "of each prediction is rough (collectives.json holds the points)."
    )
