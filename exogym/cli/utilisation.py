"""Per-node simulated time of compared runs: ``utilisation.csv`` and a bar chart per node.

Every node's clock is its compute, its communication and the time it waited for others
(``exogym.clocks``); utilisation is compute over clock. Nodes of unequal speed, or
islands that meet apart, show here what a single ``sim_time`` hides.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence
from typing import Any

from exogym.runs import atomic_path

#: Columns of ``utilisation.csv``: one row per strategy and node.
COLUMNS = ("strategy", "rank", "compute", "comm", "wait", "clock", "utilisation")

#: Bars are drawn for at most this many nodes (the first ones by rank); the CSV has every node.
MAX_BARS = 64


def mean_utilisation(nodes: Sequence[Mapping[str, float]]) -> float:
    """The nodes' mean utilisation (compute / clock); ``nan`` without nodes."""
    return sum(n["utilisation"] for n in nodes) / len(nodes) if nodes else float("nan")


def write_utilisation(nodes: Mapping[str, Sequence[Mapping[str, float]]], out_dir: str) -> list[str]:
    """Write ``<out_dir>/utilisation.csv`` (``COLUMNS``) and ``utilisation.png`` (per node, a
    bar of compute, communication and waiting seconds stacked to its clock, one panel per
    strategy) for the runs in ``nodes`` (strategy -> ``Trainer.result["nodes"]``); return the
    paths written (none without nodes). Each file is written atomically."""
    runs = {name: rows for name, rows in nodes.items() if rows}
    if not runs:
        return []
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "utilisation.csv")
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for name, rows in runs.items():
            for r in rows:
                writer.writerow({"strategy": name, **{k: r[k] for k in COLUMNS[1:]}})
    return [path, _plot(runs, out_dir)]


def _plot(runs: Mapping[str, Sequence[Mapping[str, Any]]], out_dir: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 1.2 + 1.8 * len(runs)), dpi=100, squeeze=False)
    for ax, (name, rows) in zip(axes[:, 0], runs.items(), strict=True):
        shown = list(rows)[:MAX_BARS]
        ranks = [int(r["rank"]) for r in shown]
        bottom = [0.0] * len(shown)
        for part, colour in (("compute", "tab:blue"), ("comm", "tab:orange"), ("wait", "tab:gray")):
            values = [float(r[part]) for r in shown]
            ax.bar(ranks, values, bottom=bottom, color=colour, label=part if ax is axes[0, 0] else None)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        util = mean_utilisation(rows)
        more = f", first {len(shown)} of {len(rows)} nodes" if len(rows) > len(shown) else ""
        ax.set_title(f"{name}: mean utilisation {util:.0%}{more}", fontsize=9)
        ax.set_ylabel("simulated s")
    axes[-1, 0].set_xlabel("node")
    axes[0, 0].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    path = os.path.join(out_dir, "utilisation.png")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return path


__all__ = ["COLUMNS", "MAX_BARS", "mean_utilisation", "write_utilisation"]
