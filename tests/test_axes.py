"""The matrix of strategy x world size x run options x strategy-option sweeps, as planned
before anything starts (no processes): which cells exist, which are skipped and why, and
how the report names them."""

from __future__ import annotations

import math

import pytest

import strategies
from bench.config import ConfigError
from bench.harness import runner
from bench.harness.results import case_labels
from bench.harness.runner import plan, sweep_notes
from strategies.base import Setting
from tests.conftest import small_config


def cells(tmp_path, data_root, **kw):
    return plan(small_config(tmp_path, data_root, **kw))


def test_setting_labels_are_compact_and_distinct():
    assert Setting().label == "fp32"
    assert Setting(precision="bf16", compile=True, accumulate=4, sync_bn=True).label == (
        "bf16,compile,acc4,syncbn"
    )
    assert Setting(channels_last=True).label == "fp32,cl"
    mode = Setting(compile=True, compile_mode="reduce-overhead")
    assert mode.label == "fp32,compile-reduce-overhead"


def test_compile_modes_are_cases_of_their_own_in_reports():
    labels = case_labels(
        [("single", "fp32"), ("single", "fp32,compile"), ("single", "fp32,compile-reduce-overhead")]
    )
    assert labels[("single", "fp32")] == "single [eager]"
    assert labels[("single", "fp32,compile")] == "single [compile]"
    assert labels[("single", "fp32,compile-reduce-overhead")] == "single [compile-reduce-overhead]"


def test_verify_baselines_run_eager_whatever_the_compile_mode(tmp_path, data_root):
    """verify's baselines (single at fp32, eager) are valid runs of a compiled matrix."""
    from bench.analysis.verify import baseline_config, parity_config

    cfg = small_config(tmp_path, data_root, compile=(True,), compile_mode="reduce-overhead")
    base = baseline_config(parity_config(cfg, 2), tmp_path, "baseline")
    assert base.compile == (False,) and base.compile_mode == "default"


def test_compile_mode_applies_to_the_compiled_cells_only(tmp_path, data_root):
    planned = cells(
        tmp_path,
        data_root,
        strategies=("single",),
        world_sizes=(1,),
        compile=(False, True),
        compile_mode="max-autotune-no-cudagraphs",
    )
    got = {c.label: c.setting.compile_mode for c in planned}
    assert got == {
        "fp32": "default",
        "fp32,compile-max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs",
    }


@pytest.mark.parametrize(
    "mode, passed", [("default", None), ("reduce-overhead", "reduce-overhead")]
)
def test_the_compile_mode_reaches_torch_compile(monkeypatch, mode, passed):
    """attach() compiles after the strategy's own wrapping, in the mode asked for (None:
    torch's default), and the row's notes say which; a CUDA-graph mode on a CPU says it
    captures none."""
    import torch

    from strategies.base import RankContext
    from strategies.single import Single

    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: seen.append(mode) or model)
    ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), seed=0)
    strategy = Single(ctx, {}, Setting(compile=True, compile_mode=mode))
    model = torch.nn.Linear(4, 2)
    strategy.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert seen == [passed]
    (note,) = [n for n in strategy.notes if n.startswith("torch.compile")]
    assert ("mode=reduce-overhead" in note) == (mode == "reduce-overhead")
    assert ("need a CUDA device" in note) == (mode == "reduce-overhead")


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_dataparallel_replicas_compute_in_the_cells_precision(precision):
    """nn.DataParallel runs each replica's forward in a thread of its own, and torch's
    parallel_apply enters autocast there with that thread's default dtype (autocast's
    dtype is per-thread): fp16 on CUDA, so `dp --precision bf16` over 2 GPUs computed in
    fp16 with no loss scaling. The replicated module must carry the cell's dtype. Here on
    the CPU, a replica's thread is entered as parallel_apply does, its default dtype the
    other one."""
    import threading

    import torch

    from strategies.base import RankContext
    from strategies.dp import DataParallel
    from strategies.precision import DTYPES

    ctx = RankContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), seed=0)
    strategy = DataParallel(ctx, {}, Setting(precision=precision))
    model = torch.nn.Linear(4, 2)
    strategy.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))
    replicated = strategy.model.module  # what DataParallel copies to each device
    got = []

    other = DTYPES["fp16" if precision == "bf16" else "bf16"]

    def replica() -> None:
        torch.set_autocast_dtype("cpu", other)  # this thread's default alone
        with torch.amp.autocast("cpu", enabled=True):  # parallel_apply's, in the replica
            got.append(replicated(torch.ones(3, 4)).dtype)

    thread = threading.Thread(target=replica)
    thread.start()
    thread.join()
    assert got == [DTYPES[precision]]
    # evaluation, parity and the model state still see the model itself, its names as they were
    assert strategy.unwrap(strategy.model) is model
    assert set(strategy.full_state_dict()) == {"weight", "bias"}


def test_channels_last_is_an_axis_named_in_case_labels(tmp_path, data_root):
    planned = cells(
        tmp_path, data_root, strategies=("single",), world_sizes=(1,), channels_last=(False, True)
    )
    assert [c.label for c in planned] == ["fp32", "fp32,cl"]
    labels = case_labels([("single", "fp32"), ("single", "fp32,cl")])
    assert labels[("single", "fp32,cl")] == "single [cl]"
    assert labels[("single", "fp32")] == "single [nchw]"


def test_default_matrix_keeps_each_strategys_own_precision(tmp_path, data_root):
    got = {(c.strategy, c.world_size): c for c in cells(tmp_path, data_root, world_sizes=(1,))}
    assert got[("single", 1)].label == "fp32" and got[("ddp_spawn", 1)].label == "fp32"
    assert got[("amp_ddp", 1)].label == "bf16"  # the seed's row keeps its meaning: AMP
    assert got[("apex_amp_ddp", 1)].status == "unavailable"


def test_precision_axis_runs_every_value_and_skips_what_a_strategy_cannot(tmp_path, data_root):
    planned = cells(
        tmp_path,
        data_root,
        strategies=("single", "fsdp", "amp_ddp"),
        world_sizes=(1,),
        precisions=("fp32", "bf16"),
    )
    got = {(c.strategy, c.label): c for c in planned}
    assert len(planned) == 6
    for name in ("single", "fsdp"):
        assert not got[(name, "fp32")].status and not got[(name, "bf16")].status
    assert got[("amp_ddp", "fp32")].status == "skipped"
    assert "bf16 | fp16 only" in got[("amp_ddp", "fp32")].reason
    assert not got[("amp_ddp", "bf16")].status


def test_fp16_loss_scaling_says_how_many_optimizer_steps_it_skipped() -> None:
    """A step whose gradients hold an inf is skipped by the GradScaler (no update) but
    timed like the rest: the rows' notes say how many, counted from the scale at the end
    (no per-step read, which would synchronise with the device); past growth_interval
    clean steps the scale may have grown too, so the count is a least."""
    import torch

    from strategies import precision as prec

    def run(bad: list[bool], scaler: torch.amp.GradScaler | None = None):
        p = prec.make("fp16", "cpu")
        if scaler is not None:
            p.scaler = scaler
        w = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.SGD([w], lr=0.1)
        for overflow in bad:
            opt.zero_grad()
            p.backward((w * (math.inf if overflow else 1.0)).sum())
            p.step(opt)
        return p, w

    p, w = run([False, True, False, True, True])
    assert p.notes() == [
        "fp16 loss scaling skipped 3 of 5 optimizer steps since the cell began (warm-up and "
        "any probes' included) on inf/nan gradients, scale 65536 -> 8192"
    ]
    assert torch.allclose(w.detach(), torch.full((3,), 0.8))  # two updates of 0.1, no more
    assert run([False, False])[0].notes()[0].startswith("fp16 loss scaling skipped 0 of 2")
    grows = torch.amp.GradScaler("cpu", growth_interval=2)
    (grown,) = run([True, False, False, False, False], grows)[0].notes()
    assert grown.startswith("fp16 loss scaling over 5 optimizer steps") and "skipped" not in grown
    assert "scale 65536 -> 131072" in grown  # one skip, two growths
    grows = torch.amp.GradScaler("cpu", growth_interval=2)
    (fell,) = run([True, True, True, False, False], grows)[0].notes()
    assert fell.endswith("so at least 2 skipped")  # three skips, one growth
    # every step overflowing halves the scale to 0 (about 166 steps in float32): said, and
    # no log of 0
    (gone,) = run([True] * 170)[0].notes()
    assert (
        "scale 65536 -> 0 over 170 optimizer steps" in gone and "every update was skipped" in gone
    )
    assert prec.make("bf16", "cpu").notes() == [] and prec.make("fp32", "cpu").notes() == []


def test_sync_bn_off_and_on_skips_the_cpu_cells_with_the_reason(tmp_path, data_root):
    planned = cells(
        tmp_path, data_root, strategies=("ddp_spawn",), world_sizes=(2,), sync_bn=(False, True)
    )
    by = {c.label: c for c in planned}
    assert not by["fp32"].status
    assert by["fp32,syncbn"].status == "skipped" and "GPU modules" in by["fp32,syncbn"].reason


def test_an_option_sweep_multiplies_only_the_strategies_that_take_it(tmp_path, data_root):
    planned = cells(
        tmp_path,
        data_root,
        strategies=("single", "ddp_spawn", "zero1"),
        world_sizes=(1,),
        options={"bucket_cap_mb": "1,25,100"},
        repeats=2,
    )
    per = {
        s: sorted({c.label for c in planned if c.strategy == s})
        for s in ("single", "ddp_spawn", "zero1")
    }
    assert per["single"] == ["fp32"]
    assert (
        per["ddp_spawn"]
        == per["zero1"]
        == [
            "fp32,bucket_cap_mb=1",
            "fp32,bucket_cap_mb=100",
            "fp32,bucket_cap_mb=25",
        ]
    )
    assert len(planned) == 2 * (1 + 3 + 3)
    keys = [c.key for c in planned]
    assert len(keys) == len(set(keys))  # resume tells every cell apart
    dirs = [c.dirname for c in planned]
    assert len(dirs) == len(set(dirs)) and "ddp_spawn-ws1-fp32+bucket_cap_mb=25-r1" in dirs


@pytest.mark.parametrize(
    ("names", "options", "said"),
    [
        (
            ("fsdp", "fsdp_zero2"),
            {"reshard_after_forward": "on,off"},  # on is true, as the strategy reads it
            "--set reshard_after_forward=on makes fsdp_zero2 (fsdp with "
            "reshard_after_forward=false) run as fsdp: set it on fsdp, or leave fsdp_zero2 "
            "out (of --strategies)",
        ),
        (
            ("pipeline_1f1b",),
            {"schedule": "gpipe"},
            "--set schedule=gpipe makes pipeline_1f1b (pipeline_gpipe with schedule=1f1b) "
            "run as pipeline_gpipe: set it on pipeline_gpipe",
        ),
        (  # another micro-batch count beside it: still GPipe's steps under 1F1B's name
            ("pipeline_1f1b",),
            {"schedule": "gpipe", "microbatches": "8"},
            "--set schedule=gpipe makes pipeline_1f1b (pipeline_gpipe with schedule=1f1b) "
            "run as pipeline_gpipe",
        ),
        (
            ("horovod_fp16",),
            {"compression": "none"},
            "makes horovod_fp16 (horovod with compression=fp16) run as horovod",
        ),
        (  # the other way: horovod leaves compression at none, horovod_fp16 fixes fp16
            ("horovod", "horovod_fp16"),
            {"compression": "fp16"},
            "--set compression=fp16 makes horovod run as horovod_fp16 (which is horovod with "
            "compression=fp16): run horovod_fp16 for it, or leave horovod out (of --strategies)",
        ),
        (
            ("fsdp",),
            {"reshard_after_forward": "true,0"},  # 0 is false, as the strategy reads it
            "--set reshard_after_forward=0 makes fsdp run as fsdp_zero2",
        ),
    ],
)
def test_a_set_that_turns_a_variant_into_its_sibling_is_refused(
    tmp_path, data_root, names, options, said
):
    """fsdp_zero2 [reshard_after_forward=true] ran fsdp's steps under fsdp_zero2's name,
    which says they keep parameters gathered: one line before anything runs."""
    with pytest.raises(ConfigError) as exc:
        cells(tmp_path, data_root, strategies=names, world_sizes=(2,), options=options)
    assert said in str(exc.value)


def test_every_variant_a_set_turns_into_its_sibling_is_named(tmp_path, data_root):
    """fsdp with reshard_after_forward=false is fsdp_zero2 and fsdp_zero2 with true is fsdp:
    both in one line, not one fix at a time."""
    with pytest.raises(ConfigError) as exc:
        cells(
            tmp_path,
            data_root,
            strategies=("fsdp", "fsdp_zero2"),
            world_sizes=(2,),
            options={"reshard_after_forward": "true,false"},
        )
    said = str(exc.value)
    assert said.startswith("(1) --set reshard_after_forward=false makes fsdp run as fsdp_zero2")
    assert "(2) --set reshard_after_forward=true makes fsdp_zero2 (fsdp with" in said


def test_a_set_of_the_default_a_variant_leaves_runs(tmp_path, data_root):
    """horovod with compression=none and fsdp with reshard_after_forward=true run their own
    steps: no sibling fixes those values."""
    planned = cells(
        tmp_path,
        data_root,
        strategies=("fsdp",),
        world_sizes=(2,),
        options={"reshard_after_forward": "true"},
    )
    assert [c.label for c in planned] == ["fp32,reshard_after_forward=true"]
    # (asked of the planner's check: a machine without Horovod plans no horovod cell)
    horovod = strategies.get("horovod")
    assert runner._runs_as_sibling(horovod, (("compression", "none"),)) == ""
    assert "run as horovod_fp16" in runner._runs_as_sibling(horovod, (("compression", "fp16"),))


def test_a_set_a_variant_fixes_stays_a_sweep_where_no_sibling_runs_it(tmp_path, data_root):
    """pipeline_gpipe fixes 4 micro-batches; 8 is a pipeline_gpipe of its own, and its own
    value (or one spelled otherwise, 04) changes nothing."""
    planned = cells(
        tmp_path,
        data_root,
        strategies=("pipeline_gpipe", "fsdp_zero2"),
        world_sizes=(2,),
        options={"microbatches": "04,8", "reshard_after_forward": "off"},
    )
    assert sorted({c.label for c in planned if c.strategy == "pipeline_gpipe"}) == [
        "fp32,microbatches=04",
        "fp32,microbatches=8",
    ]


def test_compress_divide_runs_once_without_it_where_it_changes_nothing(tmp_path, data_root):
    """single [compress_divide=before_sum] and [after_sum] with nothing rounded, or with the
    whole gradient rounded once (one share), ran the same steps under two names: one cell
    without it, and a line says why. Where shares are rounded apart it stays a sweep."""
    options = {"compress": "none,fp16", "shares": "1,2", "compress_divide": "before_sum,after_sum"}
    planned = cells(tmp_path, data_root, strategies=("single",), world_sizes=(1,), options=options)
    assert sorted(c.label for c in planned) == [
        "fp32,compress=fp16,compress_divide=after_sum,shares=2",
        "fp32,compress=fp16,compress_divide=before_sum,shares=2",
        "fp32,compress=fp16,shares=1",
        "fp32,compress=none,shares=1",
        "fp32,compress=none,shares=2",
    ]
    cfg = small_config(tmp_path, data_root).replace(options=options)
    assert sweep_notes(cfg, planned) == [
        "--set compress_divide: single runs its fp32 cells once without it: it says where "
        "the shares of a gradient rounded by compress are divided, and compress=none rounds "
        "nothing",
        "--set compress_divide: single runs its fp32 cells once without it: with one share "
        "the whole gradient is rounded once, and there are no shares to divide it among",
    ]


def test_norm_units_runs_once_without_it_where_it_changes_nothing(tmp_path, data_root):
    """norm_units places the BatchNorm layers FSDP keeps in fp32 under bf16/fp16: a sweep of
    it in fp32, or on a model without BatchNorm, planned two cells of the same steps whose
    rows named different options. Those cells run once, without it, and a line says why."""
    synthetic = dict(dataset="synthetic", model="resnet18", image_size=32, limit=64)
    planned = cells(
        tmp_path,
        data_root,
        strategies=("fsdp", "fsdp_zero2"),
        world_sizes=(2,),
        precisions=("fp32", "bf16"),
        options={"norm_units": "group,layer"},
        global_batch=8,
        **synthetic,
    )
    assert sorted(c.label for c in planned if c.strategy == "fsdp") == [
        "bf16,norm_units=group",
        "bf16,norm_units=layer",
        "fp32",
    ]
    cfg = small_config(tmp_path, data_root, precisions=("fp32", "bf16"), **synthetic)
    cfg = cfg.replace(options={"norm_units": "group,layer"})
    assert sweep_notes(cfg, planned) == [
        "--set norm_units: fsdp, fsdp_zero2 run their fp32 cells once without it: it sets how "
        "bf16/fp16 shard the BatchNorm layers they keep in fp32, and in fp32 those shard "
        "with their blocks"
    ]
    # MNIST's CNN has no BatchNorm: one cell in bf16 too
    mnist = cells(
        tmp_path,
        data_root,
        strategies=("fsdp",),
        world_sizes=(2,),
        precisions=("bf16",),
        options={"norm_units": "group,layer"},
    )
    assert [c.label for c in mnist] == ["bf16"]


def test_single_shares_skip_only_the_micro_batch_counts_that_do_not_divide_them(
    tmp_path, data_root
):
    """Shares of 6 (global batch 12, shares=2): one micro-batch runs, four would scale the
    loss by 3/4 and are skipped; the strategy's check sees each cell's --accumulate."""
    got = {
        c.setting.accumulate: c.reason
        for c in cells(
            tmp_path,
            data_root,
            strategies=("single",),
            world_sizes=(1,),
            global_batch=12,
            accumulate=(1, 4),
            options={"shares": "2"},
        )
    }
    assert got[1] == ""
    assert got[4].endswith(
        "(2 shares of global batch 12) does not split into 4 equal micro-batches"
    )


def test_single_asked_for_micro_batches_that_do_not_divide_its_batch_says_so_plainly(
    tmp_path, data_root
):
    """`--strategies single --accumulate 3` at global batch 64: the error names the batch
    and the micro-batches, not '1 shares' of a --set shares the user never gave."""
    with pytest.raises(ConfigError) as err:
        cells(
            tmp_path,
            data_root,
            strategies=("single",),
            world_sizes=(1,),
            global_batch=64,
            accumulate=(3,),
        )
    assert str(err.value) == (
        "single cannot run at world size 1 with fp32,acc3: global batch 64 is not divisible "
        "by world size 1 x 3 micro-batches"
    )


def test_micro_batches_a_rank_cannot_cut_evenly_skip_only_their_cells(tmp_path, data_root):
    """Global batch 24, --accumulate 8: 3 samples a micro-batch at world size 1, but a
    rank's 12 at world size 2 do not cut into 8. That cell is a skipped row, the other
    runs (the whole run was refused); a run where no cell can is an error that says why."""
    got = {
        c.world_size: c.reason
        for c in cells(
            tmp_path,
            data_root,
            strategies=("ddp_spawn",),
            world_sizes=(1, 2),
            global_batch=24,
            accumulate=(8,),
        )
    }
    assert got == {1: "", 2: "global batch 24 is not divisible by world size 2 x 8 micro-batches"}
    with pytest.raises(ConfigError, match="ddp_spawn cannot run at world size 2 with fp32,acc8"):
        cells(
            tmp_path,
            data_root,
            strategies=("ddp_spawn",),
            world_sizes=(2,),
            global_batch=24,
            accumulate=(8,),
        )
    # every strategy (none named): skipped rows only, were it not an error
    with pytest.raises(ConfigError, match=r"^no cell can run: .* x 3 micro-batches"):
        cells(tmp_path, data_root, world_sizes=(1, 2), accumulate=(3,))
    # a world size that cannot share the batch at all is refused still, micro-batches or not
    with pytest.raises(ConfigError, match="global batch 30 is not divisible by world size 4;"):
        cells(
            tmp_path,
            data_root,
            strategies=("ddp_spawn",),
            world_sizes=(1, 4),
            global_batch=30,
            accumulate=(2,),
            oversubscribe=True,
        )


def test_why_a_strategy_cannot_run_groups_its_sizes_and_settings():
    """Each reason once, with the sizes it stops in every setting, then those it stops in
    some, grouped by those settings: short however many settings the matrix sweeps."""
    from bench.harness.runner import Cell, _cannot_run

    fp32, bf16 = Setting(), Setting(precision="bf16")
    cells = [
        Cell("x", ws, 0, s, (), "skipped", why)
        for ws, s, why in [
            (1, fp32, "A"),
            (1, bf16, "A"),
            (2, fp32, "B"),
            (2, bf16, "A"),
            (4, fp32, "B"),
            (4, bf16, "A"),
        ]
    ]
    assert _cannot_run("x", cells) == (
        "x cannot run: at world size 1 and at world size 2,4 with bf16: A; "
        "at world size 2,4 with fp32: B"
    )
    assert _cannot_run("x", cells[:2]) == "x cannot run at world size 1: A"
    assert _cannot_run("x", [cells[1]]) == "x cannot run at world size 1 with bf16: A"


def test_a_strategy_that_can_run_none_of_its_cells_is_an_error(tmp_path, data_root):
    with pytest.raises(ConfigError, match="dp cannot run at world size 1 with fp32,compile"):
        cells(tmp_path, data_root, strategies=("dp",), world_sizes=(1,), compile=(True,))
    # inside a matrix that also has cells it can run, the same cell is a skipped row
    planned = cells(
        tmp_path, data_root, strategies=("dp",), world_sizes=(1,), compile=(False, True)
    )
    assert [c.status for c in planned] == ["", "skipped"]


def test_report_names_show_only_the_axes_that_vary():
    pairs = [
        ("single", "fp32"),
        ("amp_ddp", "bf16"),
        ("ddp_torchrun", "fp32,bucket_cap_mb=1"),
        ("ddp_torchrun", "fp32,bucket_cap_mb=25"),
    ]
    labels = case_labels(pairs)
    assert labels[("single", "fp32")] == "single"
    assert labels[("amp_ddp", "bf16")] == "amp_ddp"  # its own precision is not an axis
    assert labels[("ddp_torchrun", "fp32,bucket_cap_mb=1")] == "ddp_torchrun [bucket_cap_mb=1]"
    swept = case_labels([("single", "fp32"), ("single", "bf16"), ("fsdp", "bf16,acc2")])
    assert swept[("single", "bf16")] == "single [bf16]"
    assert swept[("fsdp", "bf16,acc2")] == "fsdp [bf16]"  # only fsdp ran acc2: one value
    both = case_labels([("fsdp", "fp32"), ("fsdp", "fp32,acc2")])
    assert both[("fsdp", "fp32")] == "fsdp [acc1]" and both[("fsdp", "fp32,acc2")] == "fsdp [acc2]"


def test_a_compiled_cell_killed_in_its_first_step_says_compilation_may_be_why(tmp_path, data_root):
    """The deadline that kills a compiled cell before its first step ended (where
    torch.compile compiles) names compilation beside a hang; a cell past its first step
    reads as a hang, and one not compiled that ended no step may still have been starting."""
    import json

    from bench.harness.progress import PROGRESS_FILE
    from bench.harness.runner import Cell, RunDir, Runner

    cfg = small_config(tmp_path, data_root, timeout_s=12)
    runner = Runner(cfg, RunDir(tmp_path))

    def reason(compile: bool, done: int | None) -> str:
        cell = Cell("single", 1, 0, Setting(compile=compile))
        cell_dir = tmp_path / "cells" / f"{cell.dirname}-{done}"
        cell_dir.mkdir(parents=True)
        if done is not None:
            (cell_dir / PROGRESS_FILE).write_text(json.dumps({"done": done}))
        (row,) = runner._collect(cell, cell_dir, None, True, 12.0)[0]
        assert row["status"] == "timeout"
        return row["reason"]

    compiling = reason(True, None)
    assert compiling.startswith("no result within 12 s")
    assert "torch.compile's compilation" in compiling and "--timeout" in compiling
    assert reason(True, 1) == "no result within 12 s (hang?); all its processes were killed"
    # no step ended: it read as a bare hang, where horovodrun alone takes 7-12 s to start
    assert reason(False, None) == (
        "no result within 12 s (hang? rank 0 had ended no step: still starting (the launcher, "
        "the ranks' rendezvous, the data, the first step) for the --timeout, or hung there); "
        "all its processes were killed"
    )


def test_a_cell_killed_while_it_still_stepped_says_how_far_it_got_not_hang(tmp_path, data_root):
    """A deadline that kills a cell whose rank 0 was seen stepping just before it is too
    short a --timeout, not a hang: the reason says the steps run and their time; one whose
    step count last moved long before the deadline reads as a hang, and one that had run
    every step says it was killed after them (it read as a bare hang, though its steps had
    all ended)."""
    import json
    import math

    from bench.harness.progress import PROGRESS_FILE
    from bench.harness.runner import Cell, RunDir, Runner

    cfg = small_config(tmp_path, data_root, timeout_s=15)
    runner = Runner(cfg, RunDir(tmp_path))

    def reason(done: int, quiet_s: float) -> str:
        cell = Cell("ddp_torchrun", 2, 0, Setting())
        cell_dir = tmp_path / "cells" / f"{cell.dirname}-{done}-{quiet_s:g}"
        cell_dir.mkdir(parents=True)
        state = {"epoch": 0, "epochs": 1, "step": done, "steps": 60}
        state |= {"done": done, "total": 60, "step_ms": 124.8}
        (cell_dir / PROGRESS_FILE).write_text(json.dumps(state))
        (row,) = runner._collect(cell, cell_dir, None, True, 15.0, quiet=quiet_s)[0]
        assert row["status"] == "timeout"
        return row["reason"]

    slow = reason(32, 0.3)
    assert slow == (
        "no result within 15 s (still training: rank 0 had run 32 of 60 steps, 125 ms each, "
        "its last step seen 0.3 s before the deadline; a --timeout that leaves room for the "
        "cell); all its processes were killed"
    )
    # a step count never seen to move (nan) claims nothing either
    for done, quiet in ((32, 12.0), (31, math.nan)):
        assert reason(done, quiet) == (
            "no result within 15 s (hang?); all its processes were killed"
        )
    for quiet in (0.3, 12.0):
        assert reason(60, quiet) == (
            "no result within 15 s (hang? rank 0 had run all 60 of its steps and was killed "
            "after them, in the evaluation, the communication probe or teardown: too long for "
            "the --timeout, or hung there); all its processes were killed"
        )


def test_when_rank_0_last_stepped_is_read_on_the_harness_clock_not_the_file_mtime(tmp_path):
    """The harness notes, on its own clock, when rank 0's step count moved: a progress file
    written by a node whose clock is an hour off (its mtime) changes nothing, a count that
    stays put does not count as a step, and reads are at most one a second."""
    import json
    import math
    import os
    import time

    from bench.harness.progress import PROGRESS_FILE, LastStep

    now = [100.0]
    heard = LastStep(tmp_path, every_s=1.0, clock=lambda: now[0])

    def report(done: int) -> None:
        (tmp_path / PROGRESS_FILE).write_text(json.dumps({"done": done, "total": 60}))
        skewed = time.time() - 3600  # another node's clock
        os.utime(tmp_path / PROGRESS_FILE, (skewed, skewed))

    heard.poll()  # nothing written yet
    assert math.isnan(heard.quiet(115.0))
    report(3)
    now[0] = 101.0
    heard.poll()
    assert heard.quiet(115.0) == 14.0
    report(4)
    now[0] = 101.5  # within a second of the last read: not read
    heard.poll()
    assert heard.quiet(115.0) == 14.0
    now[0] = 102.2
    heard.poll()
    assert heard.quiet(115.0) == pytest.approx(12.8)
    now[0] = 110.0  # the same count again: rank 0 stopped
    heard.poll()
    assert heard.quiet(115.0) == pytest.approx(12.8)


def test_fsdp_compiles_its_blocks_and_refuses_cuda_graph_modes(tmp_path, data_root):
    """FSDP2 compiles each block apart (test_fsdp_options): a compiled FSDP cell is planned
    as DDP's is; torch.compile's CUDA-graph modes are not wired for it, a skipped row beside
    the cells that run them, and asked for alone an error before anything starts."""
    planned = cells(
        tmp_path,
        data_root,
        strategies=("ddp_spawn", "fsdp", "fsdp_zero2"),
        world_sizes=(2,),
        compile=(False, True),
    )
    assert {c.reason for c in planned} == {""}
    assert {(c.strategy, c.setting.compile) for c in planned} >= {("fsdp", True)}
    with pytest.raises(ConfigError, match="CUDA-graph modes are not wired for FSDP"):
        cells(
            tmp_path,
            data_root,
            strategies=("fsdp",),
            world_sizes=(2,),
            compile=(True,),
            compile_mode="reduce-overhead",
        )
