"""Run several strategies on one task and compare loss against steps, bytes and simulated time."""

from __future__ import annotations

import csv
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import torch

from exogym.cli.plots import plot_comparison
from exogym.core.comm.network import resolve_network
from exogym.logger import CSVLogger
from exogym.strategy.registry import build
from exogym.tasks import load_task
from exogym.trainer import Trainer

logger = logging.getLogger(__name__)

#: Columns of ``summary.csv`` (and of the printed table).
SUMMARY_COLUMNS = ("strategy", "val_loss", "val_accuracy", "bytes_sent_per_node", "sim_time", "wall_time", "steps")


def compare(
    task: str,
    strategies: Sequence[str],
    nodes: int = 4,
    steps: int = 200,
    batch_size: int = 32,
    lr: float | None = None,
    H: int = 20,
    network: str = "internet",
    out_dir: str = "exogym_runs/compare",
    device: str = "cpu",
    data_dir: str = "data",
    seed: int = 42,
    val_size: int = 512,
    progress: bool = True,
    workers: int | None = None,
) -> list[dict[str, Any]]:
    """Train each preset in ``strategies`` on ``task`` from the same initial model; write each
    run's ``<out_dir>/<strategy>/metrics.csv``, ``<out_dir>/summary.csv`` and the plots of
    :func:`exogym.cli.plots.plot_comparison`; return the summary rows (:data:`SUMMARY_COLUMNS`).
    ``workers``: processes hosting the ``nodes`` (default: ``fit``'s, one per core)."""
    spec = load_task(task, data_dir)
    net = resolve_network(network)
    histories: dict[str, list[dict[str, Any]]] = {}
    summary = []
    for i, name in enumerate(strategies):
        strategy = build(name, lr or spec.lr, H)  # unknown names fail before any training
        logger.info(
            "[%d/%d] %s on %s: %d nodes x %d steps, network %s",
            i + 1,
            len(strategies),
            name,
            task,
            nodes,
            steps,
            net.name,
        )
        torch.manual_seed(seed)
        trainer = Trainer(spec.make_model(), spec.train, spec.val)
        t0 = time.perf_counter()
        trainer.fit(
            strategy,
            num_nodes=nodes,
            workers=workers,
            max_steps=steps,
            batch_size=batch_size,
            device=device,
            network=net,
            logger=CSVLogger(out_dir),
            run_name=name,
            val_size=min(val_size, len(spec.val)),
            seed=seed,
            progress=progress,
        )
        wall = time.perf_counter() - t0
        histories[name] = trainer.history
        last_val = [r for r in trainer.history if "val_loss_global" in r][-1]
        last_train = [r for r in trainer.history if "train_loss" in r][-1]
        summary.append(
            {
                "strategy": name,
                "val_loss": last_val["val_loss_global"],
                "val_accuracy": last_val.get("val_accuracy_global"),
                "bytes_sent_per_node": last_train["bytes_sent"],
                "sim_time": last_train["sim_time"],
                "wall_time": wall,
                "steps": last_train["step"],
            }
        )
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "summary.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
        writer.writeheader()
        writer.writerows(summary)
    plot_comparison(histories, out_dir, title=f"{task}, {nodes} nodes, network {net.name}")
    return summary


def format_table(summary: Sequence[dict[str, Any]]) -> str:
    """The summary as an aligned text table."""
    head = f"{'strategy':<16}{'val loss':>10}{'accuracy':>10}{'MB sent/node':>14}{'sim time s':>12}{'wall s':>9}"
    lines = [head, "-" * len(head)]
    for r in summary:
        acc = "-" if r["val_accuracy"] is None else f"{r['val_accuracy']:.3f}"
        lines.append(
            f"{r['strategy']:<16}{r['val_loss']:>10.4f}{acc:>10}{r['bytes_sent_per_node'] / 1e6:>14.2f}"
            f"{r['sim_time']:>12.2f}{r['wall_time']:>9.1f}"
        )
    return "\n".join(lines)
