"""The table printed at the end of a run: one line per strategy and world size."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping

from bench.harness import results


def _f(row: Mapping[str, str], key: str) -> float:
    try:
        return float(row.get(key) or "nan")
    except ValueError:
        return float("nan")


def _key(r: Mapping[str, str]) -> tuple[str, str, str, str]:
    return (r["strategy"], r["world_size"], r["repeat"], r["epoch"])


def _counted(rows: list[Mapping[str, str]]) -> set[tuple[str, str, str, str]]:
    """The rows the report counts: the last epoch of every repeat whose rows are all ok."""
    import pandas as pd

    from bench.analysis.report import counted_rows

    if not rows:
        return set()
    df = pd.DataFrame(rows)
    df["epoch"] = pd.to_numeric(df["epoch"], errors="coerce")
    kept = counted_rows(df)
    return {(r.strategy, r.world_size, r.repeat, str(int(r.epoch))) for r in kept.itertuples()}


def _labelled(rows: list[Mapping[str, str]]) -> list[dict[str, str]]:
    """`strategy` as the case's display name (the strategy plus the run options that vary)."""
    from bench.harness.results import case_labels

    labels = case_labels((r["strategy"], r.get("setting") or "") for r in rows)
    return [
        {
            **r,
            "strategy_name": r["strategy"],
            "strategy": labels[(r["strategy"], r.get("setting") or "")],
        }
        for r in rows
    ]


def _baseline(ok: Mapping[tuple[str, int], list[Mapping[str, str]]]) -> tuple[str, int] | None:
    """The cell every speed-up is over, chosen as the report chooses (report.baseline_row:
    single at world size 1 in its plainest setting; never a median of several)."""
    import pandas as pd

    from bench.analysis.report import baseline_row

    cells = [
        {
            "strategy": name,
            "world_size": ws,
            "strategy_name": rs[0]["strategy_name"],
            "setting": rs[0].get("setting") or "",
        }
        for (name, ws), rs in sorted(ok.items())
    ]
    base = baseline_row(pd.DataFrame(cells)) if cells else None
    return None if base is None else (base["strategy"], 1)


def table(rows: Iterable[Mapping[str, str]]) -> str:
    rows = _labelled(list(rows))
    counted = _counted(rows)
    ok: dict[tuple[str, int], list[Mapping[str, str]]] = defaultdict(list)
    other: dict[tuple[str, int], Mapping[str, str]] = {}
    for r in rows:
        key = (r["strategy"], int(r["world_size"]))
        if r["status"] == "ok":
            if _key(r) in counted:
                ok[key].append(r)
        else:
            other.setdefault(key, r)

    def med(rs: list, k: str) -> float:
        vals = [_f(r, k) for r in rs]
        vals = [v for v in vals if v == v]
        return statistics.median(vals) if vals else float("nan")

    # more ranks than cores (--oversubscribe): ran for correctness, its speed is not ranked
    over = {k for k, rs in ok.items() if any(_f(r, "oversubscribed") > 0 for r in rs)}

    def label(key: tuple[str, int]) -> str:
        return f"{key[0]} (oversubscribed)" if key in over else key[0]

    base_key = _baseline(ok)
    # a token model's work is counted in tokens (samples are sequences of them)
    tokens = any(_f(r, "tokens_per_s") == _f(r, "tokens_per_s") for rs in ok.values() for r in rs)
    metric, unit = ("tokens_per_s", "tokens/s") if tokens else ("samples_per_s", "samples/s")
    base = med(ok[base_key], metric) if base_key else float("nan")
    width = max([16, *(len(label(k)) + 1 for k in (*ok, *other))])
    head = f"{'strategy':<{width}}{'ws':>3}{unit:>12}{'speed-up':>9}{'step p50 ms':>13}{'data %':>8}{'peak MiB':>10}{'loss':>8}{'acc':>7}  status"
    lines = [head, "-" * len(head)]
    for key in sorted(set(ok) | set(other), key=lambda k: (results.natural_key(k[0]), k[1])):
        name, ws = key
        if key in ok:
            rs = ok[key]
            sps = med(rs, metric)
            up = sps / base if base == base and base > 0 and key not in over else float("nan")
            speedup = f"{up:8.2f}x" if up == up else f"{'–':>9}"
            lines.append(
                f"{label(key):<{width}}{ws:>3}{sps:>12.1f}{speedup}{med(rs, 'step_time_ms_p50'):>13.2f}"
                f"{med(rs, 'data_wait_pct'):>8.1f}{med(rs, 'peak_mem_mib'):>10.0f}"
                f"{med(rs, 'train_loss_final'):>8.3f}{med(rs, 'eval_accuracy'):>7.3f}  ok"
            )
        if key in other:
            r = other[key]
            lines.append(f"{name:<{width}}{ws:>3}{'':>67}  {r['status']}: {r['reason']}")
    if base_key and base_key[0] != "single":
        lines.append(f"speed-up: over {base_key[0]} at world size 1")
    return "\n".join(lines)
