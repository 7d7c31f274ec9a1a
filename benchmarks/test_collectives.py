"""Collective latency and bus bandwidth between two ranks, measured with pytest-benchmark:
all_reduce, all_gather (all_gather_into_tensor) and reduce_scatter (reduce_scatter_tensor).

Rank 0 is the benchmark process itself, so pytest-benchmark times real collective calls;
rank 1 is this file run as a script in a subprocess. The peer cannot know how many calls
pytest-benchmark's calibration will make, so the end of a measurement travels in-band: all
buffers hold zeros, and rank 0 ends a size with one more call after writing a 1 where the
peer will see it in its own output (see `Collective.end_mark`). Nothing but the collective
runs in the timed loop.

"bytes" is the full buffer n, as in nccl-tests: the reduced buffer of all_reduce, the
gathered output of all_gather, the input of reduce_scatter (each rank's chunk is n / p).
Bus bandwidth as nccl-tests define it: algbw = n / time, busbw = algbw * bus factor, with
2(p-1)/p for all_reduce and (p-1)/p for all_gather and reduce_scatter, which makes the
numbers comparable with the link's peak whatever the op and world size (see
bench/harness/collectives.py, which also fits a latency + bandwidth model to such times). Both go
into `benchmark.extra_info` (stored with --benchmark-autosave) and are printed at the end
of the session (see conftest.py).

    pytest benchmarks --benchmark-autosave --benchmark-compare
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist

from bench.harness.collectives import OPS, bus_factor
from bench.harness.proc import HARNESS_VAR, die_with_parent

WORLD_SIZE = 2
SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]  # bytes: 4 KiB .. 16 MiB
DTYPE = torch.float32
WARMUP_CALLS = 3  # untimed calls per size: gloo sets up its buffers on first use
TIMEOUT = dt.timedelta(seconds=60)  # a dead peer fails the benchmark instead of hanging it
HEADER_STOP = 1  # header[1]: the session is over; header = [bytes, stop, op index]


def _size_id(nbytes: int) -> str:
    return f"{nbytes >> 20}MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10}KiB"


def bus_bandwidth(
    nbytes: int, seconds: float, world_size: int, op: str = "all_reduce"
) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes) of `op` on an `nbytes` buffer, nccl-tests' way."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * bus_factor(op, world_size)


def _loopback_env() -> None:
    # gloo picks the interface of the host name, which may not route on a sandboxed host
    names = {name for _, name in socket.if_nameindex()}
    if "lo" in names:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Collective:
    """One op on an `nbytes` buffer of zeros: the call, and the in-band end-of-size mark.

    Rank 0 calls `end_mark` and then the collective once more; each peer calls `ended`
    after every call. Where rank 0's 1 lands:
      all_reduce      the last element of the buffer: the sum has it on every rank;
      all_gather      the last element of rank 0's input chunk: every rank gathers it into
                      the last element of chunk 0 of its output;
      reduce_scatter  the last element of every other rank's chunk of rank 0's input: rank
                      r's output is the sum of chunk r of all inputs, so its last element.
    Outputs are overwritten by every call and the inputs stay zero until the mark, so a
    peer never sees a mark early.
    """

    def __init__(self, op: str, nbytes: int, device: torch.device) -> None:
        n = nbytes // torch.tensor([], dtype=DTYPE).element_size()
        self.op, self.chunk = op, n // WORLD_SIZE

        def zeros(k: int) -> torch.Tensor:
            return torch.zeros(k, dtype=DTYPE, device=device)

        if op == "all_reduce":
            self.input = self.output = zeros(n)
        elif op == "all_gather":
            self.input, self.output = zeros(self.chunk), zeros(n)
        elif op == "reduce_scatter":
            self.input, self.output = zeros(n), zeros(self.chunk)
        else:
            raise ValueError(f"unknown collective {op!r}")
        self.call = {
            "all_reduce": lambda: dist.all_reduce(self.output),
            "all_gather": lambda: dist.all_gather_into_tensor(self.output, self.input),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(self.output, self.input),
        }[op]
        # the peer's gap between calls delays rank 0's next call: keep its check cheap
        self._seen = self.output.numpy() if device.type == "cpu" else self.output
        self._seen_at = self.chunk - 1 if op == "all_gather" else -1

    def end_mark(self) -> None:
        """Rank 0: make the next call show every peer the end of this size."""
        if self.op == "reduce_scatter":
            self.input[2 * self.chunk - 1 :: self.chunk] = 1  # chunks 1 .. p-1
        else:
            self.input[-1] = 1

    def ended(self) -> bool:
        """Peer: did the last call carry rank 0's end mark?"""
        return float(self._seen[self._seen_at]) != 0


# ---------------------------------------------------------------- rank 1 (subprocess)


def peer(port: int, backend: str, device: str) -> None:
    """Rank 1: reduce whatever size rank 0 announces, until rank 0 says stop."""
    _loopback_env()
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, WORLD_SIZE, is_master=False, timeout=TIMEOUT)
    dist.init_process_group(
        backend,
        store=store,
        rank=1,
        world_size=WORLD_SIZE,
        timeout=TIMEOUT,
        device_id=_device_id(device),
    )
    dev = torch.device(device)
    _handshake(1, dev)
    header = torch.zeros(3, dtype=torch.int64, device=dev)
    try:
        while True:
            header.zero_()
            dist.all_reduce(header)
            nbytes, stop, op = header.tolist()
            if stop:
                return
            coll = Collective(OPS[op], nbytes, dev)
            while True:
                coll.call()
                if coll.ended():
                    break
    finally:
        dist.destroy_process_group()


def _handshake(rank: int, device: torch.device) -> None:
    """One checked all_reduce: proof that the peer takes part and the sum is right."""
    probe = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(probe)
    expected = WORLD_SIZE * (WORLD_SIZE + 1) / 2  # 1 + 2 + ... + world size
    if not torch.all(probe == expected):
        raise RuntimeError(f"all_reduce returned {probe.tolist()}, expected {expected}")


def _device_id(device: str) -> torch.device | None:
    return torch.device(device) if device.startswith("cuda") else None


# ---------------------------------------------------------------- rank 0 (this process)


@dataclass
class Pair:
    backend: str
    device: torch.device
    proc: subprocess.Popen

    def _header(self, nbytes: int, stop: int = 0, op: int = 0) -> None:
        header = torch.tensor([nbytes, stop, op], dtype=torch.int64, device=self.device)
        dist.all_reduce(header)

    def measure(self, benchmark, op: str, nbytes: int) -> dict[str, Any]:
        """Benchmark `op` on `nbytes`; the peer follows however many calls it takes."""
        self._header(nbytes, op=OPS.index(op))
        coll = Collective(op, nbytes, self.device)

        def collective() -> None:
            coll.call()
            _sync(self.device)  # NCCL only enqueues; time the completed collective

        try:
            for _ in range(WARMUP_CALLS):
                collective()
            benchmark(collective)
        finally:
            coll.end_mark()  # ends the peer's loop for this size
            coll.call()
        return self._record(benchmark, op, nbytes)

    def _record(self, benchmark, op: str, nbytes: int) -> dict[str, Any]:
        info = {
            "op": op,
            "backend": self.backend,
            "device": self.device.type,
            "world_size": WORLD_SIZE,
            "message_bytes": nbytes,
            "dtype": str(DTYPE).removeprefix("torch."),
        }
        if benchmark.stats is not None:  # None under --benchmark-disable
            median = benchmark.stats.stats.median
            algbw, busbw = bus_bandwidth(nbytes, median, WORLD_SIZE, op)
            info.update(latency_us_median=median * 1e6, algbw_GBps=algbw, busbw_GBps=busbw)
        benchmark.extra_info.update(info)
        return info

    def close(self) -> None:
        try:
            self._header(0, HEADER_STOP)
        finally:
            dist.destroy_process_group()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


#: backend -> (rank 0's device, rank 1's device)
BACKENDS = {"gloo": ("cpu", "cpu"), "nccl": ("cuda:0", "cuda:1")}


def _start_peer(port: int, backend: str, device: str) -> subprocess.Popen:
    """Rank 1, this file as a script. It dies with this process (proc.die_with_parent): a
    pytest killed (SIGTERM from a CI limit, SIGKILL) before the peer reached the store left
    it retrying to connect there for minutes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", HARNESS_VAR: str(os.getpid())}
    argv = [sys.executable, __file__, "--port", str(port), "--backend", backend]
    return subprocess.Popen([*argv, "--device", device], env=env)


def _start_pair(backend: str) -> Pair:
    own, other = BACKENDS[backend]
    _loopback_env()
    # port 0: the OS picks a free one; the peer learns it from its command line
    store = dist.TCPStore(
        "127.0.0.1", 0, WORLD_SIZE, is_master=True, timeout=TIMEOUT, wait_for_workers=False
    )
    proc = _start_peer(store.port, backend, other)
    try:
        dist.init_process_group(
            backend,
            store=store,
            rank=0,
            world_size=WORLD_SIZE,
            timeout=TIMEOUT,
            device_id=_device_id(own),
        )
    except Exception:
        proc.kill()
        proc.wait()
        raise
    _handshake(0, torch.device(own))
    return Pair(backend, torch.device(own), proc)


def _skip_reason(backend: str) -> str | None:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "nccl" and gpus < WORLD_SIZE:
        return f"nccl needs {WORLD_SIZE} GPUs (NCCL refuses two ranks on one GPU); found {gpus}"
    return None


# Module-scoped and parametrised: pytest finishes every size on one backend and closes that
# pair (and its default process group) before it starts the next backend's.
@pytest.fixture(scope="module", params=list(BACKENDS))
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    reason = _skip_reason(request.param)
    if reason:
        pytest.skip(reason)
    p = _start_pair(request.param)
    yield p
    p.close()


@pytest.mark.parametrize("nbytes", SIZES, ids=_size_id)
@pytest.mark.parametrize("op", OPS)
def test_collective(benchmark, pair: Pair, op: str, nbytes: int, bandwidth_rows: list) -> None:
    benchmark.group = f"{op} {pair.backend} {pair.device.type}, {WORLD_SIZE} ranks"
    bandwidth_rows.append(pair.measure(benchmark, op, nbytes))
    assert pair.proc.poll() is None, "the peer rank exited during the measurement"


def test_bus_bandwidth_formula() -> None:
    # nccl-tests: all_reduce on 2 ranks moves 2(p-1)/p = 1x the buffer, on 8 ranks 1.75x
    assert bus_bandwidth(10**9, 1.0, 2) == (1.0, 1.0)
    assert bus_bandwidth(10**9, 0.5, 8) == (2.0, 3.5)
    # all_gather and reduce_scatter move (p-1)/p of the full (gathered / reduced) buffer
    for op in ("all_gather", "reduce_scatter"):
        assert bus_bandwidth(10**9, 1.0, 2, op) == (1.0, 0.5)
        assert bus_bandwidth(10**9, 0.5, 8, op) == (2.0, 1.75)


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description="rank 1 of the collectives micro-benchmark")
    cli.add_argument("--port", type=int, required=True)
    cli.add_argument("--backend", default="gloo")
    cli.add_argument("--device", default="cpu")
    a = cli.parse_args()
    die_with_parent()  # $PARABENCH_HARNESS: the pytest that started it
    peer(a.port, a.backend, a.device)
