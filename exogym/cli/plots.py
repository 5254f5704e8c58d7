"""Comparison plots: validation loss (and accuracy) against steps, bytes sent and simulated time."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from exogym.runs import atomic_path

#: x-axis name -> (history column, axis label, scale to the label's unit). The bytes and
#: simulated-time axes are logarithmic (symlog, so the step-0 point at 0 stays on the plot).
AXES = {
    "step": ("step", "step", 1.0),
    "bytes": ("bytes_sent", "MB sent per node", 1e-6),
    "sim_time": ("sim_time", "simulated seconds", 1.0),
}

#: Units of the simulated-time axis, largest first: (seconds in one, name). A plot uses the
#: largest unit its longest run spans twice (hours for a run priced at a scale).
TIME_UNITS = ((86400.0, "days"), (3600.0, "hours"), (60.0, "minutes"), (1.0, "seconds"))


def time_unit(longest: float) -> tuple[float, str]:
    """``(seconds in the unit, its name)`` for a simulated-time axis whose longest run lasts
    ``longest`` seconds."""
    return next(((s, name) for s, name in TIME_UNITS if longest >= 2 * s), TIME_UNITS[-1])


#: y-axis name -> (history column, axis label).
METRICS = {
    "val_loss": ("val_loss_global", "validation loss (average model)"),
    "val_accuracy": ("val_accuracy_global", "validation accuracy (average model)"),
}


def plot_comparison(
    histories: Mapping[str, Sequence[dict[str, Any]]],
    out_dir: str,
    title: str = "",
    caption: str = "",
    metrics: Sequence[str] | None = None,
    target_loss: float | None = None,
) -> list[str]:
    """Write ``<out_dir>/<metric>_vs_<axis>.png`` (each atomically: a temporary file, then a
    rename) for every ``METRICS`` entry that some run
    has (accuracy needs a classifier) and every ``AXES`` entry, with one curve per run;
    return the paths.

    ``histories`` maps a run's label to its ``Trainer.history`` rows; ``caption`` (the settings)
    is written under each plot; ``metrics`` (names in ``METRICS``) limits the plots to those;
    ``target_loss`` draws a dashed horizontal line at that loss on the validation-loss plots.
    """
    unknown = set(metrics or ()) - set(METRICS)
    if unknown:
        raise ValueError(f"metrics: unknown {sorted(unknown)}; choose from {list(METRICS)}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for metric, (ycol, ylabel) in METRICS.items():
        if metrics is not None and metric not in metrics:
            continue
        if not any(ycol in r for rows in histories.values() for r in rows):
            continue
        for axis, (xcol, xlabel, scale) in AXES.items():
            if axis == "sim_time":  # in the unit the runs span: hours at a scale
                longest = max((r.get(xcol) or 0.0 for rows in histories.values() for r in rows), default=0.0)
                seconds, unit = time_unit(longest)
                xlabel, scale = f"simulated {unit}", 1.0 / seconds
            fig, ax = plt.subplots(figsize=(7, 4.6), dpi=100)
            smallest = float("inf")
            for name, rows in histories.items():
                pts = [(r[xcol] * scale, r[ycol]) for r in rows if ycol in r and xcol in r]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, ys, marker="o", markersize=3, label=name)
                    smallest = min([smallest, *(x for x in xs if x > 0)])
            if target_loss is not None and metric == "val_loss":
                ax.axhline(target_loss, color="0.3", linestyle="--", linewidth=1, label=f"target {target_loss:g}")
            if axis != "step" and smallest < float("inf"):
                ax.set_xscale("symlog", linthresh=smallest)  # linear up to the first point, then log
            ax.set_xlabel(xlabel + (" (log)" if axis != "step" else ""))
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            ax.grid(alpha=0.3)
            ax.legend()
            if caption:
                fig.text(0.01, 0.01, caption, fontsize=7, wrap=True, va="bottom")
                fig.tight_layout(rect=(0, 0.07, 1, 1))
            else:
                fig.tight_layout()
            path = os.path.join(out_dir, f"{metric}_vs_{axis}.png")
            with atomic_path(path) as tmp:
                fig.savefig(tmp, format="png")
            plt.close(fig)
            paths.append(path)
    return paths


def plot_label_histogram(counts: Any, out_dir: str, title: str = "") -> str:
    """Write ``<out_dir>/label_histogram.png``: one stacked bar per node of how many examples of
    each label it holds (``counts``: ``[nodes, classes]``, e.g. ``Partition.label_counts()``);
    return the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    counts = np.asarray(counts)
    nodes, classes = counts.shape
    fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * nodes + 2), 4.2), dpi=100)
    bottom = np.zeros(nodes)
    cmap = plt.get_cmap("tab10" if classes <= 10 else "tab20")
    for c in range(classes):
        ax.bar(range(nodes), counts[:, c], bottom=bottom, color=cmap(c % cmap.N), label=str(c), width=0.85)
        bottom += counts[:, c]
    ax.set_xlabel("node")
    ax.set_ylabel("examples")
    ax.set_title(title)
    if nodes <= 32:
        ax.set_xticks(range(nodes))
    if classes <= 20:
        ax.legend(title="label", fontsize=7, ncol=1 if classes <= 10 else 2, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    path = os.path.join(out_dir, "label_histogram.png")
    os.makedirs(out_dir, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path
