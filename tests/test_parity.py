"""Parity: with the same seed and global batch, every strategy's losses and weights after
K steps match the single-process baseline within the precision's stated tolerance."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

import strategies
from bench.analysis import verify as verify_mod
from bench.analysis.verify import (
    AMPLIFIED,
    RECIPES,
    REFERENCE_FACTOR,
    REFERENCE_LIMIT,
    baselines_dir,
    compare,
    table,
    verify,
)
from bench.config import RunConfig
from bench.harness.runner import RunDir
from tests.conftest import faulty_strategies, need_horovod, small_config

pytestmark = pytest.mark.slow
FP32 = ("ddp_spawn", "ddp_torchrun")
HOROVOD = ("horovod", "horovod_fp16")


def _horovod_required() -> bool:
    return os.environ.get("PARABENCH_REQUIRE_HOROVOD") == "1"


def _copy_run(run: Path, to: Path) -> Path:
    """A copy of a module's run for a test to change: its weights (.pt; 45 MB each for
    resnet18, whose run is 0.9 GB) hard links to the run's, which _save_weights replaces
    rather than writes into; every other file copied."""

    def link_weights(src: str, dst: str) -> str:
        if src.endswith(".pt"):
            with contextlib.suppress(OSError):  # (another file system: copied)
                os.link(src, dst)
                return dst
        return shutil.copy2(src, dst)

    shutil.copytree(run, to, copy_function=link_weights)
    return to


def _save_weights(weights: dict[str, torch.Tensor], path: Path) -> None:
    """torch.save to a new file: in a _copy_run, `path` is a link to the module's run's."""
    path.unlink()
    torch.save(weights, path)


@pytest.fixture(scope="module")
def parity_run(tmp_path_factory, data_root):
    """The multi-process strategies at world size 2 (their baseline, single, runs apart)
    that bf16_run does not hold in fp32: the run's directory, its rows by (strategy, world
    size) and their parity."""
    names = ("ddp_torchrun", "amp_ddp", "test_amp_fp32")
    if strategies.get("horovod").unavailable("cpu") is None:
        names += HOROVOD
    cfg = small_config(
        tmp_path_factory.mktemp("parity"), data_root, strategies=names, world_sizes=(2,)
    )
    with faulty_strategies():
        run_dir, result = verify(cfg, steps=8, echo=lambda m: None)
    print(table(result))
    rows = {(r["strategy"], int(r["world_size"])): r for r in RunDir(run_dir).runs.read()}
    # the precision references (single at world size 1) by their setting too
    refs = {(p.strategy, p.world_size, p.setting): p for p in result if p.reference}
    return run_dir, rows, {(p.strategy, p.world_size): p for p in result} | refs


@pytest.fixture(scope="module")
def parity(parity_run, bf16_run):
    """Every cell at world size 2 in fp32 or its strategy's own precision (amp_ddp: bf16), by
    (strategy, world size): parity_run's, and bf16_run's fp32 cells (DDP, one that skips
    its all-reduce, the fp16 hooks), which the run in fp32 alone would repeat; the
    precision references by (single, 1, setting) too."""
    fp32 = {(p.strategy, p.world_size): p for p in bf16_run[1].values() if p.setting == "fp32"}
    refs = {k: p for k, p in bf16_run[1].items() if p.reference}
    return fp32 | refs | parity_run[2]


@pytest.mark.parametrize("name", FP32)
def test_fp32_strategies_match_the_baseline(parity, name):
    p = parity[(name, 2)]
    assert p.status == "pass", p
    assert p.loss_abs <= RECIPES["exact"].loss_abs and p.param_rel <= RECIPES["exact"].param_rel


def test_a_replica_that_fell_out_of_step_fails_though_rank_0s_weights_pass(
    parity, bf16_run, tmp_path, data_root
):
    """verify compares rank 0's weights with the baseline: over one step, a DDP whose rank 1
    skips its optimizer step matched on loss and weights alike, and passed. Each replica's
    weights against rank 0's say it; DDP's own replicas agree (the module's run)."""
    cfg = small_config(tmp_path, data_root, strategies=("test_replica_nostep",), world_sizes=(2,))
    with faulty_strategies():
        _, result = verify(cfg, steps=1, echo=lambda m: None)
    (bad,) = result
    good = parity[("ddp_spawn", 2)]
    assert good.status == "pass", good
    assert bad.param_rel <= RECIPES["exact"].param_rel  # rank 0's weights are right...
    assert bad.status == "FAIL", bad  # ...rank 1's stayed where they began: a whole update
    assert bad.reason.startswith("rank 1's weights ended 1 of an update from rank 0's"), bad
    gaps = bf16_run[0].glob("cells/ddp_spawn*-fp32*/replicas.json")
    assert len(json.loads(next(gaps).read_text())["param_gap_by_rank"]) == 2


@pytest.fixture(scope="module")
def one_rank_run(tmp_path_factory, data_root):
    """A verify at world size 1 alone (single in the run): DataParallel on one CPU device
    (its only world size here), a strategy that trains another model (one more layer) and
    one that takes twice the global batch, which runs out of data (256 samples) in half
    the steps; the run's directory and its parity by strategy."""
    names = ("dp", "test_other_model", "test_double_batch")
    cfg = small_config(
        tmp_path_factory.mktemp("one_rank"),
        data_root,
        strategies=names,
        world_sizes=(1,),
        limit=256,
    )
    with faulty_strategies():
        run_dir, result = verify(cfg, steps=8, echo=lambda m: None)
    print(table(result))
    by = {p.strategy: p for p in result}
    assert sorted(by) == sorted(names) and len(result) == len(names), result
    return run_dir, by


def test_data_parallel_matches_the_baseline(one_rank_run):
    """DataParallel on one CPU device (its only world size here), in a run with single."""
    p = one_rank_run[1]["dp"]
    assert (p.strategy, p.world_size, p.status) == ("dp", 1, "pass"), p
    assert p.loss_abs <= RECIPES["exact"].loss_abs and p.param_rel <= RECIPES["exact"].param_rel


def test_attentions_key_bias_is_left_out_of_the_weights_compared(tmp_path, data_root):
    """Softmax cancels the key bias (each query's scores shift alike), so its gradient is
    zero but for rounding, which Adam scales up to steps of its own: a correct DDP on the
    transformer (and the lm) under Adam read 6.9e-4 of an update from single, all of it in
    the key biases, and FAILed. Those are left out; every other weight still counts."""
    cfg = small_config(
        tmp_path,
        data_root,
        model="transformer",
        model_kwargs={"dim": 32, "depth": 1},
        optimizer="adam",
        strategies=("ddp_spawn",),
        world_sizes=(2,),
        global_batch=8,
    )
    run_dir, result = verify(cfg, steps=3, echo=lambda m: None)
    (p,) = result
    assert p.status == "pass", p
    assert p.param_rel <= RECIPES["exact"].param_rel
    # the key bias did move apart by rounding alone (what this checks is still there)
    mine = torch.load(next(run_dir.glob("cells/ddp_spawn*/params.pt")))
    base = torch.load(next(baselines_dir(run_dir).glob("*/cells/single*/params.pt")))
    key = "blocks.0.attn.k.bias"
    assert (mine[key] - base[key]).abs().max() > 100 * p.param_abs


def _tied_model(tmp_path: Path) -> Path:
    """A file whose build() is a tiny language model whose head shares the embedding's
    weight."""
    model = tmp_path / "tied.py"
    model.write_text(
        "from bench.workload.models import LanguageModel\n\n\n"
        "def build(num_classes=256):\n"
        "    m = LanguageModel(num_classes, seq_len=16, size='tiny', dim=16, depth=1)\n"
        "    m.head.fc.weight = m.embed.tok.weight\n"
        "    return m\n"
    )
    return model


@pytest.fixture(scope="module")
def tied_run(tmp_path_factory, data_root):
    """A 2-rank verify of DDP and of a pipeline that cuts the tie across its stages, on the
    tied-weight model, on python-source tokens: the run's directory and its parity by
    strategy."""
    tmp_path = tmp_path_factory.mktemp("tied")
    cfg = small_config(
        tmp_path,
        data_root,
        model=f"{_tied_model(tmp_path)}:build",
        dataset="python-source",
        seq_len=16,
        limit=64,
        strategies=("ddp_spawn", "test_pipeline_untied"),
        world_sizes=(2,),
        global_batch=8,
    )
    with faulty_strategies():
        run_dir, result = verify(cfg, steps=2, echo=lambda m: None)
    return run_dir, {p.strategy: p for p in result}


def test_a_tied_weight_counts_once_in_the_weights_compared(tied_run):
    """A head that shares the embedding's weight is in the state dict under both names:
    counted under each, that tensor weighed twice in ||w - w_base|| / ||w_base - w_init||."""
    run_dir, by = tied_run
    p = by["ddp_spawn"]
    assert p.status == "pass", p
    mine = torch.load(next(run_dir.glob("cells/ddp_spawn*/params.pt")))
    base = torch.load(next(baselines_dir(run_dir).glob("*/cells/single*/params.pt")))
    init = torch.load(next(baselines_dir(run_dir).glob("*/cells/single*/params_init.pt")))
    once = [k for k in base if k not in ("head.fc.weight", "blocks.0.attn.k.bias")]
    num = sum((mine[k].double() - base[k].double()).pow(2).sum() for k in once)
    den = sum((base[k].double() - init[k].double()).pow(2).sum() for k in once)
    assert p.param_rel == pytest.approx(math.sqrt(num / den), rel=1e-9)


def test_a_tied_weight_broken_across_pipeline_stages_fails(tied_run):
    """verify leaves a tied weight's second name out of the weights compared (it is one
    tensor); a pipeline that cuts the tie across its stages trains two copies, each with
    part of the gradient, and the one saved under both names is not the baseline's."""
    run_dir, by = tied_run
    p = by["test_pipeline_untied"]
    assert p.status == "FAIL" and p.param_rel > p.tol.param_rel, p
    # the two copies did part (saved weights: the head's copy under both names)
    mine = torch.load(next(run_dir.glob("cells/test_pipeline_untied*/params.pt")))
    base = torch.load(next(baselines_dir(run_dir).glob("*/cells/single*/params.pt")))
    assert not torch.equal(mine["embed.tok.weight"], base["embed.tok.weight"])


def test_amp_matches_at_its_looser_tolerance(parity):
    p = parity[("amp_ddp", 2)]
    assert p.numerics == "autocast_bf16" and p.status == "pass", p
    assert p.param_rel > 0  # bf16 really changes the numbers; the check is not vacuous
    assert p.tol == RECIPES["autocast_bf16"]  # MNIST does not amplify rounding: not widened
    # single in bf16 cut into the 2 ranks' shares (run apart), as autocast rounds each rank's
    # gradient: the model amp_ddp trains, to the bit (on the whole batch it is not: README)
    ref = parity[("single", 1, "bf16,shares=2")]
    assert ref.reference and ref.status == "pass", ref
    assert (p.loss_abs, p.param_rel) == (ref.loss_abs, ref.param_rel), (p, ref)


def test_amp_ddp_rows_say_bf16_autocast_and_device_data(parity_run):
    _, rows, _ = parity_run
    r = rows[("amp_ddp", 2)]
    assert r["status"] == "ok", r["reason"]
    assert r["precision"] == "bf16" and r["numerics"] == "autocast_bf16"
    assert r["data_path"] == "device"  # MNIST is in memory: moved to the device once
    assert float(r["samples_per_s"]) > 0 and math.isfinite(float(r["train_loss_final"]))


def test_verifys_fp32_companion_of_a_reduced_precision_strategy_is_no_cell(parity_run, tmp_path):
    """--precision fp16 puts fp32 beside it for the baseline, every strategy's: amp_ddp's
    fp32 cell, which it cannot train, is no cell of what was asked, where it was listed as
    skipped and counted ("1 of 2 cell(s) match", "1 cell(s) skipped")."""
    run_dir, rows, _ = parity_run
    copy = tmp_path / "run"
    _copy_run(run_dir, copy)
    why = "trains in bf16 | fp16 only, not fp32"
    amp = {**rows[("amp_ddp", 2)], "setting": "fp32", "precision": "fp32"}
    amp |= {"status": "skipped", "reason": why}
    # a strategy that does train in fp32, skipped there, stays a skipped cell
    dp = {**amp, "strategy": "dp", "reason": "DataParallel parallelises over GPUs"}
    RunDir(copy).runs.append([amp, dp])
    parity = verify_mod.compare(copy)
    assert [p.setting for p in parity if p.strategy == "amp_ddp"] == ["bf16"]
    assert [p.status for p in parity if p.strategy == "dp"] == ["skipped"]
    said = verify_mod.summary(parity)
    assert "1 cell(s) skipped or unavailable here (reasons above)" in said


def test_horovod_and_fp16_compression_run_through_horovodrun(parity_run):
    from tests.test_failures import leftover_processes

    need_horovod()
    run_dir, rows, _ = parity_run
    plain, fp16 = rows[("horovod", 2)], rows[("horovod_fp16", 2)]
    for r in (plain, fp16):
        assert r["status"] == "ok", r["reason"]
        assert r["launcher"] == "horovodrun" and r["backend"] == "gloo"
        assert float(r["samples_per_s"]) > 0 and math.isfinite(float(r["train_loss_final"]))
        assert int(r["samples"]) == int(r["steps"]) * 32 and r["horovod_version"] == "0.28.1"
    assert plain["precision"] == fp16["precision"] == "fp32"
    assert plain["numerics"] == "exact" and fp16["numerics"] == "grad_fp16"
    ranks = [r for r in RunDir(run_dir).ranks.read() if r["strategy"] == "horovod"]
    assert sorted(r["rank"] for r in ranks) == ["0", "1"]
    assert leftover_processes(run_dir) == []


def test_a_cell_that_did_not_run_keeps_its_reason(parity_run, tmp_path):
    """verify's table and verify.csv say why a cell was skipped, as the run's row does."""
    run_dir, rows, _ = parity_run
    copy = tmp_path / "run"
    _copy_run(run_dir, copy)
    why = "DataParallel parallelises over GPUs; on cpu it has one device"
    row = {**rows[("ddp_torchrun", 2)], "strategy": "dp", "status": "skipped", "reason": why}
    single = {**row, "strategy": "single", "reason": "Single runs one process"}
    RunDir(copy).runs.append([row, single])
    parity = verify_mod.compare(copy)
    (p,) = [p for p in parity if p.strategy == "dp"]
    assert (p.status, p.reason) == ("skipped", why) and p.ok
    assert f"dp ws=2: {why}" in table([p])
    # compared with nothing: no baseline named, in the table or verify.csv
    assert p.baseline == "" and " single " not in table([p]).splitlines()[2]
    assert "single, N shares" not in table([p])
    # single at world size 2 is no comparison: left out; the rest in a stable order
    assert ("single", 2) not in {(p.strategy, p.world_size) for p in parity}
    cells = [(p.strategy, p.world_size, p.setting) for p in parity if not p.reference]
    assert cells == sorted(cells)


def test_a_strategy_that_skips_gradient_sync_fails_parity(parity):
    bad = parity[("test_nosync", 2)]
    assert bad.status == "FAIL" and bad.param_rel > 100 * RECIPES["exact"].param_rel
    # the reason names the bound it is past, where the summary says 'reasons above'
    assert f"params {bad.param_rel:.3g} past {bad.tol.param_rel:.3g}" in bad.reason, bad


def test_a_cell_that_never_rounds_in_its_precision_fails_parity(parity):
    """Within every tolerance of the model, yet as close to fp32 as fp32 itself while
    single in bf16 is not: its autocast never took effect."""
    bad, good = parity[("test_amp_fp32", 2)], parity[("amp_ddp", 2)]
    assert good.status == "pass", good
    assert bad.status == "FAIL" and bad.param_rel <= RECIPES["exact"].param_rel, bad
    assert "does not train in bf16" in bad.reason, bad


def test_a_compression_hook_that_never_compresses_fails_parity(parity):
    """Within every tolerance of the model, yet as close to fp32 as fp32 itself while single
    with its gradients rounded to fp16 is not: the hook all-reduces uncompressed."""
    bad, good = parity[("test_hook_fp32", 2)], parity[("ddp_fp16_hook", 2)]
    assert bad.status == "FAIL" and bad.param_rel <= RECIPES["exact"].param_rel, bad
    assert "does not compress its gradients" in bad.reason, bad
    # the reference rounds each of the 2 ranks' gradients, as the hook does: the same model
    ref = parity[("single", 1, "fp32,compress=fp16,shares=2")]
    assert ref.reference and ref.numerics == "grad_fp16" and ref.status == "pass", ref
    assert good.status == "pass" and good.param_rel == ref.param_rel, good


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory, data_root):
    """MNIST in bf16 at world size 2 (fp32 beside it, for the baseline): DDP, a pipeline, a
    DDP that skips its all-reduce, and the compression hooks, one of which never compresses;
    the run's directory and its parity by (strategy, world size, setting)."""
    names = ("ddp_spawn", "pipeline_gpipe", "test_nosync")
    names += ("ddp_fp16_hook", "test_hook_fp32", "ddp_bf16_hook")
    cfg = small_config(
        tmp_path_factory.mktemp("bf16"),
        data_root,
        strategies=names,
        world_sizes=(2,),
        precisions=("bf16",),
    )
    with faulty_strategies():
        run_dir, result = verify(cfg, steps=8, echo=lambda m: None)
    print(table(result))
    return run_dir, {(p.strategy, p.world_size, p.setting): p for p in result}


def test_a_compression_hook_that_never_compresses_fails_parity_in_bf16(bf16_run, tmp_path):
    """In bf16 both hooks are 5.5e-2 of an update from fp32, bf16's own rounding: the
    unrounded check cannot tell them. Against single in bf16 on the cell's layout (2 shares
    at 2 ranks: autocast rounds each rank's gradient), the one that never compresses is
    exact while single with its gradients rounded to fp16 is not; a bf16 hook passes. (At
    world size 2 alone: one rank is the same check on the plain layout, for twice the time.)"""
    parity = bf16_run[1]
    bad, good = parity[("test_hook_fp32", 2, "bf16")], parity[("ddp_fp16_hook", 2, "bf16")]
    assert bad.status == "FAIL" and "does not compress its gradients" in bad.reason, bad
    assert bad.param_rel > RECIPES["exact"].param_rel  # not the unrounded check's FAIL
    assert good.status == "pass", good
    assert parity[("ddp_bf16_hook", 2, "bf16")].status == "pass"
    # where a reference of that check did not run, the cell says it was not checked rather
    # than passing as if it had been; a cell whose own reference is there is unchanged
    run_dir = tmp_path / "run"
    _copy_run(bf16_run[0], run_dir)
    shutil.rmtree(baselines_dir(run_dir) / "shares2-acc1-bf16+grad_fp16")
    with faulty_strategies():
        again = {(p.strategy, p.world_size, p.setting): p for p in compare(run_dir)}
    unchecked = again[("ddp_fp16_hook", 2, "bf16")]
    assert unchecked.status == "inconclusive", unchecked
    assert "whether it compresses its gradients is not checked" in unchecked.reason
    assert again[("ddp_bf16_hook", 2, "bf16")].status == "pass"


def test_a_precision_reference_cuts_the_batch_as_its_cells_do(bf16_run):
    """autocast hands each rank's micro-batch its gradient already rounded, so on MNIST (no
    BatchNorm) in bf16 at 2 ranks, single on the whole batch trains neither DDP's model nor
    a pipeline's (9.7e-3 and 3.1e-2 of an update from them); cut as each cuts the batch (2
    shares; 4 micro-batches) it trains each one's to the bit. A DDP that skips its
    all-reduce still FAILs, and no reference on the whole batch runs: no cell is on it."""
    run_dir, parity = bf16_run
    by = {(p.strategy, p.setting): p for p in parity.values()}
    for name, setting in (("ddp_spawn", "bf16,shares=2"), ("pipeline_gpipe", "bf16,acc4")):
        cell, ref = by[(name, "bf16")], by[("single", setting)]
        assert ref.reference and ref.status == "pass", ref
        assert cell.status == "pass", cell
        assert (cell.loss_abs, cell.param_rel) == (ref.loss_abs, ref.param_rel), (cell, ref)
    bad = by[("test_nosync", "bf16")]
    assert bad.status == "FAIL" and bad.param_rel > bad.tol.param_rel, bad
    runs = sorted(p.name for p in baselines_dir(run_dir).iterdir())
    # (the run's hooks add theirs: single rounding its 2 shares' gradients, in fp32 and bf16)
    hooks = [f"shares2-acc1-{p}grad_{h}" for p in ("bf16+", "") for h in ("bf16", "fp16")]
    assert runs == ["shares1-acc1", "shares1-acc4-bf16", "shares2-acc1-bf16", *hooks]


@pytest.mark.parametrize("name", HOROVOD)
def test_horovod_matches_the_baseline(parity, name):
    if (name, 2) not in parity:
        if _horovod_required():
            pytest.fail(f"Horovod is not usable: {strategies.get(name).unavailable('cpu')}")
        pytest.skip("Horovod not installed (make horovod)")
    assert parity[(name, 2)].status == "pass", parity[(name, 2)]


def _row(**kw):
    row = {"global_batch": "16", "micro_batch": "8", "world_size": "2", "launcher": "spawn"}
    return {**row, "sync_bn": "0", **kw}


def test_batch_norm_cells_are_checked_against_the_baseline_cut_into_their_shares():
    from bench.analysis.verify import baseline_label, batch_norm_layout, batch_norm_reason

    ddp = _row(per_rank_batch="8", data_ranks="2")
    assert batch_norm_layout(ddp, norms=20) == (2, 1)
    assert baseline_label((2, 1)) == "single, 2 shares"
    assert batch_norm_layout(ddp, norms=0) == (1, 1)  # no BatchNorm: the plain baseline
    assert batch_norm_layout({**ddp, "sync_bn": "1"}, norms=20) == (1, 1)  # SyncBN joins them
    acc = _row(per_rank_batch="8", micro_batch="4", data_ranks="2")
    assert batch_norm_layout(acc, norms=1) == (2, 2)
    assert baseline_label((2, 2)) == "single, 2 shares x 2 micro-batches"
    one = _row(world_size="1", per_rank_batch="16", micro_batch="16", data_ranks="1")
    assert batch_norm_layout(one, norms=20) == (1, 1)  # one rank, whole batch: plain single
    assert baseline_label(batch_norm_layout(one, norms=20)) == "single"
    pipe = _row(per_rank_batch="16", micro_batch="4", data_ranks="1")
    assert batch_norm_layout(pipe, norms=1) == (1, 4)
    assert batch_norm_reason(ddp, norms=20) == ""  # comparable, against its own baseline
    # DataParallel's scatter over devices is the one split no baseline reproduces
    dp = _row(micro_batch="16", launcher="inprocess")
    why = batch_norm_reason(dp, norms=3)
    assert why.startswith("3 BatchNorm layers normalise over each device's 8 samples"), why


def test_running_statistics_off_the_baseline_fail_though_the_weights_match():
    """An extra forward in train mode (a metric, a recompute) leaves the weights and losses
    exact and BatchNorm's running statistics wrong, which evaluation normalises by."""
    import torch
    from torch import nn

    from bench.analysis.verify import _Baseline, _gaps

    torch.manual_seed(0)
    norm, x = nn.BatchNorm1d(3), torch.randn(8, 3)
    init = {k: v.clone() for k, v in norm.state_dict().items()}
    buffers = {"running_mean", "running_var", "num_batches_tracked"}

    def run(*batches):
        bn = nn.BatchNorm1d(3)
        bn.load_state_dict(init)
        for b in batches:
            bn(b)
        state = {k: v.clone() for k, v in bn.state_dict().items()}
        params = {k: v for k, v in state.items() if k not in buffers}
        held = {k: v for k, v in state.items() if k in buffers}
        return _Baseline("", [1.0, 0.9], init, params, held)

    exact, base = RECIPES["exact"], run(x)
    assert _gaps(run(x), base, norms=1).within(exact)
    twice = _gaps(run(x, x), base, norms=1)  # the weights as the baseline's, a count ahead
    assert twice.param_rel == 0 and twice.loss_abs == 0 and not twice.within(exact)
    assert "num_batches_tracked" in twice.buffers_off(exact)
    other = _gaps(run(x + 1), base, norms=1)  # the right count, statistics of other samples
    assert not other.within(exact) and "of their update" in other.buffers_off(exact)
    # a model without BatchNorm has no running statistics to judge
    assert _gaps(run(x, x), base, norms=0).within(exact)
    # a NaN in them is not within anything, nor shown as a difference of 0
    nan = run(x)
    nan.buffers["running_var"][0] = float("nan")
    broken = _gaps(nan, base, norms=1)
    assert not broken.within(exact) and broken.buffer_abs == math.inf
    # weights off too: the weights are the cause named, not the statistics that follow them
    wrong = _gaps(run(x + 1), base, norms=1)
    wrong = dataclasses.replace(wrong, param_rel=1.2, loss_abs=0.3)
    assert not wrong.within(exact) and wrong.buffers_off(exact) == ""


def test_verification_turns_off_every_dropout_layer():
    import torch

    from bench.workload.models import build_model, without_dropout

    cnn = build_model("mnist_cnn", 10)
    attn = torch.nn.Sequential(torch.nn.MultiheadAttention(8, 2, dropout=0.1), torch.nn.Dropout2d())
    assert without_dropout(cnn) == 2 and without_dropout(attn) == 2
    assert without_dropout(cnn) == 0  # all off now
    assert all(m.p == 0 for m in cnn.modules() if isinstance(m, torch.nn.Dropout))
    assert attn[0].dropout == 0


@pytest.fixture(scope="module")
def amplified(tmp_path_factory):
    """resnet18 at 32 px in bf16 at world size 2: one step, where bf16 alone moves the
    weights 0.42 of an update from fp32 (past the recipe's 0.1), with a strategy that
    forgets the all-reduce. Batch 16, 8 per rank: bf16 steps are slow on a CPU without
    bf16 units (8 s at batch 32 here), and BatchNorm over 8 samples amplifies as well."""
    cfg = RunConfig(
        dataset="synthetic",
        model="resnet18",
        image_size=32,
        strategies=("ddp_spawn", "test_nosync"),
        world_sizes=(2,),
        precisions=("bf16",),
        global_batch=16,
        limit=256,
        device="cpu",
        out_dir=str(tmp_path_factory.mktemp("amplified")),
        timeout_s=240,
    )
    with faulty_strategies():
        run_dir, parity = verify(cfg, steps=4, echo=lambda m: None)
    print(table(parity))
    return run_dir, {(p.strategy, p.setting): p for p in parity}


def test_a_precision_reference_tells_rounding_from_a_wrong_strategy(amplified):
    """single in bf16 on the cells' layout shows what bf16 alone moves; on a model whose
    conditioning shows it amplifies rounding, bf16 cells are held to 1.5x that gap, and a
    strategy that skips the all-reduce still fails."""
    run_dir, by = amplified
    ref = by[("single", "bf16,shares=2")]
    assert ref.reference and ref.status == AMPLIFIED, ref
    assert RECIPES["autocast_bf16"].param_rel < ref.param_rel <= REFERENCE_LIMIT
    good, bad = by[("ddp_spawn", "bf16")], by[("test_nosync", "bf16")]
    assert good.status == "pass" and good.tol.basis, good
    assert good.tol.param_rel == pytest.approx(REFERENCE_FACTOR * ref.param_rel)
    assert good.param_rel > RECIPES["autocast_bf16"].param_rel  # the recipe alone would fail it
    assert bad.status == "FAIL" and bad.param_rel > good.tol.param_rel, bad
    assert by[("ddp_spawn", "fp32")].status == "pass"  # fp32 cells keep the exact tolerance
    assert by[("ddp_spawn", "fp32")].tol == RECIPES["exact"]
    with open(run_dir / "verify.csv") as f:
        rows = {(r["strategy"], r["setting"]): r for r in csv.DictReader(f)}
    assert rows[("single", "bf16,shares=2")]["precision_reference"] == "1"
    assert rows[("ddp_spawn", "bf16")]["tolerance_basis"].startswith("1.5x single [bf16")


def test_conditioning_cuts_the_batch_as_the_largest_default_world_size(tmp_path, monkeypatch):
    """With no --world-sizes the cells span 1, 2, 4, ... up to the devices: on 4 of them the
    cells at 4 ranks normalise over 4 shares, and the twins that find the steps rounding
    leaves comparable must too (over 2, BatchNorm over twice the samples conditions better
    and the horizon comes out too long for them)."""
    from bench.harness import env

    class Seen(Exception):
        pass

    def run_matrix(cfg, **kw):
        raise Seen(cfg.options["shares"])

    monkeypatch.setattr(env, "cpu_cores", lambda: 4)
    monkeypatch.setattr(verify_mod, "run_matrix", run_matrix)
    cfg = RunConfig(
        dataset="synthetic", model="resnet18", image_size=32, device="cpu", out_dir=str(tmp_path)
    )
    for sizes, shares in (((), "4"), ((1, 2), "2")):
        with pytest.raises(Seen, match=f"^{shares}$"):
            verify_mod.conditioning(cfg.replace(world_sizes=sizes), 2, tmp_path)


def test_how_far_a_reference_may_be_amplified_depends_on_conditioning(amplified, monkeypatch):
    """The same run, read as if conditioning had found the model well-conditioned: bf16's
    0.42 is past twice its recipe, so the precision itself is suspect (FAIL) and no cell is
    widened. Within the bound (Adam in bf16 on MNIST already comes to 0.094 of 0.1) the
    reference is amplified with a reason that does not blame the model, and the cells are
    held to it. A
    reference further than a whole update fails and makes its cells not comparable."""
    run_dir, by = amplified
    assert "this model amplifies rounding" in by[("single", "bf16,shares=2")].reason
    monkeypatch.setattr(verify_mod, "amplifies_rounding", lambda path: False)
    by = {(p.strategy, p.setting): p for p in verify_mod.compare(run_dir)}
    ref = by[("single", "bf16,shares=2")]
    assert ref.status == "FAIL" and "the precision itself is suspect" in ref.reason, ref
    assert by[("ddp_spawn", "bf16")].status == "FAIL" and not by[("ddp_spawn", "bf16")].tol.basis
    monkeypatch.setattr(verify_mod, "UNSHOWN_FACTOR", 10.0)  # the gap within the bound
    by = {(p.strategy, p.setting): p for p in verify_mod.compare(run_dir)}
    ref = by[("single", "bf16,shares=2")]
    assert ref.status == AMPLIFIED and "calibrated with SGD on MNIST" in ref.reason, ref
    assert by[("ddp_spawn", "bf16")].status == "pass" and by[("ddp_spawn", "bf16")].tol.basis
    assert by[("test_nosync", "bf16")].status == "FAIL"
    monkeypatch.setattr(verify_mod, "REFERENCE_LIMIT", 0.2)  # (a reference past the limit)
    by = {(p.strategy, p.setting): p for p in verify_mod.compare(run_dir)}
    assert by[("single", "bf16,shares=2")].status == "FAIL"
    assert by[("ddp_spawn", "bf16")].status == "not comparable"
    assert "more than the update itself" in by[("ddp_spawn", "bf16")].reason


def test_a_fail_where_one_ulp_moves_the_first_loss_says_it_may_be_rounding(amplified, tmp_path):
    """Where one-ulp twins are past half the exact tolerance in their very first loss (on an
    H100 with cuDNN's TF32: 6.3e-4 for resnet18 at 32 px), one step is still compared and a
    FAIL stays a FAIL, but its reason and the conditioning line say it may be rounding;
    where they are not (this CPU run), a FAIL says nothing of the kind."""
    import json

    nosync = ("test_nosync", "fp32")
    assert amplified[1][nosync].status == "FAIL"
    assert "may be rounding" not in amplified[1][nosync].reason
    run_dir = tmp_path / "run"
    _copy_run(amplified[0], run_dir)
    path = run_dir / "conditioning.json"
    cond = json.loads(path.read_text())
    path.write_text(json.dumps({**cond, "gaps": [6.3e-4, *cond["gaps"][1:]], "horizon": 1}))
    bad = {(p.strategy, p.setting): p for p in verify_mod.compare(run_dir)}[nosync]
    assert bad.status == "FAIL" and "6.3e-04 apart in their first loss" in bad.reason, bad
    text = verify_mod.conditioning_of(run_dir).describe()
    assert "even the first loss" in text and "may be rounding" in text


def test_a_reference_from_other_weights_fails_and_leaves_the_recipe(amplified, tmp_path):
    """A reference whose initial weights are not the baseline's says so and widens nothing."""
    import torch

    run_dir = tmp_path / "run"
    _copy_run(amplified[0], run_dir)
    (init,) = (run_dir / "baselines" / "shares2-acc1-bf16" / "cells").glob("*/params_init.pt")
    weights = torch.load(init, weights_only=True)
    name = next(iter(weights))
    weights[name] = weights[name] + 1e-2
    _save_weights(weights, init)
    by = {(p.strategy, p.setting): p for p in verify_mod.compare(run_dir)}
    ref = by[("single", "bf16,shares=2")]
    assert ref.status == "FAIL" and "did not start from the baseline's weights" in ref.reason
    assert by[("ddp_spawn", "bf16")].tol == RECIPES["autocast_bf16"]


def test_a_cell_from_other_weights_fails_and_says_why(one_rank_run, tmp_path):
    """A cell whose initial weights are not the baseline's FAILs however close its gaps, and
    its reason says so: its table row alone is within every tolerance it shows."""
    run_dir = tmp_path / "run"
    _copy_run(one_rank_run[0], run_dir)
    (init,) = (run_dir / "cells").glob("dp-*/params_init.pt")
    weights = torch.load(init, weights_only=True)
    name = next(iter(weights))
    weights[name] = weights[name] + 1e-6
    _save_weights(weights, init)
    with faulty_strategies():
        (cell,) = [p for p in compare(run_dir) if p.strategy == "dp"]
    assert cell.status == "FAIL" and cell.param_rel <= cell.tol.param_rel
    assert "did not start from the baseline's weights" in cell.reason
    assert f"dp ws=1: {cell.reason}" in table([cell])


def test_weights_under_a_strategys_own_wrapper_say_unwrap_is_missing():
    """A strategy that wraps the model in a module of its own and does not take it off in
    unwrap() trains the baseline's model, but its weights are named under the wrapper:
    verify said it "trained another model", sending the user to look for a layer."""
    import torch

    def weights(prefix: str) -> verify_mod._Baseline:
        w = {f"{prefix}{k}": torch.zeros(2) for k in ("fc.bias", "fc.weight", "head.bias")}
        return verify_mod._Baseline("x", [1.0], w, w, {})

    said = verify_mod.other_model(weights("inner."), weights(""))
    assert said == (
        "its weights have the baseline's names and shapes under 'inner.': the strategy wraps "
        "the model in a module of its own, which its unwrap(model) must take off"
    )
    assert verify_mod.other_model(weights("a.b."), weights("")).startswith(
        "its weights have the baseline's names and shapes under 'a.b.'"
    )
    # the baseline's names under the wrapper, but a weight of another shape: another model
    reshaped = weights("inner.")
    reshaped.params["inner.fc.weight"] = torch.zeros(3)
    assert "trained another model" in verify_mod.other_model(reshaped, weights(""))
    # a wrapper with weights of its own, or other names, is another model
    other = weights("inner.")
    other.params["inner.extra"] = torch.zeros(1)
    assert "trained another model" in verify_mod.other_model(other, weights(""))
    assert verify_mod.other_model(weights(""), weights("")) == ""


def test_a_strategy_that_trains_another_model_fails_and_says_why(one_rank_run, tmp_path):
    """A strategy whose model is not the baseline's (a layer more, so other names) is a
    FAIL row naming the difference, beside the other cells' verdicts, not a traceback that
    leaves verify.csv unwritten; a weight of another shape alike."""
    run_dir, by = one_rank_run
    assert by["dp"].status == "pass", by
    bad = by["test_other_model"]
    assert bad.status == "FAIL" and "trained another model than the baseline" in bad.reason
    assert "lacks classifier.0.bias" in bad.reason and "has 0.classifier.0.bias" in bad.reason
    with open(run_dir / "verify.csv") as f:
        assert {r["strategy"]: r["result"] for r in csv.DictReader(f)}["test_other_model"] == "FAIL"
    copy = tmp_path / "run"
    _copy_run(run_dir, copy)
    (final,) = (copy / "cells").glob("dp-*/params.pt")
    weights = torch.load(final, weights_only=True)
    weights["features.0.bias"] = weights["features.0.bias"][:1]
    _save_weights(weights, final)
    with faulty_strategies():
        (cell,) = [p for p in compare(copy) if p.strategy == "dp"]
    assert cell.status == "FAIL" and "holds features.0.bias in another shape" in cell.reason


def _apart_ended(run: Path, tmp_path: Path, baseline: str, status: str, reason: str) -> Path:
    """A copy of verify's `run` whose `baseline` run apart (under baselines/) ended `status`."""
    return _apart_changed(run, tmp_path, baseline, status=status, reason=reason)


def _apart_changed(run: Path, tmp_path: Path, baseline: str, **changes: str) -> Path:
    """A copy of verify's `run` whose `baseline` run apart (under baselines/) has `changes`
    in its rows."""
    from bench.harness.runner import RunDir

    run_dir = tmp_path / "run"
    _copy_run(run, run_dir)
    runs = RunDir(run_dir / "baselines" / baseline).runs
    rows = runs.read()
    for r in rows:
        r.update(**changes)
    runs.path.unlink()
    runs.append(rows)
    return run_dir


def test_a_reference_that_did_not_run_is_a_row_and_leaves_the_recipe(amplified, tmp_path):
    """The reference run apart ended in error: its row says so (and fails verify), and the
    bf16 cells are held to their recipe's tolerance, not widened by a figure never taken."""
    run_dir = _apart_ended(
        amplified[0], tmp_path, "shares2-acc1-bf16", "error", "worker exited with code 1"
    )
    by = {(p.strategy, p.setting): p for p in verify_mod.compare(run_dir)}
    ref = by[("single", "bf16,shares=2")]
    assert ref.reference and ref.status == "error" and not ref.ok, ref
    assert "did not run (error: worker exited with code 1)" in ref.reason
    good = by[("ddp_spawn", "bf16")]
    assert good.tol == RECIPES["autocast_bf16"] and good.status == "FAIL", good


def test_a_strategy_that_runs_fewer_steps_fails_and_says_why(one_rank_run):
    """A strategy that takes twice the global batch runs out of data in half the steps, and
    ends ok: a FAIL row saying how many steps it ran, not a ZeroDivisionError from the
    late-loss gap of steps it never ran (an approximate recipe's check alike)."""
    bad = one_rank_run[1]["test_double_batch"]
    assert bad.status == "FAIL" and bad.reason == "it ran 4 step(s), the baseline 8", bad
    assert verify_mod.late_loss_gap([2.3], [2.3, 2.2, 2.1]) == math.inf


def test_a_baseline_that_did_not_run_is_a_failed_row_that_says_why(amplified, tmp_path):
    """Nothing can be compared without single at fp32: after the cells ran, that is a row of
    its own saying how it ended and why (a --timeout too short for the slowest cell, say),
    failing verify, and the cells held to other baselines keep their verdicts; not an exit 2
    that drops the table as if the input were bad."""
    run_dir = _apart_ended(
        amplified[0], tmp_path, "shares1-acc1", "timeout", "no step finished within --timeout 60 s"
    )
    parity = verify_mod.compare(run_dir)
    base = parity[0]
    assert (base.strategy, base.world_size, base.status) == ("single", 1, "timeout")
    assert base.reason == (
        "the fp32 baseline did not run to the end (no step finished within --timeout 60 s): "
        "no cell it is the baseline of can be compared"
    )
    assert not base.ok
    # its cells, held to the baselines of their own layout (2 shares), keep their verdicts
    assert {(p.strategy, p.setting): p.status for p in parity[1:]} == {
        k: p.status for k, p in amplified[1].items()
    }
    said = verify_mod.summary(parity)
    assert said[0] == f"2 of {len(parity) - 2} cell(s) match their baseline"  # not it, nor refs
    assert said[1] == (
        "the fp32 baseline ended timeout: verify fails, and no cell held to it was compared "
        "(reason above)"
    )
    assert verify_mod.summary([]) == [
        "no cell of a strategy compared: single at fp32 is the baseline itself"
    ]


def test_a_share_baseline_that_did_not_run_is_a_failed_row_too(amplified, tmp_path):
    """A baseline cut into shares that timed out left its cells `not comparable`, which does
    not fail verify: it passed having compared nothing. It is a row of its own that fails
    verify, as the whole batch's baseline is."""
    (apart,) = [p.name for p in baselines_dir(amplified[0]).glob("shares2-acc1-t*")]
    timeout = "no step finished within --timeout 60 s"
    run_dir = _apart_ended(amplified[0], tmp_path, apart, "timeout", timeout)
    parity = verify_mod.compare(run_dir)
    base = parity[0]
    assert (base.label, base.status) == ("single [fp32,shares=2]", "timeout"), base
    assert base.baseline_run and not base.ok and not all(p.ok for p in parity)
    assert base.reason == (
        f"the fp32 baseline (single, 2 shares) did not run to the end ({timeout}): no cell "
        "it is the baseline of can be compared"
    )
    cells = {(p.strategy, p.setting): p.status for p in parity[1:]}
    assert set(cells.values()) == {verify_mod.NOT_COMPARABLE}, cells
    said = verify_mod.summary(parity)
    assert said[0] == f"0 of {len(parity) - 1} cell(s) match their baseline"
    assert said[1] == (
        "the fp32 baseline single [fp32,shares=2] ended timeout: verify fails, and no cell "
        "held to it was compared (reason above)"
    )


def test_a_reference_whose_fp32_baseline_did_not_run_is_a_row_and_leaves_the_recipe(
    amplified, tmp_path
):
    """A precision reference runs on the fewest threads of its layout's cells (a pipeline at
    2 and 4 ranks on 4 cores: 1), and is measured from the fp32 baseline on those. Where
    that alone did not run, the cells on other threads kept their own baseline and lost the
    reference without a word: its row was gone, and a correct bf16 cell FAILed against the
    recipe, its reason naming no reference. A copy whose reference ran on threads no fp32
    baseline ran on stands for it."""
    (apart,) = baselines_dir(amplified[0]).glob("shares2-acc1-t*")
    ran = int(apart.name.rsplit("-t", 1)[1]) + 1  # a count with no fp32 baseline
    run_dir = _apart_changed(amplified[0], tmp_path, "shares2-acc1-bf16", threads_per_rank=str(ran))
    by = {(p.strategy, p.setting): p for p in verify_mod.compare(run_dir)}
    ref = by[("single", "bf16,shares=2")]
    assert ref.reference and ref.status == verify_mod.NOT_COMPARABLE, ref
    assert ref.reason == (
        f"the fp32 baseline it is measured from (single, 2 shares on {ran} thread(s)) did not "
        "run to the end: what bf16 alone moves is not known, and cells in bf16 on this "
        "layout keep their recipe's tolerance"
    )
    good = by[("ddp_spawn", "bf16")]
    assert good.tol == RECIPES["autocast_bf16"], good  # not widened by a figure never taken


@pytest.mark.parametrize("name, side", [("googlenet", 64), ("inception_v3", 75)])
def test_models_with_auxiliary_heads_train_on_their_output_alone(name, side):
    """In training torchvision's googlenet and inception_v3 return their auxiliary heads'
    logits beside the output (a named tuple the loss cannot take): built without them."""
    import torch

    from bench.config import ConfigError
    from bench.workload.models import build_model, cross_entropy

    model = build_model(name, 10).train()
    out = model(torch.randn(2, 3, side, side))
    assert isinstance(out, torch.Tensor) and out.shape == (2, 10)
    cross_entropy(out, torch.tensor([1, 2])).backward()
    with pytest.raises(ConfigError, match="main output alone"):
        build_model(name, 10, aux_logits=True)


def test_a_verify_stopped_leaves_no_conditioning_folder(tmp_path, data_root, monkeypatch):
    """Ctrl-C in a BatchNorm model's conditioning runs (or in the cells after them) left a
    hidden .conditioning-<pid> folder in the output directory; verify has no --resume to
    use it, so it goes with the stop."""

    def stopped(cfg, steps, out_dir, echo=print):
        (out_dir / "conditioning").mkdir(parents=True)  # as its runs make it
        raise KeyboardInterrupt

    monkeypatch.setattr(verify_mod, "conditioning", stopped)
    cfg = small_config(tmp_path, data_root, strategies=("ddp_spawn",), world_sizes=(2,))
    with pytest.raises(KeyboardInterrupt):
        verify(cfg, steps=2, echo=lambda m: None, condition=True)
    assert list(tmp_path.iterdir()) == []


def test_a_verify_stopped_in_its_conditioning_names_no_rows_it_removed(
    tmp_path, data_root, monkeypatch, capsys
):
    """Ctrl-C in a conditioning run said "N finished rows kept in
    <out>/.conditioning-<pid>/conditioning/runs.csv", a folder verify removes as it stops:
    its line says only how to go on."""
    from bench.harness import runner

    def stopped(self, cells):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner.Runner, "run", stopped)
    cfg = small_config(tmp_path, data_root, strategies=("ddp_spawn",), world_sizes=(2,))
    with pytest.raises(KeyboardInterrupt):
        verify(cfg, steps=2, echo=lambda m: None, condition=True)
    assert capsys.readouterr().err == (
        "interrupted: verify has no --resume; for its verdict, run the same verify again\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_conditioning_run_that_failed_keeps_the_logs_its_line_names(tmp_path, data_root):
    """A BatchNorm model whose conditioning baseline failed said "...; see
    <out>/.conditioning-<pid>/conditioning", a folder verify removes as it ends: the logs of
    the run that failed were gone. They are moved out of it, to the folder the line names."""
    from bench.config import ConfigError

    model = tmp_path / "broken_bn.py"
    model.write_text(
        "import torch\n"
        "from torch import nn\n\n\n"
        "class Broken(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc, self.bn = nn.Linear(784, 10), nn.BatchNorm1d(10)\n\n"
        "    def forward(self, x):\n"
        "        if self.training and torch.is_grad_enabled():\n"
        "            raise RuntimeError('deliberate failure in training')\n"
        "        return self.bn(self.fc(x.flatten(1)))\n\n\n"
        "def build(num_classes=10):\n"
        "    return Broken()\n"
    )
    out = tmp_path / "out"
    cfg = small_config(out, data_root, strategies=("ddp_spawn",), world_sizes=(2,))
    cfg = dataclasses.replace(cfg, model=f"{model}:build")
    with pytest.raises(ConfigError, match="could not measure the model's conditioning") as err:
        verify(cfg, steps=2, echo=lambda m: None)
    kept = Path(str(err.value).rsplit("its logs: ", 1)[1])
    assert kept.parent == out and kept.is_dir()
    assert "deliberate failure in training" in "".join(
        p.read_text(errors="replace") for p in kept.rglob("log.txt")
    )
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
