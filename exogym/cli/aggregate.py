"""A sweep's per-run rows gathered into one row per point: mean, standard deviation and
confidence interval over seeds (see [`exogym.stats`][exogym.stats] for the formulas)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from exogym.stats import estimate

__all__ = ["METRICS", "aggregate", "format_sweep_table", "summary_columns"]

#: The per-run quantities aggregated over seeds (``time_to_target`` only with a target loss).
METRICS = ("val_loss", "val_accuracy", "bytes_sent_per_node", "sim_time", "time_to_target")

#: Suffixes of a metric's columns in ``summary.csv``.
STATS = ("mean", "std", "ci_low", "ci_high")


def summary_columns(axes: Sequence[str], target: bool) -> list[str]:
    """``summary.csv``'s columns: ``strategy``, the grid's names, ``seeds`` (how many runs),
    ``<metric>_<mean|std|ci_low|ci_high>`` for each metric, and with a target loss
    ``time_to_target_*`` and ``target_reached`` (how many seeds reached it)."""
    metrics = [m for m in METRICS if target or m != "time_to_target"]
    extra = ["target_reached"] if target else []
    return ["strategy", *axes, "seeds", *(f"{m}_{s}" for m in metrics for s in STATS), *extra]


def aggregate(
    rows: Sequence[dict[str, Any]], axes: Sequence[str], target: bool, confidence: float = 0.95
) -> list[dict[str, Any]]:
    """One row per strategy and grid point (in first-seen order) of the per-run ``rows`` (which
    carry ``strategy``, the grid names, ``seed`` and the ``METRICS``): for each metric, the
    mean, sample standard deviation and ``confidence`` interval over the seeds whose value is
    not ``None`` (all ``None``: every statistic ``None``; one value: std and interval ``nan``).
    A grid name that does not apply to the strategy is ``None`` in its row."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["strategy"], *(repr(row.get(a)) for a in axes)), []).append(row)
    out = []
    for members in groups.values():
        first = members[0]
        agg: dict[str, Any] = {"strategy": first["strategy"], **{a: first.get(a) for a in axes}}
        agg["seeds"] = len(members)
        for metric in METRICS:
            if metric == "time_to_target" and not target:
                continue
            values = [r[metric] for r in members if r.get(metric) is not None]
            est = estimate(values, confidence) if values else None
            for stat, value in zip(STATS, (est.mean, est.std, est.low, est.high) if est else (None,) * 4, strict=True):
                agg[f"{metric}_{stat}"] = value
        if target:
            agg["target_reached"] = sum(r.get("time_to_target") is not None for r in members)
        out.append(agg)
    return out


def _pm(row: dict[str, Any], metric: str, scale: float = 1.0, fmt: str = ".4f") -> str:
    """``mean +- half-width`` of the interval (the mean alone for one seed, ``-`` for none)."""
    mean, high = row.get(f"{metric}_mean"), row.get(f"{metric}_ci_high")
    if mean is None:
        return "-"
    if high is None or math.isnan(high):
        return f"{mean * scale:{fmt}}"
    return f"{mean * scale:{fmt}} +- {(high - mean) * scale:{fmt}}"


def format_sweep_table(summary: Sequence[dict[str, Any]], axes: Sequence[str], target: bool) -> str:
    """The aggregated rows as an aligned text table: each value is the mean over seeds +- the
    half-width of its confidence interval."""

    def fit(name: str, key: str, least: int) -> tuple[str, int]:  # a column as wide as its longest value
        return name, max(least, len(name) + 2, *(len(str(r[key])) + 2 for r in summary))

    cols = [fit("strategy", "strategy", 16), *(fit(a, a, 8) for a in axes), ("seeds", 6)]
    stats = [("val loss", "val_loss", 1.0, ".4f"), ("accuracy", "val_accuracy", 1.0, ".3f")]
    stats += [("MB sent/node", "bytes_sent_per_node", 1e-6, ".2f"), ("sim time s", "sim_time", 1.0, ".2f")]
    if target:
        stats.append(("time to target s", "time_to_target", 1.0, ".2f"))
    width = 22
    head = "".join(f"{name:<{w}}" for name, w in cols) + "".join(f"{name:>{width}}" for name, *_ in stats)
    lines = [head, "-" * len(head)]
    for r in summary:
        cells = [f"{r['strategy']:<{cols[0][1]}}", *(f"{'-' if r[a] is None else r[a]!s:<{w}}" for a, w in cols[1:-1])]
        seeds = r["seeds"]
        cells.append(f"{seeds:<6}")
        cells += [f"{_pm(r, m, s, f):>{width}}" for _, m, s, f in stats]
        lines.append("".join(cells))
    return "\n".join(lines)
