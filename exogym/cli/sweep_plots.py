"""A sweep's plots: the mean over seeds with its confidence interval as a shaded band."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from exogym.cli.plots import AXES, METRICS
from exogym.runs import atomic_path
from exogym.stats import estimate

if TYPE_CHECKING:
    from exogym.cli.sweep import Sweep

__all__ = ["mean_curve", "plot_seed_curves", "plot_sweep"]


def mean_curve(
    histories: Sequence[Sequence[dict[str, Any]]], xcol: str, ycol: str, confidence: float = 0.95
) -> list[tuple[float, float, float, float]]:
    """``(x, mean, low, high)`` at each step where every one of ``histories`` (the seeds of one
    point) has ``ycol``: ``x`` is the mean of their ``xcol``, ``mean``/``low``/``high`` the
    [`exogym.stats.estimate`][exogym.stats.estimate] of their ``ycol`` (``low``/``high`` ``nan`` for
    one seed)."""
    by_step: dict[int, list[tuple[float, float]]] = {}
    for rows in histories:
        seen = {}
        for r in rows:
            if ycol in r and xcol in r:
                seen[r["step"]] = (r[xcol], r[ycol])
        for step, xy in seen.items():
            by_step.setdefault(step, []).append(xy)
    out = []
    for step in sorted(by_step):
        pairs = by_step[step]
        if len(pairs) == len(histories):
            est = estimate([y for _, y in pairs], confidence)
            out.append((sum(x for x, _ in pairs) / len(pairs), est.mean, est.low, est.high))
    return out


def _point_name(row: dict[str, Any], axes: Sequence[str], skip: str | None = None) -> str:
    return " ".join([row["strategy"], *(f"{a}={row[a]}" for a in axes if a != skip and row.get(a) is not None)])


def _band(ax: Any, xs: Sequence[float], low: Sequence[float], high: Sequence[float], color: Any) -> None:
    if not any(math.isnan(v) for v in (*low, *high)):
        ax.fill_between(xs, low, high, color=color, alpha=0.2, linewidth=0)


def _save(fig: Any, ax: Any, out_dir: str, name: str, title: str, caption: str, confidence: float) -> str:
    import matplotlib.pyplot as plt

    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    note = f"mean over seeds, band: {confidence:.0%} CI (Student t)"
    fig.text(0.01, 0.01, f"{caption}; {note}" if caption else note, fontsize=7, wrap=True)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path = os.path.join(out_dir, f"{name}.png")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path


def _against_axis(result: Sweep, axis: str, metric: str, confidence: float) -> str | None:
    """``<metric>_vs_<axis>.png``: one curve per strategy and other grid values; a strategy the
    axis does not apply to is a constant line."""
    import matplotlib.pyplot as plt

    values = list(dict.fromkeys(r[axis] for r in result.summary if r[axis] is not None))
    if len(values) < 2:
        return None
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    position = {v: (v if numeric else i) for i, v in enumerate(values)}
    curves: dict[str, list[dict[str, Any]]] = {}
    for r in result.summary:
        curves.setdefault(_point_name(r, result.axes, skip=axis), []).append(r)
    fig, ax = plt.subplots(figsize=(7, 4.6), dpi=100)
    col, ylabel = f"{metric}_mean", METRICS[metric][1]
    for name, rows in curves.items():
        rows = [r for r in rows if r[col] is not None]
        if not rows:
            continue
        if rows[0][axis] is None:  # the axis does not apply: one run for all its values
            r = rows[0]
            xs = [position[values[0]], position[values[-1]]]
            (line,) = ax.plot(xs, [r[col]] * 2, linestyle="--", label=f"{name} (any {axis})")
            _band(ax, xs, [r[f"{metric}_ci_low"]] * 2, [r[f"{metric}_ci_high"]] * 2, line.get_color())
            continue
        rows.sort(key=lambda r: position[r[axis]])
        xs = [position[r[axis]] for r in rows]
        (line,) = ax.plot(xs, [r[col] for r in rows], marker="o", markersize=4, label=name)
        _band(ax, xs, [r[f"{metric}_ci_low"] for r in rows], [r[f"{metric}_ci_high"] for r in rows], line.get_color())
    if not numeric:
        ax.set_xticks(range(len(values)), [str(v) for v in values])
    elif all(v > 0 for v in values) and max(values) / min(values) >= 10:
        ax.set_xscale("log")
    ax.set_xlabel(axis)
    ax.set_ylabel(ylabel)
    return _save(fig, ax, result.out_dir, f"{metric}_vs_{axis}", "", result.caption, confidence)


def _curves(
    groups: Mapping[str, Sequence[Sequence[dict[str, Any]]]],
    axis: str,
    metric: str,
    out_dir: str,
    title: str,
    caption: str,
    confidence: float,
) -> str:
    """``<metric>_vs_<axis>.png``: one curve per group of histories, its mean over them."""
    import matplotlib.pyplot as plt

    xcol, xlabel, scale = AXES[axis]
    ycol, ylabel = METRICS[metric]
    fig, ax = plt.subplots(figsize=(7, 4.6), dpi=100)
    smallest = math.inf
    for name, histories in groups.items():
        pts = mean_curve(histories, xcol, ycol, confidence)
        if not pts:
            continue
        xs = [x * scale for x, *_ in pts]
        (line,) = ax.plot(xs, [m for _, m, _, _ in pts], marker="o", markersize=2, label=name)
        _band(ax, xs, [lo for *_, lo, _ in pts], [hi for *_, hi in pts], line.get_color())
        smallest = min([smallest, *(x for x in xs if x > 0)])
    if axis != "step" and smallest < math.inf:
        ax.set_xscale("symlog", linthresh=smallest)
    ax.set_xlabel(xlabel + (" (log)" if axis != "step" else ""))
    ax.set_ylabel(ylabel)
    return _save(fig, ax, out_dir, f"{metric}_vs_{axis}", title, caption, confidence)


def plot_seed_curves(
    groups: Mapping[str, Sequence[Sequence[dict[str, Any]]]],
    out_dir: str,
    title: str = "",
    caption: str = "",
    metrics: Sequence[str] | None = None,
    confidence: float = 0.95,
) -> list[str]:
    """Write ``<out_dir>/<metric>_vs_<axis>.png`` for each ``METRICS``
    entry some run has (``metrics`` limits them) and each ``AXES`` entry:
    one curve per group (label -> the ``Trainer.history`` of each seed), the mean over the seeds
    at each validation (``mean_curve``) with its ``confidence`` interval as a band; return
    the paths."""
    import matplotlib

    matplotlib.use("Agg")
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for metric, (ycol, _) in METRICS.items():
        if metrics is not None and metric not in metrics:
            continue
        if any(ycol in r for hs in groups.values() for h in hs for r in h):
            paths += [_curves(groups, axis, metric, out_dir, title, caption, confidence) for axis in AXES]
    return paths


def plot_sweep(result: Sweep, confidence: float = 0.95) -> list[str]:
    """Write into ``result.out_dir`` and return the paths of, for the validation loss (and the
    accuracy, for a classifier): ``<metric>_vs_<name>.png`` for each grid name with two values
    or more (mean over seeds against the name's values, one curve per strategy and other grid
    values, a strategy the name does not apply to as a dashed constant), and
    ``<metric>_vs_step|bytes|sim_time.png`` (one curve per strategy and grid point, its mean over
    seeds at each validation). Every curve has its ``confidence`` interval as a shaded band."""
    import matplotlib

    matplotlib.use("Agg")
    os.makedirs(result.out_dir, exist_ok=True)
    paths = []
    for metric in METRICS:
        if any(r.get(f"{metric}_mean") is not None for r in result.summary):
            paths += [p for axis in result.axes if (p := _against_axis(result, axis, metric, confidence))]
    groups: dict[str, list[list[dict[str, Any]]]] = {}
    for r in result.runs:
        groups.setdefault(_point_name(r, result.axes), []).append(result.histories[r["label"]])
    return paths + plot_seed_curves(groups, result.out_dir, caption=result.caption, confidence=confidence)
