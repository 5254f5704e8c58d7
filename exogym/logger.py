"""Loggers: where rank 0 writes the metrics of a run.

A logger is configured in the user's process, pickled into the nodes, and used by rank 0 only
(every rank holds the same aggregated metrics; rank 0 only logs). :class:`CSVLogger` is the
default.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import time
from typing import Any, Protocol

logger = logging.getLogger(__name__)

#: Columns of the per-run metrics CSV (a row fills the ones it has; the rest stay empty).
COLUMNS = (
    "step",
    "examples",
    "train_loss",
    "val_loss_local",
    "val_loss_global",
    "lr",
    "bytes_sent",
    "bytes_received",
    "step_time",
    "compute_time",
    "comm_time",
    "wall_time",
)


class Logger(Protocol):
    """What the training loop calls on rank 0."""

    def start(self, run_name: str, config: dict[str, Any]) -> None:
        """Begin a run; ``config`` holds the run's settings."""

    def log(self, metrics: dict[str, Any]) -> None:
        """Record one row of metrics (keys from :data:`COLUMNS`)."""

    def finish(self) -> None:
        """Flush and close."""


class CSVLogger:
    """Writes ``<save_dir>/<run_name>/metrics.csv`` and ``config.json``.

    Args:
        save_dir: parent folder of the run folders.
    """

    def __init__(self, save_dir: str = "exogym_runs") -> None:
        self.save_dir = save_dir
        self.path: str | None = None
        self._file: Any = None

    def start(self, run_name: str, config: dict[str, Any]) -> None:
        run_dir = os.path.join(self.save_dir, run_name)
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.json"), "w") as f:
            json.dump(config, f, indent=2, default=str)
        self.path = os.path.join(run_dir, "metrics.csv")
        self._file = open(self.path, "w", newline="")  # noqa: SIM115 - closed in finish()
        self._writer = csv.DictWriter(self._file, fieldnames=COLUMNS)
        self._writer.writeheader()
        logger.info("writing metrics to %s", self.path)

    def log(self, metrics: dict[str, Any]) -> None:
        unknown = set(metrics) - set(COLUMNS)
        if unknown:
            raise KeyError(f"CSVLogger got metrics {sorted(unknown)} that are not in COLUMNS")
        self._writer.writerow(metrics)
        self._file.flush()

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def default_run_name(strategy_name: str) -> str:
    """``<strategy>-<YYYYmmdd-HHMMSS>-<pid>``: unique per program and second."""
    return f"{strategy_name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
