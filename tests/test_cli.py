"""Bad input: one line on stderr, exit code 2, before anything starts (no run directory)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import program
from bench.cli import build_parser, config_from_args, main
from bench.config import ConfigError, RunConfig


@pytest.fixture
def run(tmp_path, capsys, data_root):
    def _run(*args: str, data: str | None = None) -> tuple[int, str, str]:
        argv = [
            "run",
            "--out-dir",
            str(tmp_path / "out"),
            "--device",
            "cpu",
            "--data-root",
            data if data is not None else str(data_root),
            *args,
        ]
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse errors
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return _run


CASES = [
    (["--strategies", "nosuch"], "unknown strategy 'nosuch'"),
    (["--strategies", "single", "--model", "notamodel"], "unknown model 'notamodel'"),
    (["--dataset", "cifar10"], "unknown dataset 'cifar10'"),
    (["--strategies", "dp", "--world-sizes", "2"], "dp cannot run at world size 2"),
    (  # every named strategy that cannot run, in the one line: not one fix per try
        ["--strategies", "dp,tp,single", "--world-sizes", "2"],
        "over GPUs; on cpu it has one device, so world size 2 cannot run (2) tp cannot run at "
        "world size 2: model mnist_cnn has no attention or MLP blocks with separate "
        "projections to split (use --model transformer or lm, or build yours of "
        "bench.workload.models.Attention / MLP) (3) single cannot run at world size 2: Single "
        "runs",
    ),
    (  # a batch the ranks cannot share, beside a strategy that cannot run: both said
        ["--strategies", "dp,ddp_spawn", "--world-sizes", "2", "--global-batch", "33"],
        "(1) dp cannot run at world size 2: DataParallel parallelises over GPUs; on cpu it has "
        "one device, so world size 2 cannot run (2) global batch 33 is not divisible by world "
        "size 2; every rank must get the same share",
    ),
    (["--strategies", "ddp_spawn", "--world-sizes", "64"], "needs 64 cores"),
    (
        ["--strategies", "ddp_spawn", "--world-sizes", "2", "--global-batch", "33"],
        "not divisible by world size 2",
    ),
    (["--strategies", "single", "--world-sizes", "0"], "world sizes must be positive"),
    (["--strategies", "single", "--world-sizes", "one"], "comma-separated list of int"),
    (
        ["--strategies", "single", "--global-batch", "-4"],
        "--global-batch must be a positive integer",
    ),
    (["--strategies", "apex_amp_ddp"], "apex_amp_ddp is unavailable: apex.amp needs CUDA"),
    (["--strategies", "single", "--device", "cuda"], "torch sees no CUDA device"),
    (  # (a --resume with nothing else: tests/test_bad_input.py, resume-a-file)
        ["--strategies", "single", "--resume", "/nonexistent/run"],
        "finishes the run with its own options (its config.json; --timeout aside); --strategies, --device",
    ),
    (
        ["--strategies", "amp_ddp", "--set", "amp_dtype=fp8"],
        "amp_ddp takes amp_dtype = fp16 | bf16",
    ),
    (  # amp_dtype is amp_ddp's default precision: beside --precision it would do nothing
        ["--strategies", "amp_ddp", "--precision", "bf16", "--set", "amp_dtype=fp16"],
        "amp_dtype chooses amp_ddp's precision where --precision does not",
    ),
    (  # shares of 6 cut in 4 micro-batches: the loss would be scaled by 3/4
        ["--strategies", "single", "--world-sizes", "1", "--global-batch", "12"]
        + ["--accumulate", "4", "--set", "shares=2"],
        "a share of 6 samples (2 shares of global batch 12) does not split into 4 equal",
    ),
    (  # model_split takes no micro-batch option: it names the strategy that does
        ["--strategies", "model_split", "--model", "transformer", "--world-sizes", "2"]
        + ["--accumulate", "2"],
        "cut into micro-batches it is pipeline_gpipe (--strategies pipeline_gpipe --set",
    ),
    (  # PowerSGD's options mean nothing to a cast hook
        ["--strategies", "ddp_fp16_hook", "--set", "powersgd_rank=4"],
        "--set powersgd_rank: no selected strategy takes this option",
    ),
    (
        ["--strategies", "ddp_powersgd", "--set", "powersgd_rank=1.5"],
        "ddp_powersgd takes powersgd_rank = an int",
    ),
    (  # checked before the ranks start, not by them
        ["--strategies", "ddp_powersgd", "--world-sizes", "2", "--set", "powersgd_start=1"],
        "compresses from step 2 at the earliest",
    ),
    (  # its first two steps all-reduce in full: timed, they were averaged into its row
        ["--strategies", "ddp_powersgd", "--world-sizes", "2", "--warmup-steps", "1"],
        "PowerSGD compresses from step 2 (powersgd_start), after --warmup-steps 1: timed "
        "steps would all-reduce uncompressed; give --warmup-steps 2 or more",
    ),
    (
        ["--strategies", "ddp_powersgd", "--world-sizes", "2", "--set", "powersgd_start=9"],
        "give --warmup-steps 9 or more",
    ),
    (  # torch's DDP asserts under no_sync() with a static graph: refused, not a failed row
        ["--strategies", "zero1", "--set", "static_graph=true", "--accumulate", "2"],
        "zero1 cannot run at world size 1,2 with fp32,acc2,static_graph=true: static_graph=true "
        "with --accumulate: torch's DDP fails under no_sync()",
    ),
    (["--strategies", "single", "--set", "junk=1"], "--set junk: no selected strategy takes"),
    (["--strategies", "single", "--max-steps", "3"], "--warmup-steps (5) must be less than"),
    (["--strategies", "single", "--limit", "10"], "smaller than the global batch"),
    (["--strategies", "single", "--image-size", "8"], "--image-size must be at least 16"),
    (
        ["--strategies", "single", "--dataset", "imagenet-subset", "--model", "mnist_cnn"],
        "use a torchvision model",
    ),
    (["--exclude", "nosuch"], "unknown strategy 'nosuch'"),
    (["--strategies", "single", "--exclude", "dp"], "--exclude goes with the default"),
    # run options (axes) and strategy-option sweeps
    (["--strategies", "single", "--precision", "fp64"], "unknown precision 'fp64'"),
    (["--strategies", "single", "--precision", "bf16,bf16"], "--precision lists a value twice"),
    (["--strategies", "single", "--compile", "maybe"], "expected on, off or off,on"),
    (["--strategies", "single", "--channels-last", "maybe"], "expected on, off or off,on"),
    (["--strategies", "single", "--accumulate", "0"], "--accumulate takes positive integers"),
    (["--strategies", "single", "--optimizer", "lion"], "unknown optimizer 'lion'"),
    (
        ["--strategies", "ddp_spawn", "--world-sizes", "2", "--accumulate", "3"],
        "not divisible by world size 2 x 3 micro-batches",
    ),
    (["--strategies", "ddp_spawn", "--sync-bn"], "SyncBatchNorm needs GPU modules"),
    (["--strategies", "single", "--sync-bn"], "SyncBatchNorm needs ranks to synchronise"),
    (["--strategies", "dp", "--compile"], "torch.compile is not used with it"),
    (
        ["--strategies", "single", "--compile", "--warmup-steps", "0", "--dry-run"],
        "--warmup-steps 0 would time that compilation as a training step",
    ),
    (  # tp counts its collectives' bytes in its first step, under a mode that slows it
        [
            "--strategies",
            "tp",
            "--model",
            "transformer",
            "--world-sizes",
            "2",
            "--warmup-steps",
            "0",
            "--dry-run",  # refused as planned: a regression fails fast, launching no ranks
        ],
        "--warmup-steps 0 would time that step; give --warmup-steps 1 or more",
    ),
    (["--strategies", "amp_ddp", "--precision", "fp32"], "trains in bf16 | fp16 only"),
    # said without its reason, tp's refusal read as caution (fp16 there failed mid-cell)
    (
        ["--strategies", "tp", "--model", "transformer", "--precision", "fp16"],
        "not fp16: fp16's loss scaling cannot check its split and unsplit",
    ),
    (
        ["--strategies", "ddp_spawn", "--set", "bucket_cap_mb=abc"],
        "ddp_spawn takes bucket_cap_mb = a float",
    ),
    (
        ["--strategies", "ddp_spawn", "--set", "bucket_cap_mb=1,0"],
        "takes bucket_cap_mb = a positive, finite float",
    ),
    (["--strategies", "ddp_spawn", "--set", "bucket_cap_mb=1,1"], "give distinct, non-empty"),
    (["--strategies", "ddp_spawn", "--set", "bucket_cap_mb=inf"], "a positive, finite float"),
    (["--strategies", "ddp_spawn", "--set", "bucket_cap_mb=1,01"], "a value is given twice"),
    (["--strategies", "ddp_spawn", "--set", "static_graph=true,1"], "a value is given twice"),
    (["--strategies", "fsdp", "--set", "reshard_after_forward=off,0"], "a value is given twice"),
    (
        ["--strategies", "ddp_spawn", "--set", "bucket_cap_mb=1", "--set", "bucket_cap_mb=2"],
        "--set bucket_cap_mb is given twice",
    ),
    (["--strategies", ","], "--strategies: expected at least one value"),
    (["--strategies", "single", "--world-sizes", ","], "expected at least one value"),
    # a stray comma was dropped without a word: `1,2,$N` with N unset ran at 1,2
    (["--strategies", "single,ddp_spawn,"], "'single,ddp_spawn,' has an empty item"),
    (["--strategies", "single", "--world-sizes", "1,,2"], "'1,,2' has an empty item"),
    (["--strategies", "single", "--compile", "off,"], "'off,' has an empty item"),
    (["--strategies", "single", "--timeout", "inf"], "--timeout takes seconds above 0"),
    (["--strategies", "single", "--run-id", "x" * 201], "--run-id names a folder: at most 200"),
    (["--strategies", "single", "--image-size", "100000"], "--image-size takes 16 to 1024"),
    (
        ["--strategies", "single", "--limit", "640", "--warmup-steps", "20"],
        "--warmup-steps 20 leaves no step to time: an epoch has 10 steps",
    ),
    (
        ["--strategies", "single", "--limit", "640", "--target-precision", "5"],
        "--target-precision checks from the 50th timed step on",
    ),
    (
        ["--strategies", "single", "--max-steps", "30", "--target-precision", "5"],
        "--max-steps 30) less 5 of warm-up leaves 25; raise --max-steps",
    ),
    (
        ["--strategies", "single", "--dataset", "synthetic", "--model", "vit_b_16"],
        "vit_b_16: forward on a batch of (3, 64, 64) float32 fails",
    ),
    (
        ["--strategies", "fsdp", "--set", "reshard_after_forward=sometimes"],
        "fsdp takes reshard_after_forward = true | false",
    ),
    # model parallelism and the model's own arguments
    (
        ["--strategies", "tp", "--world-sizes", "2"],
        "tp cannot run at world size 2: model mnist_cnn has no attention",
    ),
    (  # a reason per world size, each with its own fix
        ["--strategies", "tp", "--world-sizes", "1,2"],
        "tp cannot run: at world size 1: tensor parallelism needs at least 2 ranks (at world "
        "size 1 it is `single`); at world size 2: model mnist_cnn has no attention",
    ),
    (  # swept axes the reasons do not depend on: no setting listed (it was 537 characters)
        ["--strategies", "tp", "--world-sizes", "1,2", "--precision", "fp32,bf16"]
        + ["--compile", "off,on", "--accumulate", "1,2"],
        "tp cannot run: at world size 1: tensor parallelism needs at least 2 ranks (at world "
        "size 1 it is `single`); at world size 2: model mnist_cnn has no attention",
    ),
    (
        ["--strategies", "pipeline_gpipe", "--world-sizes", "1"],
        "a pipeline needs at least 2 ranks",
    ),
    (
        ["--strategies", "single", "--model", "transformer", "--model-arg", "width=3"],
        "--model-arg width: transformer takes dim, depth, heads, mlp_ratio, patch, dropout",
    ),
    (  # a name it takes with a value of another type: which type, not a TypeError's words
        ["--strategies", "single", "--model", "transformer", "--model-arg", "depth=abc"],
        "--model-arg depth='abc': transformer's depth takes an int (default 4)",
    ),
    (
        ["--strategies", "single", "--model", "lm", "--model-arg", "dropout=true"],
        "--model-arg dropout='true': lm's dropout takes a number (default 0.0)",
    ),
    (
        ["--strategies", "single", "--model", "transformer", "--model-arg", "shape=(3,8,8)"],
        "--model-arg shape: transformer's shape is the data's, not an argument",
    ),
    (
        ["--strategies", "single", "--model", "transformer", "--model-arg", "heads=3"],
        "dim 128 is not divisible by 3 heads",
    ),
    (["--strategies", "single", "--model-arg", "depth"], "expected key=value"),
    (  # a key given twice kept its last value, the first dropped without a word
        ["--strategies", "single", "--model", "transformer"]
        + ["--model-arg", "depth=8", "--model-arg", "depth=2"],
        "--model-arg depth is given twice (depth=8, depth=2): give it once",
    ),
    (
        ["--strategies", "single", "--dataset", "tests/plugins/hungry_data.py:hungry"]
        + ["--dataset-arg", "n=64", "--dataset-arg", "n=128"],
        "--dataset-arg n is given twice (n=64, n=128): give it once",
    ),
    (["--strategies", "single", "--diverge-factor", "1"], "--diverge-factor must be more than 1"),
    (  # every strategy (none named) skipped: exit 0 with nothing measured, after the estimate
        ["--world-sizes", "4096", "--dataset", "synthetic"],
        "no cell can run: one CPU core per rank at least: world size 4096 needs 4096 cores",
    ),
    (
        ["--strategies", "single", "--world-sizes", "1", "--global-batch", "20000"],
        "global batch 20000 is larger than the",
    ),
    (
        [
            "--strategies",
            "single",
            "--world-sizes",
            "1",
            "--dataset",
            "imagenet-subset",
            "--model",
            "resnet18",
            "--global-batch",
            "5000",
        ],
        "global batch 5000 is larger than the",
    ),
]


@pytest.mark.parametrize(("args", "message"), CASES)
def test_bad_input_is_one_line_and_exit_2(run, tmp_path, args, message):
    code, out, err = run(*args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("parabench: error:"), err
    assert message in lines[0]
    assert not (tmp_path / "out").exists()  # nothing was created


@pytest.mark.parametrize("model", ["lm", "transformer"])
def test_a_model_deeper_than_any_trained_is_refused_before_its_blocks_are_built(
    run, tmp_path, monkeypatch, model
):
    """--model-arg depth=100000000 built block after block on the meta device for the checks,
    past 8 GiB in minutes with nothing said: a depth past MAX_DEPTH is one line, no block
    built beyond it."""
    from bench.workload import models

    built = []
    real = models.Block

    def block(*a, **k):
        built.append(1)
        assert len(built) <= 1000, "blocks built past MAX_DEPTH (1000)"
        return real(*a, **k)

    monkeypatch.setattr(models, "Block", block)
    args = ["--strategies", "single", "--world-sizes", "1", "--model", model]
    code, _, err = run(*args, "--model-arg", "depth=100000000", "--dry-run")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0] == (
        f"parabench: error: {model}: depth 100000000 is more than 1000 blocks, deeper than "
        "any model trained (each is built before the run starts): lower --model-arg depth"
    )
    assert not built and not (tmp_path / "out").exists()


def test_predict_refuses_a_stray_comma_in_its_world_sizes(tmp_path, capsys):
    """As run's list options do: `--world-sizes 4,8,` predicted at 4 and 8 without a word."""
    with pytest.raises(SystemExit) as bad:
        main(["predict", str(tmp_path), "--world-sizes", "4,8,"])
    err = capsys.readouterr().err
    assert bad.value.code == 2 and err.count("\n") == 1, err
    assert "'4,8,' has an empty item (a stray comma); give the values alone, e.g. 4,8" in err


def test_an_output_folder_that_cannot_be_written_is_one_line(run, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out, err = run("--strategies", "single", "--out-dir", str(blocker / "results"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"cannot write the run there ({blocker}: not a directory)" in err
    assert "estimated" not in out  # said before the estimate times anything


def test_a_run_id_of_a_run_stopped_before_its_first_row_is_not_reused(run, tmp_path):
    """Its folder holds config.json and the first measurements (model.json, collectives.json)
    of its own model: a new run there would have kept them as its own."""
    begun = tmp_path / "out" / "begun"
    begun.mkdir(parents=True)
    (begun / "config.json").write_text("{}")
    code, _, err = run("--strategies", "single", "--run-id", "begun")
    assert code == 2 and "stopped before its first row" in err and "--resume" in err


def test_list_for_a_device_that_is_not_here_is_refused(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["list", "--device", "cuda"]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err


def test_missing_data_root(run, tmp_path):
    code, _, err = run("--strategies", "single", data=str(tmp_path / "nowhere"))
    assert code == 2 and "MNIST not found" in err and len(err.strip().splitlines()) == 1


def test_malformed_data_root(run, tmp_path):
    raw = tmp_path / "bad" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    (raw / "t10k-images-idx3-ubyte").write_bytes(b"not an idx file")
    (raw / "t10k-labels-idx1-ubyte").write_bytes(b"nor this")
    code, _, err = run("--strategies", "single", data=str(tmp_path / "bad"))
    assert code == 2 and "is not an idx file" in err and len(err.strip().splitlines()) == 1


def test_a_factory_argument_reaches_the_ranks_as_the_harness_checked_it():
    """The ranks read --dataset-arg and --model-arg from the run's config, as JSON: a tuple
    came back there a list, so the harness checked the factories with other arguments than
    their ranks were given (a dict's int keys, which came back strings, are refused:
    tests/test_bad_input.py)."""
    shapes = str(Path(__file__).resolve().parents[1] / "examples" / "own_data.py") + ":shapes"
    args = ["run", "--dataset", shapes, "--model", "lm"]
    args += ["--dataset-arg", "shape=(3, 32, 32)", "--model-arg", 'widths={"a": (8, 16)}']
    a = build_parser().parse_args(args)
    cfg = RunConfig(
        dataset=a.dataset,
        model=a.model,
        dataset_kwargs=dict(a.dataset_args),
        model_kwargs=dict(a.model_args),
    )
    ranks = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert ranks.dataset_kwargs == cfg.dataset_kwargs == {"shape": [3, 32, 32]}
    assert ranks.model_kwargs == cfg.model_kwargs == {"widths": {"a": [8, 16]}}


def test_list_shows_every_strategy_with_reasons(capsys):
    assert main(["list", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for name in ("single", "dp", "ddp_torchrun", "ddp_spawn", "amp_ddp", "apex_amp_ddp", "horovod"):
        assert f"  {name} " in out
    for name in ("model_split", "pipeline_gpipe", "pipeline_1f1b", "pipeline_interleaved"):
        assert f"  {name} " in out
    assert "  tp " in out and "  fsdp_tp " in out and "transformer" in out
    assert "apex.amp needs CUDA" in out


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`parabench list | head -1`: the pipe closes under the listing (here before it
    starts, so the test does not race the reader); parabench stops quietly with
    128 + SIGPIPE instead of a BrokenPipeError traceback."""
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.cli", "list", "--device", "cpu"],
            stdout=write,
            stderr=subprocess.PIPE,
            timeout=120,
        )
    finally:
        os.close(write)
    err = proc.stderr.decode()
    assert proc.returncode == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_broken_pipe_that_is_not_stdout_is_not_hidden(monkeypatch):
    """Only stdout's reader leaving is quiet: a pipe to a rank or a socket that breaks
    is a failure with its traceback."""
    from bench import cli

    def broke(_args):
        raise BrokenPipeError("a rank's pipe")

    monkeypatch.setattr(cli, "cmd_list", broke)
    read, write = os.pipe()  # stdout: a pipe someone still reads
    monkeypatch.setattr(sys, "stdout", os.fdopen(write, "w"))
    try:
        with pytest.raises(BrokenPipeError, match="a rank's pipe"):
            cli.main(["list"])
        os.close(read)  # now stdout's reader is gone: the same error is the quiet one
        assert cli.main(["list"]) == 141
    finally:
        sys.stdout.close()


def test_resume_with_a_corrupt_config(tmp_path, capsys):
    bad = tmp_path / "run"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    assert main(["run", "--resume", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "config.json is unreadable" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("repeats", 2.5, "repeats is 2.5, not a whole number"),
        ("repeats", "2", 'repeats is "2", not a whole number'),
        ("timeout_s", "900", 'timeout_s is "900", not a number'),
        ("global_batch", None, "global_batch is null, not a whole number"),
        ("download", 1, "download is 1, not true or false"),
        # a matrix axis of true/false: [1] and "true" ran as true
        ("compile", [1], "compile is [1], not a list of true or false"),
        ("sync_bn", "true", 'sync_bn is ["true"], not a list of true or false'),
    ],
)
def test_resume_of_a_config_edited_to_a_value_of_another_type(
    tmp_path, capsys, data_root, key, value, said
):
    """A config.json edited by hand: "repeats": 2.5 was a TypeError traceback from the plan
    (range() of a float), "2" a line about '>=' between str and int. One line saying which
    value is wrong, and how, exit 2."""
    from tests.conftest import small_config

    run = tmp_path / "run"
    run.mkdir()
    saved = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1,))
    (run / "config.json").write_text(json.dumps(saved.to_dict() | {key: value}))
    assert main(["run", "--resume", str(run), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert err == f"parabench: error: --resume {run}: config.json is unreadable ({said})\n"
    # as saved (a float as JSON writes a whole one, no lr), it is read
    assert RunConfig.from_dict(saved.to_dict() | {"timeout_s": 900, "lr": None}).timeout_s == 900


def _stand_in_timed(cfg, bundle, precisions, isolate) -> dict:
    """estimate.timed's figures without timing a step: 1 ms a sample, 0.5 a forward."""
    return {p: (1.0, 0.5) for p in precisions}


@pytest.fixture
def untimed(monkeypatch):
    """The estimate a run prints first from a stand-in step time, not steps timed here: for
    tests of what comes after it (each run of theirs spent a second or more timing them,
    far more on a busy machine). tests/test_estimate.py times them."""
    from bench.harness import estimate

    monkeypatch.setattr(estimate, "timed", _stand_in_timed)


def _not_raised(run, *args: str) -> tuple[int, str, str]:
    try:
        return run(*args)
    except KeyboardInterrupt:  # escaped: a traceback for the user (and an end to pytest)
        pytest.fail("Ctrl-C left parabench as a KeyboardInterrupt traceback")


def test_ctrl_c_before_the_run_begins_is_one_line_and_exit_130(run, tmp_path, monkeypatch):
    """Ctrl-C while the estimate times the model (seconds, before any row): a
    KeyboardInterrupt traceback, exit by SIGINT; now one line and 130, nothing created."""
    from bench.harness import estimate

    def interrupted(cfg, cells):
        raise KeyboardInterrupt

    monkeypatch.setattr(estimate, "estimate", interrupted)
    code, out, err = _not_raised(run, "--strategies", "single", "--world-sizes", "1")
    assert (code, out, err) == (130, "", "parabench: interrupted\n")
    assert not (tmp_path / "out").exists()


def test_ctrl_c_in_the_report_after_the_run_says_the_rows_are_kept(
    run, tmp_path, monkeypatch, untimed
):
    from bench.analysis import report
    from bench.harness import runner

    done = tmp_path / "out" / "done"
    monkeypatch.setattr(runner, "run_matrix", lambda cfg, **kw: (done, []))

    def interrupted(run_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "render", interrupted)
    code, out, err = _not_raised(run, "--strategies", "single", "--world-sizes", "1")
    assert code == 130 and "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        f"interrupted while writing the report: every row is in {done}; "
        f"`parabench report {done}` writes it"
    )


def test_a_run_writing_its_report_is_still_going_to_status(run, tmp_path, monkeypatch, untimed):
    """`parabench run` let go of its run as the last cell ended, then wrote the report (its
    plots: seconds): `status` in another terminal said the run complete and named no
    report, which was not there yet. It holds the run until the report is written: status
    says it is writing it, then complete with the report."""
    import shutil

    from bench.analysis import report
    from bench.harness import progress, results, runner

    done = tmp_path / "out" / "done"
    shutil.copytree(ROOT / "results/reference/cpu-2core-mnist-3rounds", done)
    (done / "report.md").unlink()
    rd = runner.RunDir(done)  # planned: the cells it has rows for (an older run: no plan.csv)
    rd.write_plan([SimpleNamespace(key=k) for k in {results.row_key(r) for r in rd.runs.read()}])
    monkeypatch.setattr(runner, "run_matrix", lambda cfg, **kw: (done, []))
    said = []

    def render(run_dir):
        said.append(progress.run_status(run_dir))
        (run_dir / "report.md").write_text("# report\n")
        return run_dir / "report.md"

    monkeypatch.setattr(report, "render", render)
    code, out, err = run("--strategies", "single", "--world-sizes", "1")
    assert code == 0, err
    cells = "120 of 120 cells done (84 ok, 30 skipped, 6 unavailable)"
    pid = os.getpid()
    assert said == [f"{done}: running (parabench pid {pid}): {cells}; writing its report"]
    report_md = done / "report.md"
    assert progress.run_status(done) == f"{done}: complete, {cells}; report: {report_md}"


def test_the_report_a_run_writes_of_itself_does_not_call_it_still_going(tmp_path):
    """`run` holds its run as it writes the report: one that left cells for a machine they
    fit on has planned cells with no row, and its report.md named this very process as the
    one still running it ("parabench pid N holds it"), for good. It says how to finish it."""
    import shutil

    from bench.analysis import report
    from bench.harness import results, runner

    done = tmp_path / "done"
    shutil.copytree(ROOT / "results/reference/cpu-2core-mnist-3rounds", done)
    rd = runner.RunDir(done)
    cells = [*{results.row_key(r) for r in rd.runs.read()}, ("ddp_spawn", 8, "fp32", 0)]
    rd.write_plan([SimpleNamespace(key=k) for k in cells])
    rd.lock()  # as `run` holds it
    try:
        text = report.load_run(done).missing_text()
    finally:
        rd.unlock()
    assert text.endswith(
        f"the run is still going, or it stopped; to finish it, parabench run --resume {done}"
    ), text


def test_a_stop_the_run_could_not_say_is_said_once(run, tmp_path, monkeypatch, untimed):
    """Ctrl-C that left the run before it could say what it kept (as it opened its folder):
    `run` ended with exit 130 and not a word; now main's line. A stop the run did say
    (proc.Interrupted) gets no second one."""
    from bench.harness import proc, runner

    def stopped(cfg, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_matrix", stopped)
    code, out, err = _not_raised(run, "--strategies", "single", "--world-sizes", "1")
    assert (code, err) == (130, "parabench: interrupted\n")

    def said(cfg, **kw):
        raise proc.Interrupted

    monkeypatch.setattr(runner, "run_matrix", said)
    code, out, err = _not_raised(run, "--strategies", "single", "--world-sizes", "1")
    assert (code, err) == (130, "")


def test_a_report_the_disk_has_no_room_for_is_not_bad_input(run, tmp_path, monkeypatch, untimed):
    """A run whose every cell ended, on a disk that filled up as its plots were written:
    "error: cannot write the report there", exit 2 (bad input), no table and no word of the
    rows; now the rows are said to be kept, how to write the report, the table, exit 1."""
    from bench.analysis import report
    from bench.harness import runner

    done = tmp_path / "out" / "done"
    monkeypatch.setattr(runner, "run_matrix", lambda cfg, **kw: (done, []))

    def full(run_dir):
        path = Path(run_dir)
        raise ConfigError(f"{path}: cannot write the report there (No space left on device)")

    monkeypatch.setattr(report, "render", full)
    code, out, err = _not_raised(run, "--strategies", "single", "--world-sizes", "1")
    assert code == 1 and "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        f"parabench: no report: {done}: cannot write the report there (No space left on "
        f"device); every row is in {done}: `parabench report {done}` writes it"
    )
    assert f"results: {done}" in out and "report:" not in out


def test_the_table_at_a_runs_end_names_cells_measured_on_a_busy_cpu(
    run, tmp_path, monkeypatch, untimed
):
    """The report names the cells measured while other processes took 20 % of a CPU
    machine or more (report.busy_line), but the table `parabench run` ends with did not:
    a reader of the terminal alone took their speeds for the strategies'. It says the
    report's line under the table, with --no-report too."""
    import csv
    import shutil

    from bench.harness import runner

    done = tmp_path / "out" / "done"
    shutil.copytree(ROOT / "results/reference/cpu-2core-mnist-3rounds", done)
    with open(done / "runs.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(done / "runs.csv", "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0]))
        out.writeheader()
        for r in rows:
            if r["strategy"] == "ddp_spawn" and r["world_size"] == "2":
                r["other_cpu_pct"] = "68.5"
            out.writerow(r)
    monkeypatch.setattr(runner, "run_matrix", lambda cfg, **kw: (done, rows))
    code, out_, err = run("--strategies", "single", "--world-sizes", "1", "--no-report")
    assert code == 0, err
    table, _, after = out_.partition(f"results: {done}")
    assert (
        "Measured while other processes used 20 % of the CPUs or more: ddp_spawn ws=2 "
        "(at most 68.5 %)"
    ) in table.splitlines()[-1]
    # a quiet run's end says nothing of it
    for r in rows:
        r["other_cpu_pct"] = "3.0"
    with open(done / "runs.csv", "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows)
    code, out_, err = run("--strategies", "single", "--world-sizes", "1", "--no-report")
    assert code == 0 and "of the CPUs or more" not in out_, err


def test_the_table_at_a_runs_end_says_which_cells_are_within_noise(
    run, tmp_path, monkeypatch, untimed
):
    """The table `parabench run` ends with gave each cell's speed-up and nothing of its
    noise: cells the report found within noise of the fastest read as ranked by it, and a
    run of one repeat (the default) as measured to its last digit. Under the table, the
    report's ranking: the fastest per world size and those within noise of it, or that too
    few repeats tell none apart."""
    import shutil

    import pandas as pd

    from bench.harness import runner

    done = tmp_path / "out" / "done"
    shutil.copytree(ROOT / "results/reference/cpu-2core-mnist-3rounds", done)
    monkeypatch.setattr(runner, "run_matrix", lambda cfg, **kw: (done, []))

    def end() -> list[str]:
        code, out_, err = run("--strategies", "single", "--world-sizes", "1", "--no-report")
        assert code == 0, err
        return out_.partition(f"results: {done}")[0].splitlines()

    said = end()
    assert said[-3].startswith("- world size 1: fastest single; within noise of it: zero1, ")
    assert said[-2].startswith("- world size 2: fastest ddp_spawn; within noise of it: ")
    assert said[-1].startswith("- unstable (samples/s varies more than 5 % over repeats): ")
    runs = pd.read_csv(done / "runs.csv", dtype=str, keep_default_na=False)
    runs[runs["repeat"] == "0"].to_csv(done / "runs.csv", index=False)  # one repeat
    said = end()
    one = " (no interval (fewer than 3 repeats): ties cannot be told from noise)"
    assert said[-2] == f"- world size 1: fastest ddp_bf16_hook{one}"  # its repeat 0 alone
    assert said[-1].startswith("- world size 2: fastest ") and said[-1].endswith(one)


def test_a_run_still_going_is_not_resumed_beside_it(tmp_path, capsys, data_root):
    """`--resume` of a run another parabench is running (a second terminal, a job requeued
    while the first still runs) ran its cells again into the same cell folders, and the two
    harnesses' rows overwrote each other: refused, one line, nothing written. Once that run
    has ended, it resumes."""
    from bench.harness import runner
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1,))
    _, going, _ = runner.open_run(cfg.replace(run_id="busy"), None)  # held by this process
    try:
        assert main(["run", "--resume", str(going.path), "--no-report"]) == 2
        err = capsys.readouterr().err
        assert f"{going.path} is being run by another parabench (pid {os.getpid()})" in err
        assert err.count("\n") == 1, err
        assert not (going.path / "environment.json").exists()  # it started nothing
        assert not (going.path / "cells").exists()
        # a new run under its id: said to be going, not "stopped before its first row"
        again = ["run", "--run-id", "busy", "--out-dir", str(going.path.parent), "--no-report"]
        assert main([*again, "--strategies", "single", "--world-sizes", "1"]) == 2
        err = capsys.readouterr().err
        assert "is being run by another parabench" in err
        # a new run is told to take another id, not to resume a run it did not mean to join
        assert "choose another --run-id" in err and "--resume" not in err, err
    finally:
        going.unlock()
    assert not (going.path / ".lock").exists()  # an ended run leaves no lock file
    _, resumed, _ = runner.open_run(cfg, going.path)
    resumed.unlock()


def test_resume_refuses_an_option_given_its_default(tmp_path, capsys, data_root, monkeypatch):
    """`--resume RUN --repeats 1` of a run of 2 repeats (to finish it sooner): 1 is the
    default, so the option passed for not given, and the run went on with 2 repeats, the
    option ignored without a word. Given is given, whatever its value: refused."""
    from bench.harness import runner
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1,))
    _, begun, _ = runner.open_run(cfg.replace(run_id="two", repeats=2), None)
    begun.unlock()

    def ran(cfg, **kw):
        pytest.fail("the resumed run started, its option ignored")

    monkeypatch.setattr(runner, "run_matrix", ran)
    for given in (["--repeats", "1"], ["--rep=1"], ["--device", "auto"], ["--epochs", "1"]):
        assert main(["run", "--resume", str(begun.path), "--no-report", *given]) == 2
        err = capsys.readouterr().err
        flag = "--repeats" if given[0].startswith("--rep") else given[0]
        assert f"{flag} would be ignored: leave them out" in err, given
        assert err.count("\n") == 1, err


def test_resume_takes_a_timeout_for_the_cells_it_runs(tmp_path, capsys, data_root, monkeypatch):
    """A cell that timed out ("too long for the --timeout") could only run again with the
    same deadline: --resume refused --timeout as an option of the run's. It measures
    nothing, so a resume (--retry-failed beside it) takes it for the cells it runs; the
    run's config.json keeps the deadline its cells so far ran with."""
    from bench.harness import runner
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1,))
    _, begun, _ = runner.open_run(cfg.replace(run_id="r"), None)
    begun.unlock()
    asked = []
    monkeypatch.setattr(runner, "run_matrix", lambda cfg, **kw: asked.append(kw) or 1 / 0)
    with pytest.raises(ZeroDivisionError):  # (the run itself is not this test's)
        main(["run", "--resume", str(begun.path), "--retry-failed", "--timeout", "900"])
    assert (asked[0]["timeout_s"], asked[0]["retry"]) == (900, True)
    with pytest.raises(ZeroDivisionError):
        main(["run", "--resume", str(begun.path)])
    assert asked[1]["timeout_s"] is None  # not given: the run's own
    monkeypatch.undo()
    said: list[str] = []
    resumed, rd, _ = runner.open_run(cfg, begun.path, said.append, timeout_s=900)
    rd.unlock()
    assert resumed.timeout_s == 900 and said == [
        "cells run with --timeout 900 s (the run began with 240)"
    ]
    assert rd.config().timeout_s == 240


def test_a_resume_given_a_timeout_says_it_in_the_command_that_goes_on(
    tmp_path, data_root, monkeypatch, capsys
):
    """`--resume RUN --retry-failed --timeout S` of a SLURM run outside an allocation was
    told to `sbatch job.sbatch` (or resume inside salloc) with neither option, and such a
    resume stopped (Ctrl-C) was told to go on with a plain --resume: either, run as said,
    gave the cells the run's first deadline again (and retried none). They keep them."""
    from bench.harness import proc, runner, slurm
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1,))
    _, begun, _ = runner.open_run(cfg.replace(run_id="r"), None)
    begun.unlock()
    monkeypatch.setattr(runner, "measure_collectives", lambda *a: (_ for _ in ()).throw(
        KeyboardInterrupt))  # fmt: skip
    with pytest.raises(proc.Interrupted):
        runner.run_matrix(cfg, resume=begun.path, echo=lambda line: None, timeout_s=900)
    assert f"continue with: parabench run --resume {begun.path} --timeout 900" in (
        capsys.readouterr().err
    )
    config = json.loads(begun.config_path.read_text())
    slurm_run = {"launcher": "slurm", "nodes": 1, "procs_per_node": 1, "hosts": ["n1"]}
    begun.config_path.write_text(json.dumps({**config, **slurm_run, "master_addr": "n1"}))
    (begun.path / "job.sbatch").write_text('exec parabench run --resume r "$@"\n')
    monkeypatch.setattr(slurm, "in_allocation", lambda: False)
    with pytest.raises(ConfigError) as refused:
        runner.open_run(cfg, begun.path, retry=True, timeout_s=900)
    job = begun.path / "job.sbatch"
    assert f"sbatch {job} --retry-failed --timeout 900 (it resumes" in str(refused.value)


def test_the_timeout_a_stopped_resume_gave_is_named_by_what_goes_on(
    run, tmp_path, data_root, monkeypatch, untimed
):
    """A resume given --timeout that stopped said to go on with it, but `status`, the report
    and a run's end line for its failed cells named a plain --resume, which ran the cells
    left with the run's first deadline again. The deadline the last resume that ran cells
    gave them is kept beside config.json (which keeps the first) and named by each; a plain
    resume that runs cells goes back to the run's own."""
    import shutil

    from bench.harness import progress, results, runner
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1,))
    _, begun, _ = runner.open_run(cfg.replace(run_id="r"), None)
    begun.unlock()
    plain = f"to finish it: parabench run --resume {begun.path}"
    assert progress.run_status(begun.path).endswith(plain)
    for timeout_s, said in ((900, f"{plain} --timeout 900"), (None, plain)):
        _, rd, _ = runner.open_run(cfg, begun.path, lambda line: None, timeout_s=timeout_s)
        rd.unlock()  # (stopped before its first cell ended)
        assert progress.run_status(begun.path).endswith(said), timeout_s
        assert rd.config().timeout_s == 240
    # a run's end: the failed cells' command keeps it, and asks for more where one timed out
    done = tmp_path / "out" / "done"
    shutil.copytree(ROOT / "results/reference/cpu-2core-mnist-3rounds", done)
    (done / results.RESUMED).write_text('{"timeout_s": 900}')
    rows = [{**runner.RunDir(done).runs.read()[0], "status": "timeout", "reason": "too long"}]
    monkeypatch.setattr(runner, "run_matrix", lambda cfg, **kw: (done, rows))
    code, out, err = run("--strategies", "single", "--world-sizes", "1", "--no-report")
    assert out.splitlines()[-1] == (
        f"to run those that failed, ran out of memory or timed out again: parabench run "
        f"--resume {done} --retry-failed --timeout 900 (with its --timeout larger for those "
        "that timed out)"
    )


def test_a_resume_refused_says_no_new_timeout(tmp_path, data_root, monkeypatch):
    """`--resume RUN --timeout S` said "cells run with --timeout S" and then was refused
    (every cell it has left too big for this machine): the line
    said a deadline that no cell ran with. It is said only where a cell runs with it."""
    from bench.harness import runner
    from tests.conftest import small_config

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    cfg = small_config(tmp_path, data_root, strategies=("pipeline_gpipe",), run_id="pipe")
    _, begun, _ = runner.open_run(cfg, None)
    begun.unlock()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    said: list[str] = []
    with pytest.raises(ConfigError, match="nothing it has left can run here"):
        runner.open_run(cfg, begun.path, said.append, timeout_s=900)
    assert not any("--timeout" in line for line in said), said
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # where it fits: said
    _, resumed, _ = runner.open_run(cfg, begun.path, said.append, timeout_s=900)
    resumed.unlock()
    assert said == ["cells run with --timeout 900 s (the run began with 240)"], said


def test_a_lock_on_the_file_an_ending_run_removed_is_taken_anew(tmp_path, monkeypatch):
    """A harness that opened `.lock` just as the run holding it ended (which removes it)
    gets the lock on a file with no name: a third could then lock a new `.lock` too and
    both would run the cells. It takes the lock on the file that is there instead."""
    import fcntl

    from bench.config import ConfigError
    from bench.harness import runner

    path = tmp_path / "run"
    path.mkdir()
    flock, calls = fcntl.flock, []

    def ended_meanwhile(f, how):  # the first try: the run holding it ends before flock
        calls.append(how)
        if len(calls) == 1:
            (path / ".lock").unlink()
        return flock(f, how)

    monkeypatch.setattr(fcntl, "flock", ended_meanwhile)
    held = runner.RunDir(path)
    held.lock()
    monkeypatch.setattr(fcntl, "flock", flock)
    try:
        assert len(calls) == 2  # it tried again, on the file now there
        with pytest.raises(ConfigError, match="is being run by another parabench"):
            runner.RunDir(path).lock()
    finally:
        held.unlock()


def test_a_resume_begun_as_a_report_reads_the_lock_is_not_refused(tmp_path, monkeypatch) -> None:
    """`parabench report` (or compare) reads whether a run is held by taking its lock, shared,
    for a moment (results.held_by); a --resume that tried the lock in that moment was refused
    as "being run by another parabench". The lock is tried again a few times first; a run
    held for longer is still refused."""
    import fcntl

    from bench.harness import runner

    path = tmp_path / "run"
    path.mkdir()
    (path / ".lock").write_text("")
    reader = open(path / ".lock")  # noqa: SIM115 - closed below
    fcntl.flock(reader, fcntl.LOCK_SH)
    waits = []

    def read_ends(seconds: float) -> None:  # the report's read ends while the run waits
        waits.append(seconds)
        reader.close()

    monkeypatch.setattr(runner.time, "sleep", read_ends)
    rd = runner.RunDir(path)
    rd.lock()  # refused at once before
    rd.unlock()
    assert waits == [runner.LOCK_RETRY_S]
    monkeypatch.undo()
    with open(path.parent / "run" / ".lock", "a+") as holder:  # held for good: refused
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(ConfigError, match="is being run by another parabench"):
            runner.RunDir(path).lock()


def test_a_new_run_that_waited_for_the_lock_does_not_run_into_the_run_that_held_it(
    tmp_path, data_root, monkeypatch
) -> None:
    """Two new runs under one --run-id at once: the second's lock waits out a moment's hold
    (a report's read) and took the folder once the first let go, a run ended, and wrote its
    own config.json and cells over it. Refused, one line; the first run's config kept."""
    from bench.harness import runner
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1,))
    cfg = cfg.replace(run_id="raced")
    taken = runner.RunDir.lock

    def first_ran_meanwhile(self, new_run=False):  # the other run's config.json, its lock gone
        self.config_path.write_text('{"first": 1}')
        return taken(self, new_run)

    monkeypatch.setattr(runner.RunDir, "lock", first_ran_meanwhile)
    with pytest.raises(ConfigError, match="holds a run already; choose another --run-id"):
        runner.open_run(cfg, None)
    kept = Path(cfg.out_dir) / "raced" / "config.json"
    assert kept.read_text() == '{"first": 1}' and not (kept.parent / ".lock").exists()


def test_a_run_on_a_read_only_file_system_resumes_to_one_line(tmp_path, capsys, data_root):
    """A run folder that cannot be written any more (a read-only mount; as root, a mode
    does not stop writes): `--resume` was an OSError traceback from rewriting plan.csv."""
    import subprocess

    from bench.harness import runner
    from tests.conftest import small_config

    if os.geteuid() != 0:
        pytest.skip("mounting a read-only file system needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)]).returncode != 0:
        pytest.skip("this machine lets no tmpfs be mounted")
    try:
        cfg = small_config(mnt, data_root, strategies=("single",), world_sizes=(1,))
        _, begun, _ = runner.open_run(cfg.replace(run_id="r"), None)
        begun.unlock()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        assert main(["run", "--resume", str(begun.path), "--no-report"]) == 2
        err = capsys.readouterr().err
        assert (
            err
            == f"parabench: error: {begun.path}: cannot write the run there (Read-only file system)\n"
        )
    finally:
        subprocess.run(["umount", str(mnt)])


@pytest.mark.parametrize("cut", [10, 60])  # in the cell's key, or after it
def test_a_runs_csv_cut_short_is_one_line_on_resume(tmp_path, capsys, data_root, cut):
    """A runs.csv whose last row is cut short (copied while it was written, a crash of the
    machine): a TypeError traceback where the row's key was cut, else a cell counted done
    whose row has no status. Now one line saying which row to remove; nothing written."""
    from bench.harness import results, runner
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1,))
    _, begun, _ = runner.open_run(cfg.replace(run_id="cut"), None)
    begun.unlock()
    row = dict.fromkeys(results.RUN_COLUMNS, "")
    row.update(run_id="cut", strategy="single", world_size="1", setting="fp32", repeat="0")
    row.update(status="ok", epoch="0")
    line = ",".join(row[c] for c in results.RUN_COLUMNS)
    (begun.path / "runs.csv").write_text(",".join(results.RUN_COLUMNS) + "\n" + line[:cut])
    before = sorted(p.name for p in begun.path.iterdir())
    assert main(["run", "--resume", str(begun.path), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"parabench: error: {begun.path}/runs.csv: row 2 is cut short or damaged; remove it "
        "(its cell runs again) and resume\n"
    )
    assert sorted(p.name for p in begun.path.iterdir()) == before


def test_a_run_from_before_run_options_is_not_run_again_on_resume(tmp_path, capsys, monkeypatch):
    """A runs.csv with no setting column (the committed reference from before run options):
    none of its rows matched a cell of the plan, so --resume ran every cell again beside
    them. Refused, one line, nothing written; the report still reads it."""
    import shutil

    from bench.analysis import report
    from bench.harness import runner

    old = tmp_path / "old"
    shutil.copytree(Path(__file__).parents[1] / "results" / "reference" / "cpu-2core-mnist", old)
    before = sorted(p.name for p in old.iterdir())

    def started(*args, **kwargs):
        pytest.fail("the resumed run started measuring")

    monkeypatch.setattr(runner, "measure_collectives", started)
    assert main(["run", "--resume", str(old), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"parabench: error: {old}/runs.csv was written by a parabench from ")
    assert err.count("\n") == 1 and "no setting column" in err
    assert sorted(p.name for p in old.iterdir()) == before
    assert len(report.load_run(old).runs) == 32


def test_predict_on_a_run_from_before_the_measurements_says_so(tmp_path, capsys):
    """The committed reference from before parabench measured collectives: predict said its
    measurement "failed (the run's output said why)", which the run never attempted."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(Path(__file__).parents[1] / "results" / "reference" / "cpu-2core-mnist", old)
    assert main(["predict", str(old)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"parabench: error: {old} has no collectives.json: the run measured no collectives "
        "(it was made by a parabench from before these measurements)\n"
    )
    assert not (old / "predict.csv").exists()


def test_predict_writes_its_csv_where_asked_and_never_into_a_committed_reference(tmp_path, capsys):
    """predict wrote predict.csv into every run it read, committed references under
    results/reference/ included (an untracked file there, rewritten by each --link asked
    about); a run directory it could not write ended in a traceback."""
    import shutil

    import pandas as pd

    src = Path(__file__).parents[1] / "results" / "reference" / "cpu-2core-mnist-20261126"
    ref = tmp_path / "results" / "reference" / "ref"
    shutil.copytree(src, ref)
    before = sorted(p.name for p in ref.iterdir())
    assert main(["predict", str(ref), "--world-sizes", "2"]) == 0
    out = capsys.readouterr().out
    assert f"predictions not written: {ref} is a committed reference; --csv PATH" in out
    assert sorted(p.name for p in ref.iterdir()) == before
    asked = tmp_path / "mine.csv"
    assert main(["predict", str(ref), "--world-sizes", "2", "--csv", str(asked)]) == 0
    assert f"predictions: {asked}" in capsys.readouterr().out
    assert set(pd.read_csv(asked)["world_size"]) == {2}
    assert sorted(p.name for p in ref.iterdir()) == before
    # a run of one's own: beside its runs.csv, as before
    mine = shutil.copytree(ref, tmp_path / "results" / "mine")
    assert main(["predict", str(mine), "--world-sizes", "2"]) == 0
    assert set(pd.read_csv(mine / "predict.csv")["world_size"]) == {2}
    capsys.readouterr()
    # a --csv that cannot be written: one line, before anything is predicted
    for bad, said in [(tmp_path / "no" / "p.csv", "no such directory"), (tmp_path, "a directory")]:
        assert main(["predict", str(mine), "--csv", str(bad)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and said in err, err
    # a file that cannot be replaced (as in a run copied read-only, which root writes anyway)
    (mine / "predict.csv").unlink()
    (mine / "predict.csv").mkdir()
    assert main(["predict", str(mine), "--world-sizes", "2"]) == 2
    last = capsys.readouterr().err.splitlines()[-1]  # after the cases left out, one line
    assert last.startswith(f"parabench: error: cannot write {mine / 'predict.csv'} ("), last


def test_dry_run_prints_the_plan_and_an_estimate_and_starts_nothing(
    tmp_path, capsys, data_root, monkeypatch
):
    from bench.cli import main
    from bench.harness import estimate

    out = tmp_path / "out"
    args = ["run", "--dry-run", "--device", "cpu", "--data-root", str(data_root)]
    args += ["--strategies", "single,ddp_spawn,pipeline_gpipe", "--world-sizes", "1,2"]
    args += ["--out-dir", str(out), "--limit", "1024", "--repeats", "2"]
    assert main([*args, "--max-steps", "10"]) == 0
    text = capsys.readouterr().out
    assert "plan: 8 cell(s) to run" in text  # (ddp_spawn x2, pipeline at 2, single) x 2 repeats
    assert "pipeline_gpipe          1  fp32                    skipped: a pipeline needs" in text
    assert any(
        line.split() == ["ddp_spawn", "2", "fp32", "spawn", "2"] for line in text.splitlines()
    )
    assert "mnist" in text and "10 step(s) per epoch" in text

    def seconds(plan: str) -> float:  # "estimated wall time 42 s (..." or "6.6 min (..."
        value, unit = plan.split("estimated wall time ")[1].split(" (")[0].split()
        return float(value) * (60 if unit == "min" else 1)

    assert seconds(text) > 0
    assert not out.exists()  # nothing ran, nothing written
    # more steps: longer, at one time per sample (timed twice, on a busy machine the first
    # timing could come out longer than the second's plan in all)
    monkeypatch.setattr(estimate, "timed", _stand_in_timed)
    assert main([*args, "--max-steps", "10"]) == 0
    short = seconds(capsys.readouterr().out)
    assert main([*args, "--max-steps", "16", "--epochs", "3"]) == 0
    assert seconds(capsys.readouterr().out) > short


def test_a_set_option_some_strategies_do_not_take_is_said(
    tmp_path, capsys, data_root, monkeypatch, untimed
) -> None:
    """--set bucket_cap_mb=5,10 with fsdp selected too: ddp_torchrun sweeps it, fsdp runs
    once without it, and run and --dry-run say so in one line (not an error)."""
    from bench.cli import main
    from bench.harness import runner

    args = ["run", "--device", "cpu", "--data-root", str(data_root), "--out-dir", str(tmp_path)]
    args += ["--world-sizes", "2", "--max-steps", "8", "--limit", "512"]
    both = [*args, "--strategies", "fsdp,ddp_torchrun", "--set", "bucket_cap_mb=5,10"]
    said = "--set bucket_cap_mb: taken by ddp_torchrun; not by fsdp, run without it"
    assert main([*both, "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == said

    def started(*a, **k):  # the run starts here: stop it
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_matrix", started)
    assert main(both) == 130
    assert capsys.readouterr().out.splitlines()[0] == said
    # every selected strategy takes it, single (the baseline) aside: nothing to say
    for plain, sizes in (("ddp_torchrun", "2"), ("single,ddp_torchrun", "1,2")):
        only = [*args, "--world-sizes", sizes, "--strategies", plain]
        assert main([*only, "--set", "bucket_cap_mb=5,10"]) == 130
        assert "--set" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "version, old",
    [
        ("2.6.0+cu124", True),  # FSDP2 fails on CPU there
        ("2.8.0+cu128", True),  # FSDP2 with accumulation and FSDP x TP fail parity there
        ("1.13.1", True),
        ("2.10.0+cu128", False),  # the oldest the suite passed on (scripts/test_torch.sh)
        ("2.11.0a0+git1234", False),
        ("2.15.0", False),
        ("3.0.0", False),
        ("not-a-version", False),
    ],
)
def test_a_torch_older_than_any_tested_is_named(version, old):
    from bench import OLDEST_TESTED_TORCH, torch_too_old

    said = torch_too_old(version)
    assert (said is not None) == old
    if old:
        assert said.startswith(f"torch {version} is older than the oldest parabench is tested")
        assert ".".join(map(str, OLDEST_TESTED_TORCH)) in said


def test_the_cli_warns_in_one_line_on_an_untested_torch_and_still_runs(monkeypatch, capsys):
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(
        metadata, "version", lambda dist: "2.6.0" if dist == "torch" else real(dist)
    )
    assert main(["list"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "parabench: warning: torch 2.6.0 is older than the oldest parabench is tested with "
        "(2.10); strategies may fail or hang on it"
    ]
    monkeypatch.setattr(
        metadata, "version", lambda dist: "2.15.0" if dist == "torch" else real(dist)
    )
    assert main(["list"]) == 0
    assert capsys.readouterr().err == ""  # a tested torch: nothing to say


@pytest.mark.parametrize("args", [[], ["latest"], ["2.7.1;rm"]])
def test_test_torch_wants_a_version_before_it_makes_anything(args, tmp_path):
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "test_torch.sh"
    venvs = set(script.parent.parent.glob(".venv-torch-*"))
    done = subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"usage: {script} TORCH_VERSION [PYTEST ARGS ...]   (e.g. {script} 2.11.0)"
    ]
    assert set(script.parent.parent.glob(".venv-torch-*")) == venvs


def test_status_of_a_run_on_this_machine_says_how_far_it_is(tmp_path, capsys) -> None:
    """`parabench status` of a run started here (no job.id) was refused ("not made by
    parabench submit"): a run left going in another terminal could only be watched by
    reading its CSVs. It says, in one line, that the run is running (the parabench holding
    it, the cell it is in, its step, about how long is left from the cells so far), stopped
    (with the command that finishes it) or complete (its report, and the command that runs
    its failed cells again), and how its cells ended."""
    from bench.harness.runner import RunDir

    run = tmp_path / "run"
    rd = RunDir(run)
    run.mkdir()
    rd.config_path.write_text(json.dumps({"launcher": ""}))
    cells = [("single", 1, "fp32", 0), ("ddp", 2, "fp32", 0), ("ddp", 2, "bf16", 0)]
    cells.append(("single", 2, "fp32", 0))
    rd.write_plan([SimpleNamespace(key=k) for k in cells])

    def row(cell, status, epoch, wall):
        names = ("strategy", "world_size", "setting", "repeat")
        return {
            **dict(zip(names, cell, strict=True)),
            "epoch": epoch,
            "status": status,
            "cell_wall_s": wall,
        }

    # single's two epochs (one row each, its wall time on both), ddp's row out of memory
    rd.write([row(cells[0], "ok", 0, 10), row(cells[0], "ok", 1, 10)], [], [])
    rd.write([row(cells[1], "oom", "", 4)], [], [])
    rd.write([row(cells[3], "skipped", "", "")], [], [])  # at once, no wall time
    done = "3 of 4 cells done (1 ok, 1 oom, 1 skipped)"

    assert main(["status", str(run)]) == 0
    resume = f"{program()} run --resume {run}"
    assert capsys.readouterr().out == f"{run}: stopped, {done}; to finish it: {resume}\n"

    rd.lock()  # as the parabench running it holds it
    try:
        for name, steps in (("single-ws1-fp32-r0", 20), ("ddp-ws2-bf16-r0", 12)):
            (run / "cells" / name).mkdir(parents=True)  # single's (done) first, then bf16's
            (run / "cells" / name / "progress.json").write_text(
                json.dumps({"done": 5, "total": steps, "step_ms": 3.0})
            )
        assert main(["status", str(run)]) == 0
        assert capsys.readouterr().out == (
            f"{run}: running (parabench pid {os.getpid()}): {done}; now ddp-ws2-bf16-r0, step 5 "
            "of 12; about 5 s left (5 s a cell so far)\n"  # 14 s for 3 cells, one skipped
        )
    finally:
        rd.unlock()

    rd.write([row(cells[2], "ok", 0, 7)], [], [])
    (run / "report.md").write_text("# report\n")
    assert main(["status", str(run)]) == 0
    assert capsys.readouterr().out == (
        f"{run}: complete, 4 of 4 cells done (2 ok, 1 oom, 1 skipped); report: {run / 'report.md'}; to run "
        f"the failed cells again: {resume} --retry-failed\n"
    )


def test_status_with_no_folder_named_follows_the_newest_run(tmp_path, monkeypatch, capsys):
    """`parabench status` alone (make bench going in another terminal, its run id made of the
    time and a pid) follows the run under results/ begun or written last; with none there,
    one line says so."""
    monkeypatch.chdir(tmp_path)
    assert main(["status"]) == 2
    assert "no run under results/" in capsys.readouterr().err
    for when, name in enumerate(("older", "newer")):
        (tmp_path / "results" / name).mkdir(parents=True)
        config = tmp_path / "results" / name / "config.json"
        config.write_text(json.dumps({"launcher": ""}))
        os.utime(config, (1e9 + when, 1e9 + when))
    assert main(["status"]) == 0
    assert capsys.readouterr().out.startswith("results/newer: ")
    (tmp_path / "results" / "older" / "runs.csv").write_text("strategy\n")  # written now
    assert main(["status"]) == 0
    assert capsys.readouterr().out.startswith("results/older: ")
    # a report or prediction of the other run since writes no row of it: not followed
    for name in ("summary.csv", "predict.csv"):
        (tmp_path / "results" / "newer" / name).write_text("strategy\n")
        later = time.time() + 60
        os.utime(tmp_path / "results" / "newer" / name, (later, later))
        assert main(["status"]) == 0
        assert capsys.readouterr().out.startswith("results/older: "), name


def test_status_of_an_older_run_or_a_verify_names_no_command_that_fails_it(
    tmp_path, capsys
) -> None:
    """A run from before plan.csv and run options (results/reference/cpu-2core-mnist) was
    said "complete, 0 of 0 cells done": its rows name no setting, and with no plan every
    run read as complete. A verify's run stopped part-way was told to finish with `run
    --resume` (and one with a failed cell, `--retry-failed`), which runs its cells with no
    verdict: verify has no --resume."""
    from bench.harness.runner import RunDir

    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"launcher": "torchrun"}))
    (old / "runs.csv").write_text(
        "run_id,strategy,world_size,repeat,epoch,status\n"
        "old,ddp,2,0,0,ok\nold,ddp,2,1,0,oom\nold,single,1,0,0,ok\n"
    )
    assert main(["status", str(old)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{old}: not running, 3 cells done (2 ok, 1 oom) (no plan.csv"), out
    assert "--resume" not in out

    run = tmp_path / "verify"
    rd = RunDir(run)
    run.mkdir()
    rd.config_path.write_text(json.dumps({"launcher": "", "save_params": True}))
    cells = [("single", 1, "fp32", 0), ("ddp", 2, "fp32", 0)]
    rd.write_plan([SimpleNamespace(key=k) for k in cells])
    names = ("strategy", "world_size", "setting", "repeat")
    for cell, status in zip(cells, ("ok", "oom"), strict=True):
        assert main(["status", str(run)]) == 0
        out = capsys.readouterr().out
        rd.write([{**dict(zip(names, cell, strict=True)), "epoch": 0, "status": status}], [], [])
        if status == "ok":  # stopped before its first cell's row
            assert "verify has no --resume" in out and "run --resume" not in out, out
    assert main(["status", str(run)]) == 0
    assert capsys.readouterr().out == f"{run}: complete, 2 of 2 cells done (1 ok, 1 oom)\n"


def _status_with(slurm_run, job: str, tmp_path, monkeypatch, capsys) -> str:
    """`parabench status` of a submitted run whose job is `job`, SLURM's commands answered
    by `slurm_run`: what it printed."""
    from bench.harness import slurm

    monkeypatch.setattr(slurm, "_run", slurm_run)
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)  # a test may have put the job's log there
    (run_dir / "job.id").write_text(job + "\n")
    assert main(["status", str(run_dir)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "squeue_says, line",
    [
        ("slurm_load_jobs error: Invalid job id specified", "not in the queue (finished"),
        ("squeue: fatal: Could not establish a configuration source", "state unknown (`squeue"),
    ],
)
def test_status_tells_a_job_gone_from_a_queue_it_could_not_ask(
    tmp_path, monkeypatch, capsys, squeue_says, line
):
    """squeue failing for a job that left the queue is one thing; failing to reach SLURM
    at all is another, and says so instead of claiming the job finished."""
    from bench.config import ConfigError

    def squeue(argv, timeout=30):
        raise ConfigError(f"`{' '.join(argv)}` failed: {squeue_says}")

    out = _status_with(squeue, "12345", tmp_path, monkeypatch, capsys)
    assert out.startswith("job 12345: ") and line in out and "0 rows written" in out


@pytest.mark.parametrize(
    "squeue_says, sacct_says, line",
    [
        ("PENDING 0:00 2 (Resources)", None, "job 7: pending (Resources); 0 rows"),
        ("RUNNING 1:02 2 n[1-2]", None, "job 7: running for 1:02 on 2 node(s) (n[1-2]); 0 rows"),
        ("FAILED 0:12 1 (NonZeroExitCode)", None, "job 7: failed, ended after 0:12; 0 rows"),
        ("COMPLETED 3:04 2 (None)", None, "job 7: completed, ended after 3:04; 0 rows"),
        # gone from squeue (MinJobAge): sacct, where accounting keeps the job
        ("", "CANCELLED by 0|0:41|2", "job 7: cancelled, ended after 0:41; 0 rows"),
        ("", "", "job 7: ended, not in the queue (finished or cancelled); 0 rows"),
        # cancelled while pending: SLURM never wrote its log, and status says it is not there
        ("CANCELLED 0:00 2 (None)", None, "job 7: cancelled, ended after 0:00; 0 rows"),
    ],
)
def test_status_says_how_a_job_ended(tmp_path, monkeypatch, capsys, squeue_says, sacct_says, line):
    """squeue -t all still lists a job that ended (for a while), and sacct after: a failed
    job is not reported as finished, and its line says where its log is, where it wrote one."""
    from bench.config import ConfigError

    wrote_log = squeue_says != "CANCELLED 0:00 2 (None)"

    def run(argv, timeout=30):
        if argv[0] == "squeue":
            assert "-t" in argv and argv[argv.index("-t") + 1] == "all", argv
            return squeue_says + "\n"
        if sacct_says is None or not sacct_says:  # accounting off: sacct fails
            raise ConfigError("`sacct` failed: Slurm accounting storage is disabled")
        return sacct_says + "\n"

    if wrote_log:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "slurm-7.out").write_text("slurmstepd: error: *** JOB 7 ***\n")
    out = _status_with(run, "7", tmp_path, monkeypatch, capsys)
    run_dir = tmp_path / "run"
    assert out.startswith(line), out
    ended_badly = line.startswith(("job 7: failed", "job 7: cancelled"))
    assert ("its log: " in out) == (ended_badly and wrote_log), out
    assert (f"no log at {run_dir / 'slurm-7.out'}" in out) == (ended_badly and not wrote_log), out
    if "its log" in out:
        assert out.rstrip().endswith(str(run_dir / "slurm-7.out"))


def test_status_of_a_running_job_names_the_cell_it_is_in(tmp_path, monkeypatch, capsys):
    """A submitted run's job running said its rows written, not which cell it was in nor how
    far: it says the cell last begun that has no row yet, and its step, from the progress
    file the cell writes as it steps (on the shared folder the job writes its rows to)."""
    run = tmp_path / "run"
    for when, (cell, done) in enumerate((("single-ws1-fp32-r0", 10), ("ddp-ws2-fp32-r0", 3))):
        (run / "cells" / cell).mkdir(parents=True)
        file = run / "cells" / cell / "progress.json"
        file.write_text(json.dumps({"done": done, "total": 10, "step_ms": 5.0}))
        os.utime(file, (1e9 + when, 1e9 + when))  # single's first, ddp's a second later
    (run / "runs.csv").write_text(
        "run_id,strategy,world_size,setting,repeat,epoch,status\nr,single,1,fp32,0,0,ok\n"
    )
    out = _status_with(lambda argv, timeout=30: "RUNNING 1:02 2 n[1-2]\n", "7", tmp_path,
                       monkeypatch, capsys)  # fmt: skip
    assert out.startswith("job 7: running for 1:02 on 2 node(s) (n[1-2]); 1 row written"), out
    assert out.endswith("; now ddp-ws2-fp32-r0, step 3 of 10\n"), out


@pytest.fixture
def sbatch(monkeypatch):
    """sbatch answered here: each script it was given (the text), a job id back; set
    .refuse to a message to have it refuse the next."""
    from bench.harness import slurm

    class Sbatch:
        scripts: list[str] = []
        refuse = ""

    real = slurm._run

    def run(argv, timeout=30):
        assert argv[:2] == ["sbatch", "--parsable"], argv
        if Sbatch.refuse:  # as sbatch would: its message on stderr, exit 1
            return real(["bash", "-c", f"printf '{Sbatch.refuse}' >&2; exit 1"])
        Sbatch.scripts.append(Path(argv[2]).read_text())
        return f"{40 + len(Sbatch.scripts)}\n"

    monkeypatch.setattr(slurm, "_run", run)
    Sbatch.scripts = []
    return Sbatch


def _submit_args(data_root, out, run_id, *extra):
    return [
        "submit",
        "--dataset=mnist",
        f"--data-root={data_root}",
        f"--out-dir={out}",
        f"--run-id={run_id}",
        "--strategies=ddp_torchrun",
        "--nodes=2",
        "--procs-per-node=1",
        *extra,
    ]


def test_submit_writes_a_job_for_any_folder_and_refuses_a_run_id_twice(
    tmp_path, capsys, data_root, sbatch
):
    """A folder with a space and a run id with a % are named whole in the #SBATCH lines
    (SLURM reads %j in --output, %% is a %); an abbreviated --sbatch-arg is submit's own,
    not passed on to the job's `run`; a run id already submitted, or a run begun by `run`,
    is refused before anything is sent; a job sbatch refuses leaves no run directory."""
    out = tmp_path / "sp ace"
    args = _submit_args(data_root, out, "a%jb", "--sbatch=--time=00:05:00")
    assert main(args) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    assert "submitted job 41" in said
    script = sbatch.scripts[0]
    run = out / "a%jb"
    # the commands it prints run as printed: the folder with a space is one word
    assert shlex.split(said.splitlines()[-1]) == ["parabench", "status", str(run), "scancel", "41"]
    assert f'#SBATCH --output="{out}/a%%jb/slurm-%j.out"' in script.splitlines()
    assert '#SBATCH --job-name="parabench-a%jb"' in script.splitlines()
    assert "#SBATCH --time=00:05:00" in script.splitlines()
    job_line = script.splitlines()[-1]
    assert "--sbatch" not in job_line and "--run-id=a%jb" in job_line, job_line
    assert (run / "job.id").read_text() == "41\n"
    # the same run id again: one line, nothing sent
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "submitted already, as job 41" in err and err.count("\n") == 1, err
    assert f"sbatch {shlex.quote(str(run / 'job.sbatch'))}`" in err
    # a run `run` began (it stopped before its first row) is not taken over either
    begun = out / "begun"
    begun.mkdir()
    (begun / "config.json").write_text("{}")
    assert main(_submit_args(data_root, out, "begun")) == 2
    assert "holds a run already" in capsys.readouterr().err
    assert len(sbatch.scripts) == 1
    # sbatch refuses (its message spans lines): one line, and no half-made run left behind
    sbatch.refuse = "error: Batch job submission failed:\\nInvalid account or partition"
    assert main(_submit_args(data_root, out, "refused")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Invalid account or partition" in err, err
    assert not (out / "refused").exists()


def test_submit_asks_the_job_for_the_cpus_cores_per_node_names(tmp_path, capsys, data_root, sbatch):
    """submit --cores-per-node 6 --procs-per-node 4 asked the job for no CPUs: where nodes
    are shared, SLURM gave it one a task, 4 of a node, and its run refused the 6 (before
    that refusal: 1 thread a rank, told 6 cores). The job asks for ceil(6 / 4) = 2 a rank,
    8 a node, unless an --sbatch-arg already says how many; without --cores-per-node it
    asks for none, taking what the cluster gives."""
    cpus = [
        line
        for line in _submitted(tmp_path, capsys, data_root, sbatch, "a", "--cores-per-node=6")
        if "cpus" in line
    ]
    assert cpus == ["#SBATCH --cpus-per-task=2"]
    own = "--sbatch-arg=--cpus-per-task=3"
    lines = _submitted(tmp_path, capsys, data_root, sbatch, "b", "--cores-per-node=6", own)
    assert [line for line in lines if "cpus" in line] == ["#SBATCH --cpus-per-task=3"]
    lines = _submitted(tmp_path, capsys, data_root, sbatch, "c", "--oversubscribe")  # 4 > cores
    assert not [line for line in lines if "cpus" in line]


def _submitted(tmp_path, capsys, data_root, sbatch, run_id, *extra) -> list[str]:
    """The #SBATCH lines of a run submitted at 2 nodes x 4 ranks."""
    args = [*_submit_args(data_root, tmp_path, run_id, *extra), "--procs-per-node=4"]
    assert main(args) == 0, capsys.readouterr().err
    capsys.readouterr()
    return [line for line in sbatch.scripts[-1].splitlines() if line.startswith("#SBATCH")]


def test_the_resume_command_runs_as_printed_from_a_folder_with_a_space(tmp_path) -> None:
    """What a stopped run, its report and a stopped job's log say to run names the folder
    as one word, where 'sbatch /a b/job.sbatch' named two files."""
    from bench.harness import results

    run = tmp_path / "sp ace" / "run"
    run.mkdir(parents=True)
    how = results.resume_command("", run)
    assert shlex.split(how) == ["parabench", "run", "--resume", str(run)]
    (run / "job.sbatch").write_text("#!/bin/bash\n")
    sbatch, _, inside = results.resume_command("slurm", run).partition(" (it resumes the run), or ")
    assert shlex.split(sbatch) == ["sbatch", str(run / "job.sbatch")]
    assert inside == f"{how} inside salloc"
    # a job script from before it passed its arguments on: --retry-failed inside salloc only
    retry = results.resume_command("slurm", run, retry=True)
    assert retry == f"{how} --retry-failed inside an allocation (salloc)"


def test_submit_passes_a_run_id_with_a_leading_dash_to_the_job(
    tmp_path, capsys, data_root, sbatch
) -> None:
    """A run id submit took (`--run-id=-x`) reaches the job's `run` as the same run id: the
    job's command line, split as its shell splits it, parses to it and to the run folder,
    where `--run-id -x` failed the job at once ('expected one argument')."""
    from bench.cli import build_parser

    assert main(_submit_args(data_root, tmp_path, "-x")) == 0, capsys.readouterr().err
    words = shlex.split(sbatch.scripts[0].splitlines()[-1])
    job = build_parser().parse_args(words[words.index("bench.cli") + 1 :])
    assert (job.command, job.run_id, job.out_dir) == ("run", "-x", str(tmp_path))
    assert (job.nodes, job.procs_per_node) == (2, 1)


def test_submit_checks_a_gpu_job_from_a_machine_without_one(
    tmp_path, capsys, data_root, sbatch, monkeypatch
):
    """A login node has no GPU: `submit --device cuda` checks the matrix as the job's nodes
    will see it (one GPU per rank) and says so, instead of refusing CUDA."""
    from bench.harness import runner

    monkeypatch.setattr(runner, "_cuda_available", lambda: False)
    args = _submit_args(data_root, tmp_path, "gpu", "--device=cuda")
    assert main(args) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    assert "no CUDA device here: checked as if each node had 1 GPU(s)" in said
    assert "--device=cuda" in sbatch.scripts[0].splitlines()[-1]
    # the job asks for its GPUs (a cluster hides those a job did not ask for) ...
    assert "#SBATCH --gpus-per-node=1" in sbatch.scripts[0].splitlines()
    assert "asked for 1 GPU(s) per node" in said
    # ... unless the user asked in their cluster's own form; a CPU job asks for none
    for i, (own, asked) in enumerate(
        [("--gres=gpu:a100:1", True), ("-G 2", True), ("--gres=nvme:1", False)]
    ):
        args = _submit_args(data_root, tmp_path, f"own{i}", "--device=cuda", f"--sbatch-arg={own}")
        assert main(args) == 0, capsys.readouterr().err
        lines = sbatch.scripts[-1].splitlines()
        assert f"#SBATCH {own}" in lines
        assert ("#SBATCH --gpus-per-node=1" in lines) is not asked
    assert main(_submit_args(data_root, tmp_path, "cpu", "--device=cpu")) == 0
    assert not any("gpus" in line for line in sbatch.scripts[-1].splitlines())
    capsys.readouterr()
    # `run` on that machine is still refused: it would train here
    assert main(["run", "--device=cuda", f"--data-root={data_root}", "--dry-run"]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("visible, local, index", [(4, 3, 3), (1, 3, 0), (2, 3, 1)])
def test_a_rank_drives_its_local_gpu_among_those_it_sees(monkeypatch, visible, local, index):
    """Four GPUs seen: local rank 3 drives cuda:3. One seen (SLURM bound one GPU to each
    task): it is cuda:0 for every rank, not an ordinal that does not exist."""
    import torch

    from bench.harness.worker import rank_context
    from tests.conftest import small_config

    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setenv("RANK", str(local))
    monkeypatch.setenv("LOCAL_RANK", str(local))
    monkeypatch.setenv("WORLD_SIZE", "4")
    ctx = rank_context(small_config(Path("."), Path(".")), 4, "cuda", True)
    assert ctx.device == torch.device("cuda", index)


def test_slurm_jobs_meet_on_ports_of_their_own(monkeypatch):
    """Two jobs on one node (a shared partition, nodes behind one address) each took
    --rdzv-port for their first cell, and the second failed with EADDRINUSE. Each job now has
    two ports of the 200 above it, by its id, its cells taking them in turn."""
    from bench.harness import nodes, slurm

    def ports(job: int) -> list[int]:
        monkeypatch.setenv("SLURM_JOB_ID", str(job))
        return [slurm.cell_port(29500, order) for order in range(1, 5)]

    assert ports(4100) == [29500, 29501, 29500, 29501]
    assert ports(4101) == [29502, 29503, 29502, 29503]  # the next job: apart
    assert ports(4199) == [29698, 29699, 29698, 29699]  # the window's last two
    assert ports(4200) == ports(4100)  # ids 100 apart share them (as the README says)
    assert max(ports(4199)) < 29500 + nodes.PORTS


def _srun_options(cfg, threads: int = 1) -> list[str]:
    """The srun options of a cell's step (what comes before the ranks' program)."""
    from bench.harness import slurm

    argv = slurm.step_argv(cfg, Path("spec.json"), "parabench-r-c", threads)
    return argv[1 : argv.index(sys.executable)]


def test_a_step_from_inside_a_step_shares_its_cpus(monkeypatch):
    """From a shell inside a step (`srun --pty bash`, an interactive job's), every cell's
    srun waited for the CPUs that step holds, silent under --quiet, until the cell's
    timeout, its row a hang 'still starting'. The cells' steps now overlap the driver's own
    (it sits idle); from salloc's shell or a batch script, where no step holds them, they
    ask as before, and wait for a step of the run's that has not yet left."""
    cfg = RunConfig(
        launcher="slurm", nodes=2, procs_per_node=1, hosts=("n1", "n2"), master_addr="n1"
    )
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    assert "--overlap" not in _srun_options(cfg)
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    assert "--overlap" in _srun_options(cfg)


def test_a_step_runs_on_the_nodes_its_row_names(monkeypatch):
    """--nodes 1 in a two-node allocation: srun chose the step's node itself, n2 where n1 was
    busy, while the ranks were told to meet at n1's address, where no rank 0 listened (on
    the test cluster, whose nodes share 127.0.0.1, the row said n2). The step is pinned to
    the nodes the run describes, the first of them the one whose address they meet at."""
    from bench.harness import slurm

    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    monkeypatch.setattr(slurm, "allocation", lambda: (["n1", "n2"], ["10.0.0.1", "10.0.0.2"]))
    for nodes, pinned in ((1, "n1"), (None, "n1,n2")):
        where = slurm.describe(nodes, 0)
        cfg = RunConfig(
            launcher="slurm",
            nodes=where["nodes"],
            procs_per_node=where["procs_per_node"],
            hosts=where["hosts"],
            master_addr=where["master"],
        )
        assert f"--nodelist={pinned}" in _srun_options(cfg)
        assert where["master"] == "10.0.0.1"


def test_nodes_in_an_allocation_all_or_as_given(monkeypatch):
    """--launcher slurm: --nodes left out is all the allocation's nodes; --nodes 1 is one."""
    from bench.harness import slurm

    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    monkeypatch.delenv("SLURM_TASKS_PER_NODE", raising=False)
    monkeypatch.delenv("SLURM_JOB_CPUS_PER_NODE", raising=False)
    monkeypatch.setattr(slurm, "allocation", lambda: (["n1", "n2"], ["10.0.0.1", "10.0.0.2"]))
    assert slurm.describe(None, 0)["hosts"] == ("n1", "n2")
    assert slurm.describe(1, 0) == {
        "nodes": 1,
        "procs_per_node": 1,
        "hosts": ("n1",),
        "master": "10.0.0.1",
        "cores_per_node": 0,  # CPUs not said: this machine's, as before
    }
    # salloc -N 2 -n 8 sets no SLURM_NTASKS_PER_NODE: its 4 a node (it ran 1 a node, world
    # size 2 for the 8 tasks asked for); --ntasks-per-node's own count first, a given M over both
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "4(x2)")
    assert slurm.describe(None, 0)["procs_per_node"] == 4
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "3(x2),2")  # -n 8 on 3 nodes: what each has
    assert slurm.describe(None, 0)["procs_per_node"] == 2
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "3")
    assert slurm.describe(None, 0)["procs_per_node"] == 3
    assert slurm.describe(None, 2)["procs_per_node"] == 2


def test_a_ranks_threads_are_the_allocations_cpus_and_its_step_asks_for_them(
    monkeypatch, capsys, data_root
):
    """salloc -N 2 --ntasks-per-node 4 --cpus-per-task 8 from a login node of 2 cores: each
    rank got the login node's cores / 4 threads (1, on a node of 32 CPUs), and its step
    asked for no CPUs of the job's (srun takes no --cpus-per-task from it), so a task bound
    to its CPUs ran on one whatever its threads. The threads are the allocation's CPUs a
    node / its ranks, the step asks for that many a task, and --cores-per-node past what
    the allocation has is one line before anything runs."""
    from bench.harness import slurm
    from bench.harness.runner import Cell, rank_threads

    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    monkeypatch.setenv("SLURM_JOB_CPUS_PER_NODE", "32(x2)")
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    monkeypatch.setattr("bench.harness.runner.cpu_cores", lambda: 2)  # the login node's
    monkeypatch.setattr(slurm, "allocation", lambda: (["n1", "n2"], ["10.0.0.1", "10.0.0.2"]))
    args = build_parser().parse_args(
        ["run", "--launcher=slurm", f"--data-root={data_root}", "--strategies=ddp_torchrun"]
    )
    cfg = config_from_args(args)
    assert (cfg.nodes, cfg.procs_per_node, cfg.cores_per_node) == (2, 4, 32)
    threads = rank_threads(cfg, Cell("ddp_torchrun", 8, 0))
    assert threads == 8
    options = _srun_options(cfg, threads)
    assert "--cpus-per-task=8" in options and "--overcommit" not in options
    # uneven nodes: the fewest CPUs any has, which every node can give
    monkeypatch.setenv("SLURM_JOB_CPUS_PER_NODE", "32,16")
    assert config_from_args(args).cores_per_node == 16
    # more ranks than CPUs (--oversubscribe): one thread each, the step told it may
    monkeypatch.setenv("SLURM_JOB_CPUS_PER_NODE", "2(x2)")
    assert "--overcommit" in _srun_options(config_from_args(args), 1)
    # asked for past what the job has: one line, exit 2
    monkeypatch.setenv("SLURM_JOB_CPUS_PER_NODE", "32(x2)")
    code = main(["run", "--launcher=slurm", f"--data-root={data_root}", "--cores-per-node=64"])
    err = capsys.readouterr().err
    assert code == 2 and "the allocation has 32 CPU(s) on a node" in err, err
    assert err.count("\n") == 1


def test_hosts_and_rdzv_under_slurm_are_refused_not_dropped(monkeypatch, capsys, data_root):
    """Inside an allocation, --launcher slurm with --hosts or --rdzv static ran on the
    allocation's nodes as if neither were given, and config.json kept the allocation's
    hosts: one line and exit 2, as --host-exec is."""
    from bench.harness import slurm

    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.setattr(slurm, "allocation", lambda: (["n1", "n2"], ["10.0.0.1", "10.0.0.2"]))
    base = ["run", "--launcher=slurm", "--procs-per-node=1", f"--data-root={data_root}"]
    for bad in (["--hosts=10.9.9.9,10.9.9.8"], ["--rdzv=static"]):
        assert main([*base, "--dry-run", *bad]) == 2, bad
        err = capsys.readouterr().err
        assert "--hosts and --rdzv go with torchrun's agents" in err and err.count("\n") == 1
    assert main([*base, "--dry-run", "--strategies=ddp_torchrun"]) == 0, capsys.readouterr().err


def test_a_slurm_run_resumed_outside_an_allocation_says_how(tmp_path, capsys, data_root):
    """A submitted run stopped (cancelled, timed out): `run --resume` outside an allocation
    names its job script, which resumes it, instead of pointing at `parabench submit`."""
    import json

    from tests.conftest import small_config

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    cfg = small_config(tmp_path, data_root, world_sizes=(), strategies=("ddp_torchrun",))
    cfg = cfg.replace(
        launcher="slurm", nodes=2, procs_per_node=1, hosts=("n1", "n2"), master_addr="n1"
    )
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict()))
    (run_dir / "job.sbatch").write_text("#!/bin/bash\n")
    os.environ.pop("SLURM_JOB_ID", None)
    assert main(["run", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"continue it with sbatch {run_dir}/job.sbatch" in err and err.count("\n") == 1, err


def test_a_requeued_batch_job_resumes_its_run(tmp_path, monkeypatch):
    """SLURM requeues a job whose node was lost: the script `parabench submit` wrote runs
    again, and finishes the run it began instead of refusing its run id; given
    --retry-failed, it runs the run's failed cells again too."""
    import subprocess

    from bench.harness import results, slurm

    monkeypatch.setattr(sys, "executable", "/bin/echo")  # the script says what it would run
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    script = run_dir / "job.sbatch"
    script.write_text(slurm.batch_script(run_dir, ["--run-id", "job", "--no-report"], 2, 1, []))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    env = {**os.environ, "SLURM_JOB_ID": "99"}
    first = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True)
    assert first.stdout.split()[2:5] == ["run", "--launcher", "slurm"]
    assert not (run_dir / "job.id").exists()  # not under SLURM: no job to name
    # resubmitted after a cancel (`sbatch job.sbatch`): `status` follows the new job
    again = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert (run_dir / "job.id").read_text() == "99\n" and again.returncode == 0
    (run_dir / "config.json").write_text("{}")
    again = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True)
    assert again.stdout.split()[2:] == ["run", "--resume", str(run_dir), "--no-report"]
    # `sbatch job.sbatch --retry-failed`, as the run's end and its report say it
    said = results.resume_command("slurm", run_dir, retry=True)
    assert said.startswith(f"sbatch {script} --retry-failed (it resumes the run)")
    args = shlex.split(said.partition(" (")[0])[2:]
    again = subprocess.run(["bash", str(script), *args], capture_output=True, text=True)
    assert again.stdout.split()[2:] == ["run", "--resume", str(run_dir), "--no-report", *args]


def test_a_batch_job_on_a_node_without_the_submit_folder_stops(tmp_path, monkeypatch):
    """The job runs from the folder `parabench submit` ran in, where relative options
    point; on a node that lacks it, the script ran parabench from the home folder anyway
    (bash's cd failed and it went on), with those options naming other paths."""
    import subprocess

    from bench.harness import slurm

    monkeypatch.setattr(sys, "executable", "/bin/echo")  # the script says what it would run
    with monkeypatch.context() as m:
        m.setattr(os, "getcwd", lambda: str(tmp_path / "only on the login node"))
        text = slurm.batch_script(tmp_path / "job", ["--data-root=data"], 2, 1, [])
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and "only on the login node" in done.stderr, done
    assert done.stdout == ""  # parabench never started


def test_verify_takes_run_options_given_the_values_it_would_set(
    tmp_path, capsys, data_root, untimed
):
    """Arguments shared between `run` and `verify` (a script's) are fine where they ask for
    what verify does anyway: no evaluation, no probes, --max-steps equal to --steps."""
    same = ["--eval-samples", "0", "--probe-steps", "0", "--no-scaling-model"]
    same += ["--warmup-steps", "0", "--max-steps", "8", "--steps", "8"]
    args = ["verify", "--dry-run", "--strategies", "ddp_spawn", "--world-sizes", "2"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path), *same]
    assert main(args) == 0, capsys.readouterr().err
    assert main([*args[:-1], "6"]) == 2  # --steps 6 with --max-steps 8: one is ignored
    assert "--max-steps would be ignored" in capsys.readouterr().err


def test_verify_refuses_a_powersgd_start_no_compared_loss_follows(
    tmp_path, capsys, data_root, untimed
):
    """Step i's loss follows the updates of the steps before it: with PowerSGD starting at
    --steps' last step or later, every loss verify compares came from plain all-reduce, and
    ddp_powersgd passed without having compressed anything. It has no warm-up to refuse."""
    args = ["verify", "--dry-run", "--strategies", "ddp_powersgd", "--world-sizes", "2"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path), "--steps", "4"]
    assert main([*args, "--set", "powersgd_start=3"]) == 2
    err = capsys.readouterr().err
    assert "no loss of the 4 steps compared would follow a compressed step" in err
    assert "give --steps 5 or more" in err
    assert main([*args, "--set", "powersgd_start=2"]) == 0, capsys.readouterr().err


def test_verify_refuses_runs_defaults_it_would_ignore(tmp_path, capsys, data_root, untimed):
    """`run`'s defaults given outright (a run's command line reused) are not verify's: 5
    warm-up steps, 1,000 held-out samples and the probes would be ignored, and are refused
    as any other value is."""
    args = ["verify", "--dry-run", "--strategies", "ddp_spawn", "--world-sizes", "2"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path)]
    d = RunConfig()
    given = {"--warmup-steps": d.warmup_steps, "--eval-samples": d.eval_samples}
    given |= {"--probe-steps": d.probe_pairs, "--profile-steps": d.profile_steps}
    for flag, value in given.items():
        assert main([*args, flag, str(value)]) == 2, flag
        assert f"{flag} would be ignored; leave them out" in capsys.readouterr().err
    # nor does its help offer them, or give run's defaults for those it changes
    with pytest.raises(SystemExit):
        main(["verify", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert all(flag not in help_text for flag in [*given, "--max-steps", "--epochs"])
    assert "over all ranks, the same for every strategy and world size (default 32)" in help_text
    assert "where run folders go (default results/verify/)" in help_text


def test_verify_says_why_it_runs_fp32_beside_the_precision_asked(
    tmp_path, capsys, data_root, untimed
):
    """--precision bf16 alone: fp32 cells run too (single's is the baseline), and the
    output says so; asked for already, nothing is added or said."""
    args = ["verify", "--dry-run", "--strategies", "ddp_spawn", "--world-sizes", "2"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path), "--steps", "3"]
    assert main([*args, "--precision", "bf16"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "also run: --precision fp32 beside what was asked: single there is the baseline" in out
    assert main([*args, "--precision", "fp32,bf16"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "also run:" not in out and "compression references" not in out


def test_verify_plans_tp_with_a_setting_added_as_it_runs_it(tmp_path, capsys, data_root, untimed):
    """tp with --precision bf16 or --accumulate 2 (beside which verify adds fp32, one
    micro-batch) was refused for --warmup-steps 0, which would time the step its bytes are
    counted in: the settings asked were planned as `run` plans them, where verify times
    nothing and refuses --warmup-steps itself."""
    args = ["verify", "--dry-run", "--strategies", "tp", "--world-sizes", "2", "--steps", "2"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path), "--model", "transformer"]
    for setting, label in [("--precision", "bf16"), ("--accumulate", "fp32,acc2")]:
        value = label.split(",")[-1].removeprefix("acc")
        assert main([*args, setting, value]) == 0, capsys.readouterr().err
        rows = [line.split()[:3] for line in capsys.readouterr().out.splitlines()]
        assert ["tp", "2", label] in rows, rows


def test_verify_lists_no_fp32_cell_of_a_strategy_that_never_trains_in_fp32(
    tmp_path, capsys, data_root, untimed
):
    """--precision fp16 adds fp32 for the baseline; amp_ddp cannot train there, and its
    cell there was listed as skipped beside the fp16 one asked for (single at world size 2
    was too, where verify's table has no row of it)."""
    args = ["verify", "--dry-run", "--strategies", "amp_ddp,ddp_spawn", "--world-sizes", "2"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path), "--steps", "3"]
    assert main([*args, "--precision", "fp16"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    amp = [line.split()[:3] for line in out.splitlines() if line.startswith("amp_ddp ")]
    assert amp == [["amp_ddp", "2", "fp16"]], out
    assert [w for w in out.split() if w == "ddp_spawn"] == ["ddp_spawn"] * 2  # fp32 and fp16
    # nor single at world size 2, a layout the baseline cannot have: verify compares none
    args = ["verify", "--dry-run", "--strategies", "single,ddp_spawn", "--world-sizes", "1,2"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path), "--steps", "3"]
    assert main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    single = [line.split()[:2] for line in out.splitlines() if line.startswith("single ")]
    assert single == [["single", "1"]], out


def test_verify_dry_run_names_the_runs_batch_norm_adds(tmp_path, capsys, data_root, untimed):
    """On a model with BatchNorm verify runs single 3 times more before the cells (the
    conditioning) and cut into the cells' shares after them: the plan says so; on one
    without, neither runs and nothing is said."""
    args = ["verify", "--dry-run", "--world-sizes", "1,2", "--strategies", "ddp_spawn"]
    args += ["--out-dir", str(tmp_path), "--steps", "2"]
    bn = ["--model", "resnet18", "--dataset", "synthetic", "--image-size", "32"]
    assert main([*args, *bn]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "before the cells, 3 runs of single, the batch cut into 2 share(s)" in out
    assert "the share baselines (neither is in the estimate above)" in out
    assert main([*args, "--data-root", str(data_root)]) == 0, capsys.readouterr().err
    assert "conditioning" not in capsys.readouterr().out


def test_verify_dry_run_names_the_compression_references(tmp_path, capsys, data_root, untimed):
    """The cells that compress their gradients in fp32 get a reference run of single with
    its gradients rounded alike: the plan says so before anything runs (their numerics are
    known only once they run); a cell that does not compress adds none."""
    # (4 steps: PowerSGD compresses from step 2, and step 3's loss is the first to follow)
    args = ["verify", "--dry-run", "--world-sizes", "2", "--steps", "4"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path)]
    assert main([*args, "--strategies", "ddp_bf16_hook,ddp_fp16_hook"]) == 0
    said = "and single with its gradients rounded to bf16, fp16 on each layout"
    assert said in capsys.readouterr().out
    assert main([*args, "--strategies", "ddp_powersgd"]) == 0
    assert "compression references" not in capsys.readouterr().out


def test_verify_caps_the_samples_only_where_the_data_has_more(tmp_path, capsys, data_root, untimed):
    """verify's own cap (4096 samples) is no --limit given: on the ImageNet sample, of 1000
    images, it trains them all rather than refuse a limit above them; MNIST is capped."""
    args = ["verify", "--dry-run", "--strategies", "ddp_spawn", "--world-sizes", "2"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path), "--steps", "2"]
    image = ["--dataset", "imagenet-subset", "--model", "resnet18", "--image-size", "32"]
    assert main([*args, *image]) == 0, capsys.readouterr().err
    assert "train 1000 / held-out 0" in capsys.readouterr().out
    assert main(args) == 0, capsys.readouterr().err
    assert "train first 4096 of 10000 (--limit)" in capsys.readouterr().out


def test_verify_reads_the_data_once_for_its_cap(tmp_path, capsys, data_root, monkeypatch):
    """The cap needs the data's own size: that is read once, then the capped data once (by
    the plan), not again (an image tree listed, or a plugin's factory called, each time)."""
    from bench.workload import data

    limits = []
    checked = data.checked

    def counted(cfg):
        limits.append(cfg.limit)
        return checked(cfg)

    monkeypatch.setattr(data, "checked", counted)
    args = ["verify", "--dry-run", "--strategies", "ddp_spawn", "--world-sizes", "2"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path), "--steps", "2"]
    assert main(args) == 0, capsys.readouterr().err
    assert limits == [None, 4096]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_verify_stopped_part_way_says_to_run_verify_again(
    tmp_path, capsys, data_root, monkeypatch, sig, sigint_raises
):
    """Ctrl-C or SIGTERM in verify's run: that run's `parabench run --resume` would finish it
    and give no verdict (no baselines, no comparison), so verify says to run verify again,
    in one line and exit 130 (README), where `parabench: interrupted` followed it as if it
    were a second stop; its run id, stopped before a row, is then refused without advice to
    --resume it either."""
    from bench.harness import runner

    def interrupted(self, cells):
        os.kill(os.getpid(), sig)
        raise AssertionError("the signal did not stop the run")

    monkeypatch.setattr(runner.Runner, "run", interrupted)
    args = ["verify", "--strategies", "dp", "--world-sizes", "1", "--steps", "2"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path), "--run-id", "v"]
    assert main([*args, "--device", "cpu"]) == 130
    out = capsys.readouterr().err
    said = (
        "verify has no --resume; for its verdict, run the same verify again under another --run-id"
    )
    assert out == f"interrupted: no row yet for {tmp_path / 'v' / 'runs.csv'}; {said}\n", out
    assert main([*args, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'v'} already holds a run; use another --run-id" in err
    assert "--resume" not in err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_verify_stopped_between_its_runs_says_to_run_verify_again(
    tmp_path, capsys, data_root, monkeypatch, sig, sigint_raises
):
    """Ctrl-C or SIGTERM once verify's runs are done, as it compares them (or between them):
    its one line said only `parabench: interrupted`, not that verify has no --resume and its
    verdict is to be had by running it again, as a stop in a run says."""
    from bench.analysis import verify as verify_mod

    def ran(cfg, **kw):
        (tmp_path / "v").mkdir()
        return tmp_path / "v", []

    def compared(run_dir):
        os.kill(os.getpid(), sig)
        raise AssertionError("the signal did not stop verify")

    monkeypatch.setattr(verify_mod, "run_matrix", ran)
    monkeypatch.setattr(verify_mod, "run_share_baselines", lambda *a, **kw: None)
    monkeypatch.setattr(verify_mod, "compare", compared)
    args = ["verify", "--strategies", "dp", "--world-sizes", "1", "--steps", "2"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path), "--run-id", "v"]
    assert main([*args, "--device", "cpu"]) == 130
    said = (
        "verify has no --resume; for its verdict, run the same verify again under another --run-id"
    )
    assert capsys.readouterr().err == f"interrupted: {said}\n"
    assert not (tmp_path / "v" / "verify.csv").exists()


def test_verify_plans_its_matrix_once_before_it_runs(tmp_path, data_root, monkeypatch):
    """`parabench verify` planned the parity matrix for its own checks, then verify()
    planned it again (its cells and data checked twice) before the run planned it."""
    from bench.analysis import verify as verify_mod
    from bench.harness import runner

    def interrupted(self, cells):
        raise KeyboardInterrupt

    planned = []
    monkeypatch.setattr(runner.Runner, "run", interrupted)
    monkeypatch.setattr(verify_mod, "plan", lambda cfg: planned.append(cfg) or runner.plan(cfg))
    args = ["verify", "--strategies", "dp", "--world-sizes", "1", "--steps", "2"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path), "--device", "cpu"]
    assert main(args) == 130
    assert len(planned) == 1 and planned[0].strategies == ("single", "dp")


def test_verify_csv_names_a_basis_only_for_a_tolerance_it_has(tmp_path):
    """tolerance_basis says where a row's tolerance came from: `recipe` for a recipe's, and
    nothing for a row with none (numerics no recipe covers, not comparable)."""
    import csv

    from bench.analysis.verify import NOT_COMPARABLE, RECIPES, UNKNOWN, Parity, write_csv

    def row(name, tol, status):
        return Parity(name, 2, "fp32", "mine", 0.0, 0.0, 0.0, tol, status)

    rows = [row("ddp_spawn", RECIPES["exact"], "pass"), row("mine", UNKNOWN, "no tolerance")]
    rows += [row("dp", UNKNOWN, NOT_COMPARABLE)]
    write_csv(rows, tmp_path / "verify.csv")
    with open(tmp_path / "verify.csv") as f:
        basis = {r["strategy"]: r["tolerance_basis"] for r in csv.DictReader(f)}
    assert basis == {"ddp_spawn": "recipe", "mine": "", "dp": ""}


def test_verify_csv_stopped_as_it_is_written_is_not_left_cut_short(tmp_path, monkeypatch):
    """Ctrl-C, SIGTERM or a full disk as verify.csv is written: no file with the rows before
    the stop, which read as a verdict on every cell."""
    from bench.analysis import verify as verify_mod

    real = verify_mod.csv.writer

    class Stopped:  # the second cell's row stops the writing
        def __init__(self, f):
            self.w, self.rows = real(f), 0

        def writerow(self, row):
            self.rows += 1
            if self.rows == 3:
                raise KeyboardInterrupt
            self.w.writerow(row)

    rows = [
        verify_mod.Parity(n, 2, "fp32", "exact", 0.0, 0.0, 0.0, verify_mod.RECIPES["exact"], "pass")
        for n in ("ddp_spawn", "fsdp")
    ]
    monkeypatch.setattr(verify_mod.csv, "writer", Stopped)
    with pytest.raises(KeyboardInterrupt):
        verify_mod.write_csv(rows, tmp_path / "verify.csv")
    assert list(tmp_path.iterdir()) == []


def test_verify_closes_with_what_passed_and_why_the_rest_did_not():
    """verify's closing lines count each kind of row apart: a cell that crashed or has no
    tolerance fails verify but is not said to mismatch, nor a precision reference counted
    as a cell; where all pass, a line says so."""
    from bench.analysis.verify import RECIPES, Parity, summary

    def row(name, status, reference=False):
        return Parity(
            name, 2, "fp32", "exact", 0.0, 0.0, 0.0, RECIPES["exact"], status, reference=reference
        )

    good = [row("ddp_spawn", "pass"), row("fsdp", "pass"), row("dp", "skipped")]
    assert summary(good) == [
        "2 of 3 cell(s) match their baseline",
        "1 cell(s) skipped or unavailable here (reasons above)",
    ]
    bad = good + [row("zero1", "FAIL"), row("tp", "error"), row("mine", "no tolerance")]
    bad += [row("single", "FAIL", reference=True)]
    lines = summary(bad)
    assert lines[0] == "2 of 6 cell(s) match their baseline"
    assert (
        "1 cell(s) FAIL: outside their tolerance, not started or run as the baseline was, "
        "or too close to fp32 for the rounding they claim (reasons above)" in lines
    )
    assert "1 cell(s) did not run to the end (1 error): no verdict" in lines
    assert any(line.startswith("1 cell(s) have no stated tolerance") for line in lines)
    assert "1 precision reference(s) failed (reasons above)" in lines
    assert not any("strategy/world-size" in line for line in lines)
    # an inconclusive exact cell (its compression not checked) is not called an approximate
    # check that an untrained run would pass
    loose = Parity(
        "ddp_powersgd", 2, "fp32", "powersgd", 0.0, 0.0, 0.0, RECIPES["powersgd"], "inconclusive"
    )
    # single in bf16 alone (`verify --strategies single --precision bf16`): no cell of a
    # strategy, only its precision reference; not "0 of 0 cell(s) match"
    assert summary([row("single", "pass", reference=True)]) == [
        "no cell of a strategy compared: 1 precision reference(s) alone"
    ]
    lines = summary(good + [row("ddp_fp16_hook", "inconclusive"), loose])
    assert (
        "1 approximate check(s) inconclusive: within their band, as a run that never trained "
        "would be (reasons above)" in lines
    )
    assert (
        "1 cell(s) inconclusive: within their tolerance, but whether they compress their "
        "gradients is not checked (reasons above)" in lines
    )


# ---------------------------------------------------------------- the Makefile's targets

ROOT = Path(__file__).resolve().parent.parent


def _make_sandbox(tmp_path: Path) -> Path:
    """The Makefile in a folder of its own whose venv is installed already and whose
    `parabench` only echoes its arguments, so `make report` runs nothing real."""
    import shutil

    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "parabench").write_text('#!/bin/sh\necho "parabench $*"\n')
    (bin_dir / "python").write_text("#!/bin/sh\n")
    for exe in bin_dir.iterdir():
        exe.chmod(0o755)
    (tmp_path / ".venv" / ".installed").touch()  # newer than pyproject.toml: up to date
    return tmp_path


def _make(where: Path, *targets: str):
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    return subprocess.run(
        ["make", "-s", *targets], cwd=where, env=env, capture_output=True, text=True, timeout=60
    )


def test_make_report_without_a_run_says_so_in_one_line(tmp_path) -> None:
    """...before it installs anything: on a fresh machine that would take minutes."""
    box = _make_sandbox(tmp_path)
    (box / ".venv" / ".installed").unlink()  # not installed: `install` would call pip
    called = box / "python-called"
    (box / ".venv" / "bin" / "python").write_text(f'#!/bin/sh\necho "$*" >> "{called}"\n')
    done = _make(box, "report")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert "no run under results/" in done.stderr and "make bench" in done.stderr
    assert not called.exists(), called.read_text()


def test_make_report_renders_the_run_written_last(tmp_path) -> None:
    box = _make_sandbox(tmp_path)
    for age, name in enumerate(["zz-older", "aa newest"]):
        runs_csv = box / "results" / name / "runs.csv"
        runs_csv.parent.mkdir(parents=True)
        runs_csv.touch()
        os.utime(runs_csv, (1_000_000 + age, 1_000_000 + age))
    done = _make(box, "report")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "parabench report results/aa newest"


def test_make_clean_removes_the_venvs_test_torch_made(tmp_path) -> None:
    """`make test-torch` makes a `.venv-torch-<version>` per torch tried, each as large as
    .venv; `make clean` left them behind. Results and the data carried for a GPU stay."""
    box = _make_sandbox(tmp_path)
    made = [".venv-torch-2.10.0/bin", ".pytest_cache", "bench/harness/__pycache__", "build"]
    kept = ["results/reference/r", "results/mine", ".data/mnist", ".whl"]
    for name in made + kept:
        (box / name).mkdir(parents=True)
    done = _make(box, "clean")
    assert done.returncode == 0, done.stderr
    assert [n for n in [".venv", *made] if (box / n).exists()] == []
    assert [n for n in kept if not (box / n).is_dir()] == []


def test_make_help_names_every_target(tmp_path) -> None:
    import re

    text = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split()
    shown = {line.split()[1] for line in _make(ROOT, "help").stdout.splitlines()}
    assert set(phony) - {"help"} <= shown, set(phony) - shown


@pytest.mark.parametrize(
    ("args", "workers"),
    [
        (["--data-path", "loader", "--workers", "2"], 2),  # a DataLoader: its workers count
        (["--dataset", "imagenet-subset", "--workers", "3"], 3),  # decoded by a DataLoader
        ([], None),  # not given: nothing to refuse
    ],
)
def test_workers_where_a_dataloader_runs_them_is_taken(args, workers, data_root) -> None:
    from bench.cli import build_parser, config_from_args

    a = build_parser().parse_args(["run", "--data-root", str(data_root), *args])
    assert config_from_args(a).workers == workers


def test_every_option_of_every_command_says_what_it_does() -> None:
    """`parabench <command> --help` explains each option: one without a help text shows
    only its name (as `list --device` did)."""
    import argparse

    from bench.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bare = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, sub in commands.choices.items()
        for action in sub._actions
        if not isinstance(action, argparse._HelpAction) and not action.help
    ]
    assert len(commands.choices) >= 8 and bare == []


def test_verify_says_how_many_steps_it_compared_and_whose_weights(tmp_path, capsys, data_root):
    """The table's legend names the steps compared (where no conditioning ran, nothing else
    said it) and that the weights are rank 0's after the last of them."""
    args = ["verify", "--strategies", "dp", "--world-sizes", "1", "--steps", "3"]
    args += ["--data-root", str(data_root), "--out-dir", str(tmp_path), "--device", "cpu"]
    assert main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "baseline: single at world size 1, fp32; 3 step(s) compared;" in out, out
    assert "over parameters, after the last step (rank 0's, gathered where sharded)" in out


def test_a_submitted_run_id_is_the_jobs_alone_before_it_starts(
    tmp_path, capsys, data_root, sbatch, monkeypatch
) -> None:
    """`parabench run` into a run id submitted but not begun (the job pending) is one line
    and exit 2, nothing written: it ran there, and the job, once started, resumed that run
    as its own. The job itself (SLURM_JOB_ID the one in job.id) still starts its run there."""
    from bench.harness import runner

    assert main(_submit_args(data_root, tmp_path, "queued")) == 0, capsys.readouterr().err
    run = tmp_path / "queued"
    capsys.readouterr()
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    args = ["run", "--strategies=single", "--world-sizes=1", "--dataset=mnist"]
    assert (
        main([*args, f"--data-root={data_root}", f"--out-dir={tmp_path}", "--run-id=queued"]) == 2
    )
    err = capsys.readouterr().err
    assert "was submitted already, as job 41" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in run.iterdir()) == ["job.id", "job.sbatch"]
    monkeypatch.setenv("SLURM_JOB_ID", "41")  # the job's own run
    runner.check_new_run(RunConfig(out_dir=str(tmp_path), run_id="queued"))


def test_a_run_folder_whose_job_id_cannot_be_read_is_one_line(tmp_path, capsys, data_root):
    """A job.id that cannot be read (here a folder) stopped `parabench run --run-id` with
    a traceback; it is one line and exit 2, as a job.id that reads is."""
    (tmp_path / "odd" / "job.id").mkdir(parents=True)
    args = ["run", "--strategies=single", "--world-sizes=1", "--dataset=mnist"]
    assert main([*args, f"--data-root={data_root}", f"--out-dir={tmp_path}", "--run-id=odd"]) == 2
    err = capsys.readouterr().err
    assert "job.id: cannot read it" in err and err.count("\n") == 1, err


def test_status_follows_a_job_resubmitted_before_it_starts(tmp_path, monkeypatch, capsys):
    """`sbatch job.sbatch` (what a stopped job's log says to do) queues a job that writes its
    id to job.id only once it starts: until then status said the job before it had ended
    ("cancelled", its log), the new one pending unseen. squeue's jobs running this run's
    script, however sbatch was given its path, are read for a newer one."""
    run_dir = tmp_path / "run"
    asked = []

    def run(argv, timeout=30):
        assert argv[0] == "squeue", argv
        if "-j" in argv:
            asked.append(argv[argv.index("-j") + 1])
            return {"7": "CANCELLED 0:41 2 (None)", "9": "PENDING 0:00 2 (Priority)"}[asked[-1]]
        return "\n".join(
            [
                f"7|{tmp_path}|{run_dir}/job.sbatch",  # the job before, ended
                f"9|{run_dir}|./job.sbatch",  # resubmitted from the run's folder
                f"12|{tmp_path}|{tmp_path}/other/job.sbatch",  # another run's
            ]
        )

    out = _status_with(run, "7", tmp_path, monkeypatch, capsys)
    assert out.startswith("job 9 (resubmitted after job 7): pending (Priority); 0 rows"), out
    assert asked == ["9"]


def test_the_mnist_make_bench_downloads_into_data_is_git_ignored(tmp_path) -> None:
    """Where neither $PARABENCH_DATA_ROOT nor ../shared/data is there, `make bench` (and the
    CLI's default --data-root) downloads MNIST into ./data: git must not offer it for a
    commit, as it offered its raw files to `git add -A`."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=60)
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    (raw / "train-images-idx3-ubyte.gz").write_bytes(b"images")
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert status.splitlines() == ["?? .gitignore"], status


def test_the_readme_runs_python_commands_with_the_venvs_python() -> None:
    """`make` installs parabench and its packages into .venv only: a README command with a
    bare `python` (as `python benchmarks/startup.py` was) runs the machine's own, which
    lacks them (ModuleNotFoundError: pandas)."""
    import re

    bare = r"(?:`|^\s*|\")(python3? [^`\n\"]*)"
    readme = (ROOT / "README.md").read_text()
    assert re.findall(bare, readme, re.M) == []
    # nor in what every report.md says, or the collectives benchmark's usage line
    for source in ("bench/analysis/report.py", "bench/harness/collectives.py"):
        assert re.findall(bare, (ROOT / source).read_text(), re.M) == [], source


def test_a_hint_names_parabench_as_the_user_called_it(tmp_path, monkeypatch, capsys) -> None:
    """README has a newcomer type `.venv/bin/parabench` (make installs it there, not on the
    PATH); the commands its lines said to run next began `parabench`, which that shell did
    not find. They name the program as it was called, or `parabench` where that finds it.
    (The program run as the user runs it, then, for the activated venv, main in this
    process with that argv[0].)"""
    import subprocess

    script = tmp_path / "venv" / "bin" / "parabench"
    script.parent.mkdir(parents=True)
    script.write_text(
        f"#!{sys.executable}\nimport sys\nfrom bench.cli import main\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    run_dir = tmp_path / "begun"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}")  # a run stopped before its first row
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def said(path: str) -> str:
        args = [path, "predict", str(run_dir), "--world-sizes", "4"]
        done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        return done.stderr

    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if p != str(script.parent)
    )
    assert f"`venv/bin/parabench run --resume {run_dir}`" in said("venv/bin/parabench")
    monkeypatch.setenv("PATH", os.pathsep.join([str(script.parent), env["PATH"]]))  # activated
    monkeypatch.setattr(sys, "argv", ["venv/bin/parabench"])
    monkeypatch.chdir(tmp_path)
    assert main(["predict", str(run_dir), "--world-sizes", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"`parabench run --resume {run_dir}`" in err, err


def test_a_resume_seeing_fewer_cores_runs_the_world_sizes_the_run_planned(
    tmp_path, data_root, monkeypatch
):
    """A run of the default world sizes (1, 2, ... up to the cores) resumed where fewer
    cores are seen (another machine, a narrower CPU affinity, a smaller job) planned the
    sizes it saw: the cells the run had planned and not run were dropped, from plan.csv
    too, and the resume said all its cells were done. It plans the run's own sizes; a cell
    that cannot run here is left with no row, said in one line (a skipped row would count
    it done, and a resume where it fits would not run it). A run begun before config.json
    kept the sizes takes them from its plan.csv."""
    import json

    from bench.harness import runner
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, strategies=("ddp_spawn",))  # default world sizes
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    _, begun, cells = runner.open_run(cfg.replace(run_id="two-cores"), None)
    begun.unlock()
    assert sorted(c.world_size for c in cells) == [1, 2]
    assert not any(c.status for c in cells)
    config = json.loads(begun.config_path.read_text())
    assert config["world_sizes"] == [1, 2]

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    for begun_before in (False, True):
        if begun_before:  # config.json as a parabench of before wrote it
            begun.config_path.write_text(json.dumps({**config, "world_sizes": []}))
        said: list[str] = []
        _, resumed, cells = runner.open_run(cfg, begun.path, said.append)
        resumed.unlock()
        assert [(c.world_size, c.status) for c in cells] == [(1, "")], begun_before
        assert said and "left for a resume where they fit" in said[0] and "core" in said[0]
        assert [r["world_size"] for r in resumed.plan.read()] == ["1", "2"]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # back where it fits
    _, resumed, cells = runner.open_run(cfg, begun.path, said.append)
    resumed.unlock()
    assert sorted((c.world_size, c.status) for c in cells) == [(1, ""), (2, "")]
    # a strategy named that has no cell this machine can run (a pipeline's two stages): its
    # cell is left as the others, not a refusal of the whole resume
    cfg = cfg.replace(strategies=("single", "pipeline_gpipe"), run_id="pipeline")
    _, begun, cells = runner.open_run(cfg, None)
    begun.unlock()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    _, resumed, cells = runner.open_run(cfg, begun.path, said.append)
    resumed.unlock()
    assert [(c.strategy, c.world_size) for c in cells if not c.status] == [("single", 1)]
    assert ("pipeline_gpipe", 2) not in [(c.strategy, c.world_size) for c in cells]
    assert "pipeline_gpipe at world size 2" in said[-1]
    # every cell it has left too big here: a refusal, not a resume that ran nothing and
    # exited 0 as if the run were whole
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    cfg = cfg.replace(strategies=("pipeline_gpipe",), run_id="only-pipeline")
    _, begun, _ = runner.open_run(cfg, None)
    begun.unlock()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    with pytest.raises(ConfigError, match="nothing it has left can run here: .*world size 2"):
        runner.open_run(cfg, begun.path, said.append)
    assert not (begun.path / ".lock").exists()  # unlocked: a later resume is not refused


def test_a_run_begun_on_a_gpu_is_not_resumed_on_the_cpu(tmp_path, data_root, monkeypatch):
    """A run of `--device auto` (the default) begun where torch saw a GPU, resumed where it
    sees none (a CPU node, a shell without CUDA_VISIBLE_DEVICES): its config.json said
    `auto`, so the rest of its cells ran on the CPU, their rows repeats of the same cells
    as the GPU's. The run keeps the device it began on, and such a resume is one line,
    nothing run; a run begun before config.json kept it goes by its environment.json."""
    import json

    import torch

    from bench.harness import results, runner
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, strategies=("single",), device="auto")
    with monkeypatch.context() as gpu:  # a machine with 2 GPUs, as far as the plan asks
        gpu.setattr(torch.cuda, "is_available", lambda: True)
        gpu.setattr(torch.cuda, "device_count", lambda: 2)
        _, begun, _ = runner.open_run(cfg.replace(run_id="gpu"), None)
        begun.unlock()
    config = json.loads(begun.config_path.read_text())
    assert config["device"] == "cuda"
    for begun_before in (False, True):
        if begun_before:  # as a parabench of before wrote them
            begun.config_path.write_text(json.dumps({**config, "device": "auto"}))
            (begun.path / "environment.json").write_text(json.dumps({"device_type": "cuda"}))
        with pytest.raises(ConfigError, match="torch sees no CUDA device"):
            runner.open_run(cfg, begun.path)
        assert results.held_by(begun.path) is None
    # begun here, on the CPU: resumed on it
    _, here, _ = runner.open_run(cfg.replace(run_id="cpu"), None)
    here.unlock()
    assert json.loads(here.config_path.read_text())["device"] == "cpu"
    saved, again, cells = runner.open_run(cfg, here.path)
    again.unlock()
    assert saved.device == "cpu" and cells


def test_a_resume_without_the_run_s_plug_in_strategy_is_refused(tmp_path, data_root):
    """A run of every strategy, a plug-in's among them (PARABENCH_STRATEGIES), resumed from
    a shell without that variable: the plan made again had none of the plug-in's cells, so
    they were dropped, from plan.csv too, and the resume said all its cells were done. One
    line now, naming them and the cause, nothing written; with the plug-in, it resumes."""
    from bench.harness import runner
    from tests.conftest import faulty_strategies, small_config

    cfg = small_config(tmp_path, data_root, world_sizes=(1,))  # every strategy
    with faulty_strategies():
        _, begun, cells = runner.open_run(cfg.replace(run_id="plugged"), None)
        begun.unlock()
    assert "test_crash" in {c.strategy for c in cells}
    plan = (begun.path / "plan.csv").read_text()
    with pytest.raises(ConfigError) as refused:
        runner.open_run(cfg, begun.path)
    said = str(refused.value)
    assert "the run planned cells it has not run that it cannot plan here" in said
    plugged = sum(c.strategy.startswith("test_") for c in cells)
    assert f"{plugged} cells of test_" in said and "not registered here" in said, said
    assert "PARABENCH_STRATEGIES" in said
    assert "\n" not in said
    assert (begun.path / "plan.csv").read_text() == plan
    with faulty_strategies():
        _, resumed, again = runner.open_run(cfg, begun.path)
        resumed.unlock()
    assert {c.key for c in again} == {c.key for c in cells}


def test_a_run_resumed_on_another_machine_says_so(tmp_path, data_root, monkeypatch):
    """A run resumed on another machine (or with another torch, another parabench) summed
    the repeats measured on both into one cell's figures without a word: its rows carry
    their own provenance, but the table at its end and the summary take them as one run's.
    The resume says what differs, in one line; resumed where it began, nothing."""
    import json

    from bench.harness import results, runner
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1,))
    _, begun, _ = runner.open_run(cfg.replace(run_id="moved"), None)
    begun.unlock()
    env = begun.path / "environment.json"
    here = runner.provenance("cpu")
    elsewhere = here | {"cpu_cores": here["cpu_cores"] + 6}
    monkeypatch.setattr(runner.Runner, "run", lambda self, cells: [])  # measures nothing

    def resumed(began: dict) -> list[str]:
        env.write_text(json.dumps(began))
        lines: list[str] = []
        runner.run_matrix(cfg, resume=begun.path, echo=lines.append)
        assert json.loads(env.read_text()) == began  # the run's own, kept
        return [ln for ln in lines if "another setup" in ln]

    assert resumed(here) == []
    (moved,) = resumed(elsewhere)
    assert f"(CPU cores {here['cpu_cores'] + 6} -> {here['cpu_cores']})" in moved, moved
    # its one cell done: nothing is measured from now on, nothing to say
    row = dict.fromkeys(results.RUN_COLUMNS, "")
    row.update(run_id="moved", strategy="single", world_size="1", setting="fp32", repeat="0")
    begun.runs.append([row | {"status": "ok", "epoch": "0"}])
    assert resumed(elsewhere) == []


def test_a_resume_refused_a_full_disk_keeps_the_run_s_plan(tmp_path, data_root, monkeypatch):
    """`--resume` on a disk still full removed plan.csv before failing to write it again:
    the run, refused, was left without the cells it set out to run (the report's missing
    cells, what the next resume checks its plan against). The plan is replaced whole or
    left as it was."""
    import errno

    from bench.harness import results, runner
    from tests.conftest import small_config

    cfg = small_config(tmp_path, data_root, strategies=("single",), world_sizes=(1,))
    _, begun, _ = runner.open_run(cfg.replace(run_id="full", repeats=2), None)
    begun.unlock()
    plan = begun.plan.path.read_text()
    whole = results.written_whole

    def full(path, *args, **kwargs):
        if path.name == "plan.csv":
            raise OSError(errno.ENOSPC, "No space left on device")
        return whole(path, *args, **kwargs)

    monkeypatch.setattr(results, "written_whole", full)
    with pytest.raises(ConfigError, match="cannot write the run there"):
        runner.open_run(cfg, begun.path)
    assert begun.plan.path.read_text() == plan
    monkeypatch.setattr(results, "written_whole", whole)  # room again
    _, resumed, _ = runner.open_run(cfg, begun.path)
    resumed.unlock()
    assert begun.plan.path.read_text() == plan


def test_a_run_with_a_relative_data_root_resumes_from_another_folder(
    tmp_path, data_root, monkeypatch
):
    """A run begun with a relative --data-root (the default `data`, README's
    `../shared/data`) and resumed from another folder looked for its data there: refused
    with a hint of options --resume does not take (or, where that folder had data of the
    name, trained on other data). The run keeps its data root whole; one begun before
    that is told its root is relative to where it began."""
    import json

    from bench.harness import runner
    from tests.conftest import small_config

    monkeypatch.chdir(data_root.parent)
    cfg = small_config(tmp_path, Path(data_root.name), strategies=("single",), world_sizes=(1,))
    _, begun, _ = runner.open_run(cfg.replace(run_id="rel"), None)
    begun.unlock()
    config = json.loads(begun.config_path.read_text())
    assert config["data_root"] == str(data_root.resolve())
    monkeypatch.chdir(tmp_path)
    saved, resumed, _ = runner.open_run(cfg, begun.path)
    resumed.unlock()
    assert saved.data_path == data_root.resolve()
    begun.config_path.write_text(json.dumps({**config, "data_root": data_root.name}))
    with pytest.raises(ConfigError) as refused:
        runner.open_run(cfg, begun.path)
    said = str(refused.value)
    assert f"its data root {data_root.name} is relative to the folder the run began in" in said


def test_what_the_readme_says_runs_make_benchs_tp_and_fsdp_tp_plans_them(data_root) -> None:
    """make bench skips tp and fsdp_tp; README said both were for the CNN and that
    `--model transformer` ran them, but on 2 cores fsdp_tp's rows are skipped for their world
    size (4 ranks at least), with the transformer too (named alone: an error). The reasons
    are as the README gives them, and the options it names plan their cells."""
    import re

    from bench.cli import config_from_args
    from bench.harness import runner

    readme = " ".join((ROOT / "README.md").read_text().split())
    tp = re.search(
        r"`tp` is a skipped row, since the CNN has no attention to split \(add `([^`]+)` for it\)",
        readme,
    )
    fsdp_tp = re.search(
        r"so is `fsdp_tp`, which needs 4 ranks too \(`([^`]+)` on 2 cores\)", readme
    )
    assert tp and fsdp_tp, "README's make bench paragraph on tp and fsdp_tp"

    def cells(*args: str) -> dict[tuple[str, int], str]:
        a = build_parser().parse_args(["run", "--data-root", str(data_root), *args])
        return {(c.strategy, c.world_size): c.reason for c in runner.plan(config_from_args(a))}

    bench = cells("--world-sizes", "1,2")  # make bench's on 2 cores (named alone: an error)
    assert "no attention" in bench[("tp", 2)]
    assert "at least 4, got 2" in bench[("fsdp_tp", 2)]
    both = cells("--strategies", "tp,fsdp_tp", *shlex.split(tp[1]), *shlex.split(fsdp_tp[1]))
    assert both == {("tp", 4): "", ("fsdp_tp", 4): ""}
