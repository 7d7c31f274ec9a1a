"""`make gpu-check` on a machine without a GPU: one line, exit 2, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _stand_in_torch(tmp_path: Path, gpu: str | None = None) -> Path:
    """A folder whose `torch` answers the only questions gpu_check.sh's Python asks of it
    before a part runs (that it imports; is_available; the device's name): `gpu` its name,
    None no CUDA device. Put ahead of the real torch (on PYTHONPATH), it spares each of the
    script's `python -c 'import torch ...'` the seconds the real import takes."""
    fake = tmp_path / "stand-in"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(
        "class cuda:\n"
        f"    is_available = staticmethod(lambda: {gpu is not None})\n"
        f"    get_device_name = staticmethod(lambda i=0: {gpu!r})\n"
    )
    return fake


def _check(tmp_path, python: str, *parts: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=python, GPU_CHECK_OUT=str(tmp_path / "out"))
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), *parts],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_a_gpu_it_says_so_in_one_line(tmp_path, monkeypatch):
    """(A torch that sees no CUDA device, here or on a GPU machine.)"""
    monkeypatch.setenv("PYTHONPATH", str(_stand_in_torch(tmp_path)))
    done = _check(tmp_path, sys.executable)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gpu-check: torch sees no CUDA device here (torch.cuda.is_available() is False); "
        "it needs one"
    ]
    assert not (tmp_path / "out").exists()


def test_a_python_without_torch_is_named(tmp_path):
    done = _check(tmp_path, "/bin/false")
    assert done.returncode == 2 and "cannot import torch" in done.stderr


def test_an_unknown_part_is_refused_before_anything(tmp_path):
    done = _check(tmp_path, sys.executable, "mnist", "resnet")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gpu-check: unknown part 'resnet'; parts: install horovod tests mnist resnet50 "
        "resnet50-all compile overhead apex"
    ]
    assert not (tmp_path / "out").exists()


def _dry_run(tmp_path, parts=("mnist", "horovod", "apex"), **env) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "GPU_CHECK_OUT": str(tmp_path / "out"),
        "GPU_CHECK_DRY_RUN": "1",
        **env,
    }
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), *parts],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _horovod_built() -> bool:
    try:
        import horovod.torch  # noqa: F401
    except Exception:
        return False
    return True


def test_a_dry_run_plans_each_matrix_here_and_writes_nothing(tmp_path):
    """GPU_CHECK_DRY_RUN=1 checks the parts' command lines on the CPU: every matrix a
    GPU machine would run is planned (its cells listed), before that machine's minutes go.
    (The plans' estimate times no steps here: a stand-in figure, set as each `-m bench.cli
    ... --dry-run` starts; tests/test_estimate.py times them. Each of the five plans spent
    seconds on it, more on a busy machine, which times them again on one thread.)"""
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "sitecustomize.py").write_text(
        "import sys\n"
        "if sys.argv[:1] == ['-m'] and '--dry-run' in sys.argv:\n"
        f"    sys.path.insert(0, {str(ROOT)!r})\n"
        "    from bench.harness import estimate\n"
        "    estimate.timed = lambda cfg, bundle, precisions, isolate: {\n"
        "        p: (1.0, 0.5) for p in precisions\n"
        "    }\n"
    )
    path = os.pathsep.join(p for p in (str(stub), os.environ.get("PYTHONPATH")) if p)
    done = _dry_run(tmp_path, PYTHONPATH=path)
    assert done.returncode == 0, done.stderr[-2000:]
    plans = [line for line in done.stdout.splitlines() if line.startswith("plan: ")]
    # mnist: device, loader, events; horovod: run and verify, where it is built (CI builds it)
    assert len(plans) == (5 if _horovod_built() else 3), done.stdout
    # the MNIST matrix has every strategy; world size 2 runs where ranks can share a device
    assert "ddp_torchrun            2" in done.stdout
    assert "would run: scripts/build_horovod.sh" in done.stdout
    assert "would run: parabench run --run-id apex" in done.stdout
    assert done.stderr.strip().endswith("gpu-check: dry run, nothing run or written")
    assert "1.00 ms per sample" in done.stdout  # the stand-in's figure: no step was timed
    assert not (tmp_path / "out").exists()


def test_some_gpu_tests_are_chosen_with_a_k_expression_and_logged_apart(tmp_path):
    """GPU_CHECK_TESTS passes a -k expression to the tests part, for a machine whose command
    limit the whole file may not fit, and logs the selection beside the whole file's log."""
    fake = str(_stand_in_torch(tmp_path))  # the part's command is printed, not run
    done = _dry_run(tmp_path, parts=("tests",), GPU_CHECK_TESTS="syncbn or loop", PYTHONPATH=fake)
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = [ln for ln in done.stdout.splitlines() if "tests/test_gpu.py" in ln]
    assert line.endswith(f"-k syncbn or loop > {tmp_path / 'out' / 'test_gpu-syncbn-or-loop.log'}")
    whole = _dry_run(tmp_path, parts=("tests",), PYTHONPATH=fake)
    (line,) = [ln for ln in whole.stdout.splitlines() if "tests/test_gpu.py" in ln]
    assert "-k" not in line and line.endswith("test_gpu.log")


def test_a_whole_check_builds_horovod_before_the_tests_and_matrices(tmp_path):
    """Run whole, the check builds Horovod right after installing: built last (as it was),
    every matrix before it had horovod and horovod_fp16 as unavailable rows and the GPU
    tests skipped their Horovod test. A stand-in interpreter answers `-m bench.cli` (each
    matrix's planning, minutes on this CPU) with one line, so only the order is checked."""
    shim = tmp_path / "python"
    shim.write_text(
        "#!/bin/bash\n"
        'if [ "$1" = -m ] && [ "$2" = bench.cli ]; then echo "bench.cli ${*:3}"; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    shim.chmod(0o755)
    fake = str(_stand_in_torch(tmp_path))  # (the others import only torch, or horovod)
    done = _dry_run(tmp_path, parts=(), PYTHON=str(shim), PYTHONPATH=fake)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(out) if text in line)

    build = first("would run: scripts/build_horovod.sh")
    assert build < first("tests/test_gpu.py") < first("--run-id mnist-device"), out
    assert build < first("--run-id resnet50-strategies "), out


def test_a_dry_run_without_horovod_says_its_matrix_waits_for_the_build(tmp_path):
    """Where Horovod is not built (a developer's machine, a GPU machine before its part
    runs), the part's build is what makes its matrix plannable: the dry run says so and
    passes, rather than failing on the strategy it has not built yet."""
    shadow = tmp_path / "shadow" / "horovod"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not built (test)')\n")
    # (mnist's matrices, planned the same with or without Horovod, are the test above's)
    path = os.pathsep.join([str(shadow.parent), str(_stand_in_torch(tmp_path))])
    done = _dry_run(tmp_path, parts=("horovod", "apex"), PYTHONPATH=path)
    assert done.returncode == 0, done.stderr[-2000:]
    plans = [line for line in done.stdout.splitlines() if line.startswith("plan: ")]
    assert plans == [], done.stdout  # horovod's two wait for its build, apex's for CUDA
    assert "would run: scripts/build_horovod.sh" in done.stdout
    assert (
        "would run: parabench verify --run-id horovod-verify --world-sizes 1 --strategies "
        "horovod,horovod_fp16 (not planned: Horovod does not import for"
    ) in done.stdout
    assert "(not planned: it needs CUDA)" in done.stdout  # apex's, as before
    assert not (tmp_path / "out").exists()


def test_a_logged_command_that_fails_is_named_and_the_parts_after_it_run(tmp_path):
    """The script's own `logged` (a command's output teed to a file), under the script's
    set -euo pipefail: a failing command is one of the failed commands at the end, not the
    end of the script (a failed Horovod build once cut off its part's runs)."""
    import re

    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    logged = re.search(r"^logged\(\) \{.*?^\}$", script, re.S | re.M)
    assert logged, "no logged() in gpu_check.sh"
    body = "\n".join(
        [
            "set -euo pipefail",
            "DRY=0",
            "FAILED=()",
            logged.group(0),
            f"part=tests; logged {tmp_path}/a.log false",
            f"part=overhead; logged {tmp_path}/b/b.log echo ran",
            'printf "failed: %s\\n" "${FAILED[@]}"',
        ]
    )
    done = subprocess.run(["bash", "-c", body], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["ran", f"failed: tests: false (log: {tmp_path}/a.log)"]
    assert (tmp_path / "b" / "b.log").read_text() == "ran\n"


def test_an_earlier_days_check_is_named_so_a_cut_off_part_is_finished_there(tmp_path):
    """The default folder carries the date: run on another day, the script names the
    earlier check of the same GPU (GPU_CHECK_OUT finishes its parts there) instead of
    silently starting anew. A fake GPU (a stand-in torch: the real one patched at start-up
    was imported four times a run) and a copy of the script in a folder of its own, so
    nothing lands in this tree."""
    import shutil

    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "gpu_check.sh", tmp_path / "scripts")
    fake = _stand_in_torch(tmp_path, gpu="NVIDIA Fake GPU 80GB")
    earlier = tmp_path / "results" / "reference" / "nvidia-fake-gpu-80gb-20200101"
    (earlier / "mnist-device").mkdir(parents=True)
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(fake))
    env.pop("GPU_CHECK_OUT", None)

    def install_part() -> subprocess.CompletedProcess:
        script = str(tmp_path / "scripts" / "gpu_check.sh")
        return subprocess.run(
            ["bash", script, "install"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )

    done = install_part()
    assert done.returncode == 0, done.stderr[-2000:]
    hint = (
        "gpu-check: an earlier check of this GPU is in results/reference/"
        "nvidia-fake-gpu-80gb-20200101; GPU_CHECK_OUT=results/reference/"
        "nvidia-fake-gpu-80gb-20200101 finishes its parts instead of starting anew in "
        "results/reference/nvidia-fake-gpu-80gb-"
    )
    assert hint in done.stderr, done.stderr
    # named, the earlier folder is used, and nothing is said
    env["GPU_CHECK_OUT"] = "results/reference/nvidia-fake-gpu-80gb-20200101"
    again = install_part()
    assert again.returncode == 0 and "earlier check" not in again.stderr, again.stderr
    assert "install -> results/reference/nvidia-fake-gpu-80gb-20200101" in again.stderr


def _carry_tree(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of scripts/gpu_carry.sh in a git tree of its own, Horovod's sdist there
    already, so nothing is fetched; and MNIST at ../shared/data seen from the tree. The
    tree and that MNIST folder."""
    import shutil
    import tarfile

    source = tmp_path / "shared" / "data" / "mnist"  # ../shared/data, seen from the tree
    source.mkdir(parents=True)
    (source / "t10k-images-idx3-ubyte").write_bytes(b"images")
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "gpu_carry.sh", tree / "scripts")
    shutil.copy(ROOT / ".gitignore", tree)
    subprocess.run(["git", "init", "-q", str(tree)], check=True, timeout=60)
    (tree / ".whl").mkdir()
    with tarfile.open(tree / ".whl" / "horovod-0.28.1.tar.gz", "w:gz") as tar:
        tar.add(tree / ".gitignore", arcname="horovod-0.28.1/PKG-INFO")
    return tree, source


def _gpu_carry(tree: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k != "PARABENCH_DATA_ROOT"}, **env}
    return subprocess.run(
        ["bash", str(tree / "scripts" / "gpu_carry.sh"), sys.executable],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_gpu_carry_with_data_linked_to_the_source_keeps_the_source(tmp_path):
    """scripts/gpu_carry.sh where .data is a link to the data root (git ignores a link
    there too): .data/mnist is then the source itself, which the script removed before
    copying it, deleting the machine's only MNIST and failing on the copy."""
    tree, source = _carry_tree(tmp_path)
    (tree / ".data").symlink_to(source.parent)
    done = _gpu_carry(tree, tree)
    assert (source / "t10k-images-idx3-ubyte").read_bytes() == b"images"
    assert done.returncode == 0, done.stderr
    assert "gpu-carry: .data/mnist is ../shared/data/mnist itself; left as it is" in done.stderr
    assert "remove the link .data and run this again" in done.stderr
    # a folder .data whose mnist is a link to the source: the link gives way to a copy
    (tree / ".data").unlink()
    (tree / ".data").mkdir()
    (tree / ".data" / "mnist").symlink_to(source)
    done = _gpu_carry(tree, tree)
    assert done.returncode == 0, done.stderr
    assert (source / "t10k-images-idx3-ubyte").read_bytes() == b"images"
    copied = tree / ".data" / "mnist"
    assert not copied.is_symlink() and (copied / "t10k-images-idx3-ubyte").read_bytes() == b"images"


def test_gpu_carry_reads_a_relative_data_root_from_where_it_is_run(tmp_path):
    """A relative $PARABENCH_DATA_ROOT names a folder from the caller's directory, as for
    every parabench command; the script read it from the checkout it moves to first, and
    found no MNIST there (or another one)."""
    tree, _ = _carry_tree(tmp_path)
    elsewhere = tmp_path / "work"
    (elsewhere / "mine" / "mnist").mkdir(parents=True)
    (elsewhere / "mine" / "mnist" / "t10k-images-idx3-ubyte").write_bytes(b"the caller's")
    done = _gpu_carry(tree, elsewhere, PARABENCH_DATA_ROOT="mine")
    assert done.returncode == 0, done.stderr
    copied = tree / ".data" / "mnist" / "t10k-images-idx3-ubyte"
    assert copied.read_bytes() == b"the caller's"
    # ~ is the caller's home (quoted, the shell left it as it is)
    (elsewhere / "mine" / "mnist" / "t10k-images-idx3-ubyte").write_bytes(b"at home")
    done = _gpu_carry(tree, tmp_path, PARABENCH_DATA_ROOT="~/mine", HOME=str(elsewhere))
    assert done.returncode == 0, done.stderr
    assert copied.read_bytes() == b"at home"


def test_gpu_carry_copies_a_read_only_data_root_into_folders_it_can_remove(tmp_path):
    """A shared data folder is often read-only; `cp -r` kept its folders so, and the next
    run's `rm -rf .data/mnist` could not empty them (as anyone but root: set -e, exit 1)."""
    import stat

    tree, source = _carry_tree(tmp_path)
    (source / "MNIST" / "raw").mkdir(parents=True)
    for folder in (source / "MNIST" / "raw", source / "MNIST", source):
        folder.chmod(0o555)
    try:
        done = _gpu_carry(tree, tree)
    finally:
        for folder in (source, source / "MNIST", source / "MNIST" / "raw"):
            folder.chmod(0o755)
    assert done.returncode == 0, done.stderr
    copied = tree / ".data" / "mnist"
    folders = [copied, *(p for p in copied.rglob("*") if p.is_dir())]
    assert len(folders) == 3
    assert [p for p in folders if not p.stat().st_mode & stat.S_IWUSR] == []


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (["--help"], 0, "scripts/gpu_carry.sh [PYTHON]"),
        (["-h"], 0, "scripts/gpu_carry.sh [PYTHON]"),
        (["--python=x"], 2, "gpu-carry: no option '--python=x'"),
        (["/nowhere/python"], 2, "gpu-carry: '/nowhere/python' cannot run pip"),
        # a second argument was dropped without a word, after the copy
        ([sys.executable, "--help"], 2, "gpu-carry: one argument, not 2"),
        (["-h", "extra"], 2, "gpu-carry: one argument, not 2"),
    ],
)
def test_gpu_carry_says_what_is_wrong_with_its_argument_before_it_copies(
    tmp_path, args, code, said
):
    """The one argument is a Python: `--help` was run as one, after MNIST had been copied
    into .data ("--help: command not found", exit 127); so was a Python that is not there."""
    tree, _ = _carry_tree(tmp_path)
    (tree / ".whl" / "horovod-0.28.1.tar.gz").unlink()  # pip would fetch it: the Python runs
    env = {k: v for k, v in os.environ.items() if k != "PARABENCH_DATA_ROOT"}
    done = subprocess.run(
        ["bash", str(tree / "scripts" / "gpu_carry.sh"), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == code, done.stderr
    assert said in (done.stdout if code == 0 else done.stderr)
    assert done.stderr.count("\n") == (code != 0), done.stderr
    assert not (tree / ".data").exists()


def test_gpu_carry_reads_a_relative_python_from_where_it_is_run(tmp_path):
    """`scripts/gpu_carry.sh ./py` names a Python from the caller's directory, as its
    relative data root is; the script looked for it in the checkout it moves to first:
    "cannot run pip"."""
    tree, _ = _carry_tree(tmp_path)
    (tree / ".whl" / "horovod-0.28.1.tar.gz").unlink()  # pip fetches it: the Python runs
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    # a stand-in for pip: `-m pip --version`, and `-m pip download ... -d DIR` writing the sdist
    fake = elsewhere / "py"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        '[ "$3" = download ] || exit 0\n'
        'while [ "$1" != -d ]; do shift; done\n'
        'tmp=$(mktemp -d); mkdir "$tmp/horovod-0.28.1"; echo x > "$tmp/horovod-0.28.1/PKG-INFO"\n'
        'tar -czf "$2/horovod-0.28.1.tar.gz" -C "$tmp" horovod-0.28.1\n'
    )
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PARABENCH_DATA_ROOT"}
    done = subprocess.run(
        ["bash", str(tree / "scripts" / "gpu_carry.sh"), "./py"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (tree / ".whl" / "horovod-0.28.1.tar.gz").exists()


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("GPU_CHECK_REPEATS", "0", "GPU_CHECK_REPEATS must be a whole number of at least 1"),
        ("GPU_CHECK_REPEATS", "two", "GPU_CHECK_REPEATS must be a whole number of at least 1"),
        (
            "GPU_CHECK_OVERHEAD_MINUTES",
            "-1",
            "GPU_CHECK_OVERHEAD_MINUTES must be a number of minutes",
        ),
    ],
)
def test_a_bad_repeats_or_minutes_is_refused_before_anything(tmp_path, variable, value, said):
    """Passed on only when a part's runs start: on a GPU machine after the install,
    Horovod's build and the GPU tests (minutes of a machine lent by the minute), then each
    run refused it. Now one line and exit 2 before anything, here on a CPU too."""
    env = dict(os.environ, PYTHON=sys.executable, GPU_CHECK_OUT=str(tmp_path / "out"))
    env[variable] = value
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"gpu-check: {said}, got '{value}'"]
    assert not (tmp_path / "out").exists()
