"""parabench: three rooms, and the CLI and the run's config on top of them.

- workload/  what is trained: data sets, models, your own factories, a step's FLOPs
- harness/   how it runs and is measured: the matrix, launchers, the per-rank worker, probes,
             and the records and CSVs it writes
- analysis/  what a run's CSVs say: summary, report, plots, compare, verify, predict

Imports go one way, workload <- harness <- analysis, every room reading config, the
strategies beside the harness (the workload imports none); the analysis reads only what
the harness wrote, so it works on a run from another machine.
"""

import importlib
import importlib.abc
import importlib.util
import shlex
import shutil
import sys
import warnings
from pathlib import Path

#: the folder holding bench/ and strategies/: what a rank's PYTHONPATH starts with
ROOT = Path(__file__).resolve().parent.parent


def program() -> str:
    """parabench as a command we tell the user to run (`... --resume DIR`): as they called it
    (README's `.venv/bin/parabench`, or another path), or `parabench` where that name finds
    the same program (an activated environment, an install on the PATH), or where it was not
    called by its name (`python -m bench.cli`, or in-process). A hint saying `parabench` to
    one who had typed .venv/bin/parabench was "command not found" in a fresh shell."""
    called = sys.argv[0] if sys.argv else ""
    if Path(called).name != "parabench":
        return "parabench"
    found = shutil.which("parabench")
    try:
        if found and Path(found).samefile(called):
            return "parabench"
    except OSError:  # argv[0] names no file here (changed by the caller)
        return "parabench"
    return shlex.quote(called)


#: bench's modules before the rooms (they sat at its top), and where each is now
MOVED = {
    name: room
    for room, names in {
        "workload": "data models plugins flops",
        "harness": "runner launchers worker proc probes progress env nodes slurm estimate "
        "results breakdown stats collectives",
        "analysis": "report summary plots compare verify predict",
    }.items()
    for name in names.split()
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import bench.models` and `from bench import models` (a user's own model file, a
    notebook) still work, with a DeprecationWarning naming the new module. The old name is
    the same module object as the new one, so nothing is loaded twice. Import statements
    only: loading the old name's spec by hand (module_from_spec, LazyLoader) gets an empty
    placeholder."""

    def find_spec(self, fullname, path, target=None):
        old = fullname.removeprefix("bench.")
        if fullname.startswith("bench.") and old in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return None  # a placeholder: exec_module puts the real module in its place

    @staticmethod
    def new_name(old: str) -> str:
        name = old.removeprefix("bench.")
        return f"bench.{MOVED[name]}.{name}"

    def get_code(self, fullname):
        """`python -m bench.collectives`: runpy prints this one line."""
        new = self.new_name(fullname)
        raise ImportError(f"{fullname} is now {new}: python -m {new}")

    def exec_module(self, module) -> None:
        old, new = module.__name__, self.new_name(module.__name__)
        # stacklevel 2 names the line that imported: warnings skips importlib's frames
        warnings.warn(f"{old} is now {new}", DeprecationWarning, stacklevel=2)
        # importlib returns what sys.modules holds under the name once this returns
        sys.modules[old] = importlib.import_module(new)


# once, also after importlib.reload(bench) (whose _Moved is a new class)
sys.meta_path[:] = [
    f for f in sys.meta_path if (type(f).__module__, type(f).__qualname__) != (__name__, "_Moved")
]
sys.meta_path.append(_Moved())

# The oldest torch the whole suite has passed on (scripts/test_torch.sh; README, "Which
# torch"); pyproject.toml asks for it. Older ones fail in ways the suite has seen: FSDP2's
# parity with accumulation and 2-D FSDP x TP on 2.7 and 2.8, FSDP2 on CPU at all on 2.6.
OLDEST_TESTED_TORCH = (2, 10)


def _installed_torch() -> str | None:
    """The installed torch's version, from the package's metadata (`parabench --help`
    imports no torch); None where there is none (the commands that need it say so)."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def torch_before(release: tuple[int, int], version: str | None = None) -> bool:
    """Whether the installed torch (or `version`) is older than `release` (major, minor).
    A version that does not say (a source build's) or no torch at all: False."""
    version = version or _installed_torch()
    if version is None:
        return False
    try:
        major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < release


def torch_too_old(version: str | None = None) -> str | None:
    """One line where the installed torch (or `version`) is older than OLDEST_TESTED_TORCH,
    else None. An install made without dependencies (`pip install --no-deps` beside a GPU
    machine's own torch) is not held to pyproject's bound, hence the check."""
    version = version or _installed_torch()
    if version is None or not torch_before(OLDEST_TESTED_TORCH, version):
        return None
    oldest = ".".join(map(str, OLDEST_TESTED_TORCH))
    return (
        f"torch {version} is older than the oldest parabench is tested with ({oldest}); "
        "strategies may fail or hang on it"
    )
