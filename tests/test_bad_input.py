"""A sweep of bad input to every option of run, verify, report and compare.

Each case: exit code 2, one line on stderr starting `parabench: error:` (no traceback),
and nothing created or changed on disk. No case may start a run: `bench.harness.runner.open_run`
is guarded, so input that validation lets through fails the case instead of training.
Cases already in test_cli.py, test_config.py, test_compare.py and test_report.py are not
repeated here.
"""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

import strategies
from bench.cli import main
from bench.harness import results, runner

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# ---------------------------------------------------------------- fixtures on disk


def _runs_csv(header: list[str] | None = None, rows: list[list[str]] = ()) -> str:
    lines = [",".join(header or results.RUN_COLUMNS), *(",".join(r) for r in rows)]
    return "\n".join(lines) + "\n"


def _run_dir(root: Path, name: str, files: dict[str, str | bytes] | None = None) -> Path:
    """A run directory: a runs.csv with the runner's header and no rows (a valid, empty
    run), with `files` written over it."""
    path = root / name
    path.mkdir(parents=True)
    for fname, text in {"runs.csv": _runs_csv(), **(files or {})}.items():
        if isinstance(text, bytes):
            (path / fname).write_bytes(text)
        else:
            (path / fname).write_text(text)
    return path


def _file(root: Path) -> None:
    (root / "file").write_text("not a run\n")


def _bad_world_size() -> str:
    row = dict.fromkeys(results.RUN_COLUMNS, "")
    row.update(strategy="single", world_size="two", repeat="0", status="ok", epoch="0")
    return _runs_csv(rows=[[row[c] for c in results.RUN_COLUMNS]])


def _text_measurement() -> str:
    """Two repeats of a cell, one's throughput left text by a spreadsheet (`n/a`): read as
    not measured, the cell would be ranked on the other repeat alone, with no word why."""
    rows = []
    for repeat, speed in (("0", "1000.5"), ("1", "n/a")):
        row = dict.fromkeys(results.RUN_COLUMNS, "")
        row.update(strategy="single", world_size="1", repeat=repeat, status="ok", epoch="0")
        row.update(samples_per_s=speed)
        rows.append([row[c] for c in results.RUN_COLUMNS])
    return _runs_csv(rows=rows)


def _cut_row() -> str:
    """A runs.csv cut short in its last row (a copy that stopped), after the row's
    throughput: read filled out with empty fields, the cell would be reported as run."""
    row = dict.fromkeys(results.RUN_COLUMNS, "")
    row.update(strategy="single", world_size="1", repeat="0", status="ok", epoch="0")
    row.update(samples_per_s="1000.5")
    cut = results.RUN_COLUMNS.index("samples_per_s") + 1
    return _runs_csv(rows=[[row[c] for c in results.RUN_COLUMNS][:cut]]).rstrip("\n")


def _huge_field() -> str:
    """A runs.csv whose notes hold a field past the csv module's limit (a file overwritten
    by other data, or a paste gone wrong): pandas reads it, the check for rows cut short
    raised a traceback (as 3.10's reader does on a crash's NUL bytes)."""
    row = dict.fromkeys(results.RUN_COLUMNS, "")
    row.update(strategy="single", world_size="1", repeat="0", status="ok", epoch="0")
    row.update(notes="x" * (csv.field_size_limit() + 1))
    return _runs_csv(rows=[[row[c] for c in results.RUN_COLUMNS]])


def _cut_mnist(root: Path) -> None:
    """MNIST's test split in its .gz files, the images' cut short (a partial download):
    their header is whole, so only reading them all finds the end missing."""
    raw = root / "cut_mnist" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    n = 200
    labels = bytes([0, 0, 8, 1]) + n.to_bytes(4, "big") + bytes(i % 10 for i in range(n))
    images = bytes([0, 0, 8, 3]) + b"".join(d.to_bytes(4, "big") for d in (n, 28, 28))
    images += bytes(i % 251 for i in range(n * 28 * 28))
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(labels))
    (raw / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(images)[:-100])


#: name -> what it makes under the case's input folder; the argv names it as {name}
SETUPS = {
    "good": lambda root: _run_dir(root, "good"),
    "file": _file,
    "cut_mnist": _cut_mnist,
    "empty_csv": lambda root: _run_dir(root, "empty_csv", {"runs.csv": ""}),
    "binary_csv": lambda root: _run_dir(root, "binary_csv", {"runs.csv": b"\x89PNG\r\n\x1a\n\x00"}),
    "ragged_csv": lambda root: _run_dir(
        root, "ragged_csv", {"runs.csv": "strategy,world_size,repeat,status\na,1,0,ok,x,y,z\n"}
    ),
    "columns_csv": lambda root: _run_dir(root, "columns_csv", {"runs.csv": "a,b\n1,2\n"}),
    "text_world_size": lambda root: _run_dir(
        root, "text_world_size", {"runs.csv": _bad_world_size()}
    ),
    "text_measurement": lambda root: _run_dir(
        root, "text_measurement", {"runs.csv": _text_measurement()}
    ),
    "cut_row": lambda root: _run_dir(root, "cut_row", {"runs.csv": _cut_row()}),
    "huge_field": lambda root: _run_dir(root, "huge_field", {"runs.csv": _huge_field()}),
    "runs_csv_dir": lambda root: (root / "runs_csv_dir" / "runs.csv").mkdir(parents=True),
    "corrupt_config": lambda root: _run_dir(root, "corrupt_config", {"config.json": "{not json"}),
    "list_config": lambda root: _run_dir(root, "list_config", {"config.json": "[1, 2]"}),
    "corrupt_env": lambda root: _run_dir(root, "corrupt_env", {"environment.json": "{"}),
    "corrupt_steps": lambda root: _run_dir(root, "corrupt_steps", {"steps.csv": b"\xff\xfe\x00"}),
    # --resume targets
    "resume_list": lambda root: _run_dir(root, "resume_list", {"config.json": "[]"}),
    "resume_null": lambda root: _run_dir(root, "resume_null", {"config.json": "null"}),
    "resume_bad_value": lambda root: _run_dir(
        root, "resume_bad_value", {"config.json": json.dumps({"global_batch": "abc"})}
    ),
    "resume_bad_dataset": lambda root: _run_dir(
        root, "resume_bad_dataset", {"config.json": json.dumps({"dataset": "cifar10"})}
    ),
    # another machine's run, its data somewhere else there
    "resume_moved_data": lambda root: _run_dir(
        root,
        "resume_moved_data",
        {"config.json": json.dumps({"dataset": "mnist", "data_root": str(root / "moved")})},
    ),
    # a job.id that `parabench submit` did not write (emptied, or edited by hand)
    "garbage_job_id": lambda root: _run_dir(root, "garbage_job_id", {"job.id": "xyz\n"}),
    "md_dir": lambda root: (_run_dir(root, "md_dir") / "report.md").mkdir(),
    # a run already in out/taken (the run and verify commands write into out/)
    "taken": lambda root: _run_dir(root.parent / "out", "taken"),
    # a file in out/ where the run's folder would go
    "taken_by_file": lambda root: _taken_by_file(root.parent / "out"),
}


def _taken_by_file(out: Path) -> None:
    out.mkdir()
    _file(out)


# ---------------------------------------------------------------- the cases

RUN = "run"
VERIFY = "verify"
REPORT = "report"
COMPARE = "compare"


def case(command, args, fragment, setup=(), *, bug=None, id=None):
    marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
    return pytest.param(command, list(args), fragment, tuple(setup), marks=marks, id=id)


CASES = [
    # ---- run: wrong types
    case(RUN, ["--global-batch", "abc"], "invalid int value: 'abc'", id="global-batch-text"),
    case(RUN, ["--global-batch", "1.5"], "invalid int value: '1.5'", id="global-batch-float"),
    case(RUN, ["--epochs", "x"], "--epochs: invalid int value", id="epochs-text"),
    case(RUN, ["--max-steps", "x"], "--max-steps: invalid int value", id="max-steps-text"),
    case(RUN, ["--warmup-steps", "x"], "--warmup-steps: invalid int", id="warmup-text"),
    case(RUN, ["--repeats", "x"], "--repeats: invalid int value", id="repeats-text"),
    case(RUN, ["--workers", "x"], "--workers: invalid int value", id="workers-text"),
    case(RUN, ["--seed", "abc"], "--seed: invalid int value", id="seed-text"),
    case(RUN, ["--lr", "x"], "--lr: invalid float value: 'x'", id="lr-text"),
    case(RUN, ["--limit", "x"], "--limit: invalid int value", id="limit-text"),
    case(RUN, ["--image-size", "big"], "--image-size: invalid int", id="image-size-text"),
    case(RUN, ["--seq-len", "x"], "--seq-len: invalid int value", id="seq-len-text"),
    case(RUN, ["--timeout", "x"], "--timeout: invalid float value", id="timeout-text"),
    case(RUN, ["--diverge-factor", "x"], "--diverge-factor: invalid float", id="diverge-text"),
    case(RUN, ["--world-sizes", "1.5"], "comma-separated list of int", id="world-sizes-float"),
    case(RUN, ["--accumulate", "two"], "comma-separated list of int", id="accumulate-text"),
    case(RUN, ["--sync-bn", "yes"], "expected on, off or off,on", id="sync-bn-word"),
    case(RUN, ["--compile", ""], "expected at least one value, got ''", id="compile-empty"),
    case(RUN, ["--compile", "--compile-mode", "fast"], "--compile-mode takes", id="compile-mode"),
    case(
        RUN,
        ["--compile-mode", "reduce-overhead"],
        "--compile-mode reduce-overhead is torch.compile's mode: it needs --compile",
        id="compile-mode-without-compile",
    ),
    case(RUN, ["--set", "opt_level"], "expected key=value", id="set-no-equals"),
    case(RUN, ["--dataset-arg", "n"], "expected key=value", id="dataset-arg-no-equals"),
    case(
        RUN,
        ["--dataset", "{examples}/own_data.py:shapes", "--model", "{examples}/own_model.py:build"]
        + ["--dataset-arg", "=5"],
        "expected key=value, got '=5'",
        id="dataset-arg-no-key",
    ),
    # the ranks read the factory's arguments from the run's config.json: a value JSON
    # cannot hold stopped the run with a traceback after its estimate
    case(
        RUN,
        ["--dataset", "{examples}/own_data.py:shapes", "--model", "{examples}/own_model.py:build"]
        + ["--dataset-arg", "seed={{1, 2}}"],
        "--dataset-arg: seed={1, 2}: a set value cannot be passed to the ranks",
        id="dataset-arg-set",
    ),
    case(
        RUN,
        ["--model", "{examples}/own_model.py:build", "--model-arg", "width=b'8'"],
        "--model-arg: width=b'8': a bytes value cannot be passed to the ranks",
        id="model-arg-bytes",
    ),
    case(
        RUN,
        ["--model", "{examples}/own_model.py:build", "--model-arg", "widths={{8: 16}}"],
        "--model-arg: widths={8: 16}: a dict whose keys are not strings cannot be passed",
        id="model-arg-int-keys",
    ),
    case(RUN, ["--bogus"], "unrecognized arguments: --bogus", id="unknown-option"),
    case(RUN, ["extra"], "unrecognized arguments: extra", id="stray-positional"),
    # ---- run: out of range
    case(RUN, ["--epochs", "-1"], "--epochs must be at least 1", id="epochs-negative"),
    case(RUN, ["--max-steps", "-1"], "--max-steps must be at least 1", id="max-steps-negative"),
    case(RUN, ["--repeats", "-1"], "--repeats must be at least 1", id="repeats-negative"),
    case(RUN, ["--workers", "-1"], "--workers cannot be negative", id="workers-negative"),
    case(RUN, ["--device", "gpu"], "unknown device 'gpu'", id="device-gpu"),
    case(RUN, ["--lr", "0"], "--lr must be positive", id="lr-zero"),
    case(RUN, ["--lr", "-0.1"], "--lr must be positive", id="lr-negative"),
    case(RUN, ["--lr", "nan"], "--lr must be positive", id="lr-nan"),
    case(RUN, ["--limit", "0"], "--limit must be at least 1", id="limit-zero"),
    case(RUN, ["--eval-samples", "-1"], "--eval-samples cannot be negative", id="eval-negative"),
    case(RUN, ["--image-size", "3"], "--image-size must be at least 16", id="image-size-3"),
    case(RUN, ["--image-size", "15"], "--image-size must be at least 16", id="image-size-15"),
    # 0 is the config's "not given": typed, it is no way to ask for the default
    case(RUN, ["--image-size", "0"], "--image-size must be at least 16, got 0", id="image-size-0"),
    case(RUN, ["--image-size", "-1"], "--image-size must be at least 16", id="image-size-neg"),
    case("list", ["--device", "tpu"], "unknown device 'tpu'", id="list-device-tpu"),
    case("status", ["{in}/nope"], "nope: no such run directory", id="status-no-run-dir"),
    case("status", ["{in}"], "no config.json there", id="status-not-a-run"),
    case(
        "status",
        ["{corrupt_config}"],
        "its files cannot be read",
        ["corrupt_config"],
        id="status-bad-config",
    ),
    case("predict", ["{in}/nope"], "nope: no such run directory", id="predict-no-run-dir"),
    case(
        "status",
        ["{in}/garbage_job_id/job.id"],
        "job.id is a file, not a run directory: try ",  # it read 'no such run directory'
        ["garbage_job_id"],
        id="status-a-file-of-the-run",
    ),
    case(
        "predict",
        ["{in}/garbage_job_id/job.id"],
        "job.id is a file, not a run directory: try ",  # it read 'no such run directory'
        ["garbage_job_id"],
        id="predict-a-file-of-the-run",
    ),
    case(
        "status",
        ["{in}/garbage_job_id"],
        "job.id: 'xyz' is not a SLURM job id",  # it read 'job xyz: ended', exit 0
        ["garbage_job_id"],
        id="status-garbage-job-id",
    ),
    case(RUN, ["--seq-len", "1"], "--seq-len takes 2 to 1048576 tokens", id="seq-len-1"),
    case(RUN, ["--seq-len", "-5"], "--seq-len takes 2 to 1048576 tokens", id="seq-len-negative"),
    case(RUN, ["--timeout", "-1"], "--timeout takes seconds above 0", id="timeout-negative"),
    case(RUN, ["--timeout", "nan"], "--timeout takes seconds above 0", id="timeout-nan"),
    case(RUN, ["--diverge-factor", "0.5"], "must be more than 1", id="diverge-below-1"),
    case(RUN, ["--diverge-factor", "nan"], "must be more than 1", id="diverge-nan"),
    case(RUN, ["--world-sizes", "-1"], "world sizes must be positive", id="world-size-negative"),
    case(RUN, ["--accumulate", "-1"], "--accumulate takes positive", id="accumulate-negative"),
    case(RUN, ["--accumulate", "2,2"], "--accumulate lists a value twice", id="accumulate-twice"),
    case(RUN, ["--compile", "on,on"], "--compile lists a value twice", id="compile-twice"),
    # a typo for another name (horovod,horovod for horovod,horovod_fp16) would run that one
    case(RUN, ["--exclude", "dp,dp"], "--exclude lists a strategy twice", id="exclude-twice"),
    case(RUN, ["--data-path", "disk"], "--data-path takes auto, device or", id="data-path-word"),
    case(RUN, ["--dataset", ""], "unknown dataset ''", id="dataset-empty"),
    case(
        RUN,
        ["--dataset", "imagenet-subset", "--max-classes", "1"],
        "--max-classes must be at least 2",
        id="max-classes-1",
    ),
    case(
        RUN,
        ["--seed", "-1"],
        "--seed",
        id="seed-negative",
    ),
    case(
        RUN,
        ["--seed", str(2**32)],
        "--seed",
        id="seed-too-big",
    ),
    case(
        RUN,
        ["--lr", "inf"],
        "--lr",
        id="lr-inf",
    ),
    # ---- run: conflicting options
    # an option that the run's data and model would ignore: no row may claim it
    case(
        RUN,
        ["--image-size", "64"],
        "--image-size 64 does nothing here: MNIST is",
        id="image-size-mnist",
    ),
    case(RUN, ["--seq-len", "64"], "--seq-len 64 does nothing here: MNIST is", id="seq-len-mnist"),
    # in-memory data indexed on the device: no DataLoader, so no loader workers
    case(
        RUN,
        ["--workers", "4"],
        "--workers 4 does nothing here: mnist is held in memory and its batches are indexed "
        "on the device (--data-path auto)",
        id="workers-mnist",
    ),
    case(
        RUN,
        ["--dataset", "synthetic", "--data-path", "device", "--workers", "0"],
        "--workers 0 does nothing here: synthetic is held in memory",
        id="workers-synthetic-device",
    ),
    case(
        RUN,
        ["--dataset", "python-source", "--model", "lm", "--workers", "2"],
        "--workers 2 does nothing here: python-source is held in memory",
        id="workers-python-source",
    ),
    case(
        RUN,
        ["--dataset", "synthetic", "--model", "mnist_cnn", "--image-size", "64"],
        "synthetic data is what model mnist_cnn takes, (1, 28, 28) float32, at any size",
        id="image-size-synthetic-mnist-cnn",
    ),
    case(
        RUN,
        ["--dataset", "synthetic", "--model", "lm", "--image-size", "64"],
        "--image-size 64 does nothing here: synthetic data is what model lm takes",
        id="image-size-synthetic-lm",
    ),
    case(
        RUN,
        ["--dataset", "synthetic", "--seq-len", "64"],
        "--seq-len 64 does nothing here: synthetic data is what model resnet18 takes",
        id="seq-len-synthetic-resnet",
    ),
    case(
        RUN,
        ["--dataset", "python-source", "--image-size", "64"],
        "python-source is text",
        id="image-size-python-source",
    ),
    case(
        VERIFY,
        ["--dataset", "imagenet-subset", "--seq-len", "64"],
        "the ImageNet subset is images, not tokens",
        id="verify-seq-len-imagenet",
    ),
    case(
        RUN,
        [
            "--dataset",
            "{examples}/own_data.py:shapes",
            "--model",
            "{examples}/own_model.py:build",
            "--image-size",
            "64",
        ],
        "your data set",
        id="image-size-own-data",
    ),
    case(
        RUN,
        ["--dataset", "synthetic", "--max-classes", "10"],
        "--max-classes keeps the ImageNet subset's first N classes",
        id="max-classes-synthetic",
    ),
    # --limit above the training samples would cap nothing: every data set but synthetic's
    # (where it sets the samples) says how many it has
    case(
        RUN,
        ["--strategies", "single", "--limit", "9001"],
        "--limit 9001: mnist test split has 9000 training samples (and 1000 held out); lower",
        id="limit-above-mnist",
    ),
    case(
        VERIFY,
        ["--strategies", "ddp_spawn", "--limit", "10001"],
        "--limit 10001: mnist test split has 10000 training samples; lower it or leave it out",
        id="verify-limit-above-mnist",
    ),
    case(
        RUN,
        ["--strategies", "single", "--data-root", "{cut_mnist}", "--global-batch", "8"],
        "t10k-images-idx3-ubyte.gz cannot be read: Compressed file ended before",
        ["cut_mnist"],
        id="mnist-gz-cut-short",
    ),
    case(
        RUN,
        ["--strategies", "single", "--dataset", "imagenet-subset", "--model", "resnet18"]
        + ["--global-batch", "8", "--warmup-steps", "1", "--limit", "901"],
        "imagenet-sample has 900 training samples (and 100 held out)",
        id="limit-above-imagenet",
    ),
    case(
        RUN,
        ["--strategies", "single", "--dataset", "{examples}/own_data.py:shapes"]
        + ["--model", "{examples}/own_model.py:build", "--limit", "5000"],
        "own_data.py:shapes has 3687 training samples (and 409 held out)",
        id="limit-above-own-data",
    ),
    case(
        RUN,
        ["--strategies", "single", "--dataset", "python-source", "--channels-last"],
        "--channels-last lays out image batches (N, C, H, W); python-source with model lm",
        id="channels-last-text",
    ),
    case(
        RUN,
        [
            "--strategies",
            "single",
            "--dataset",
            "synthetic",
            "--model",
            "lm",
            "--channels-last",
            "off,on",
        ],
        "is fed samples of (128,) token ids < 256",
        id="channels-last-axis-tokens",
    ),
    case(
        RUN,
        ["--warmup-steps", "4", "--max-steps", "4"],
        "--warmup-steps (4) must be less than --max-steps (4)",
        id="warmup-equals-max-steps",
    ),
    case(
        RUN,
        ["--data-path", "device", "--dataset", "imagenet-subset"],
        "--data-path device needs data held in memory",
        id="data-path-device-imagenet",
    ),
    case(
        RUN,
        ["--strategies", "single", "--model", "lm"],
        "model lm takes token sequences and mnist is images",
        id="lm-on-mnist",
    ),
    case(
        RUN,
        ["--strategies", "single", "--dataset", "python-source", "--model", "mnist_cnn"],
        "python-source is text",
        id="image-model-on-text",
    ),
    case(
        RUN,
        ["--strategies", "single", "--model", "resnet18"],
        "takes 3-channel images and MNIST is 1-channel",
        id="rgb-model-on-mnist",
    ),
    case(
        RUN,
        ["--strategies", "single", "--model", "nosuch_module_xyz:factory"],
        "nosuch_module_xyz",
        id="model-factory-missing-module",
    ),
    case(
        RUN,
        ["--strategies", "single", "--model", "{in}/missing.py:factory"],
        "missing.py",
        id="model-factory-missing-file",
    ),
    case(
        RUN,
        ["--strategies", "single", "--dataset", "{in}/missing.py:factory", "--model", "lm"],
        "missing.py",
        id="dataset-factory-missing-file",
    ),
    case(
        RUN,
        ["--strategies", "single", "--data-root", "{file}"],
        "MNIST",
        ["file"],
        id="data-root-is-a-file",
    ),
    case(
        RUN,
        ["--strategies", "single", "--run-id", "taken"],
        "already holds a run",
        ["taken"],
        id="run-id-taken",
    ),
    case(
        RUN,
        ["--strategies", "single", "--run-id", "file"],
        "--run-id file: ",  # not --out-dir's fault, and said before the estimate is timed
        ["taken_by_file"],
        id="run-id-is-a-file",
    ),
    case(
        RUN,
        ["--strategies", "single", "--run-id", "../escaped"],
        "--run-id",
        id="run-id-escapes-out-dir",
    ),
    case(
        RUN,
        ["--strategies", "single", "--dataset-arg", "classes=3"],
        "--dataset-arg",
        id="dataset-arg-for-a-built-in-dataset",
    ),
    case(
        RUN,
        ["--strategies", "single", "--model", "transformer", "--model-arg", "depth=-1"],
        "depth",
        id="model-arg-negative-depth",
    ),
    case(
        RUN,
        ["--strategies", "single", "--dataset", "synthetic", "--model", "lm"]
        + ["--model-arg", "depth=0"],
        "lm: depth=0: dim, depth and heads must be at least 1",  # not the size's depth, silently
        id="model-arg-lm-depth-0",
    ),
    case(
        RUN,
        ["--strategies", "single", "--dataset", "synthetic", "--model", "lm"]
        + ["--model-arg", "vocab_size=0"],
        "lm: vocab_size must be at least 2",  # not "the data has 1000 classes"
        id="model-arg-lm-vocab-0",
    ),
    case(
        RUN,
        ["--exclude", ",".join(strategies.registry())],
        "--exclude",
        id="exclude-everything",
    ),
    # ---- run --resume
    case(RUN, ["--resume", "{file}"], "no config.json there", ["file"], id="resume-a-file"),
    case(RUN, ["--retry-failed"], "goes with --resume RUN_DIR", id="retry-without-resume"),
    case(
        RUN,
        ["--resume", "{file}", "--timeout", "-1"],
        "--timeout takes seconds above 0",
        ["file"],
        id="resume-timeout-negative",
    ),
    case(
        RUN,
        ["--resume", "{file}", "--retry-failed"],
        "no config.json there",
        ["file"],
        id="retry-a-file",
    ),
    case(
        RUN,
        ["--resume", "{resume_bad_value}", "--max-steps", "50"],
        "--max-steps would be ignored",
        ["resume_bad_value"],
        id="resume-with-another-option",
    ),
    case(
        RUN,
        ["--resume", "{resume_bad_value}"],
        "config.json is unreadable",
        ["resume_bad_value"],
        id="resume-config-bad-value",
    ),
    case(
        RUN,
        ["--resume", "{resume_bad_dataset}"],
        "unknown dataset 'cifar10'",
        ["resume_bad_dataset"],
        id="resume-config-bad-dataset",
    ),
    case(  # the data's hint names --data-root, which --resume refuses: it says so
        RUN,
        ["--resume", "{resume_moved_data}"],
        "the run's own options (its config.json) do not hold here: MNIST not found under",
        ["resume_moved_data"],
        id="resume-data-moved",
    ),
    case(
        RUN,
        ["--resume", "{resume_list}"],
        "config.json is unreadable",
        ["resume_list"],
        id="resume-config-a-list",
    ),
    case(
        RUN,
        ["--resume", "{resume_null}"],
        "config.json is unreadable",
        ["resume_null"],
        id="resume-config-null",
    ),
    # ---- verify
    case(VERIFY, ["--steps", "0"], "--steps must be at least 1", id="verify-steps-zero"),
    case(VERIFY, ["--steps", "-3"], "--steps must be at least 1", id="verify-steps-negative"),
    case(VERIFY, ["--steps", "abc"], "--steps: invalid int value", id="verify-steps-text"),
    case(VERIFY, ["--resume", "x"], "unrecognized arguments", id="verify-resume"),
    case(VERIFY, ["--exclude", "single"], "--exclude single", id="verify-exclude-baseline"),
    case(
        VERIFY,
        ["--strategies", "single", "--run-id", "taken"],
        "already holds a run",
        ["taken"],
        id="verify-run-id-taken",
    ),
    case(
        VERIFY,
        ["--dataset", "synthetic", "--model", "resnet18", "--image-size", "32"]
        + ["--strategies", "single", "--run-id", "taken"],
        "already holds a run",
        ["taken"],
        id="verify-run-id-taken-batchnorm",  # BatchNorm: conditioning runs would come first
    ),
    case(
        VERIFY,
        ["--strategies", "ddp_spawn", "--world-sizes", "2", "--global-batch", "33"],
        "not divisible by world size 2",
        id="verify-batch-not-divisible",
    ),
    case(VERIFY, ["--limit", "16"], "smaller than the global batch (32)", id="verify-limit"),
    # a typo of a model's name, on the default data (MNIST) and on text
    case(VERIFY, ["--model", "resnet1"], "unknown model 'resnet1'", id="verify-unknown-model"),
    case(
        VERIFY,
        ["--model", "resnet1", "--dataset", "python-source"],
        "unknown model 'resnet1'",
        id="verify-unknown-model-text",
    ),
    # every cell asked for is skipped: verify ran only the fp32, one-micro-batch cells it
    # adds beside them, and passed
    case(
        VERIFY,
        ["--strategies", "ddp_spawn", "--world-sizes", "2", "--accumulate", "3"],
        "ddp_spawn cannot run at world size 2 with fp32,acc3: global batch 32 is not divisible",
        id="verify-only-skipped-cells",
    ),
    # options verify sets itself would be ignored (--max-steps 2 also clashed with the
    # --warmup-steps 5 it never uses)
    case(
        VERIFY,
        ["--strategies", "ddp_spawn", "--max-steps", "2"],
        "--max-steps would be ignored",
        id="verify-max-steps",
    ),
    case(
        VERIFY,
        ["--repeats", "3", "--epochs", "2", "--target-precision", "5", "--profile"],
        "--epochs, --target-precision, --repeats, --profile would be ignored",
        id="verify-run-only-options",
    ),
    case(
        VERIFY,
        ["--strategies", "ddp_spawn", "--steps", "500", "--limit", "64"],
        "--steps 500: the data holds 2 steps of global batch 32 (64 training samples)",
        id="verify-steps-past-the-data",
    ),
    case(
        VERIFY,
        ["--strategies", "single", "--world-sizes", "1"],
        "nothing to compare: the only cell to run is the baseline",
        id="verify-baseline-alone",
    ),
    # ---- report
    case(REPORT, ["{file}"], "is a file, not a run directory", ["file"], id="report-on-a-file"),
    case(REPORT, ["{empty_csv}"], "runs.csv", ["empty_csv"], id="report-empty-runs-csv"),
    case(REPORT, ["{binary_csv}"], "runs.csv", ["binary_csv"], id="report-binary-runs-csv"),
    case(REPORT, ["{ragged_csv}"], "runs.csv", ["ragged_csv"], id="report-ragged-runs-csv"),
    case(REPORT, ["{columns_csv}"], "not a parabench runs.csv", ["columns_csv"], id="report-cols"),
    case(
        REPORT,
        ["{text_world_size}"],
        "world_size",
        ["text_world_size"],
        id="report-text-world-size",
    ),
    case(
        REPORT,
        ["{text_measurement}"],
        "column samples_per_s holds 'n/a', not a number (row 3)",
        ["text_measurement"],
        id="report-text-measurement",
    ),
    case(
        REPORT,
        ["{cut_row}"],
        f"row 2 has {results.RUN_COLUMNS.index('samples_per_s') + 1} of its header's",
        ["cut_row"],
        id="report-runs-csv-cut-short",
    ),
    case(
        REPORT,
        ["{huge_field}"],
        "runs.csv is unreadable (field larger than field limit",
        ["huge_field"],
        id="report-runs-csv-huge-field",
    ),
    case(REPORT, ["{runs_csv_dir}"], "no runs.csv there", ["runs_csv_dir"], id="report-csv-dir"),
    case(REPORT, ["{corrupt_config}"], "config.json", ["corrupt_config"], id="report-bad-config"),
    case(REPORT, ["{list_config}"], "config.json", ["list_config"], id="report-list-config"),
    case(REPORT, ["{corrupt_env}"], "environment.json", ["corrupt_env"], id="report-bad-env"),
    case(REPORT, ["{corrupt_steps}"], "steps.csv", ["corrupt_steps"], id="report-bad-steps"),
    case(REPORT, ["{md_dir}"], "report.md is in the way", ["md_dir"], id="report-md-a-dir"),
    case(REPORT, [], "the following arguments are required: RUN_DIR", id="report-no-dir"),
    case(REPORT, ["{good}", "{good}"], "unrecognized arguments", ["good"], id="report-two-dirs"),
    # ---- compare
    case(COMPARE, ["{good}", "{good}", "--factor", "0"], "--factor", ["good"], id="factor-zero"),
    case(COMPARE, ["{good}", "{good}", "--factor", "-2"], "--factor", ["good"], id="factor-neg"),
    case(COMPARE, ["{good}", "{good}", "--factor", "nan"], "--factor", ["good"], id="factor-nan"),
    case(COMPARE, ["{good}", "{good}", "--factor", "inf"], "--factor", ["good"], id="factor-inf"),
    case(
        COMPARE,
        ["{good}", "{good}", "--factor", "x"],
        "--factor: invalid float value",
        ["good"],
        id="factor-text",
    ),
    case(COMPARE, ["{file}", "{good}"], "is a file, not a run", ["file", "good"], id="cmp-file"),
    case(
        COMPARE,
        ["{good}", "{empty_csv}"],
        "runs.csv",
        ["good", "empty_csv"],
        id="compare-empty-runs-csv",
    ),
    case(
        COMPARE,
        ["{ragged_csv}", "{good}"],
        "runs.csv",
        ["good", "ragged_csv"],
        id="compare-ragged-runs-csv",
    ),
    case(
        COMPARE,
        ["{good}", "{columns_csv}"],
        "not a parabench runs.csv",
        ["good", "columns_csv"],
        id="compare-columns",
    ),
    case(
        COMPARE,
        ["{good}", "{corrupt_config}"],
        "config.json",
        ["good", "corrupt_config"],
        id="compare-bad-config",
    ),
    case(
        COMPARE,
        ["{good}", "{text_world_size}"],
        "column world_size holds 'two'",
        ["good", "text_world_size"],
        id="compare-text-world-size",
    ),
    case(
        COMPARE,
        ["{good}", "{text_measurement}"],
        "column samples_per_s holds 'n/a'",
        ["good", "text_measurement"],
        id="compare-text-measurement",
    ),
    case(COMPARE, ["{good}"], "the following arguments are required: B", ["good"], id="cmp-one"),
    # ---- the command itself
    case(None, [], "the following arguments are required: command", id="no-command"),
    case(None, ["bogus"], "invalid choice: 'bogus'", id="unknown-command"),
]


def _files(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*")}


@pytest.fixture
def no_run_starts(monkeypatch):
    """Input that validation lets through fails the case: the run it would start doesn't."""
    real = runner.open_run

    def guarded(cfg, resume, *args):
        real(cfg, resume, *args)
        raise AssertionError("validation let this through: a run would have started")

    monkeypatch.setattr(runner, "open_run", guarded)


@pytest.mark.parametrize(("command", "args", "fragment", "setup"), CASES)
def test_bad_input_is_one_line_exit_2_and_nothing_created(
    command, args, fragment, setup, tmp_path, capsys, data_root, no_run_starts
):
    where = tmp_path / "in"
    where.mkdir()
    names = {"in": str(where), "examples": str(EXAMPLES)}
    for name in setup:
        SETUPS[name](where)
        names[name] = str(where / name)
    args = [a.format(**names) for a in args]
    out = tmp_path / "out"
    if command in (RUN, VERIFY) and "--resume" not in args:  # --resume takes no other option
        argv = [command, "--out-dir", str(out), "--device", "cpu", "--data-root", str(data_root)]
        argv += args
    else:
        argv = [command, *args] if command else args
    before = _files(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("parabench: error:"), err
    assert fragment in lines[0]
    assert code == 2
    assert _files(tmp_path) == before  # nothing created, nothing written
    if not any(s.startswith("taken") for s in setup):
        assert not out.exists()


def test_report_reads_a_runs_csv_of_only_the_required_columns(tmp_path, capsys):
    """The columns load_run requires are enough (the others read as empty): no KeyError."""
    run_dir = _run_dir(
        tmp_path,
        "minimal",
        {"runs.csv": "strategy,world_size,repeat,status,epoch\nsingle,1,0,ok,0\n"},
    )
    assert main(["report", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "report.md")
    assert main(["compare", str(run_dir), str(run_dir)]) == 0
