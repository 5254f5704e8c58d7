"""Comparison plots: validation loss against steps, bytes sent and simulated time (PNG)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

#: plot file stem -> (x column, x label, x scale)
AXES = {
    "val_loss_vs_step": ("step", "step", 1.0),
    "val_loss_vs_bytes": ("bytes_sent", "MB sent per node", 1e-6),
    "val_loss_vs_sim_time": ("sim_time", "simulated seconds", 1.0),
}


def plot_comparison(histories: Mapping[str, Sequence[dict[str, Any]]], out_dir: str, title: str = "") -> list[str]:
    """Write one PNG per entry of :data:`AXES` with a validation-loss curve per run; return paths.

    ``histories`` maps a run's label to its ``Trainer.history`` rows.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for stem, (col, label, scale) in AXES.items():
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        for name, rows in histories.items():
            pts = [(r[col] * scale, r["val_loss_global"]) for r in rows if "val_loss_global" in r and col in r]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o", markersize=3, label=name)
        if col == "bytes_sent":
            ax.set_xscale("symlog", linthresh=1e-3)
        ax.set_xlabel(label)
        ax.set_ylabel("validation loss (average model)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        path = os.path.join(out_dir, f"{stem}.png")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
