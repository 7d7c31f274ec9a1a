"""benchmarks/overhead.py's in-process measure of what the harness's loop adds to a step."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import single_epoch

ROOT = Path(__file__).resolve().parent.parent


def load_overhead():
    """benchmarks/overhead.py as a module (a script, outside the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("overhead", ROOT / "benchmarks" / "overhead.py")
    overhead = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(overhead)
    return overhead


def third_harness_raises(monkeypatch, overhead, exc: BaseException) -> None:
    """Rounds of `single` alone with both sides stubbed: the hand-written loop at 100
    samples/s, the harness at 90 until its third cell raises `exc`."""
    calls = iter(range(100))

    def harness(strategy, world, args, out_dir, tag):
        if next(calls) == 2:
            raise exc
        return 90.0

    monkeypatch.setattr(overhead, "check", lambda args: None)
    monkeypatch.setattr(overhead, "hand", lambda strategy, world, args: 100.0)
    monkeypatch.setattr(overhead, "harness", harness)
    monkeypatch.setattr(overhead, "pairs", lambda device: (("single", 1),))


def no_rounds(monkeypatch):
    """overhead.py, loaded, with its two sides (hand, harness) failing the test if timed."""
    overhead = load_overhead()
    refused = lambda *a, **kw: pytest.fail("a side was timed")  # noqa: E731
    monkeypatch.setattr(overhead, "hand", refused)
    monkeypatch.setattr(overhead, "harness", refused)
    return overhead


def main_here(monkeypatch, capsys, *options: str) -> tuple[int, str, str]:
    """overhead.py's main in this process with `options` (its exit code, stdout and
    stderr), where a test is about its options' checks: no side may be timed."""
    overhead = no_rounds(monkeypatch)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "overhead.py"), *options])
    with pytest.raises(SystemExit) as stopped:
        overhead.main()
    out, err = capsys.readouterr()
    return stopped.value.code, out, err


def options_known(monkeypatch, capsys) -> set[str]:
    """The options overhead.py's --help names (its main, in this process)."""
    code, out, _ = main_here(monkeypatch, capsys, "--help")
    assert code == 0 and "--data-root" in out
    return set(re.findall(r"--[a-z][\w-]*", out))


@pytest.mark.serial  # times the harness's step against a bare loop's
def test_loop_cost_reports_the_harness_step_against_a_bare_one(monkeypatch, capsys):
    """--loop-cost-only runs the real loop (single's train_epoch) and a bare loop on a tiny
    model and prints both per-step figures and their difference with its interval, with no
    paired rounds; then the per-step parts of that difference, timed alone. (In this
    process, on 200 of its 400 steps and 9 of its 15 rounds, on one thread: the lines and
    their sums are what is read; beside other work a second thread made each step of this
    tiny model wait for it, 5 ms a step against 0.7 ms, and the script ran past its 300 s.)"""
    import torch

    overhead = no_rounds(monkeypatch)
    real = overhead.loop_cost
    shorter = lambda device, timing, without=(): real(  # noqa: E731
        device, timing, steps=200, rounds=9, without=without
    )
    monkeypatch.setattr(overhead, "loop_cost", shorter)
    monkeypatch.setattr(sys, "argv", ["overhead.py", "--loop-cost-only"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        overhead.main()
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    line, parts, off = out.strip().splitlines()
    m = re.fullmatch(
        r"loop cost \(cpu, step timing sync\): harness (\d+) us a step, bare loop (\d+) us; "
        r"the harness adds (-?\d+) us a step \(median of paired rounds, "
        r"95 % interval (-?\d+) to (-?\d+) us\)",
        line,
    )
    assert m, line
    mine, bare, added, low, high = map(int, m.groups())
    assert mine > 0 and bare > 0 and abs(added) < max(mine, bare)
    # how far the rounds' differences scatter: on a busy machine the median alone (-113 us
    # once, the harness's loop 'faster' than a bare one) reads as a finding
    assert low <= added <= high
    # then the parts every step pays for, each timed alone, and what they leave unexplained
    # (on a CPU the held-memory read falls between one step's timing and the next's)
    m = re.fullmatch(
        r"  of which, per step: 3 x step-timer mark ([\d.]+) us, 5 x phase-clock mark ([\d.]+) "
        r"us = (\d+) us; the rest, (-?\d+) us: Python around them; between the steps' "
        r"timing: 1 x held-memory read ([\d.]+) us",
        parts,
    )
    assert m, parts
    mark, lap, said, rest, held = map(float, m.groups())
    assert held > 0 and min(mark, lap) >= 0  # a read of /proc: a microsecond or more
    assert abs(3 * mark + 5 * lap - said) <= 1  # the sum it prints is of its parts
    assert abs(said + rest - added) <= 1
    # then what it adds with each part, and both, switched off inside the loop itself
    n = r"(-?\d+) us \((-?\d+) to (-?\d+)\)"
    m = re.fullmatch(
        rf"  switched off inside the loop, the harness adds: without phase laps {n}; without "
        rf"held-memory read {n}; without phase laps and held-memory read {n}",
        off,
    )
    assert m, off
    for k in range(3):
        mid, low, high = map(int, m.groups()[3 * k : 3 * k + 3])
        assert low <= mid <= high and abs(mid) < max(mine, bare)


def test_switching_a_part_off_leaves_the_loop_training_and_comes_back():
    """Inside switched_off the harness's loop still trains (losses fall as with the part
    on), its steps' phases read 0 and its held memory nothing; after it, both are back."""
    overhead = load_overhead()

    with overhead.switched_off(overhead.SWITCHABLE):
        off = single_epoch(6, warmup=1)
    on = single_epoch(6, warmup=1)
    assert off.losses == on.losses  # the same training, to the bit
    assert all(v == 0 for step in off.phase_ms for v in step.values())
    assert all(math.isnan(m) for m in off.held_mib)
    assert any(v > 0 for step in on.phase_ms for v in step.values())
    assert not any(math.isnan(m) for m in on.held_mib)
    with pytest.raises(ValueError, match="cannot switch off"), overhead.switched_off(("optim",)):
        pass


def test_the_summary_says_which_way_the_ratio_reads(monkeypatch, capsys):
    """The ratio is the harness's samples/s over the hand-written loop's: the summary says
    that below 1 the harness is slower, and where the interval stays wide it blames the
    rounds' scatter, not the harness's cost (here the harness is 10-30 % slower, far more
    than the interval's width)."""
    overhead = load_overhead()
    speeds = iter([0.7, 0.9, 0.8, 0.75, 0.85, 0.72, 0.88, 0.78] * 4)
    monkeypatch.setattr(overhead, "hand", lambda strategy, world, args: 100.0)
    monkeypatch.setattr(overhead, "harness", lambda *a: 100.0 * next(speeds))
    monkeypatch.setattr(overhead, "pairs", lambda device: (("single", 1),))
    monkeypatch.setattr(overhead, "print_loop_cost", lambda *a: None)
    argv = ["overhead.py", "--min-rounds", "6", "--max-rounds", "8", "--width", "0.02"]
    monkeypatch.setattr(sys, "argv", argv)
    overhead.main()
    out = capsys.readouterr().out
    assert "ratio: the harness's samples/s over the hand-written loop's" in out
    assert "below 1 the harness is slower" in out
    assert "more than the harness costs" not in out
    assert "single: this machine did not narrow the interval to 0.02 in 8 rounds" in out
    assert "passed after" not in out  # no deadline passed
    # a deadline that passes before the rounds an interval needs is said, once
    monkeypatch.setattr(sys, "argv", [*argv, "--max-minutes", "0"])
    speeds = iter([0.7, 0.9, 0.8, 0.75, 0.85, 0.72, 0.88, 0.78] * 4)
    overhead.main()
    out = capsys.readouterr().out
    said = "--max-minutes 0 passed after 0 round(s); going on to --min-rounds 6"
    assert out.count(said) == 1 and "6 rounds" not in out.split(said)[0]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        # larger than the data: the hand-written side, which goes first, looped for ever
        (["--batch", "100000"], "--batch 100000 is larger than the 10000 training samples"),
        # its rank's timer never started: an UnboundLocalError traceback from mp.spawn
        (["--warmup", "-1"], "--warmup cannot be negative, got -1"),
        # a ZeroDivisionError traceback in the hand-written ranks
        (["--batch", "1"], "--batch 1 is not divisible by world size 2"),
        # past the epoch's end the harness's cell stopped and the hand-written loop went on:
        # a ratio of different steps, under a summary naming --steps
        (["--steps", "100000"], "--warmup 5 + --steps 100000 is more than the"),
    ],
)
def test_bad_options_are_one_line_and_exit_2_before_any_round(
    data_root, monkeypatch, capsys, options, said
):
    """An option the harness would refuse is refused before the first round, in the
    script's own words (--batch, --warmup), as one line and exit 2."""
    code, out, err = main_here(
        monkeypatch,
        capsys,
        *["--data-root", str(data_root), "--min-rounds", "1", "--max-rounds", "1"],
        *["--steps", "2", *options],
    )
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("overhead.py: error: "), err
    assert said in lines[0]
    assert "round" not in out


def test_no_mnist_is_one_line_naming_only_options_the_script_has(tmp_path, monkeypatch, capsys):
    """No MNIST under --data-root (`make overhead` on a fresh clone, whose data root is
    ./data): the harness's advice, "pass --download ... or use --dataset synthetic", named
    two options overhead.py did not have, so following it failed on argparse; with the
    last of its three ways cut out of the text, the clause lost its "or"."""
    options = ["--data-root", str(tmp_path), "--min-rounds", "1", "--steps", "2"]
    code, _, err = main_here(monkeypatch, capsys, *options)
    assert code == 2, err
    line = err.strip()
    assert line.startswith(f"overhead.py: error: MNIST not found under {tmp_path}"), line
    assert line.endswith("; pass --download on a machine with internet, or point --data-root at it")
    named = set(re.findall(r"--[a-z][\w-]*", line))
    assert named and named <= options_known(monkeypatch, capsys), line


def test_one_core_is_one_line_naming_no_option_the_script_lacks(data_root, monkeypatch, capsys):
    """On one core ddp_spawn's two ranks are refused with the harness's advice,
    "--oversubscribe runs it anyway", an option overhead.py does not have. (The script
    itself, as a user runs it, on one core: its exit code and its one line.)"""
    script = [sys.executable, str(ROOT / "benchmarks" / "overhead.py")]
    run = subprocess.run(
        [*script, "--data-root", str(data_root), "--min-rounds", "1", "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    )
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("overhead.py: error: "), run.stderr
    assert "ddp_spawn cannot run at world size 2" in lines[0], lines
    assert "round" not in run.stdout
    assert set(re.findall(r"--[a-z][\w-]*", lines[0])) <= options_known(monkeypatch, capsys)


def test_download_fetches_mnist_in_the_options_check(monkeypatch, tmp_path):
    """--download (which `make overhead` passes, as `make bench` does) fetches MNIST into
    --data-root in the options' check, before either side's first round reads it."""
    from bench.config import ConfigError
    from bench.workload import data

    fetched = []

    def download(root):
        fetched.append(root)
        raise ConfigError(f"MNIST download into {root} failed: no network in a test")

    monkeypatch.setattr(data, "_download_mnist", download)
    overhead = load_overhead()
    args = {"steps": 2, "warmup": 1, "batch": 64, "data_root": str(tmp_path), "download": True}
    args |= {"device": "cpu", "feed": "device", "step_timing": "sync"}
    said = overhead.check(args)
    assert fetched and said == f"MNIST download into {fetched[0]} failed: no network in a test"


@pytest.mark.parametrize(
    ("options", "said"),
    [
        # nan passed `--width <= 0`, and no interval is ever within nan: every round ran
        (["--width", "nan"], "--width > 0"),
        # nan: a deadline never passed; below 0, one passed before the first round
        (["--max-minutes", "nan"], "--max-minutes must be 0 or more, got nan"),
        (["--max-minutes", "-1"], "--max-minutes must be 0 or more, got -1"),
    ],
)
def test_a_width_or_time_limit_that_is_no_number_is_refused(
    options, said, tmp_path, monkeypatch, capsys
):
    # no data there: an option let through fails on it, at once, not after every round
    code, out, err = main_here(monkeypatch, capsys, "--data-root", str(tmp_path), *options)
    assert code == 2, err
    assert said in err.strip().splitlines()[-1]
    assert "round" not in out


def test_the_options_check_reads_the_data_once_beside_the_plans(data_root, monkeypatch):
    """The check read the data set twice for each pair it times: once in the harness's plan
    and once more for the epoch's steps, the same samples at the same --batch each time."""
    from bench.workload import data

    overhead = load_overhead()
    reads = []
    checked = data.checked
    monkeypatch.setattr(data, "checked", lambda cfg: reads.append(cfg) or checked(cfg))
    args = {"steps": 2, "warmup": 1, "batch": 64, "data_root": str(data_root)}
    args |= {"device": "cpu", "feed": "device", "step_timing": "sync"}
    assert overhead.check(args) is None
    assert len(reads) == 1 + len(overhead.pairs("cpu"))  # once, then each plan's own


def test_a_csv_that_cannot_be_written_is_refused_before_the_rounds(
    data_root, tmp_path, monkeypatch, capsys
):
    """A --csv path that cannot be written (here a folder) is one line and exit 2 before
    the first round, not a traceback after its minutes; a folder that does not exist yet
    is made."""
    options = ["--data-root", str(data_root), "--min-rounds", "1", "--max-rounds", "1"]
    code, out, err = main_here(
        monkeypatch, capsys, *options, "--steps", "2", "--csv", str(tmp_path)
    )
    assert code == 2, err
    assert err.strip() == f"overhead.py: error: --csv {tmp_path}: Is a directory"
    assert "round" not in out


def test_the_rounds_done_stay_in_the_csv_when_a_later_round_fails(monkeypatch, tmp_path):
    """--csv is written after every round: a harness cell that fails in round 2 (or a
    command limit that cuts the script off) keeps rounds 0 and 1's figures in it, where
    they were written only after the last round and lost with it."""
    overhead = load_overhead()
    third_harness_raises(
        monkeypatch, overhead, SystemExit("harness single failed: a test's reason")
    )
    csv_path = tmp_path / "rounds.csv"
    argv = ["overhead.py", "--min-rounds", "6", "--csv", str(csv_path)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="harness single failed"):
        overhead.main()
    lines = csv_path.read_text().splitlines()
    assert lines[0].split(",")[:4] == ["round", "strategy", "world_size", "first"]
    assert [line.split(",")[0] for line in lines[1:]] == ["0", "1"]
    assert all(line.endswith(",0.9") for line in lines[1:]), lines


def test_the_hand_written_side_trains_on_the_harness_training_set(monkeypatch, tmp_path):
    """The hand-written loop held out the default 1,000 samples that the harness's cell
    (eval_samples=0) trains on: on the MNIST test split it had 9,000 against 10,000, and a
    --batch between them, which the options' check lets through, gave it no batch at all, a
    loop that never ended. A one-layer model stands in for the CNN (its step at batch 9,500
    takes long on a CPU); an alarm turns that endless loop into a failure."""
    import signal

    import torch

    from bench.workload import models

    overhead = load_overhead()
    data_root = os.environ.get("PARABENCH_TEST_DATA")
    if not data_root or not (Path(data_root) / "mnist").is_dir():
        pytest.skip("needs MNIST under $PARABENCH_TEST_DATA")
    args = {"steps": 1, "warmup": 0, "batch": 9500, "data_root": data_root, "ddp": False}
    args |= {"device": "cpu", "feed": "device", "step_timing": "sync"}
    assert overhead.check(args) is None  # the harness takes this batch
    tiny = lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))  # noqa: E731
    monkeypatch.setattr(models, "MnistCNN", tiny)

    def endless(*_):
        raise TimeoutError("the hand-written side found no batch of --batch 9500")

    old = signal.signal(signal.SIGALRM, endless)
    signal.alarm(120)
    try:
        overhead._hand_rank(0, 1, args, 0, str(tmp_path / "r"))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert json.loads((tmp_path / "r.0").read_text())["samples"] == 9500


def test_ctrl_c_in_the_rounds_is_one_line_saying_what_was_kept(monkeypatch, tmp_path, capsys):
    """Ctrl-C, or SIGTERM from a command limit (which the harness turns into the same), in
    the third round's harness cell was a KeyboardInterrupt traceback from inside the
    harness: now one line and exit 130, naming the CSV that keeps the two rounds before."""
    overhead = load_overhead()
    third_harness_raises(monkeypatch, overhead, KeyboardInterrupt())
    csv_path = tmp_path / "rounds.csv"
    monkeypatch.setattr(sys, "argv", ["overhead.py", "--csv", str(csv_path)])
    try:
        overhead.main()
    except KeyboardInterrupt:  # caught here: it would stop the whole test session
        pytest.fail("Ctrl-C in the rounds: a KeyboardInterrupt traceback, not one line")
    except SystemExit as stopped:
        assert stopped.code == 130
    assert capsys.readouterr().err == (
        f"overhead.py: stopped; 2 pair(s) of sides timed; their figures are in {csv_path}\n"
    )
    assert len(csv_path.read_text().splitlines()) == 3  # the header and two rounds


def test_ctrl_c_in_the_hand_written_side_stops_its_ranks(monkeypatch):
    """Ctrl-C or SIGTERM while the hand-written ranks ran left them running their steps to
    the end (mp.spawn's join gave way; the ranks were joined only as Python exited): on a
    GPU, past the command that started them. Now they are killed and reaped at once."""

    import torch.multiprocessing as mp

    overhead = load_overhead()
    done: list[str] = []

    class Rank:
        def __init__(self, n: int) -> None:
            self.n = n

        def kill(self) -> None:
            done.append(f"kill {self.n}")

        def join(self) -> None:
            done.append(f"join {self.n}")

    class Ranks:
        processes = [Rank(0), Rank(1)]

        def join(self) -> bool:
            raise KeyboardInterrupt

    monkeypatch.setattr(mp, "spawn", lambda *a, **kw: Ranks())
    with pytest.raises(KeyboardInterrupt):
        overhead.hand("ddp_spawn", 2, {"steps": 1})
    assert done == ["kill 0", "join 0", "kill 1", "join 1"]


def test_a_stop_in_the_loop_cost_is_one_line_after_the_rounds(monkeypatch, tmp_path, capsys):
    """Ctrl-C or SIGTERM in the loop cost, which runs after the rounds (minutes of them) and
    their summary, was a KeyboardInterrupt traceback from its training loops, or under
    SIGTERM a silent exit 143: now one line and exit 130, naming the CSV that keeps the
    rounds, as a stop in the rounds says."""
    import signal

    overhead = load_overhead()
    third_harness_raises(monkeypatch, overhead, RuntimeError("no second round wanted"))

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # as a command limit sends it
        raise AssertionError("SIGTERM went on into the loop cost")

    def default(signum, frame):  # stands for SIGTERM's default, which would end pytest too
        raise AssertionError("SIGTERM in the loop cost: a silent exit 143")

    monkeypatch.setattr(overhead, "loop_cost", terminated)
    csv_path = tmp_path / "rounds.csv"
    argv = ["overhead.py", "--min-rounds", "1", "--max-rounds", "1", "--csv", str(csv_path)]
    monkeypatch.setattr(sys, "argv", argv)
    old = signal.signal(signal.SIGTERM, default)
    try:
        overhead.main()
    except SystemExit as stopped:
        assert stopped.code == 130
    else:
        pytest.fail("the loop cost was not stopped")
    finally:
        assert signal.signal(signal.SIGTERM, old) is default  # restored after
    out = capsys.readouterr()
    assert "median ratio" in out.out  # the rounds' summary came first
    assert out.err == (
        f"overhead.py: stopped in the loop cost; 1 pair(s) of sides timed; their figures are "
        f"in {csv_path}\n"
    )


def test_a_stop_under_loop_cost_only_counts_no_rounds(monkeypatch, capsys, sigint_raises):
    """--loop-cost-only asks for no rounds: stopped there, the line said "0 pair(s) of
    sides timed", as if rounds had been asked for and none had finished."""
    import signal

    overhead = load_overhead()

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        raise AssertionError("Ctrl-C went on into the loop cost")

    monkeypatch.setattr(overhead, "loop_cost", interrupted)
    monkeypatch.setattr(sys, "argv", ["overhead.py", "--loop-cost-only"])
    with pytest.raises(SystemExit) as stopped:
        overhead.main()
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "overhead.py: stopped in the loop cost\n"
