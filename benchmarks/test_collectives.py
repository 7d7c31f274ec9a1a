"""all_reduce latency and bus bandwidth between two ranks, measured with pytest-benchmark.

Rank 0 is the benchmark process itself, so pytest-benchmark times real `all_reduce` calls;
rank 1 is this file run as a script in a subprocess. The peer cannot know how many calls
pytest-benchmark's calibration will make, so the end of a measurement travels in-band: both
ranks reduce buffers of zeros, and rank 0 ends a size by writing 1 into the buffer's last
element, which the peer sees in the sum. Nothing but all_reduce runs in the timed loop.

Bus bandwidth as nccl-tests define it: algbw = bytes / time, busbw = algbw * 2(n-1)/n,
which makes all_reduce numbers comparable with the link's peak whatever the world size.
Both go into `benchmark.extra_info` (stored with --benchmark-autosave) and are printed
at the end of the session (see conftest.py).

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

WORLD_SIZE = 2
SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]  # bytes: 4 KiB .. 16 MiB
DTYPE = torch.float32
WARMUP_CALLS = 3  # untimed calls per size: gloo sets up its buffers on first use
TIMEOUT = dt.timedelta(seconds=60)  # a dead peer fails the benchmark instead of hanging it
HEADER_STOP = 1  # header[1]: the session is over


def _size_id(nbytes: int) -> str:
    return f"{nbytes >> 20}MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10}KiB"


def bus_bandwidth(nbytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes), nccl-tests' definitions for all_reduce."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size


def _loopback_env() -> None:
    # gloo picks the interface of the host name, which may not route on a sandboxed host
    names = {name for _, name in socket.if_nameindex()}
    if "lo" in names:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
    header = torch.zeros(2, dtype=torch.int64, device=dev)
    try:
        while True:
            header.zero_()
            dist.all_reduce(header)
            n, stop = header.tolist()
            if stop:
                return
            buf = torch.zeros(n, dtype=DTYPE, device=dev)
            # the peer's gap between calls delays rank 0's next call: keep the check cheap
            mark = buf.numpy() if dev.type == "cpu" else buf
            while True:
                dist.all_reduce(buf)
                if float(mark[-1]) != 0:  # rank 0's end-of-size mark
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

    def _header(self, n: int, stop: int = 0) -> None:
        dist.all_reduce(torch.tensor([n, stop], dtype=torch.int64, device=self.device))

    def measure(self, benchmark, nbytes: int) -> dict[str, Any]:
        """Benchmark all_reduce of `nbytes`; the peer follows however many calls it takes."""
        n = nbytes // torch.tensor([], dtype=DTYPE).element_size()
        self._header(n)
        buf = torch.zeros(n, dtype=DTYPE, device=self.device)

        def all_reduce() -> None:
            dist.all_reduce(buf)
            _sync(self.device)  # NCCL only enqueues; time the completed collective

        try:
            for _ in range(WARMUP_CALLS):
                all_reduce()
            benchmark(all_reduce)
        finally:
            buf[-1] = 1  # ends the peer's loop for this size
            dist.all_reduce(buf)
        return self._record(benchmark, nbytes)

    def _record(self, benchmark, nbytes: int) -> dict[str, Any]:
        info = {
            "backend": self.backend,
            "device": self.device.type,
            "world_size": WORLD_SIZE,
            "message_bytes": nbytes,
            "dtype": str(DTYPE).removeprefix("torch."),
        }
        if benchmark.stats is not None:  # None under --benchmark-disable
            median = benchmark.stats.stats.median
            algbw, busbw = bus_bandwidth(nbytes, median, WORLD_SIZE)
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


def _start_pair(backend: str) -> Pair:
    own, other = BACKENDS[backend]
    _loopback_env()
    # port 0: the OS picks a free one; the peer learns it from its command line
    store = dist.TCPStore(
        "127.0.0.1", 0, WORLD_SIZE, is_master=True, timeout=TIMEOUT, wait_for_workers=False
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--port",
            str(store.port),
            "--backend",
            backend,
            "--device",
            other,
        ],
        env=env,
    )
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
def test_all_reduce(benchmark, pair: Pair, nbytes: int, bandwidth_rows: list) -> None:
    benchmark.group = f"all_reduce {pair.backend} {pair.device.type}, {WORLD_SIZE} ranks"
    bandwidth_rows.append(pair.measure(benchmark, nbytes))
    assert pair.proc.poll() is None, "the peer rank exited during the measurement"


def test_bus_bandwidth_formula() -> None:
    # nccl-tests: 2 ranks move 2(n-1)/n = 1x the message; 8 ranks 1.75x
    assert bus_bandwidth(10**9, 1.0, 2) == (1.0, 1.0)
    assert bus_bandwidth(10**9, 0.5, 8) == (2.0, 3.5)


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description="rank 1 of the all_reduce micro-benchmark")
    cli.add_argument("--port", type=int, required=True)
    cli.add_argument("--backend", default="gloo")
    cli.add_argument("--device", default="cpu")
    a = cli.parse_args()
    peer(a.port, a.backend, a.device)
