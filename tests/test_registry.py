from __future__ import annotations

import pkgutil
import sys
import textwrap
from pathlib import Path

import pytest

import strategies
from bench.config import ConfigError

CORE = {
    "single",
    "dp",
    "ddp_torchrun",
    "ddp_spawn",
    "amp_ddp",
    "apex_amp_ddp",
    "horovod",
    "horovod_fp16",
}


def test_every_module_in_the_package_is_discovered():
    reg = strategies.registry()
    assert CORE <= set(reg)
    assert reg["ddp_torchrun"].cls is reg["ddp_spawn"].cls  # one class, two launchers
    assert reg["ddp_torchrun"].launcher == "torchrun"
    assert reg["ddp_spawn"].launcher == "spawn"
    assert reg["horovod_fp16"].variant.options == {"compression": "fp16"}


def test_unknown_strategy_is_a_config_error_naming_the_known_ones():
    with pytest.raises(ConfigError, match="unknown strategy 'nope'.*single"):
        strategies.get("nope")


def test_apex_is_unavailable_without_cuda_with_its_reason():
    why = strategies.get("apex_amp_ddp").unavailable("cpu")
    assert why is not None and "CUDA" in why


def test_apex_without_amp_says_it_was_removed(tmp_path, monkeypatch):
    # An apex that lacks apex.amp: what apex >= 25.07 (or PyPI's unrelated 'apex') looks like.
    pkg = tmp_path / "apex"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in [m for m in sys.modules if m == "apex" or m.startswith("apex.")]:
        monkeypatch.delitem(sys.modules, mod)
    from strategies.apex_amp_ddp import apex_problem

    why = apex_problem()
    assert why is not None and "removed in apex 25.07" in why and "25.05" in why


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """register(name, body): a module of that source, registered through
    PARABENCH_STRATEGIES for one test (the registry is rebuilt before and after)."""

    def register(name: str, body: str) -> None:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setenv("PARABENCH_STRATEGIES", name)
        strategies.registry.cache_clear()

    yield register
    monkeypatch.delenv("PARABENCH_STRATEGIES", raising=False)
    strategies.registry.cache_clear()


def test_a_plugin_module_registers_without_editing_the_package(plugin):
    plugin(
        "my_plugin",
        """
        from strategies.base import Strategy, Variant
        class Mine(Strategy):
            variants = {"mine": Variant("inprocess", "a user's strategy")}
    """,
    )
    spec = strategies.get("mine")
    assert spec.module == "my_plugin" and spec.unavailable("cpu") is None


def test_the_readmes_strategy_applies_every_option_it_takes(plugin):
    """The README's example, as a user would add it: listed, and each --set option it takes
    (DDP's, inherited) reaches torch's DDP beside its own change."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from strategies.base import RankContext

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    plugin("my_ddp", readme.split("# strategies/my_ddp.py\n", 1)[1].split("```", 1)[0])
    spec = strategies.get("my_ddp")
    assert spec.unavailable("cpu") is None and spec.launcher == "torchrun"
    given = {"bucket_cap_mb": "1", "gradient_as_bucket_view": "true", "static_graph": "true"}
    assert set(spec.accepts) == set(given)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), seed=0)
        plain, _ = spec.create(ctx).setup(nn.Linear(2, 2), None)
        ddp, _ = spec.create(ctx, given).setup(nn.Linear(2, 2), None)
    finally:
        dist.destroy_process_group()
    assert plain.find_unused_parameters and ddp.find_unused_parameters  # its own change
    assert ddp.bucket_bytes_cap == 1024 * 1024 != plain.bucket_bytes_cap
    assert ddp.gradient_as_bucket_view and not plain.gradient_as_bucket_view
    assert ddp.static_graph and not plain.static_graph


def test_the_readmes_strategy_passes_the_projects_lint(tmp_path):
    """Copied into strategies/ as the README says, the example passes `make lint` (ruff
    check and format with this project's settings), as every module there must."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    body = (root / "README.md").read_text().split("```python\n# strategies/my_ddp.py\n", 1)[1]
    module = tmp_path / "my_ddp.py"
    module.write_text("# strategies/my_ddp.py\n" + body.split("```", 1)[0])
    settings = ["--config", str(root / "pyproject.toml")]
    for argv in (["check"], ["format", "--check"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *argv, *settings, str(module)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_hook_variant_takes_no_powersgd_options():
    """PowerSGD's options mean nothing to the fp16/bf16 hooks: a sweep over them gives those
    strategies one cell, not copies that differ only in their names."""
    assert "powersgd_rank" in strategies.get("ddp_powersgd").accepts
    ddp = strategies.get("ddp_torchrun").accepts
    for name in ("ddp_fp16_hook", "ddp_bf16_hook"):  # DDP's options; the hook is the variant
        assert strategies.get(name).accepts == ddp


def test_a_broken_plugin_is_listed_unavailable_not_fatal(plugin):
    plugin("broken_plugin", "import not_a_real_package_xyz\n")
    spec = strategies.get("broken_plugin")
    why = spec.unavailable("cpu")
    assert "ModuleNotFoundError" in why and "not_a_real_package_xyz" in why
    assert spec.description == "module broken_plugin failed to import"
    assert CORE <= set(strategies.registry())


def test_a_plugins_mistakes_cost_its_own_cells_only(plugin, data_root, capsys):
    """A launcher that does not exist, or a check that raises, is a reason on that
    strategy's rows (or an error when it is named), not a crash of `list` or of the run."""
    from bench.cli import main
    from bench.harness import runner
    from tests.conftest import small_config

    plugin(
        "mistaken",
        """
        from strategies.base import Strategy, Variant
        class Typo(Strategy):
            variants = {"typo": Variant("torchrunn", "a launcher misspelt")}
        class Raises(Strategy):
            variants = {"raises": Variant("inprocess", "a check that raises")}
            @classmethod
            def unsuitable(cls, cfg, world_size, options):
                return {}["no such key"]
        class Missing(Strategy):
            variants = {"missing": Variant("inprocess", "needs a package not installed")}
            @classmethod
            def unavailable(cls, device):
                import not_a_real_package_xyz  # noqa: F401
        class NoPrecision(Strategy):
            variants = {"no_precision": Variant("inprocess", "default_precision raises")}
            @classmethod
            def default_precision(cls, device, options):
                raise RuntimeError("which one?")
        class NoLauncher(Strategy):
            variants = {"no_launcher": Variant(None, "no launcher at all")}
        class Unsupported(Strategy):
            variants = {"unsupported": Variant("inprocess", "a setting check that raises")}
            @classmethod
            def unsupported(cls, setting, device):
                raise ValueError("what setting?")
        class NoShares(Strategy):
            variants = {"no_shares": Variant("inprocess", "batch_shares raises")}
            @classmethod
            def batch_shares(cls, world_size, options):
                return options["shares"]
        class ZeroShares(Strategy):
            variants = {"zero_shares": Variant("inprocess", "batch_shares answers 0")}
            @classmethod
            def batch_shares(cls, world_size, options):
                return 0
        class Yes(Strategy):
            variants = {"yes": Variant("inprocess", "a check that answers True")}
            @classmethod
            def cannot_run(cls, world_size, device, n_devices, oversubscribe=False):
                return world_size >= 1
        class No(Strategy):
            variants = {"no": Variant("inprocess", "checks that answer False")}
            @classmethod
            def unavailable(cls, device):
                return False
            @classmethod
            def unsuitable(cls, cfg, world_size, options):
                return 0
    """,
    )
    assert "launcher 'torchrunn'; launchers: inprocess, spawn" in strategies.get(
        "typo"
    ).unavailable("cpu")
    why = strategies.get("missing").unavailable("cpu")
    assert why == (
        "Missing.unavailable() raised ModuleNotFoundError: No module named 'not_a_real_package_xyz'"
    )
    assert "NoPrecision.default_precision() raised RuntimeError: which one?" == (
        strategies.get("no_precision").unavailable("cpu")
    )
    assert "launcher None" in strategies.get("no_launcher").unavailable("cpu")
    assert main(["list"]) == 0 and "typo" in capsys.readouterr().out
    cells = runner.plan(small_config(Path("/nonexistent"), data_root, world_sizes=(1,)))
    reasons = {c.strategy: c.reason for c in cells}
    assert reasons["raises"] == "Raises.unsuitable() raised KeyError: 'no such key'"
    assert reasons["unsupported"] == "Unsupported.unsupported() raised ValueError: what setting?"
    assert reasons["no_precision"].startswith("NoPrecision.default_precision() raised")
    assert reasons["no_shares"] == "NoShares.batch_shares() raised KeyError: 'shares'"
    assert reasons["zero_shares"] == "ZeroShares.batch_shares() answered 0, not a positive int"
    # a yes or no where a sentence belongs: "True" was the reason its rows gave
    assert reasons["yes"] == (
        "Yes.cannot_run() answered True, not a sentence saying why (or None: it can)"
    )
    assert strategies.get("no").unavailable("cpu") is None and not reasons["no"]
    assert "single" in reasons and not reasons["single"]  # the others plan as before
    with pytest.raises(ConfigError, match="raises cannot run at world size 1: Raises.unsuitable"):
        runner.plan(
            small_config(Path("/nonexistent"), data_root, strategies=("raises",), world_sizes=(1,))
        )


def test_a_rank_per_process_strategy_on_the_inprocess_launcher_is_refused_before_it_starts(
    plugin, data_root
):
    """The in-process launcher starts one process: a DDP subclass named with it ran at world
    size 2 and failed once started ('launcher started 1 ranks'), where the plan said 2
    processes. Now the plan says why it cannot, and naming it is one line."""
    from bench.harness import runner
    from tests.conftest import small_config

    plugin(
        "one_launcher",
        """
        from strategies.base import Variant
        from strategies.ddp import DistributedDataParallel
        class Mine(DistributedDataParallel):
            variants = {"ddp_inprocess": Variant("inprocess", "DDP on the wrong launcher")}
        """,
    )
    cfg = small_config(Path("/nonexistent"), data_root, world_sizes=(1, 2))
    cells = {(c.strategy, c.world_size): c for c in runner.plan(cfg)}
    why = (
        "Mine runs one process per rank, and its Variant's launcher 'inprocess' starts one: "
        "name spawn or torchrun"
    )
    assert cells[("ddp_inprocess", 2)].reason == why
    assert not cells[("ddp_inprocess", 1)].reason  # one rank: one process is right
    assert not cells[("ddp_spawn", 2)].reason
    named = small_config(
        Path("/nonexistent"), data_root, strategies=("ddp_inprocess",), world_sizes=(2,)
    )
    with pytest.raises(ConfigError, match="ddp_inprocess cannot run at world size 2: Mine runs"):
        runner.plan(named)


def test_a_plugin_reusing_a_name_is_listed_unavailable_not_fatal(plugin):
    plugin(
        "clash_plugin",
        """
        from strategies.base import Strategy, Variant
        class Mine(Strategy):
            variants = {"single": Variant("inprocess", "a user's strategy named as ours")}
    """,
    )
    assert strategies.get("single").module == "strategies.single"  # ours keeps it
    why = strategies.get("clash_plugin.single").unavailable("cpu")
    assert "its name 'single' is taken by the built-in module strategies.single: rename" in why


def test_a_module_added_to_the_package_cannot_displace_a_built_in(tmp_path, monkeypatch):
    """Discovery of the package's modules is alphabetical, so a module added beside them
    named before `ddp` or `single` came first and took their names (verify's baseline
    among them): the built-ins are discovered first, and the newcomer is listed unavailable
    saying the name is theirs. Two plug-ins that clash: the first keeps the name."""
    (tmp_path / "a_mine.py").write_text(
        textwrap.dedent(
            """
            from strategies.base import Strategy, Variant
            class Mine(Strategy):
                variants = {
                    "single": Variant("inprocess", "a user's single"),
                    "ddp_spawn": Variant("inprocess", "a user's ddp"),
                    "mine_twice": Variant("inprocess", "a user's strategy"),
                }
            """
        )
    )
    (tmp_path / "b_mine.py").write_text(
        textwrap.dedent(
            """
            from strategies.base import Strategy, Variant
            class Again(Strategy):
                variants = {"mine_twice": Variant("inprocess", "named as a_mine's")}
            """
        )
    )
    monkeypatch.setattr(strategies, "__path__", [*strategies.__path__, str(tmp_path)])
    strategies.registry.cache_clear()
    try:
        reg = strategies.registry()
        assert reg["single"].module == "strategies.single"
        assert reg["ddp_spawn"].module == "strategies.ddp"
        assert reg["mine_twice"].module == "strategies.a_mine"
        taken = reg["strategies.a_mine.single"]
        assert taken.unavailable("cpu") == (
            "its name 'single' is taken by the built-in module strategies.single: rename it "
            "(the name of its class's variant)"
        )
        assert taken.description == "from module strategies.a_mine, not registered"
        assert "taken by the built-in module strategies.ddp" in (
            reg["strategies.a_mine.ddp_spawn"].unavailable("cpu")
        )
        again = reg["strategies.b_mine.mine_twice"].unavailable("cpu")
        assert again.startswith("its name 'mine_twice' is already registered by strategies.a_mine")
    finally:
        for name in ("strategies.a_mine", "strategies.b_mine"):
            sys.modules.pop(name, None)
        monkeypatch.undo()
        strategies.registry.cache_clear()


def test_the_built_in_modules_are_the_packages_own():
    here = {m.name for m in pkgutil.iter_modules(strategies.__path__)}
    assert set(strategies.BUILT_IN) <= here
    assert {strategies.get(n).module.rsplit(".", 1)[-1] for n in CORE} <= set(strategies.BUILT_IN)
    # every module this repository ships is listed: one added to strategies/ and committed
    # without joining BUILT_IN would be a plug-in that a later one could displace
    import subprocess
    from pathlib import Path

    root = Path(strategies.__file__).parent
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True
    ).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    shipped = {Path(f).stem for f in tracked if "/" not in f} - {"__init__", "base"}
    assert shipped == set(strategies.BUILT_IN)


def test_malformed_variants_are_listed_unavailable_not_fatal(plugin, capsys):
    from bench.cli import main

    plugin(
        "malformed",
        """
        from strategies.base import Strategy, Variant
        class AList(Strategy):
            variants = ["alist"]
        class NotVariants(Strategy):
            variants = {"not_variants": "inprocess"}
        class Fine(Strategy):
            variants = {"fine": Variant("inprocess", "well formed, beside them")}
        """,
    )
    reg = strategies.registry()
    assert "its variants must map names to Variant(...), got a list: ['alist']" == (
        reg["malformed.AList"].unavailable("cpu")
    )
    why = reg["malformed.NotVariants"].unavailable("cpu")
    assert why == (
        "its variants must map names to Variant(...), got str 'inprocess' for 'not_variants'"
    )
    assert reg["malformed.AList"].description == "from module malformed, not registered"
    assert reg["fine"].unavailable("cpu") is None and CORE <= set(reg)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "malformed.AList" in out and "got a list" in out


@pytest.mark.parametrize("n, name", enumerate(["a,b", " spaced", "team/x", "my ddp"]))
def test_a_variant_name_that_strategies_cannot_give_is_listed_unavailable(plugin, capsys, n, name):
    """--strategies splits at commas and strips spaces, and a cell's folder is named after
    its strategy: such a name would run only as part of every strategy, never selected."""
    from bench.cli import main

    module = f"odd_names{n}"  # a module of its own per name: an imported one is kept
    plugin(
        module,
        f"""
        from strategies.base import Strategy, Variant
        class Odd(Strategy):
            variants = {{{name!r}: Variant("inprocess", "an odd name")}}
        """,
    )
    reg = strategies.registry()
    assert name not in reg and name.strip() not in reg
    why = reg[f"{module}.Odd"].unavailable("cpu")
    assert why == (
        f"its variant name {name!r} cannot be given to --strategies: use letters, digits, "
        "'_', '-' and '.'"
    )
    assert main(["list"]) == 0
    assert f"{module}.Odd" in capsys.readouterr().out


@pytest.mark.parametrize(
    "body, expected",
    [
        ("import sys\nsys.exit(3)\n", "exits (SystemExit(3)): a plug-in must not exit"),
        (
            "import argparse\n"
            "parser = argparse.ArgumentParser()\n"
            "parser.add_argument('--config', required=True)\n"
            "parser.parse_args()\n",
            "parses the command line (argparse:",
        ),
    ],
    ids=["sys.exit", "argparse"],
)
def test_a_plugin_that_exits_at_import_is_listed_unavailable_not_fatal(
    plugin, capsys, body, expected
):
    from bench.cli import main

    plugin("exits_at_import", body)
    spec = strategies.get("exits_at_import")
    why = spec.unavailable("cpu")
    assert why.startswith("import of exits_at_import ") and expected in why, why
    assert "command-line parsing belongs under `if __name__ == '__main__':`" in why
    assert spec.description == "module exits_at_import failed to import"
    assert main(["list"]) == 0
    captured = capsys.readouterr()
    assert "exits_at_import" in captured.out and "usage:" not in captured.err


def test_a_plugin_module_is_found_in_the_current_directory(tmp_path, monkeypatch):
    """PARABENCH_STRATEGIES=mymodule from the directory that holds mymodule.py, as
    --model mymodels:build finds its module there."""
    (tmp_path / "cwd_strategy.py").write_text(
        "from strategies.base import Strategy, Variant\n"
        "class Here(Strategy):\n"
        "    variants = {'from_cwd': Variant('inprocess', 'a module in the current directory')}\n"
    )
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PARABENCH_STRATEGIES", "cwd_strategy")
    strategies.registry.cache_clear()
    try:
        spec = strategies.get("from_cwd")
        assert spec.module == "cwd_strategy" and spec.unavailable("cpu") is None
    finally:
        sys.modules.pop("cwd_strategy", None)
        monkeypatch.undo()
        strategies.registry.cache_clear()


def test_more_ranks_than_gpus_share_them_over_gloo_only_when_asked():
    ddp, hvd, dp = (strategies.get(n) for n in ("ddp_torchrun", "horovod", "dp"))
    why = ddp.cannot_run(2, "cuda", 1)
    assert why == (
        "one rank per GPU: world size 2 needs 2 GPUs, found 1; nccl refuses two ranks on one "
        "GPU (--oversubscribe runs its ranks on the shared GPU over gloo, for correctness)"
    )
    assert ddp.cannot_run(2, "cuda", 1, oversubscribe=True) is None
    assert ddp.cannot_run(2, "cuda", 2) is None
    # Horovod's NCCL build cannot share a GPU, flag or not
    hvd_why = hvd.cannot_run(2, "cuda", 1, oversubscribe=True)
    assert hvd_why.endswith("nccl refuses two ranks on one GPU")
    assert dp.cannot_run(2, "cuda", 1, oversubscribe=True).startswith("DataParallel over 2 GPUs")


def test_ranks_sharing_a_gpu_use_gloo():
    import torch

    from strategies.base import RankContext

    def backend(shares: bool) -> str:
        ctx = RankContext(
            rank=0,
            local_rank=0,
            world_size=2,
            device=torch.device("cuda:0"),
            seed=0,
            shares_device=shares,
        )
        return strategies.get("ddp_torchrun").create(ctx).backend

    assert (backend(False), backend(True)) == ("nccl", "gloo")


def test_only_strategies_whose_collectives_gloo_takes_on_cuda_share_a_gpu():
    sharing = {n for n, s in strategies.registry().items() if s.cls and s.cls.shares_gpu}
    assert {"ddp_torchrun", "ddp_spawn", "amp_ddp", "zero1", "ddp_fp16_hook"} <= sharing
    # FSDP reduce-scatters, pipelines send and receive: gloo does neither on CUDA tensors
    assert not sharing & {"fsdp", "fsdp_zero2", "pipeline_gpipe", "tp", "horovod", "dp"}


@pytest.mark.parametrize(
    "name, ws, options, expected",
    [
        ("ddp_spawn", 4, {}, [(4, r) for r in range(4)]),  # one share per rank
        ("dp", 2, {}, [(1, 0)]),  # one process cuts its share over its devices
        ("tp", 4, {}, [(1, 0)] * 4),  # every rank trains the one batch
        ("fsdp_tp", 4, {"tp": "2"}, [(2, 0), (2, 0), (2, 1), (2, 1)]),  # (dp, tp) row-major
        ("fsdp_tp", 8, {"tp": "4"}, [(2, 0)] * 4 + [(2, 1)] * 4),
        ("pipeline_gpipe", 2, {}, [(1, 0)] * 2),
    ],
)
def test_data_ranks_follow_batch_shares(name, ws, options, expected):
    """The sampler's replicas and each rank's index come from batch_shares, which plan()
    checks the global batch against: the two cannot disagree (a plug-in overriding only
    batch_shares gets the matching split)."""
    from types import SimpleNamespace

    spec = strategies.get(name)
    got = []
    for rank in range(spec.cls.processes(ws)):
        strategy = spec.cls.__new__(spec.cls)
        strategy.ctx = SimpleNamespace(world_size=ws, rank=rank)
        strategy.options = {**spec.variant.options, **options}
        got.append(strategy.data_ranks())
    assert got == expected
    assert got[0][0] * (ws // spec.cls.processes(ws)) == spec.cls.batch_shares(ws, strategy.options)
