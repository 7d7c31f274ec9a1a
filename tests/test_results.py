from __future__ import annotations

import math
import os
import time

import pytest
import torch

from bench.harness import breakdown, probes, results
from bench.harness.probes import HeldReads, StepTimer, held_mib, memory_snapshot, reset_peaks
from tests.conftest import fake_cuda_events, single_epoch


def _record(**kw):
    rec = {
        "epoch": 0,
        "steps": 6,
        "warmup_steps": 2,
        "step_times_ms": [100.0, 50.0, 10.0, 12.0, 14.0, 20.0],
        "data_wait_ms": [50.0, 1.0, 1.0, 2.0, 3.0, 4.0],
        "losses": [2.3, 2.2, 2.0, 1.9, 1.7, 1.6],
        "ranks": [
            {"rank": 0, "samples": 64, "timed_s": 0.056, "peak_rss_mib": 500.0},
            {"rank": 1, "samples": 64, "timed_s": 0.064, "peak_rss_mib": 520.0},
        ],
        "eval_accuracy": 0.5,
    }
    rec.update(kw)
    return rec


def test_measure_excludes_warmup_and_takes_the_slowest_rank():
    m = results.measure(_record(), world_size=2, device="cpu")
    assert m["steps"] == 6 and m["timed_steps"] == 4
    assert m["samples"] == 128
    assert m["samples_per_s"] == pytest.approx(128 / 0.064)
    assert m["samples_per_s_per_device"] == pytest.approx(64 / 0.064)
    assert m["step_time_ms_p50"] == pytest.approx(13.0)  # median of 10, 12, 14, 20
    assert m["data_wait_pct"] == pytest.approx(100 * 10 / 56)
    assert m["compute_ms_p50"] == pytest.approx(10.5)  # median of 9, 10, 11, 16
    assert m["train_loss_first"] == 2.3 and m["train_loss_final"] == 1.6
    assert m["peak_mem_mib"] == 520.0 and m["mem_source"] == "host_rss"
    assert math.isnan(m["eval_loss"]) and m["eval_accuracy"] == 0.5


def test_ranks_sharing_a_gpu_count_it_once_per_device():
    """Two ranks on one GPU (--oversubscribe): per-device throughput (and MFU, from it) is
    the GPU's, not half of it; on two GPUs, or two hosts' cuda:0, each has its half."""

    def ranks(*where):
        return [
            {"rank": i, "host": h, "devices": [d], "samples": 64, "timed_s": 0.064}
            for i, (h, d) in enumerate(where)
        ]

    shared = _record(ranks=ranks(("a", "cuda:0"), ("a", "cuda:0")))
    assert results.measure(shared, 2, "cuda")["samples_per_s_per_device"] == pytest.approx(2000)
    for two in (ranks(("a", "cuda:0"), ("a", "cuda:1")), ranks(("a", "cuda:0"), ("b", "cuda:0"))):
        per = results.measure(_record(ranks=two), 2, "cuda")["samples_per_s_per_device"]
        assert per == pytest.approx(1000)
    # a CPU rank's share of the cores is its device, and older records have no devices
    assert results.measure(shared, 2, "cpu")["samples_per_s_per_device"] == pytest.approx(1000)
    assert results.measure(_record(), 2, "cuda")["samples_per_s_per_device"] == pytest.approx(1000)


def test_ranks_bound_to_a_gpu_each_count_every_gpu(monkeypatch):
    """SLURM's --gpus-per-task binds one GPU to each rank, which sees it as cuda:0: two ranks
    of one node on two GPUs were counted as one GPU (twice the per-device throughput);
    their GPUs' UUIDs tell them apart, and two ranks sharing one GPU still count it once."""
    import types

    import torch

    from bench.harness.worker import device_names

    def row(uuid: str) -> dict:
        # the GPU this rank's launcher bound to it, cuda:0 in its own numbering
        props = types.SimpleNamespace(name="H100", uuid=uuid)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)
        devices = device_names([torch.device("cuda:0")])
        return {"host": "a", "devices": devices, "samples": 64, "timed_s": 0.064}

    bound = [row("GPU-aaa"), row("GPU-bbb")]
    per = results.measure(_record(ranks=bound), 2, "cuda")["samples_per_s_per_device"]
    assert per == pytest.approx(1000)
    shared = [row("GPU-aaa"), row("GPU-aaa")]
    per = results.measure(_record(ranks=shared), 2, "cuda")["samples_per_s_per_device"]
    assert per == pytest.approx(2000)
    assert device_names([torch.device("cpu")]) == ["cpu"]


def test_csv_tables_are_readable_as_the_umask_allows(tmp_path):
    """runs.csv and the other tables were 0600 (mkstemp's), unlike config.json beside them:
    a colleague (or a report run as another user) could not read a shared results folder."""
    import stat

    old = os.umask(0o022)
    try:
        t = results.CsvTable(tmp_path / "runs.csv", results.RUN_COLUMNS)
        t.append([{"run_id": "a", "strategy": "single", "status": "ok"}])
        assert stat.S_IMODE(t.path.stat().st_mode) == 0o644
        os.umask(0o077)  # one who wants their results private keeps them so
        t.append([{"run_id": "a", "strategy": "dp", "status": "ok"}])
        assert stat.S_IMODE(t.path.stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_step_rows_flag_warmup():
    rows = results.step_rows({"run_id": "r"}, _record())
    assert [r["warmup"] for r in rows] == [1, 1, 0, 0, 0, 0]
    assert rows[0]["compute_ms"] == 50.0 and rows[-1]["loss"] == 1.6


def test_csv_append_keeps_order_and_earlier_rows(tmp_path):
    t = results.CsvTable(tmp_path / "runs.csv", results.RUN_COLUMNS)
    t.append([{"run_id": "a", "strategy": "single", "status": "ok", "samples_per_s": 1.5}])
    t.append(
        [
            {
                "run_id": "a",
                "strategy": "dp",
                "status": "failed",
                "reason": "boom",
                "samples_per_s": float("nan"),
            }
        ]
    )
    rows = t.read()
    assert [r["strategy"] for r in rows] == ["single", "dp"]
    assert rows[0]["samples_per_s"] == "1.5" and rows[1]["samples_per_s"] == ""
    header = (tmp_path / "runs.csv").read_text().splitlines()[0].split(",")
    assert header == results.RUN_COLUMNS
    assert not list(tmp_path.glob(".runs.csv.*"))  # no temporary left behind


def test_a_run_with_nothing_measured_has_its_tables_with_no_rows(tmp_path):
    """A run whose every cell was skipped or failed wrote no steps.csv or ranks.csv: a
    user's `pd.read_csv` of them, as of any run's, stopped at a missing file. They are
    there with their columns and no rows; the first measured cell's rows follow."""
    import pandas as pd

    from bench.harness.runner import RunDir

    rd = RunDir(tmp_path)
    skipped = {"run_id": "a", "strategy": "dp", "world_size": 2, "status": "skipped"}
    rd.write([skipped], [], [])
    for name, columns in (("steps.csv", results.STEP_COLUMNS), ("ranks.csv", results.RANK_COLUMNS)):
        table = pd.read_csv(tmp_path / name)
        assert list(table.columns) == columns and table.empty
    ident = {"run_id": "a", "strategy": "single", "world_size": 1, "repeat": 0, "epoch": 0}
    rd.write([dict(ident, status="ok")], [dict(ident, step=0)], [dict(ident, rank=0)])
    assert [r["step"] for r in rd.steps.read()] == ["0"]
    assert [r["rank"] for r in rd.ranks.read()] == ["0"]


def test_csv_rows_of_an_older_parabench_keep_their_renamed_columns(tmp_path):
    """A runs.csv written under a column's older name (`model_state_mib_min`) is read, and
    rewritten on --resume, under its new one, its values kept."""
    path = tmp_path / "runs.csv"
    path.write_text(
        "run_id,strategy,status,model_state_mib,model_state_mib_min\na,zero1,ok,13.6,9.2\n"
    )
    t = results.CsvTable(path, results.RUN_COLUMNS)
    assert t.read()[0]["model_state_mib_lightest"] == "9.2"
    t.append([{"run_id": "a", "strategy": "single", "status": "ok", "model_state_mib_lightest": 3}])
    rows = t.read()
    assert [r["model_state_mib_lightest"] for r in rows] == ["9.2", "3"]
    assert "model_state_mib_min" not in path.read_text()


def test_retry_failed_moves_each_failed_cells_rows_and_folder_as_its_next_attempt(tmp_path):
    """--retry-failed's move (RunDir.retry_failed): a cell that failed again is the cell's
    attempt 2 (its attempt 1 already in retried/), its steps and ranks rows and its folder
    move with its row, the trace its row names is where its folder went; a cell that was ok,
    one that diverged (a result, seeded: it diverges again) and one the plan cannot run here
    (a skipped cell now) keep their rows, the last said."""
    from types import SimpleNamespace

    from bench.harness.runner import RunDir

    rd = RunDir(tmp_path)

    def ident(name, status, **more):
        return {"strategy": name, "world_size": 2, "setting": "fp32", "repeat": 0, "epoch": 0,
                "status": status, "reason": f"{name} went wrong" if status != "ok" else "",
                **more}  # fmt: skip

    trace = "cells/ddp-ws2-fp32-r0/trace.json"
    rows = [ident("ddp", "ok", trace=trace, epoch=0), ident("ddp", "oom", epoch="")]
    rows += [ident("single", "ok"), ident("fsdp", "diverged"), ident("dp", "failed")]
    rd.write(rows, [ident("ddp", "ok", step=3), ident("single", "ok", step=3)], [])
    rd.retried.path.parent.mkdir()
    rd.retried.append([{**ident("ddp", "failed", epoch=""), "attempt": 1}])
    (tmp_path / "cells" / "ddp-ws2-fp32-r0").mkdir(parents=True)
    (tmp_path / "cells" / "ddp-ws2-fp32-r0" / "log.txt").write_text("CUDA out of memory")
    cells = [SimpleNamespace(key=(n, 2, "fp32", 0), status="") for n in ("ddp", "single", "fsdp")]
    cells.append(SimpleNamespace(key=("dp", 2, "fp32", 0), status="skipped"))

    lines, left = rd.retry_failed(cells)

    assert lines == ["ddp ws=2 repeat=0: oom (ddp went wrong)"]
    assert left == "1 failed cell(s) cannot run here and keep their rows: dp ws=2 repeat=0"
    assert [(r["strategy"], r["status"]) for r in rd.runs.read()] == [
        ("single", "ok"),
        ("fsdp", "diverged"),
        ("dp", "failed"),
    ]
    assert [r["strategy"] for r in rd.steps.read()] == ["single"]
    moved = rd.retried.read()[1:]
    assert [(r["attempt"], r["status"]) for r in moved] == [("2", "ok"), ("2", "oom")]
    folder = "retried/ddp-ws2-fp32-r0-attempt2"
    assert {r["attempt_dir"] for r in moved} == {folder}
    assert moved[0]["trace"] == f"{folder}/trace.json"
    assert (tmp_path / folder / "log.txt").read_text() == "CUDA out of memory"
    assert not (tmp_path / "cells" / "ddp-ws2-fp32-r0").exists()
    steps = results.CsvTable(tmp_path / "retried" / "steps.csv", []).read()
    assert [(r["attempt"], r["strategy"], r["step"]) for r in steps] == [("2", "ddp", "3")]
    assert rd.retry_failed(cells) == ([], left)  # nothing more to retry


@pytest.mark.parametrize("cut", range(6))
def test_retry_failed_cut_short_at_any_write_ends_whole_on_the_next_resume(
    tmp_path, monkeypatch, cut
):
    """A move stopped part way (the disk full, the process killed) between any two of its
    writes of runs, steps and ranks.csv and their retried/ copies: the next resume (its
    drop_unfinished) lost no row of the attempt, and a second --retry-failed finishes the
    move as attempt 1, its rows once each, its folder (the log) the one attempt_dir names.
    Moved runs row first, a cut left the cell's steps to drop_unfinished, which dropped them;
    the folder moved first, the next try numbered the rows attempt 2, its folder not there."""
    import errno
    from types import SimpleNamespace

    from bench.harness.runner import RunDir

    rd = RunDir(tmp_path)
    ident = {"strategy": "ddp", "world_size": 2, "setting": "fp32", "repeat": 0}
    rd.write(
        [{**ident, "epoch": 0, "status": "ok"}, {**ident, "epoch": "", "status": "oom"}],
        [{**ident, "epoch": 0, "step": s} for s in range(3)],
        [{**ident, "epoch": 0, "rank": r} for r in range(2)],
    )
    (tmp_path / "cells" / "ddp-ws2-fp32-r0").mkdir(parents=True)
    (tmp_path / "cells" / "ddp-ws2-fp32-r0" / "log.txt").write_text("CUDA out of memory")
    cells = [SimpleNamespace(key=("ddp", 2, "fp32", 0), status="")]
    rewrite, writes = results.CsvTable._rewrite, []

    def cut_short(table, rows):
        writes.append(table.path)
        if len(writes) > cut:
            raise OSError(errno.ENOSPC, "No space left on device")
        rewrite(table, rows)

    monkeypatch.setattr(results.CsvTable, "_rewrite", cut_short)
    with pytest.raises(OSError):
        rd.retry_failed(cells)
    monkeypatch.setattr(results.CsvTable, "_rewrite", rewrite)
    rd.drop_unfinished()  # what a plain resume does first
    kept = results.CsvTable(tmp_path / "retried" / "steps.csv", []).read()
    assert {r["step"] for r in rd.steps.read() + kept} == {"0", "1", "2"}  # none lost
    rd.retry_failed(cells)
    rd.drop_unfinished()

    moved = rd.retried.read()
    assert [(r["attempt"], r["status"]) for r in moved] == [("1", "ok"), ("1", "oom")]
    folder = tmp_path / moved[0]["attempt_dir"]
    assert (folder / "log.txt").read_text() == "CUDA out of memory"
    for name, n in (("steps", 3), ("ranks", 2)):
        rows = results.CsvTable(tmp_path / "retried" / f"{name}.csv", []).read()
        assert [r["attempt"] for r in rows] == ["1"] * n, name
    assert rd.runs.read() == rd.steps.read() == rd.ranks.read() == []
    assert not (tmp_path / "cells" / "ddp-ws2-fp32-r0").exists()


@pytest.mark.serial  # real sleeps, timed to a few ms
def test_step_timer_measures_wall_time():
    import time

    for mode in ("sync", "events"):  # the same on a CPU: the host clock
        t = StepTimer(torch.device("cpu"), mode)
        for _ in range(2):
            t.start()
            time.sleep(0.02)
            t.data_ready()
            time.sleep(0.03)
            host_ms = t.stop(8)
        assert t.steps == 2 and 45 <= host_ms <= 90
        for r in t.records():
            assert 18 <= r.data_ms <= 40 and 45 <= r.total_ms <= 90 and r.samples == 8
    with pytest.raises(ValueError, match="choose sync or events"):
        StepTimer(torch.device("cpu"), "async")


def test_memory_snapshot_on_cpu_reads_rss():
    snap = memory_snapshot([torch.device("cpu")])
    assert snap["peak_rss_mib"] > 50  # this process has torch loaded
    assert "peak_alloc_mib" not in snap


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux's /proc")
def test_each_epoch_has_its_own_peak_resident_set():
    """An epoch's CPU peak was the process's since it started: from epoch 2 on, it was at
    least the previous epoch's evaluation."""
    spike = torch.ones(100 * 2**20)  # 400 MiB of float32, touched
    del spike
    before = memory_snapshot([torch.device("cpu")])["peak_rss_mib"]
    reset_peaks([torch.device("cpu")])
    after = memory_snapshot([torch.device("cpu")])["peak_rss_mib"]
    assert after < before - 300
    assert after >= held_mib(torch.device("cpu")) - 1  # what is held now is held at peak


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux's /proc")
def test_held_memory_is_each_processs_own_after_a_fork():
    """held_mib keeps /proc/self/statm open between steps; a forked child (a DataLoader
    worker, a launcher's fork) reads its own resident set, not its parent's through the
    inherited file, and the reading is the file's own."""
    cpu = torch.device("cpu")
    held_mib(cpu)  # opens the file in this process
    with open("/proc/self/statm") as f:
        fresh = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    assert abs(held_mib(cpu) - fresh) < 16, (held_mib(cpu), fresh)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child (no torch op: its thread pool does not survive a fork)
        try:
            before = held_mib(cpu)
            extra = b"\x01" * (256 * 2**20)  # 256 MiB more, written
            os.write(write, f"{held_mib(cpu) - before + extra[0] - 1:.1f}".encode())
        finally:
            os._exit(0)
    os.close(write)
    grown = float(os.read(read, 64).decode())
    os.waitpid(pid, 0)
    os.close(read)
    assert grown > 200, grown  # through the parent's file: the parent's RSS, unchanged


def test_held_memory_is_read_at_most_so_often_where_a_read_is_dear():
    """Where a read costs (the CUDA allocator's stats: about 100 us a step in the loop), a
    step ended within the interval of the last read is NaN; the steps it names (the first,
    the first timed) and the last are always read. On a CPU every step is."""
    cpu = torch.device("cpu")
    every = HeldReads(cpu, probes.SPARSE_EVERY_S.get("cpu", 0.0))  # as the loop's on a CPU
    for _ in range(5):
        every.step_end()
    assert not any(math.isnan(m) for m in every.readings())
    sparse = HeldReads(cpu, 3600.0, always=(0, 2))
    for _ in range(6):
        sparse.step_end()
    got = sparse.readings()
    assert [math.isnan(m) for m in got] == [False, True, False, True, True, False]


def test_cuda_marks_go_on_the_stream_looked_up_once(monkeypatch):
    """On CUDA a lap or an events-timed mark is an event recorded on the current stream,
    looked up at the first mark, not at each (current_stream() builds a Stream object per
    call, inside every timed step); what the clock and timer read back is unchanged, and
    they wait for the events on their own device. A fake CUDA here: the events' times are
    the order they were recorded in."""
    from bench.harness.probes import PhaseClock

    looked_up, recorded = [], []

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self, stream=None):
            assert stream is not None  # never left to Event.record's own lookup
            recorded.append(stream)
            self.t = len(recorded)

        def elapsed_time(self, end):
            return float(end.t - self.t)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: looked_up.append(d) or "s0")
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: synced.append(d))
    gpu = torch.device("cuda:1")  # not the current device: every wait names it
    clock, timer = PhaseClock(gpu), StepTimer(gpu, "events")
    assert not looked_up  # nothing asked of CUDA before the first mark
    for _ in range(3):
        timer.start()
        timer.data_ready()
        clock.begin()
        clock.lap("forward")
        clock.lap("backward")
        clock.end()
        timer.stop(4)
    assert looked_up == [gpu, gpu] and set(recorded) == {"s0"}  # once each, for 15 marks
    assert len(recorded) == 15  # a step's end is the next one's start: no mark of its own
    assert clock.steps() == [{"forward": 1.0, "backward": 1.0}] * 3  # (no optimizer lap)
    assert synced and all(d == gpu for d in synced), synced
    # 5 marks a step apart; the last step ends at a mark its first reading records
    assert [(r.total_ms, r.data_ms) for r in timer.records()] == [(5.0, 1.0)] * 3
    assert len(recorded) == 16 and len(timer.records()) == 3 and len(recorded) == 16


def test_a_span_on_cuda_is_between_events_where_the_stream_reaches_them(monkeypatch):
    """The pipelines' bubble is their step's span less their chunks' event-timed compute.
    The span was a host clock started before the step: under --step-timing events the last
    step's optimizer is still queued then, and counted in as bubble. On CUDA a Span is two
    events on the stream, read after waiting for the device; on a CPU, the host clock. A
    fake CUDA: an event's time is when the stream reaches it (here 7 ms after the first
    event's record, the queued work)."""
    from bench.harness.probes import Span

    # ms at which the stream reaches each event
    synced = fake_cuda_events(monkeypatch, iter([7.0, 19.0]).__next__)
    gpu = torch.device("cuda:1")
    span = Span(gpu)
    span.start()
    assert span.seconds() == pytest.approx(0.012)  # 19 - 7 ms: not the queued 7 ms before
    assert synced == [gpu]
    host = Span(torch.device("cpu"))
    host.start()
    time.sleep(0.01)
    assert 0.009 < host.seconds() < 1.0


def test_the_phase_clock_laps_steps_at_most_so_often_where_asked():
    """A clock with every_s laps a step only where that long has passed since the last
    lapped one began, and always the steps it names (the first, the first timed): the
    others read {} and add no mark. The breakdown's phases are the means over the timed
    steps that were lapped."""
    from bench.harness.probes import PhaseClock

    clock = PhaseClock(torch.device("cpu"), every_s=3600.0, always=(0, 2))
    for _ in range(5):
        clock.begin()
        clock.lap("forward")
        clock.lap("backward")
        clock.end()
    steps = clock.steps()
    assert [bool(s) for s in steps] == [True, False, True, False, False]
    assert steps[2].keys() == {"forward", "backward"}  # the phases lapped, no others
    every = PhaseClock(torch.device("cpu"))
    for _ in range(3):
        every.begin()
        every.lap("backward")
        every.end()
    assert all(s for s in every.steps())  # the default: every step
    rec = _record(phase_ms=[{}, {}, {"forward": 2.0, "backward": 4.0, "optimizer": 1.0}] + [{}] * 3)
    m = results.measure(rec, world_size=2, device="cpu")
    assert (m["forward_ms"], m["backward_ms"], m["optimizer_ms"]) == (2.0, 4.0, 1.0)
    # the parts split the lapped step (timed step 0: 10 ms, 1 of data wait), not the mean
    assert m["part_data_wait_ms"] == 1.0 and m["part_other_ms"] == pytest.approx(10 - 1 - 7)


def test_a_phase_no_step_lapped_is_empty_in_runs_csv_not_0_ms():
    """A pipeline's schedule runs its forwards inside the backward's lap: runs.csv had
    forward_ms and part_forward_ms 0.0 for model_split and the pipelines, which a reader of
    the CSV averages in as a forward that takes no time. Not measured is empty (NaN); the
    parts still add up to the step."""
    from bench.harness.probes import PhaseClock

    clock = PhaseClock(torch.device("cpu"))
    for _ in range(6):  # as Strategy._step around a pipeline's forward_backward
        clock.begin()
        clock.lap("optimizer")  # zero_grad
        clock.lap("backward")  # the whole schedule
        clock.lap("optimizer")
        clock.end()
    assert all(s.keys() == {"backward", "optimizer"} for s in clock.steps())
    lapped = [{"backward": 6.0, "optimizer": 1.0}] * 6
    m = results.measure(_record(phase_ms=lapped), world_size=2, device="cpu")
    assert math.isnan(m["forward_ms"]) and math.isnan(m["part_forward_ms"])
    assert (m["backward_ms"], m["optimizer_ms"]) == (6.0, 1.0)
    assert m["part_backward_ms"] == 6.0 and m["part_optimizer_ms"] == 1.0
    parts = [m[f"part_{p}_ms"] for p in breakdown.PARTS]
    assert sum(v for v in parts if v == v) == pytest.approx(m["step_time_ms_mean"])
    # a phase lapped in some steps only ran for 0 ms in the others: measured, its mean
    some = [{"forward": 4.0, "backward": 6.0}, {"backward": 6.0}] * 3
    assert results.measure(_record(phase_ms=some), world_size=2, device="cpu")["forward_ms"] == 2.0


def test_the_loop_laps_and_reads_the_first_the_first_timed_and_the_last_step(monkeypatch):
    """The training loop where laps and reads cost (CUDA's interval, put on this CPU): of 7
    steps with 2 of warm-up, steps 0 and 2 are lapped, and read with the last; an epoch
    no longer than its warm-up laps its last step, the first it then times."""
    monkeypatch.setitem(probes.SPARSE_EVERY_S, "cpu", 3600.0)
    stats = single_epoch(7, warmup=2)
    assert [bool(p) for p in stats.phase_ms] == [True, False, True, False, False, False, False]
    read = [not math.isnan(m) for m in stats.held_mib]
    assert read == [True, False, True, False, False, False, True]
    short = single_epoch(3, warmup=5)  # warm-up cut to 2 steps: step 2 is the timed one
    assert short.warmup_steps == 2 and [bool(p) for p in short.phase_ms] == [True, False, True]
    # ended by its loader, not --max-steps (a small --limit on a GPU): the same
    short = single_epoch(3, warmup=5, by_loader=True)
    assert short.warmup_steps == 2 and [bool(p) for p in short.phase_ms] == [True, False, True]
    monkeypatch.undo()
    every = single_epoch(4, warmup=1)  # a CPU's own: every step
    assert all(every.phase_ms) and not any(math.isnan(m) for m in every.held_mib)


def test_memory_growth_from_the_steps_that_were_read():
    """Growth is the median of the readings in the last timed quarter less the first's,
    NaN between reads ignored; a quarter with no reading has no growth to tell."""
    nan = math.nan
    held = [0.0, 0.0, 100.0, nan, 102.0, nan, nan, 150.0, nan, 160.0]  # 2 warm-up steps
    assert results.held_growth(held, 2) == pytest.approx(160.0 - 100.0)
    assert math.isnan(results.held_growth([0.0, 0.0, nan, nan, 5.0, 6.0, 7.0, 8.0], 2))


@pytest.mark.skipif(math.isnan(probes.malloc_free_mib()), reason="glibc's mallinfo2")
def test_memory_malloc_keeps_free_is_resident_and_told_apart():
    """On a CPU the resident set holds what tensors freed and malloc kept for its next
    allocations: a rank's held memory climbed step after step with no tensor more (a
    pipeline's last stage on 2 cores: 350 MiB in 60 steps, the report calling it a leak of
    tensors). malloc_free_mib says how much of it is malloc's; the loop reads it at the
    steps where it reads held memory, at most every MALLOC_EVERY_S, and its growth is taken
    between the same quarters as held_growth (it was the last step less the first timed,
    against held_growth's quarter medians: a steady climb read a third more than held
    memory's growth, all of it malloc's and more)."""
    cpu = torch.device("cpu")
    kept = [torch.ones(1024) for _ in range(16384)]  # 4 KiB each, 64 MiB written
    free, held = probes.malloc_free_mib(), held_mib(cpu)
    del kept[::2]  # holes between the tensors still held: malloc cannot give them back
    assert probes.malloc_free_mib() - free > 24, (free, probes.malloc_free_mib())
    assert held_mib(cpu) > held - 8  # still resident
    del kept
    stats = single_epoch(6, warmup=2)
    free = stats.malloc_free_mib
    assert len(free) == len(stats.held_mib) == 6
    assert math.isfinite(free[2]) and math.isfinite(free[-1])  # the first timed, the last


def test_malloc_free_growth_is_taken_as_held_growth_is(monkeypatch):
    """A rank whose resident set climbed 10 MiB a step, all of it malloc's free memory:
    its malloc growth (the last step less the first timed) read 90 MiB against a held
    growth of 60 (the last quarter's median less the first's): more of it malloc's than
    had grown. Both are now taken between the same quarters of the same steps' reads."""
    climb = iter(range(100, 1000, 10))
    monkeypatch.setattr(probes, "MALLOC_EVERY_S", 0.0)  # each step read, as a slow step is
    monkeypatch.setattr(probes, "malloc_free_mib", lambda: float(next(climb)))
    monkeypatch.setattr(probes, "held_mib", lambda device: 1000.0 + 10 * len(reads.readings()))
    reads = probes.HeldReads(torch.device("cpu"), always=(0, 2))
    for _ in range(10):
        reads.step_end()
    held, free = reads.readings(), reads.malloc_free()
    assert len(held) == len(free) == 10
    assert results.held_growth(free, 2) == results.held_growth(held, 2) == 60.0


def test_a_rows_growth_and_what_malloc_held_free_are_the_same_ranks():
    """runs.csv takes the rank that grew most, and what malloc held free of that rank's
    growth, not another's; and what malloc held free on the rank of the peak."""
    ranks = [
        {"rank": 0, "samples": 64, "timed_s": 0.05, "peak_rss_mib": 500.0},
        {"rank": 1, "samples": 64, "timed_s": 0.05, "peak_rss_mib": 900.0},
    ]
    ranks[0] |= {"held_growth_mib": 5.0, "malloc_free_growth_mib": 80.0}
    ranks[1] |= {"held_growth_mib": 350.0, "malloc_free_growth_mib": 340.0}
    ranks[0]["malloc_free_mib"], ranks[1]["malloc_free_mib"] = 600.0, 420.0
    m = results.measure(_record(ranks=ranks), world_size=2, device="cpu")
    assert m["held_growth_mib"] == 350.0 and m["malloc_free_growth_mib"] == 340.0
    # what malloc held free where the peak is (rank 1's 900 MiB), not the most of any rank
    assert m["peak_mem_mib"] == 900.0 and m["malloc_free_mib"] == 420.0
    old = results.measure(_record(), world_size=2, device="cpu")  # a run before the ranks said
    assert math.isnan(old["held_growth_mib"]) and math.isnan(old["malloc_free_growth_mib"])


def test_divergence_names_the_first_bad_step():
    from bench.harness.results import divergence

    assert divergence([2.3, 1.9, 1.2], 10) is None
    assert divergence([2.3, float("nan"), 1.0], 10) == "loss is nan at step 1"
    assert divergence([2.3, 5.0, float("inf")], 10) == "loss is inf at step 2"
    why = divergence([2.0, 3.0, 25.0], 10)
    assert why is not None and why.startswith("loss 25 at step 2 is over 10 x")
    assert divergence([], 10) is None


def test_a_later_epoch_diverges_against_the_runs_first_step_not_its_own():
    """Epoch 2 of a run that trained (its first loss 0.11, from 2.3) with one noisy batch at
    1.13 was 'diverged: over 10 x the first step's (0.112)' (seen on MNIST at global batch
    16); every epoch is held to the run's first step, so only a real climb is flagged."""
    from bench.harness.results import divergences

    trained = [[2.3, 1.2, 0.4, 0.2], [0.112, 1.129, 0.3, 0.1]]
    assert divergences(trained, 10) == [None, None]
    blew_up = divergences([[2.3, 1.2, 0.4], [0.3, 24.0, 0.5]], 10)
    assert blew_up[0] is None
    assert blew_up[1] == "loss 24 at step 1 is over 10 x the first step's (2.3)"
    assert divergences([[2.3, 0.4], [0.3, float("nan")]], 10) == [None, "loss is nan at step 1"]
    assert divergences([[], [2.0, 30.0]], 10) == [
        None,
        "loss 30 at step 1 is over 10 x the first step's (2)",
    ]


def test_events_timing_leaves_out_what_runs_after_a_read_before_the_next_step(monkeypatch):
    """Under --step-timing events a step ends where the next starts. --target-precision reads
    the steps at a block's end (one synchronisation) and the ranks then agree through a
    collective before the next step starts: that block's last step was timed to the next
    one's start, so it carried the wait for the device, the collective and the idle stream
    until the host queued again, which the README says is outside the steps' timing. A step
    a read has closed ends at the read's mark. A fake CUDA: an event's time is the fake
    stream clock's when it is recorded."""
    now = [0.0]

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing

        def record(self, stream=None):
            self.t = now[0]

        def elapsed_time(self, end):
            return end.t - self.t

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d=None: "s0")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    timer = StepTimer(torch.device("cuda:0"), "events")

    def step() -> None:
        timer.start()
        now[0] += 1.0  # the batch
        timer.data_ready()
        now[0] += 4.0  # forward, backward, optimizer
        timer.stop(8)

    step()
    step()
    assert [r.total_ms for r in timer.records()] == [5.0, 5.0]  # a block's end: read
    now[0] += 30.0  # the ranks' agreement (a collective), the stream idle meanwhile
    step()
    assert [(r.total_ms, r.data_ms) for r in timer.records()] == [(5.0, 1.0)] * 3
