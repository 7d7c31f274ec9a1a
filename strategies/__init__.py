"""Strategy registry, filled by scanning this package (plus plug-ins).

Adding a module with a `Strategy` subclass that declares `variants` is all it takes for
a strategy to appear in `parabench list` and in the next `make bench`. Other sources:
- installed packages, through the entry-point group `parabench.strategies`
  (value: an importable module);
- `PARABENCH_STRATEGIES`, a comma-separated list of importable modules (how tests and
  users try a strategy without packaging it; child processes inherit it).
A module that fails to import, or declares `variants` that are not a mapping of names to
`Variant`s (names --strategies can give: letters, digits, `_`, `-`, `.`), is listed as
unavailable with its reason, never a crash. The built-in modules
(BUILT_IN) keep their names: a plug-in's strategy named as one of theirs is listed
unavailable, whatever the order of discovery.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from bench.config import ConfigError, one_line
from strategies.base import RankContext, Setting, Strategy, Variant

__all__ = [
    "RankContext",
    "Setting",
    "Strategy",
    "StrategySpec",
    "Variant",
    "registry",
    "get",
    "UnknownStrategy",
]

ENTRY_POINT_GROUP = "parabench.strategies"
#: the modules of this package that parabench ships, first in discovery: a module added
#: beside them, an entry point or PARABENCH_STRATEGIES cannot take their strategies' names
#: (`single`, verify's baseline, above all)
BUILT_IN = (
    "single",
    "amp_ddp",
    "apex_amp_ddp",
    "ddp",
    "ddp_hooks",
    "dp",
    "fsdp",
    "horovod",
    "pipeline",
    "precision",
    "tensor_parallel",
    "zero",
)


class UnknownStrategy(ConfigError):
    pass


@dataclass(frozen=True)
class StrategySpec:
    name: str
    cls: type[Strategy] | None
    variant: Variant | None
    module: str
    #: why it is not registered (`cls` None): its module failed to import, its class's
    #: `variants` are malformed, or its name was taken
    reason: str | None = None
    import_failed: bool = False

    @property
    def launcher(self) -> str:
        return self.variant.launcher if self.variant else "inprocess"

    @property
    def description(self) -> str:
        if self.variant:
            return self.variant.description
        if self.import_failed:
            return f"module {self.module} failed to import"
        return f"from module {self.module}, not registered"

    @property
    def accepts(self) -> dict:
        """The --set options this strategy takes (its class's, for its variant; none where
        `accepted` raises, which `unavailable` reports)."""
        if self.cls is None or self.variant is None:
            return {}
        try:
            return self.cls.accepted(self.variant.options)
        except Exception:
            return {}

    def unavailable(self, device: str) -> str | None:
        """Why it cannot run on `device`, or None. A plug-in's mistakes are reasons too: a
        launcher that does not exist, a hook that raises."""
        if self.cls is None:
            return self.reason
        from bench.harness.launchers import LAUNCHERS

        if self.launcher not in LAUNCHERS:
            return (
                f"its Variant names launcher {self.launcher!r}; launchers: {', '.join(LAUNCHERS)}"
            )
        assert self.variant is not None
        for hook, args in (
            (self.cls.accepted, (self.variant.options,)),
            (self.cls.default_precision, (device, self.variant.options)),
        ):
            try:
                hook(*args)
            except Exception as exc:
                return raised(hook, exc)
        return _reason(self.cls.unavailable, device)

    # The class's checks, as the planner asks them: a plug-in's that raises gives what it
    # raised as the reason, so its bug costs its own cells only.
    def cannot_run(
        self, world_size: int, device: str, n_devices: int, oversubscribe: bool = False
    ) -> str | None:
        assert self.cls is not None
        if self.launcher == "inprocess" and self.cls.multiprocess and world_size > 1:
            # the in-process launcher starts one process: its ranks would wait for the rest
            return (
                f"{self.cls.__name__} runs one process per rank, and its Variant's launcher "
                "'inprocess' starts one: name spawn or torchrun"
            )
        return _reason(self.cls.cannot_run, world_size, device, n_devices, oversubscribe)

    def unsupported(self, setting: Setting, device: str) -> str | None:
        assert self.cls is not None
        return _reason(self.cls.unsupported, setting, device)

    def unsuitable(self, cfg: Any, world_size: int, options: Mapping[str, str]) -> str | None:
        assert self.cls is not None
        return _reason(self.cls.unsuitable, cfg, world_size, options)

    def idle_options(self, cfg: Any, setting: Any, options: Mapping[str, str]) -> dict[str, str]:
        """Its class's idle_options; none where there is no class or the hook raises or
        answers something else (the options then run as given)."""
        if self.cls is None:
            return {}
        got = answer(self.cls.idle_options, cfg, setting, options)
        return got if isinstance(got, dict) else {}

    def batch_shares(self, world_size: int, options: Mapping[str, str]) -> int | str:
        """Its class's batch_shares: a positive int, or the reason where the hook raises
        or answers something else (a plug-in's bug costs its own cells only)."""
        assert self.cls is not None
        hook = self.cls.batch_shares
        try:
            n = hook(world_size, options)
        except Exception as exc:
            return raised(hook, exc)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            return f"{self.cls.__name__}.batch_shares() answered {n!r}, not a positive int"
        return n

    def default_precision(self, device: str, options: Mapping[str, str]) -> str:
        """Its class's default precision with these options; fp32 where there is no class
        or its hook raises (`unavailable` says why)."""
        try:
            return self.cls.default_precision(device, options) if self.cls else "fp32"
        except Exception:
            return "fp32"

    def create(
        self,
        ctx: RankContext,
        options: Mapping[str, str] | None = None,
        setting: Setting | None = None,
    ) -> Strategy:
        """An instance for one rank; `options` (from --set) override the variant's."""
        assert self.cls is not None and self.variant is not None
        return self.cls(ctx, {**self.variant.options, **(options or {})}, setting)


def _reason(hook: Any, *args: Any) -> str | None:
    """A strategy class's check (`unavailable`, `cannot_run`, ...) called with `args`: its
    answer, or what it raised as a reason, so a plug-in's bug costs its own cells only. An
    answer that is not a sentence (`return world_size > 2`) is read as yes or no: where it
    says no, the reason names the check and its answer, not "True"."""
    why = answer(hook, *args)
    if why is None or isinstance(why, str):
        return why
    if not why:
        return None
    return f"{_name(hook)}() answered {why!r}, not a sentence saying why (or None: it can)"


def answer(hook: Any, *args: Any) -> Any:
    """A strategy class's hook called with `args`: what it returns, or what it raised, in
    one line (raised), so a plug-in's bug costs only what asked it."""
    try:
        return hook(*args)
    except Exception as exc:
        return raised(hook, exc)


def raised(hook: Any, exc: Exception) -> str:
    """What a strategy's hook raised, in one line naming it (`Class.hook() raised ...`)."""
    return f"{_name(hook)}() raised {one_line(exc)}"


def _name(hook: Any) -> str:
    """A strategy's hook as `Class.hook`."""
    owner = getattr(hook, "__self__", None)  # the class of a class method, else the object
    cls = owner if isinstance(owner, type) else type(owner) if owner is not None else None
    return f"{cls.__name__}.{hook.__name__}" if cls is not None else hook.__name__


def _module_names() -> list[str]:
    here = {m.name for m in pkgutil.iter_modules(__path__)}
    names = [f"{__name__}.{m}" for m in BUILT_IN if m in here]
    names += [
        f"{__name__}.{m}"
        for m in sorted(here)
        if m not in BUILT_IN and m != "base" and not m.startswith("_")
    ]
    names += [ep.value.split(":")[0] for ep in entry_points(group=ENTRY_POINT_GROUP)]
    names += [m.strip() for m in os.environ.get("PARABENCH_STRATEGIES", "").split(",") if m.strip()]
    return names


def _is_built_in(module_name: str) -> bool:
    return module_name in {f"{__name__}.{m}" for m in BUILT_IN}


def _specs_in(module_name: str) -> list[StrategySpec]:
    from bench.workload import plugins

    short = module_name.rsplit(".", 1)[-1]
    if not module_name.startswith(f"{__name__}."):
        plugins.cwd_on_path()  # as --model mymodels:build finds its module
    try:
        with plugins.no_exit():
            module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # a broken plug-in is listed, not fatal
        if isinstance(exc, SystemExit | plugins.ParsesCommandLine):
            reason = f"import of {module_name} {plugins.raised(exc)}"
        else:
            reason = f"import of {module_name} failed: {type(exc).__name__}: {exc}"
        return [StrategySpec(short, None, None, module_name, reason.splitlines()[0], True)]
    specs = []
    for _, cls in inspect.getmembers(module, inspect.isclass):
        # `cls.__dict__` so a subclass does not re-register its parent's names.
        if issubclass(cls, Strategy) and cls.__module__ == module.__name__:
            variants = cls.__dict__.get("variants", {})
            malformed = _malformed(variants)
            if malformed:  # listed under its module and class: it has no name of its own
                name = f"{short}.{cls.__name__}"
                specs.append(StrategySpec(name, None, None, module_name, malformed))
                continue
            for name, variant in variants.items():
                specs.append(StrategySpec(name, cls, variant, module_name))
    return specs


#: what a strategy's name may hold: one word of a comma-separated list and one folder name
NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _malformed(variants: Any) -> str | None:
    """Why a class's `variants` cannot register (a mapping of names to Variant(...)), or None."""
    if not isinstance(variants, Mapping):
        return (
            f"its variants must map names to Variant(...), got a {type(variants).__name__}: "
            f"{variants!r}"
        )[:200]
    for name, variant in variants.items():
        if not isinstance(name, str) or not name:
            return f"its variants must map names to Variant(...), got the name {name!r}"
        # --strategies and --exclude split at commas (and strip spaces), and a cell's
        # folder is named after it: any other name runs only unselected, or elsewhere
        if not NAME.fullmatch(name):
            return (
                f"its variant name {name!r} cannot be given to --strategies: use letters, "
                "digits, '_', '-' and '.'"
            )[:200]
        if not isinstance(variant, Variant):
            return (
                f"its variants must map names to Variant(...), got {type(variant).__name__} "
                f"{variant!r} for {name!r}"
            )[:200]
    return None


@cache
def registry() -> dict[str, StrategySpec]:
    found: dict[str, StrategySpec] = {}
    for module_name in _module_names():
        for spec in _specs_in(module_name):
            first = found.get(spec.name)
            if first is not None and first.module != spec.module:
                # the first keeps the name (the built-ins are discovered first); the other
                # is listed as unavailable, not fatal (as a plug-in that fails to import),
                # under its module's name
                if spec.reason:  # a plug-in that failed to import says so
                    reason = spec.reason
                elif _is_built_in(first.module):
                    reason = (
                        f"its name {spec.name!r} is taken by the built-in module "
                        f"{first.module}: rename it (the name of its class's variant)"
                    )
                else:
                    reason = (
                        f"its name {spec.name!r} is already registered by {first.module}: "
                        "rename it (the name of its class's variant)"
                    )
                clash = f"{spec.module}.{spec.name}"
                found[clash] = StrategySpec(
                    clash, None, None, spec.module, reason, spec.import_failed
                )
                continue
            found[spec.name] = spec
    return dict(sorted(found.items()))


def get(name: str) -> StrategySpec:
    specs = registry()
    if name not in specs:
        raise UnknownStrategy(f"unknown strategy {name!r}; known: {', '.join(specs)}")
    return specs[name]
