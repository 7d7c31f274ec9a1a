"""The report on model-parallel and oversubscribed cells, from small hand-made tables.

No processes run: runs.csv and steps.csv rows are built here, the way the runner writes
them (pipeline rows carry stages, micro-batches, bubble and bytes between stages;
tensor-parallel rows bytes of collectives; `--oversubscribe` cells `oversubscribed` = 1).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from bench.analysis import plots, report, summary
from bench.harness.results import case_labels

NAN = math.nan


def _row(
    strategy: str,
    ws: int,
    repeat: int = 0,
    *,
    sps: float = 100.0,
    status: str = "ok",
    setting: str = "fp32",
    **extra,
) -> dict:
    """One runs.csv row (last and only epoch 0): a data-parallel cell unless `extra` says
    otherwise (data_ranks, pipeline_stages, collective_mib_per_step, ...)."""
    row = {
        "run_id": "hand",
        "strategy": strategy,
        "world_size": ws,
        "setting": setting,
        "repeat": repeat,
        "epoch": 0,
        "launcher": "torchrun",
        "backend": "gloo",
        "precision": "fp32",
        "device": "cpu",
        "dataset": "synthetic",
        "model": "transformer",
        "global_batch": 64,
        "per_rank_batch": 64 // ws,
        "micro_batch": 64 // ws,
        "data_ranks": ws,
        "warmup_steps": 1,
        "threads_per_rank": 1,
        "oversubscribed": 0,
        "status": status,
        "reason": "" if status == "ok" else "boom",
        "notes": "",
        "samples_per_s": sps if status == "ok" else NAN,
        "timed_s": 1.0,
        "step_time_ms_p50": 10.0,
        "step_time_ms_p90": 12.0,
        "data_wait_pct": 1.0,
        "peak_mem_mib": 500.0,
        "mem_source": "host_rss",
        "param_mib": 1.5,
        "grad_mib": 1.5,
        "optim_mib": 1.5,
        "model_state_mib": 4.5,
        "model_state_mib_lightest": 4.5,
        "train_loss_final": 2.0,
        "eval_accuracy": 0.3,
        **{k: NAN for k in report.MODEL_PARALLEL},
    }
    return row | extra


def _pipeline(name: str, ws: int, repeat: int = 0, *, bubble: float = 30.0, **kw) -> dict:
    extra = {
        "per_rank_batch": 64,
        "micro_batch": 16,
        "data_ranks": 1,
        "pipeline_stages": ws,
        "microbatches": 4,
        "bubble_pct": bubble,
        "bubble_theory_pct": 100 * (ws - 1) / (4 + ws - 1),
        "p2p_mib_per_step": 2.0 * (ws - 1),
    }
    return _row(name, ws, repeat, **(extra | kw))


def _tp(name: str, ws: int, repeat: int = 0, *, data_ranks: int = 1, **kw) -> dict:
    extra = {
        "per_rank_batch": 64 // data_ranks,
        "micro_batch": 64 // data_ranks,
        "data_ranks": data_ranks,
        "collective_mib_per_step": 24.0 * ws,
    }
    return _row(name, ws, repeat, **(extra | kw))


def _runs(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def _mixed() -> pd.DataFrame:
    """single, ddp at 2, tp at 2 and (oversubscribed in one repeat) at 4, a pipeline at 2."""
    return _runs(
        [
            _row("single", 1, 0, sps=100.0),
            _row("single", 1, 1, sps=100.0),
            _row("ddp", 2, 0, sps=180.0),
            _row("ddp", 2, 1, sps=180.0),
            _tp("tp", 2, 0, sps=150.0),
            _tp("tp", 4, 0, sps=500.0, oversubscribed=1),
            _tp("tp", 4, 1, sps=520.0),
            _pipeline("pipeline_1f1b", 2, 0, sps=160.0, bubble=30.0),
            _pipeline("pipeline_1f1b", 2, 1, sps=160.0, bubble=50.0),
            _pipeline("pipeline_1f1b", 2, 2, sps=160.0, bubble=35.0),
        ]
    )


def _cell(table: pd.DataFrame, name: str, ws: int) -> pd.Series:
    return table[(table["strategy"] == name) & (table["world_size"] == ws)].iloc[0]


def _hand_run(runs: pd.DataFrame, steps: pd.DataFrame | None = None) -> report.Run:
    steps = steps if steps is not None else pd.DataFrame(columns=["strategy", "world_size"])
    return report.Run(path=Path("hand"), runs=runs, steps=steps, ranks=pd.DataFrame())


# ---------------------------------------------------------------- 1. oversubscribed cells


def test_summarise_leaves_oversubscribed_cells_unranked() -> None:
    table = report.summarise(_mixed())
    assert "oversubscribed" in table.columns
    over = {(r.strategy, r.world_size): r.oversubscribed for r in table.itertuples()}
    # one oversubscribed repeat makes the cell oversubscribed
    assert over == {
        ("ddp", 2): 0,
        ("pipeline_1f1b", 2): 0,
        ("single", 1): 0,
        ("tp", 2): 0,
        ("tp", 4): 1,
    }
    tp4 = _cell(table, "tp", 4)
    assert tp4["samples_per_s_median"] == pytest.approx(510.0)  # still measured
    assert math.isnan(tp4["speedup_vs_single"]) and math.isnan(tp4["scaling_efficiency"])
    ddp = _cell(table, "ddp", 2)
    assert ddp["speedup_vs_single"] == pytest.approx(1.8)
    assert ddp["scaling_efficiency"] == pytest.approx(0.9)
    assert _cell(table, "single", 1)["speedup_vs_single"] == pytest.approx(1.0)


def test_efficiency_is_over_single_in_the_same_run_options() -> None:
    """Speed-up is over plain single fp32; efficiency over single in the row's own run
    options (a bf16 DDP cell scales over single bf16), a strategy option (`key=value`) aside,
    and over plain single where the run has no single in those options."""
    (runs,) = report._labelled(
        [
            _runs(
                [
                    _row("single", 1, sps=100.0),
                    _row("single", 1, sps=250.0, setting="bf16"),
                    _row("ddp", 1, sps=240.0, setting="bf16"),
                    _row("ddp", 2, sps=400.0, setting="bf16"),
                    _row("ddp", 2, sps=180.0, setting="fp32,bucket_cap_mb=1"),
                    _row("ddp", 2, sps=300.0, setting="bf16,acc2"),
                ]
            )
        ]
    )
    table = report.summarise(runs)
    got = {
        (r.strategy_name, r.world_size, r.setting, what): value
        for r in table.itertuples()
        for what, value in (("up", r.speedup_vs_single), ("eff", r.scaling_efficiency))
    }
    want = {
        (*key, what): value
        for key, pair in {
            ("single", 1, "fp32"): (1.0, 1.0),
            ("single", 1, "bf16"): (2.5, 1.0),
            ("ddp", 1, "bf16"): (2.4, 0.96),
            ("ddp", 2, "bf16"): (4.0, 400.0 / 250.0 / 2),
            ("ddp", 2, "fp32,bucket_cap_mb=1"): (1.8, 0.9),
            ("ddp", 2, "bf16,acc2"): (3.0, 1.5),  # no single bf16,acc2: over plain single
        }.items()
        for what, value in zip(("up", "eff"), pair, strict=True)
    }
    assert got == pytest.approx(want)
    over = {
        (r.strategy_name, r.world_size, r.setting): r.efficiency_over for r in table.itertuples()
    }
    assert over[("ddp", 2, "bf16")] == "single [bf16, acc1]"
    assert over[("ddp", 2, "fp32,bucket_cap_mb=1")] == "single [fp32, acc1]"
    assert over[("ddp", 2, "bf16,acc2")] == "single [fp32, acc1]"
    text = report.summary_markdown(table)
    assert "| 0.96 |" in text and "2.40x" in text
    # the one row over a single in other run options is marked, and the mark explained
    assert "| 1.50† |" in text and text.count("†") == 2
    assert "† efficiency over plain `single`: the run has no `single` in this" in text


def test_summarise_counts_only_the_repeats_it_counts_for_oversubscribed() -> None:
    runs = _runs(
        [
            _row("single", 1, 0),
            _tp("tp", 2, 0, sps=150.0),
            # a failed repeat is not counted, nor is its flag
            _tp("tp", 2, 1, status="failed", oversubscribed=1),
        ]
    )
    tp2 = _cell(report.summarise(runs), "tp", 2)
    assert tp2["oversubscribed"] == 0
    assert tp2["speedup_vs_single"] == pytest.approx(1.5)


def test_summarise_runs_from_before_the_column_are_not_oversubscribed() -> None:
    runs = _mixed().drop(columns="oversubscribed")
    table = report.summarise(runs)
    assert set(table["oversubscribed"]) == {0}
    assert _cell(table, "tp", 4)["speedup_vs_single"] == pytest.approx(5.1)


def test_summary_table_marks_oversubscribed_rows_and_gives_no_speedup() -> None:
    text = report.summary_markdown(report.summarise(_mixed()))
    (tp4,) = [ln for ln in text.splitlines() if ln.startswith("| tp (oversubscribed) | 4 |")]
    cells = [c.strip() for c in tp4.strip("|").split("|")]
    assert cells[3] == "510.0 (500.0–520.0)"  # samples/s still shown
    assert cells[4] == "–"  # 2 repeats: no interval
    assert cells[6] == "–" and cells[7] == "–"  # speed-up, efficiency
    (ddp,) = [ln for ln in text.splitlines() if ln.startswith("| ddp | 2 |")]
    assert "| 1.80x | 0.90 |" in ddp
    assert "| tp | 2 |" in text and "tp (oversubscribed) | 2" not in text


def test_report_text_says_oversubscribed_rows_are_not_ranked() -> None:
    runs = _mixed()
    text = report.report_markdown(_hand_run(runs), report.summarise(runs), [])
    sentence = "Rows marked (oversubscribed) ran more CPU ranks than cores"
    assert sentence in text and "for correctness" in text and "not comparable" in text
    plain = runs.assign(oversubscribed=0)
    text = report.report_markdown(_hand_run(plain), report.summarise(plain), [])
    assert sentence not in text and "(oversubscribed) |" not in text


def _terminal_line(text: str, name: str, ws: int) -> str:
    """The line of a cell in the terminal table (name padded to its column, then ws)."""
    width = text.splitlines()[0].index("ws") - 1  # `ws` is right-aligned in 3 characters
    (line,) = [
        ln
        for ln in text.splitlines()[2:]
        if ln[:width].strip() == name and ln[width : width + 3].strip() == str(ws)
    ]
    return line


def test_terminal_summary_marks_oversubscribed_and_gives_no_speedup() -> None:
    # as the runner hands them over: strings, empty where there is no value
    rows = [
        {k: "" if isinstance(v, float) and math.isnan(v) else str(v) for k, v in r.items()}
        for r in _mixed().to_dict("records")
    ]
    text = summary.table(rows)
    head = text.splitlines()[0]
    at = head.index("speed-up") + len("speed-up")  # the column is right-aligned
    tp4 = _terminal_line(text, "tp (oversubscribed)", 4)
    assert tp4[at - 1] == "–" and "x" not in tp4[at - 9 : at]
    ddp = _terminal_line(text, "ddp", 2)
    assert ddp[at - 5 : at] == "1.80x"
    tp2 = _terminal_line(text, "tp", 2)
    assert "oversubscribed" not in tp2 and tp2[at - 5 : at] == "1.50x"
    # every line keeps the columns aligned, the longer name included
    assert {ln.index("  ok") for ln in (tp4, ddp, tp2)} == {len(head) - len("  status")}


def test_terminal_speedups_are_over_one_single_setting_as_the_reports() -> None:
    """With no plain fp32 single, the base is single's plainest setting (the report's
    baseline_row), named under the table; not a median over its settings, which gave no
    row 1.00x."""
    rows = [
        _row("single", 1, 0, sps=100.0, setting="bf16"),
        _row("single", 1, 0, sps=300.0, setting="bf16,acc2"),
        _row("ddp", 2, 0, sps=180.0, setting="bf16"),
    ]
    text = summary.table(
        [{k: str(v) for k, v in r.items()} for r in _runs(rows).to_dict("records")]
    )
    at = text.splitlines()[0].index("speed-up") + len("speed-up")
    assert _terminal_line(text, "single [acc1]", 1)[at - 5 : at] == "1.00x"
    assert _terminal_line(text, "single [acc2]", 1)[at - 5 : at] == "3.00x"
    assert _terminal_line(text, "ddp [acc1]", 2)[at - 5 : at] == "1.80x"
    assert text.splitlines()[-1] == "speed-up: over single [acc1] at world size 1"
    base = report.baseline_row(report.summarise(_runs(rows)))
    assert base["setting"] == "bf16"  # the report's base is the same


@pytest.mark.parametrize(
    "plain, other",
    [("fp32,acc2", "fp32,compile,acc2"), ("fp32,acc2", "bf16,acc2"), ("bf16", "fp16,cl")],
)
def test_speedups_are_over_the_plainest_single_not_the_first_in_text_order(
    plain: str, other: str
) -> None:
    """With no plain fp32 single (`--compile off,on --accumulate 2`), every speed-up is over
    the eager, fp32 single of the run: `single [compile]` sorts before `single [eager]`,
    and `[bf16]` before `[fp32]`, and was taken as the baseline."""
    rows = [
        _row("single", 1, 0, sps=100.0, setting=plain),
        _row("single", 1, 0, sps=50.0, setting=other),
        _row("ddp", 2, 0, sps=180.0, setting=plain),
    ]
    (runs,) = report._labelled([_runs(rows)])  # one case per setting, as a report has
    table = report.summarise(runs)
    assert report.baseline_row(table)["setting"] == plain
    speedup = {
        (r["strategy_name"], r["setting"]): r["speedup_vs_single"] for _, r in table.iterrows()
    }
    assert speedup[("single", plain)] == 1.0 and speedup[("ddp", plain)] == pytest.approx(1.8)
    assert speedup[("single", other)] == pytest.approx(0.5)
    text = summary.table(
        [{k: str(v) for k, v in r.items()} for r in _runs(rows).to_dict("records")]
    )
    labels = case_labels([("single", plain), ("single", other), ("ddp", plain)])
    assert text.splitlines()[-1] == f"speed-up: over {labels[('single', plain)]} at world size 1"


def test_labels_sort_with_their_numbers_as_numbers() -> None:
    from bench.harness.results import natural_key

    labels = ["ddp [x=0.5]", "ddp [x=100]", "ddp [x=0.05]", "ddp [x=1e-3]", "ddp [x=25]", "ddp"]
    assert sorted(labels, key=natural_key) == [
        "ddp",
        "ddp [x=1e-3]",
        "ddp [x=0.05]",
        "ddp [x=0.5]",
        "ddp [x=25]",
        "ddp [x=100]",
    ]


def test_swept_values_are_listed_in_numeric_order() -> None:
    rows = [
        _row("single", 1),
        *(_row("ddp", 2, setting=f"fp32,bucket_cap_mb={mb}") for mb in (100, 1, 25)),
    ]
    text = summary.table(
        [{k: str(v) for k, v in r.items()} for r in _runs(rows).to_dict("records")]
    )
    names = [line.split()[1] for line in text.splitlines()[2:] if line.startswith("ddp")]
    assert names == ["[bucket_cap_mb=1]", "[bucket_cap_mb=25]", "[bucket_cap_mb=100]"], text
    (runs,) = report._labelled([_runs(rows)])
    cases = list(report.summarise(runs)["strategy"])
    assert cases == [f"ddp [bucket_cap_mb={mb}]" for mb in (1, 25, 100)] + ["single"], cases


def test_each_strategys_plain_setting_comes_first() -> None:
    """Cases sort by strategy, then with each axis's plain value (fp32, acc1, eager, nchw,
    bn) ahead of the others: the baseline `single [fp32, acc1, eager]` heads its strategy,
    not below bf16 as name order put it (b < f, compile < eager)."""
    settings = ["bf16,compile,acc2", "fp32,compile", "bf16", "fp32,acc2", "fp32", "bf16,acc2"]
    rows = [_row("single", 1, setting=s) for s in settings] + [
        _row("ddp_spawn", 2, setting=s) for s in ("bf16,acc2", "fp32,acc2")
    ]
    want = [
        "ddp_spawn [fp32, eager, acc2]",
        "ddp_spawn [bf16, eager, acc2]",
        "single [fp32, eager, acc1]",
        "single [fp32, eager, acc2]",
        "single [fp32, compile, acc1]",
        "single [bf16, eager, acc1]",
        "single [bf16, eager, acc2]",
        "single [bf16, compile, acc2]",
    ]
    (runs,) = report._labelled([_runs(rows)])
    assert list(report.summarise(runs)["strategy"]) == want
    text = summary.table(
        [{k: str(v) for k, v in r.items()} for r in _runs(rows).to_dict("records")]
    )
    cases = [line[: line.index("]") + 1] for line in text.splitlines()[2:-1]]
    assert cases == want, text


def test_a_token_models_summary_has_tokens_per_second() -> None:
    rows = [_row("single", 1, tokens_per_s=6400.0), _row("ddp", 2, sps=180.0, tokens_per_s=11520.0)]
    text = report.summary_markdown(report.summarise(_runs(rows)))
    head, _, *body = text.splitlines()
    assert head.split(" | ")[3:7] == ["samples/s", "95% CI", "CV %", "tokens/s"]
    assert [line.split(" | ")[6] for line in body] == ["11,520", "6,400"]
    images = report.summary_markdown(report.summarise(_mixed()))  # no token model: none
    assert "tokens/s" not in images


def test_a_token_models_report_says_a_sample_is_a_sequence() -> None:
    """samples/s of a language model counts sequences: the report says of how many tokens."""
    rows = [_row("single", 1, tokens_per_s=6400.0), _row("ddp", 2, sps=180.0, tokens_per_s=11520.0)]
    note = report.token_note(report.summarise(_runs(rows)))
    assert note == " A sample is one sequence of 64 tokens: tokens/s is samples/s times that."
    assert report.token_note(report.summarise(_mixed())) == ""  # images: nothing to say
    # a summary.csv of before the tokens column: nothing to say either, and no error
    old = report.summarise(_mixed()).drop(columns="tokens_per_s_median", errors="ignore")
    assert report.token_note(old) == ""


def test_the_conditions_name_the_model_and_data_arguments() -> None:
    """`lm` is any of four sizes: the report says which was given (config.json's
    --model-arg), or a tiny and a base run read the same."""
    rows = [_row("single", 1, tokens_per_s=6400.0)]
    runs = _runs(rows).assign(model="lm", dataset="python-source")
    run = report.Run(
        path=Path("hand"),
        runs=runs,
        steps=pd.DataFrame(),
        ranks=pd.DataFrame(),
        config={"model_kwargs": {"size": "tiny", "depth": 3}, "dataset_kwargs": {}},
    )
    lines = report.fairness_markdown(run, report.counted_rows(runs)).splitlines()
    assert lines[1].startswith("- model: lm with depth=3, size=tiny; device: ")
    assert lines[0].startswith("- data set: python-source (")
    bare = report.fairness_markdown(_hand_run(runs), report.counted_rows(runs))
    assert "- model: lm; device: " in bare  # none given: nothing added


def test_throughput_plot_leaves_out_oversubscribed_cells() -> None:
    table = report.summarise(_mixed())
    ax = plots.throughput(table).axes[0]
    drawn = {
        c.get_label(): [p.get_height() for p in c.patches]
        for c in ax.containers
        if hasattr(c, "patches")
    }
    assert drawn["tp"] == pytest.approx([150.0])  # ws=2 only
    assert sorted(drawn) == ["ddp", "pipeline_1f1b", "single", "tp"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]
    assert "world size" in ax.get_xlabel() and "oversubscribed" in ax.get_xlabel()
    assert "tp ws=4" in ax.get_xlabel()


def test_scaling_plot_leaves_out_oversubscribed_cells_even_with_an_efficiency() -> None:
    table = report.summarise(_mixed())
    # a summary.csv written before oversubscribed cells had their speed-up taken away
    table.loc[table["oversubscribed"] == 1, "scaling_efficiency"] = 1.2
    ax = plots.scaling_efficiency(table).axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines["tp"].get_xdata()) == [2]
    assert "tp ws=4" in ax.get_xlabel()


def test_plots_with_only_oversubscribed_cells_say_so() -> None:
    table = report.summarise(_runs([_tp("tp", 4, oversubscribed=1)]))
    for fn in (plots.throughput, plots.scaling_efficiency):
        ax = fn(table).axes[0]
        assert any("not oversubscribed" in t.get_text() for t in ax.texts), fn.__name__
        assert not [c for c in ax.containers if hasattr(c, "patches") and len(c.patches)]
        assert "tp ws=4" in ax.get_xlabel()


def test_bar_plots_name_the_cells_whose_value_was_not_measured() -> None:
    """A runs.csv edited by hand (a column emptied or dropped) has cells with no value: the
    bar plots drew nothing there, silently, the strategy still in the legend; with no value
    at all, a blank plot on an axis running below 0 MiB."""
    runs = _runs(
        [_row("single", 1), _row("ddp", 2, sps=NAN, peak_mem_mib=NAN), _row("ddp", 1, sps=90)]
    )
    table = report.summarise(runs)
    ax = plots.throughput(table).axes[0]
    drawn = {c.get_label(): len(c.patches) for c in ax.containers if hasattr(c, "patches")}
    assert drawn == {"ddp": 1, "single": 1}  # ddp at world size 1 only
    assert "not measured" in ax.get_xlabel() and "ddp ws=2" in ax.get_xlabel()
    table["peak_mem_mib_median"] = NAN  # the column gone: no cell has a value
    ax = plots.peak_memory(table).axes[0]
    assert not [c for c in ax.containers if hasattr(c, "patches") and len(c.patches)]
    assert any("no measured values" in t.get_text() for t in ax.texts)
    assert "single ws=1" in ax.get_xlabel() and list(ax.get_xticks()) == []
    assert ax.get_legend() is None


def test_plots_without_the_column_draw_everything() -> None:
    table = report.summarise(_mixed()).drop(columns="oversubscribed")
    ax = plots.throughput(table).axes[0]
    bars = {c.get_label(): len(c.patches) for c in ax.containers if hasattr(c, "patches")}
    assert bars["tp"] == 2 and "oversubscribed" not in ax.get_xlabel()


# ---------------------------------------------------------------- 2. model parallelism


def _mp_rows(text: str) -> dict[tuple[str, str], list[str]]:
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "---" not in ln]
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in rows]
    assert cells[0] == [
        "strategy",
        "world size",
        "stages",
        "micro-batches",
        "bubble measured (%)",
        "bubble textbook (%)",
        "MiB between stages/step",
        "MiB of collectives/step",
        "model state/rank (MiB)",
    ]
    return {(c[0], c[1]): c[2:] for c in cells[1:]}


def test_model_parallel_table_has_a_row_per_model_parallel_cell() -> None:
    runs = _mixed()
    text = report.model_parallel_markdown(report.counted_rows(runs), report.summarise(runs))
    rows = _mp_rows(text)
    assert set(rows) == {
        ("pipeline_1f1b", "2"),
        ("tp", "2"),
        ("tp (oversubscribed)", "4"),
    }
    # the bubble is the median over three repeats (30, 50, 35), beside the textbook's 1/5
    assert rows[("pipeline_1f1b", "2")] == [
        "2",
        "4",
        "35.0",
        "20.0",
        "2.0",
        "–",
        "4.5 (1.5/1.5/1.5)",
    ]
    assert rows[("tp", "2")] == ["–", "–", "–", "–", "–", "48.0", "4.5 (1.5/1.5/1.5)"]
    assert rows[("tp (oversubscribed)", "4")][5] == "96.0"
    note = text.split("\n\n", 1)[1]
    assert "Bubble measured" in note and "mean over ranks" in note
    assert "equal stages and free communication" in note


@pytest.mark.parametrize(("lightest", "said"), [(4.556, ""), (4.4, "; least 4.4")])
def test_the_lightest_stage_is_named_only_where_it_reads_less(lightest, said) -> None:
    """A pipeline's two stages of the transformer hold 4.63 and 4.56 MiB: more than 1 %
    apart, they read 'least 4.6' beside the 4.6 they were said to be less than."""
    cell = {"model_state_mib_median": 4.635, "model_state_mib_lightest_median": lightest}
    cell |= {f"{k}_median": 1.545 for k in ("param_mib", "grad_mib", "optim_mib")}
    assert report.model_state_text(cell) == "4.6 (1.5/1.5/1.5)" + said


def test_a_run_made_before_the_interleaved_bubble_was_mended_reads_the_mended_one() -> None:
    """Rows keep the textbook bubble their worker wrote: a run from before interleaved
    1F1B's was mended (one micro-batch through 2 ranks' 4 stages: 33.3 %, where no
    schedule idles less than 50 %) re-renders with the formula the note now gives."""
    old = 100 / 3  # (p-1)/(v*m+p-1), as written then
    runs = _runs(
        [
            _pipeline("pipeline_interleaved", 2, r, pipeline_stages=4, microbatches=1)
            | {"bubble_theory_pct": old}
            for r in range(2)
        ]
    )
    text = report.model_parallel_markdown(report.counted_rows(runs), report.summarise(runs))
    assert _mp_rows(text)[("pipeline_interleaved", "2")][:4] == ["4", "1", "30.0", "50.0"]


def test_model_parallel_table_takes_medians_of_counted_repeats_only() -> None:
    runs = _runs(
        [
            _pipeline("pipeline_gpipe", 2, 0, bubble=20.0),
            _pipeline("pipeline_gpipe", 2, 1, bubble=40.0),
            _pipeline("pipeline_gpipe", 2, 2, bubble=99.0, status="failed"),
        ]
    )
    text = report.model_parallel_markdown(report.counted_rows(runs), report.summarise(runs))
    assert _mp_rows(text)[("pipeline_gpipe", "2")][2] == "30.0"


def test_no_model_parallel_section_without_model_parallel_rows() -> None:
    runs = _runs([_row("single", 1), _row("ddp", 2, sps=180.0)])
    table = report.summarise(runs)
    assert report.model_parallel_markdown(report.counted_rows(runs), table) == ""
    text = report.report_markdown(_hand_run(runs), table, [])
    assert "## Model parallelism" not in text
    # a model-parallel cell that only failed has no figures to show either
    runs = _runs([_row("single", 1), _pipeline("pipeline_gpipe", 2, status="failed")])
    assert report.model_parallel_markdown(report.counted_rows(runs), report.summarise(runs)) == ""


def test_report_has_the_model_parallel_section_after_the_summary() -> None:
    runs = _mixed()
    text = report.report_markdown(_hand_run(runs), report.summarise(runs), [])
    assert "## Model parallelism" in text
    end = "## Unavailable, skipped and failed"  # (no plots: none were given)
    assert text.index("## Summary") < text.index("## Model parallelism") < text.index(end)
    section = text.split("## Model parallelism", 1)[1].split(end, 1)[0]
    assert "| pipeline_1f1b | 2 | 2 | 4 | 35.0 | 20.0 |" in section


# ---------------------------------------------------------------- 3. global batch split


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        (_row("ddp", 2), "32 x 1 x 2 data-parallel shares"),
        (_row("ddp", 2, micro_batch=16), "16 x 2 x 2 data-parallel shares"),
        (_row("single", 1), "64 x 1 x 1 data-parallel share"),
        # DataParallel: one process, one share, split across its GPUs by itself
        (_row("dp", 2, per_rank_batch=64, micro_batch=64, data_ranks=1), "64 x 1 x 1 data-parallel share"),
        (_tp("tp", 2), "64 x 1 x 1 data-parallel share, 2 ranks per share"),
        (_tp("fsdp_tp", 4, data_ranks=2), "32 x 1 x 2 data-parallel shares, 2 ranks per share"),
        (_pipeline("pipeline_1f1b", 4), "16 x 4 x 1 data-parallel share, 4 ranks per share"),
        (_pipeline("model_split", 2, micro_batch=64), "64 x 1 x 1 data-parallel share, 2 ranks per share"),
        # a run from before data_ranks: one share per per-rank batch
        (_row("ddp", 4, data_ranks=NAN), "16 x 1 x 4 data-parallel shares"),
        (_row("ddp", 2, per_rank_batch=NAN), "–"),
    ],
    ids=["ddp", "ddp-acc", "single", "dp", "tp", "fsdp_tp", "pipeline", "model_split", "old", "no-batch"],
)  # fmt: skip
def test_batch_split_counts_data_parallel_shares(row: dict, expected: str) -> None:
    assert report.batch_split(_runs([row])) == expected


def test_fairness_note_explains_shares() -> None:
    runs = _mixed()
    text = report.fairness_markdown(_hand_run(runs), report.counted_rows(runs))
    assert "data-parallel shares" in text and "processes" not in text
    assert "ranks per share" in text and "DataParallel" in text
    assert "| tp | 2 | 64 x 1 x 1 data-parallel share, 2 ranks per share |" in text


# ---------------------------------------------------------------- 4. the time-split plot


def _steps(cells: dict[tuple[str, int], tuple[float, float]], repeats=(0,)) -> pd.DataFrame:
    """Five steps per repeat (the first one warm-up and 100x slower) of (compute, wait) ms."""
    rows = []
    for (name, ws), (compute, wait) in cells.items():
        for rep in repeats:
            for step in range(5):
                slow = 100.0 if step == 0 else 1.0
                rows.append(
                    {
                        "run_id": "hand",
                        "strategy": name,
                        "world_size": ws,
                        "setting": "fp32",
                        "repeat": rep,
                        "epoch": 0,
                        "step": step,
                        "warmup": int(step == 0),
                        "compute_ms": compute * slow,
                        "data_wait_ms": wait * slow,
                        "step_time_ms": (compute + wait) * slow,
                        "loss": 2.0,
                    }
                )
    return pd.DataFrame(rows)


def _containers(fig: Figure) -> dict[str, list]:
    ax = fig.axes[0]
    return {c.get_label(): list(c.patches) for c in ax.containers if hasattr(c, "patches")}


def test_time_split_draws_the_pipeline_bubble_inside_compute() -> None:
    steps = _steps({("ddp", 2): (80.0, 20.0), ("pipeline_1f1b", 2): (200.0, 4.0)})
    fig = plots.time_split(steps, bubbles={("pipeline_1f1b", 2): 25.0})
    bars = _containers(fig)
    assert sorted(bars) == [
        "_ddp data wait",
        "_pipeline_1f1b data wait",
        "_pipeline_1f1b pipeline bubble",
        "ddp",
        "pipeline_1f1b",
    ]
    (own,) = bars["pipeline_1f1b"]
    (bubble,) = bars["_pipeline_1f1b pipeline bubble"]
    (wait,) = bars["_pipeline_1f1b data wait"]
    # compute 200 ms, a quarter of it bubble; then the data wait on top, as before
    assert own.get_height() == pytest.approx(150.0) and own.get_y() == 0
    assert bubble.get_height() == pytest.approx(50.0) and bubble.get_y() == pytest.approx(150.0)
    assert wait.get_y() == pytest.approx(200.0) and wait.get_height() == pytest.approx(4.0)
    assert bubble.get_hatch() == plots.PIPELINE_BUBBLE_HATCH != wait.get_hatch()
    assert bubble.get_facecolor()[:3] == pytest.approx(own.get_facecolor()[:3])
    (ddp,) = bars["ddp"]
    assert ddp.get_height() == pytest.approx(80.0)  # no bubble: all of compute
    labels = plots.legend_labels(fig)
    assert labels[:2] == ["ddp", "pipeline_1f1b"]
    assert any(t.startswith("pipeline bubble") for t in labels)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "24.5% bubble\n2.0% wait" in texts and "20.0% wait" in texts
    assert "pipeline bubble" in fig.axes[0].get_title()


@pytest.mark.parametrize("bubbles", [None, {}, {("pipeline_1f1b", 2): NAN}])
def test_time_split_without_bubbles_is_as_before(bubbles) -> None:
    steps = _steps({("ddp", 2): (80.0, 20.0), ("pipeline_1f1b", 2): (200.0, 4.0)})
    fig = plots.time_split(steps, bubbles=bubbles)
    bars = _containers(fig)
    assert len(bars) == 4 and not any("bubble" in k for k in bars)
    assert bars["pipeline_1f1b"][0].get_height() == pytest.approx(200.0)
    assert not any("bubble" in t for t in plots.legend_labels(fig))
    assert fig.axes[0].get_title() == "Where a step's time goes: compute vs waiting for data"


def test_bubble_pcts_are_medians_over_counted_repeats() -> None:
    counted = report.counted_rows(_mixed())
    assert report.bubble_pcts(counted) == {("pipeline_1f1b", 2): pytest.approx(35.0)}
    assert report.bubble_pcts(counted.drop(columns="bubble_pct")) == {}
    assert report.bubble_pcts(counted.iloc[0:0]) == {}


def test_figures_pass_the_bubble_of_relabelled_cases(tmp_path: Path) -> None:
    """Two settings of the pipeline make case labels ("pipeline_1f1b [bf16]"): the bubble
    goes to the bar of its own case, as counted_rows and counted_steps relabel alike."""
    rows = [
        _pipeline("pipeline_1f1b", 2, 0, setting="fp32", bubble=20.0),
        _pipeline("pipeline_1f1b", 2, 0, setting="bf16", bubble=40.0),
        _row("single", 1, 0),
    ]
    _runs(rows).to_csv(tmp_path / "runs.csv", index=False)
    steps = _steps({("pipeline_1f1b", 2): (100.0, 0.0), ("single", 1): (50.0, 0.0)})
    bf16 = steps[steps["strategy"] == "pipeline_1f1b"].assign(setting="bf16")
    pd.concat([steps, bf16]).to_csv(tmp_path / "steps.csv", index=False)
    run = report.load_run(tmp_path)
    figs = report.figures(run, report.summarise(run.runs))
    bars = _containers(figs["time_split.png"])
    assert bars["_pipeline_1f1b [fp32] pipeline bubble"][0].get_height() == pytest.approx(20.0)
    assert bars["_pipeline_1f1b [bf16] pipeline bubble"][0].get_height() == pytest.approx(40.0)
    assert not any(k.startswith("_single") and "bubble" in k for k in bars)


def test_the_summary_says_a_cpu_memory_figure_is_the_whole_process() -> None:
    """make bench on a CPU: every cell near 800 MiB of 'peak mem/device' beside 13.7 MiB
    of model state, and FSDP no lower than DDP: the text called it memory per device, not
    the ranks' resident set, most of which is torch itself."""
    runs = _mixed()
    text = report.report_markdown(_hand_run(runs), report.summarise(runs), [])
    assert "peak resident memory (host RSS)" in text
    gpu = runs.assign(mem_source="cuda_allocator")
    text = report.report_markdown(_hand_run(gpu), report.summarise(gpu), [])
    assert "host RSS" not in text


def test_where_the_time_goes_shows_how_far_exposed_comm_varies_over_repeats() -> None:
    """make bench's ddp_torchrun at 2 ranks exposed 13.6, 3.9 and 8.0 ms of communication
    in its three repeats; the table showed 9.27 alone, to the hundredth, beside a profiler
    total it could exceed, so a reader could not tell a real difference from noise."""
    laps = {
        "step_time_ms_mean": 20.0,
        "part_data_wait_ms": 1.0,
        "part_forward_ms": 5.0,
        "part_backward_ms": 5.0,
        "part_optimizer_ms": 1.0,
        "part_other_ms": 0.0,
        "comm_total_ms": 6.0,
        "comm_hidden_ms": 0.0,
        "rank_skew_pct": 1.0,
        "comm_method": "ablation+profiler",
    }
    runs = _runs(
        [
            _row("ddp", 2, rep, **laps, part_comm_exposed_ms=ms)
            for rep, ms in enumerate((13.6, 3.9, 8.0))
        ]
    )
    table = report.breakdown_markdown(report.counted_rows(runs))
    row = next(ln for ln in table.splitlines() if ln.startswith("| ddp | 2 |"))
    assert "| 8.00 (3.90–13.60) |" in row


def test_a_comm_total_past_the_step_names_the_profiled_step_it_was_measured_in() -> None:
    """The H100's ddp_torchrun at 2 ranks on MNIST: 5.35 ms of communication in a 4.97 ms
    step, and pipeline_interleaved on the CPU 180 in 150: the profiler's steps ran slower
    than the timed ones, and the table gave no sign of it."""
    laps = {
        "part_data_wait_ms": 1.0,
        "part_forward_ms": 4.0,
        "part_backward_ms": 4.0,
        "part_optimizer_ms": 1.0,
        "part_other_ms": 0.0,
        "part_comm_exposed_ms": 1.0,
        "comm_hidden_ms": 0.0,
        "rank_skew_pct": 1.0,
        "comm_method": "profiler",
    }
    # (comm total, profiled step): past the step and held by the profiled one; within the
    # step; past its profiled step too, which then does not explain it
    cases = {"slow": (12.5, 14.0), "fits": (6.0, 14.0), "past": (12.5, 11.0)}
    runs = _runs(
        [
            _row(
                name,
                2,
                0,
                **laps,
                step_time_ms_mean=10.0,
                comm_total_ms=total,
                profiled_step_ms=prof,
            )
            for name, (total, prof) in cases.items()
        ]
    )
    table = report.breakdown_markdown(report.counted_rows(runs))
    rows = {ln.split(" | ")[0][2:]: ln for ln in table.splitlines() if ln.startswith("| ")}
    assert "| 12.50 (of 14.00) |" in rows["slow"]
    assert "| 6.00 |" in rows["fits"] and "(of" not in rows["fits"]
    assert "| 12.50 |" in rows["past"] and "(of" not in rows["past"]


def test_the_time_split_step_is_the_step_its_parts_split() -> None:
    """On a GPU only steps at least 20 ms apart are lapped (and the first timed one), and
    the parts split the mean of those, which carry their laps' cost: MNIST's 1.70 ms steps
    on an H100, the lapped ones 1.80. The table's step was the mean of every timed step,
    so its parts added up to 0.10 ms more than the step beside them, with `other` at 0 %."""
    laps = {
        "device": "cuda",
        "step_time_ms_mean": 1.70,  # every timed step
        "part_data_wait_ms": 0.05,
        "part_forward_ms": 0.50,
        "part_backward_ms": 0.90,
        "part_optimizer_ms": 0.35,
        "part_comm_exposed_ms": NAN,  # one process: none
        "part_other_ms": 0.0,  # the lapped steps' mean, 1.80, less their laps
        "comm_total_ms": NAN,
        "comm_hidden_ms": NAN,
        "rank_skew_pct": 0.0,
        "comm_method": "",
    }
    runs = _runs([_row("single", 1, rep, **laps) for rep in range(3)])
    table = report.breakdown_markdown(report.counted_rows(runs))
    row = next(ln for ln in table.splitlines() if ln.startswith("| single | 1 |"))
    cells = row.split(" | ")
    assert cells[2] == "1.80", row  # 0.05 + 0.50 + 0.90 + 0.35 + 0
    assert sum(float(c) for c in cells[3:7]) == pytest.approx(float(cells[2]))
    assert "can be longer than the summary's step time" in table
    # an older run's rows, with no parts: the table is left out, as before
    older = runs.drop(columns=[c for c in runs if c.startswith("part_")])
    assert report.breakdown_markdown(report.counted_rows(older)) == ""


def test_a_run_of_pipelines_alone_still_splits_its_steps() -> None:
    """runs.csv leaves a pipeline's forward empty (not measured apart from its backward),
    where it had written 0 ms. The report took a run's steps as lapped only where some row
    had a forward part: a run of pipelines alone lost its table of where the time goes and
    its stacked time-split plot, both measured."""
    from bench.analysis import plots

    laps = {
        "pipeline_stages": 2,
        "step_time_ms_mean": 10.0,
        "part_data_wait_ms": 0.5,
        "part_forward_ms": NAN,  # inside the backward's lap
        "part_backward_ms": 8.0,
        "part_optimizer_ms": 1.0,
        "part_comm_exposed_ms": NAN,
        "part_other_ms": 0.5,
        "comm_total_ms": 3.0,
        "comm_hidden_ms": NAN,
        "rank_skew_pct": 1.0,
        "comm_method": "profiler",
    }
    runs = _runs([_row("pipeline_gpipe", 2, rep, **laps) for rep in range(2)])
    counted = report.counted_rows(runs)
    assert report.lapped(counted)
    table = report.breakdown_markdown(counted)
    row = next(ln for ln in table.splitlines() if ln.startswith("| pipeline_gpipe | 2 |"))
    assert row.startswith("| pipeline_gpipe | 2 | 10.00 | 0.50 | – | 8.00 | 1.00 |"), row
    bars = plots.time_parts(counted).axes[0].containers
    assert {c.get_label() for c in bars} >= {"_pipeline_gpipe backward"}


def test_the_efficiency_plot_names_the_single_each_cell_scales_over() -> None:
    """A bf16 cell's efficiency is over single in bf16 (report.summarise), not over the
    fp32 single the title named: with two precisions the title says each cell's own."""

    def cells(*settings: str) -> pd.DataFrame:
        rows = []
        for s in settings:
            tag = f" [{s}]" if len(settings) > 1 else ""
            rows += [_row(f"single{tag}", 1, setting=s), _row(f"ddp{tag}", 2, setting=s)]
        return report.summarise(
            _runs([r | {"strategy_name": r["strategy"].split()[0]} for r in rows])
        )

    one = plots.scaling_efficiency(cells("fp32")).axes[0].get_title()
    assert "linear scaling over single at world size 1" in one
    table = cells("fp32", "bf16")
    assert set(table["efficiency_over"]) == {"single [fp32]", "single [bf16]"}
    two = plots.scaling_efficiency(table).axes[0].get_title()
    assert "over single in each cell's own run options at world size 1" in two


def test_the_report_says_its_efficiency_is_strong_scaling() -> None:
    """The global batch is fixed at every world size, so each rank of a larger cell computes
    less: the report said only "the same for every strategy at a world size", and its
    efficiency read as communication's cost alone. It says which scaling it measures, with
    each world size's batch per data-parallel share (tp's one share at 4 has none)."""
    runs = _mixed()
    text = report.report_markdown(_hand_run(runs), report.summarise(runs), [])
    said = " ".join(text.split())
    assert "Efficiency here is strong scaling: the global batch is 64 samples a step" in said
    assert "(world size 2: 32 samples a share)" in said
    assert "Weak scaling (each rank keeping single's batch" in said
    conditions = report.fairness_markdown(_hand_run(runs), report.counted_rows(runs))
    assert "at every world size, whose data-parallel ranks share it: strong scaling): 64" in (
        " ".join(conditions.split())
    )
    label = plots.scaling_efficiency(report.summarise(runs)).axes[0].get_xlabel()
    assert "strong scaling" in label
    one = _runs([_row("single", 1), _row("ddp", 1)])  # one world size: nothing scales
    assert (
        "strong scaling"
        not in report.report_markdown(_hand_run(one), report.summarise(one), []).split(
            "## Summary"
        )[1]
    )


def test_oversubscribed_cells_are_marked_where_their_times_are_shown() -> None:
    """ddp_spawn at 4 ranks on 2 cores (--oversubscribe) stepped in 330 ms beside single's
    1,160: the summary marked it and gave it no speed-up, but the Where-the-time-goes table,
    the step-time plot and the time-split plot showed it bare, a 3.5x faster step to read
    off. Each now marks it, as the summary does; the cell beside it stays unmarked."""
    laps = {
        "step_time_ms_mean": 12.0,
        "part_data_wait_ms": 1.0,
        "part_forward_ms": 5.0,
        "part_backward_ms": 5.0,
        "part_optimizer_ms": 1.0,
        "part_other_ms": 0.0,
        "part_comm_exposed_ms": 0.0,
        "comm_total_ms": 2.0,
        "comm_hidden_ms": 2.0,
        "rank_skew_pct": 1.0,
        "comm_method": "ablation+profiler",
    }
    runs = _runs([_row("ddp", 2, **laps), _row("ddp", 4, oversubscribed=1, **laps)])
    counted = report.counted_rows(runs)
    table = report.breakdown_markdown(counted)
    assert "\n| ddp (oversubscribed) | 4 |" in table and "\n| ddp | 2 |" in table
    assert "Rows marked (oversubscribed) ran more ranks than cores" in " ".join(table.split())
    assert "Rows marked (oversubscribed)" not in report.breakdown_markdown(counted.iloc[:1])
    shared = plots.oversubscribed_cells(counted)
    assert shared == {("ddp", 4)}
    steps = _steps({("ddp", 2): (10.0, 1.0), ("ddp", 4): (3.0, 1.0)})
    for fig in (
        plots.time_parts(counted),
        plots.time_split(steps, oversubscribed=shared),
        plots.step_time_distribution(steps, oversubscribed=shared),
    ):
        ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        assert ticks == ["ddp\nws=2", "ddp\nws=4\n(oversubscribed)"]
