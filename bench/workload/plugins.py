"""Models and data sets from outside parabench.

`--model` and `--dataset` take, besides the built-in names:

- `package.module:factory`: a function importable from the Python path or the current
  directory (as `python -m` finds modules);
- `path/to/file.py:factory`: a function in a file (made absolute when the run starts, so
  every rank finds it wherever it runs);
- a name registered by an installed package under the entry-point group
  `parabench.models` or `parabench.datasets` (`name = "package.module:factory"`).

A file is imported with its folder on the import path (as `python file.py` runs it), so
it imports the modules beside it. Every failure to get a working factory (module missing,
attribute missing, not callable, an exception inside it, an exit or a parse of the command
line while it is imported or called, the wrong kind of result) is a ConfigError naming the
factory: one line and exit 2 before any cell starts. The contracts a factory follows are in
README.md ("Your own model and data").
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from bench.config import DATASETS, ConfigError, one_line

MODEL_GROUP = "parabench.models"
DATASET_GROUP = "parabench.datasets"
#: the names parabench's own data sets and models keep (bench.workload.models.OWN_MODELS),
#: as the built-in strategies keep theirs: a package's entry point under one of them is
#: never used (`parabench list` says so), so that it cannot take --dataset-arg for a data
#: set that then loads without it
BUILT_IN = {DATASET_GROUP: DATASETS, MODEL_GROUP: ("mnist_cnn", "transformer", "lm")}


@functools.cache
def registered(group: str) -> dict[str, str]:
    """Entry points of `group` that parabench uses, those not named as a built-in: name ->
    "package.module:factory" (read once per process)."""
    return {ep.name: ep.value for ep in entry_points(group=group) if ep.name not in BUILT_IN[group]}


def shadowed(group: str) -> dict[str, str]:
    """Entry points of `group` named as a built-in, which are not used (for `parabench
    list`)."""
    return {ep.name: ep.value for ep in entry_points(group=group) if ep.name in BUILT_IN[group]}


def is_factory_spec(name: str) -> bool:
    """`module:factory` or `file.py:factory` (not a built-in or registered name)."""
    return ":" in name


def is_plugin(name: str, group: str) -> bool:
    return is_factory_spec(name) or name in registered(group)


def absolute(spec: str) -> str:
    """`file.py:factory` with the file's absolute path (ranks may start elsewhere); any
    other spec unchanged."""
    where, sep, attr = spec.rpartition(":")
    if sep and _is_file(where):
        return f"{Path(where).expanduser().resolve()}:{attr}"
    return spec


def _is_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where


def _split(spec: str, group: str) -> tuple[str, str]:
    target = spec if is_factory_spec(spec) else registered(group).get(spec, "")
    where, _, attr = target.rpartition(":")
    if not where or not attr:
        raise ConfigError(f"{spec!r}: expected package.module:factory or path/to/file.py:factory")
    return where, attr


def _on_path(folder: Path) -> None:
    """A user file's folder on the import path, so its own imports find the modules beside
    it (in every rank too: each imports the file through here). Appended, not first: a
    later file's folder must not hide a module an earlier one's claimed by name, which
    loader workers started afresh import by that name."""
    if str(folder) not in sys.path:
        sys.path.append(str(folder))


def _by_its_name(path: Path, spec: str) -> Any:
    """The file imported under its own name (`models.py` as `models`), its folder on
    the import path, where that name is free or already this file: then what it defines
    pickles by a name other processes can import too (DataLoader workers started by spawn
    or forkserver, the default from Python 3.14, receive the data set that way). None
    where the name is another module's (or the standard library's, imported yet or not):
    the caller imports it under a name of its own."""
    stem, real = path.stem, path.resolve()
    if not stem.isidentifier() or stem in getattr(sys, "stdlib_module_names", ()):
        return None
    known = sys.modules.get(stem)
    if known is not None:
        return known if Path(getattr(known, "__file__", "") or "").resolve() == real else None
    _on_path(real.parent)
    found = importlib.util.find_spec(stem)
    if found is None or found.origin is None or Path(found.origin).resolve() != real:
        return None
    try:
        with no_exit():
            return importlib.import_module(stem)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(stem, None)
        raise ConfigError(f"{spec}: importing {path} {raised(exc)}") from None


def _import(where: str, spec: str) -> Any:
    if _is_file(where):
        path = Path(where).expanduser()
        if not path.is_file():
            raise ConfigError(f"{spec}: no such file {path}")
        own = _by_its_name(path, spec)
        if own is not None:
            return own
        # else a name made of its path (one module per file, so two named alike do not
        # collide), which any process, started afresh too, imports by the finder below
        name = _UserFiles.name(path)
        if importlib.util.find_spec(name) is None:
            raise ConfigError(f"{spec}: {path} cannot be imported as Python")
        try:
            with no_exit():
                return importlib.import_module(name)
        except (Exception, SystemExit) as exc:
            raise ConfigError(f"{spec}: importing {path} {raised(exc)}") from None
    cwd_on_path()
    try:
        with no_exit():
            return importlib.import_module(where)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"{spec}: cannot import {where} ({exc})") from None
    except (Exception, SystemExit) as exc:
        raise ConfigError(f"{spec}: importing {where} {raised(exc)}") from None


class _UserFiles(importlib.abc.MetaPathFinder):
    """Imports a user's file whose own name is taken (`bench.py`, `test.py`) under a name
    of this package's that spells its path, so that any process can import it by that
    name: DataLoader workers started by spawn or forkserver unpickle what it defines that
    way, and importing the name's package (bench.workload) installs this finder first."""

    PREFIX = "bench.workload.file_"

    @classmethod
    def name(cls, path: Path) -> str:
        return cls.PREFIX + os.fsencode(path.resolve()).hex()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if not name.startswith(self.PREFIX):
            return None
        try:
            file = Path(os.fsdecode(bytes.fromhex(name[len(self.PREFIX) :])))
        except ValueError:
            return None
        if not file.is_file():
            return None
        _on_path(file.parent)
        return importlib.util.spec_from_file_location(name, file)


if not any(isinstance(f, _UserFiles) for f in sys.meta_path):
    sys.meta_path.append(_UserFiles())


def cwd_on_path() -> None:
    """The current directory on the import path, as `python -m` puts it: a plug-in module
    (`mypkg.models:build`, a strategy module in PARABENCH_STRATEGIES) found from where
    parabench runs, as its ranks, started there too, find it."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


class ParsesCommandLine(SystemExit):
    """A plug-in's argparse parser refused what it parsed (see `no_exit`): a SystemExit,
    as argparse's own, so a factory that parses strings of its own and catches that goes
    on as it would; uncaught, parabench's command line is what it met."""


@contextlib.contextmanager
def no_exit() -> Iterator[None]:
    """Around a plug-in's import or call: a script that parses the command line at import
    (argparse's `parse_args()` outside `if __name__ == '__main__':`) meets parabench's own
    arguments; its parser's error raises ParsesCommandLine here instead of printing a usage
    line that reads as parabench's and exiting (SystemExit: callers catch that too)."""

    def error(parser: argparse.ArgumentParser, message: str) -> None:
        text = f"{parser.prog}: {message}"
        raise ParsesCommandLine(text if len(text) <= 120 else text[:117] + "...")

    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = error  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def raised(exc: BaseException) -> str:
    """What a plug-in's import or call did, for a one-line error: "raised ..." or, for a
    script that exits or parses the command line, why that cannot work as a plug-in."""
    main = "command-line parsing belongs under `if __name__ == '__main__':`"
    if isinstance(exc, ParsesCommandLine):
        return f"parses the command line (argparse: {exc}): {main}"
    if isinstance(exc, SystemExit):
        return f"exits (SystemExit({exc.code!r})): a plug-in must not exit; {main}"
    return f"raised {one_line(exc)}"


def factory(spec: str, group: str) -> Callable[..., Any]:
    """The callable `spec` names (see the module docstring)."""
    where, attr = _split(spec, group)
    obj = _import(where, spec)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{spec}: {where} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{spec}: {attr} is of type {type(obj).__name__}, not a function")
    return obj


def call(
    spec: str,
    group: str,
    kwargs: Mapping[str, Any],
    offered: Mapping[str, Any] | None = None,
    fallback: Mapping[str, Any] | None = None,
) -> Any:
    """Call the factory `spec` names with `kwargs` (the user's), plus those of `offered`
    (what parabench knows, e.g. num_classes) that its signature takes, plus those of
    `fallback` that it requires and nothing else gave (a value for checks of its shape)."""
    fn = factory(spec, group)
    args = dict(kwargs)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C function: offer nothing
        params = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for key, value in (offered or {}).items():
        if key not in args and (key in params or takes_any):
            args[key] = value
    for key, value in (fallback or {}).items():
        if key not in args and key in params and params[key].default is inspect.Parameter.empty:
            args[key] = value
    try:
        with no_exit():
            return fn(**args)
    except ConfigError:
        raise
    except (Exception, SystemExit) as exc:
        given = ", ".join(f"{k}={v!r}" for k, v in args.items()) or "no arguments"
        raise ConfigError(f"{spec}({given}) {raised(exc)}") from None
