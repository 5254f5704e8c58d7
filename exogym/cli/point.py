"""One run of a comparison or a sweep: a task, a strategy and the run's settings, through ``fit``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from exogym.core.comm.network import Network
from exogym.core.strategy import Strategy
from exogym.logger import CSVLogger
from exogym.partition import Partition
from exogym.tasks import Task
from exogym.trainer import Trainer

__all__ = ["PointRun", "run_point"]


class PointRun(NamedTuple):
    """What ``run_point`` returns."""

    #: The run's ``Trainer.history`` (empty on a torchrun rank other than 0).
    history: list[dict[str, Any]]
    #: Its wall seconds.
    wall: float
    #: ``Trainer.result["nodes"]``: every node's simulated compute, communication and waiting
    #: seconds, clock and utilisation (empty on a torchrun rank other than 0).
    nodes: list[dict[str, float]]
    #: ``Trainer.result["summary"]``: what the strategy reports of the run (the asynchronous
    #: ones: every node's steps, the updates' staleness); ``{}`` for the others.
    summary: dict[str, Any] = {}


def run_point(
    spec: Task,
    strategy: Strategy,
    *,
    name: str,
    log_dir: str | None,
    nodes: int,
    steps: int,
    batch_size: int,
    network: Network,
    seed: int,
    val_size: int,
    progress: bool,
    device: str = "cpu",
    workers: int | None = None,
    partition: Partition | None = None,
    fit_args: Mapping[str, Any] | None = None,
) -> PointRun:
    """Train ``strategy`` on ``spec`` from the model ``torch.manual_seed(seed)`` builds; return
    the run's history, wall seconds and nodes' clocks (``PointRun``).

    Every run of [`exogym.cli.compare.compare`][exogym.cli.compare.compare] and
    [`exogym.cli.sweep.sweep`][exogym.sweep] goes through here, so the same arguments make the same
    run either way. ``log_dir``: the run's ``metrics.csv`` goes to ``<log_dir>/<name>`` (``None``:
    no files). ``fit_args``: further ``Trainer.fit`` keywords.

    Raises:
        Whatever ``Trainer.fit`` raises.
    """
    torch.manual_seed(seed)
    trainer = Trainer(spec.make_model(), spec.train if partition is None else partition, spec.val)
    t0 = time.perf_counter()
    trainer.fit(
        strategy,
        num_nodes=nodes,
        workers=workers,
        max_steps=steps,
        batch_size=batch_size,
        device=device,
        network=network,
        logger=False if log_dir is None else CSVLogger(log_dir, versions=False),
        run_name=name,
        val_size=min(val_size, len(spec.val)),
        seed=seed,
        progress=progress,
        **dict(fit_args or {}),
    )
    result = trainer.result
    return PointRun(trainer.history, time.perf_counter() - t0, result.get("nodes", []), result.get("summary", {}))
