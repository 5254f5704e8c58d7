"""Loggers: where rank 0 writes the metrics of a run.

A logger is configured in the user's process, pickled into the nodes, and used by rank 0 only
(every rank holds the same aggregated metrics; rank 0 only logs).
[`CSVLogger`][exogym.logger.CSVLogger] is the default; [`WandbLogger`][exogym.logger.WandbLogger]
and [`TensorBoardLogger`][exogym.logger.TensorBoardLogger] need their extras.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from typing import Any, Protocol

from exogym import runs
from exogym.metrics import COLUMNS
from exogym.runs import check_name

logger = logging.getLogger(__name__)


class Logger(Protocol):
    """What the training loop calls on rank 0."""

    def start(self, run_name: str, config: dict[str, Any]) -> None:
        """Begin a run; ``config`` holds the run's settings."""

    def log(self, metrics: dict[str, Any]) -> None:
        """Record one row of metrics (keys from ``exogym.metrics.COLUMNS``)."""

    def finish(self) -> None:
        """Flush and close."""


class CSVLogger:
    """Writes a run's ``metrics.csv`` (the columns of ``exogym.metrics.COLUMNS``;
    ``nodes_alive`` only for runs that drop nodes, by their faults or an availability trace) and
    ``config.json`` into a folder of its own, ``<save_dir>/<run_name>/version_N`` (N one more than
    the highest there), and points ``<save_dir>/<run_name>/latest`` at it: a run never overwrites
    another's files.

    Args:
        save_dir: parent folder of the run folders.
        versions: ``False`` writes straight into ``<save_dir>/<run_name>``, which must not exist
            yet (for a caller that gives each run a new folder itself, as ``compare`` does).

    Attributes:
        run_dir, path: the run's folder and its ``metrics.csv``, set by ``start`` in the
            process that logs (rank 0's node, which has a copy of the logger you passed to
            ``fit``); from your script, ``<save_dir>/<run_name>/latest`` names the folder.
    """

    def __init__(self, save_dir: str = "exogym_runs", versions: bool = True) -> None:
        self.save_dir, self.versions = save_dir, versions
        self.run_dir: str | None = None
        self.path: str | None = None
        self._file: Any = None

    def start(self, run_name: str, config: dict[str, Any]) -> None:
        parent = os.path.join(self.save_dir, check_name(run_name, "run_name"))
        if self.versions:
            run_dir = runs.new_version(parent)
        else:
            try:
                os.makedirs(parent)
            except FileExistsError:
                raise FileExistsError(
                    f"{parent} exists: CSVLogger(versions=False) writes only into a new folder, so that no run "
                    "overwrites another's; pick another run_name, or keep versions=True"
                ) from None
            run_dir = parent
        with runs.atomic_path(os.path.join(run_dir, "config.json")) as tmp, open(tmp, "w") as f:
            json.dump(config, f, indent=2, default=str)
        self.run_dir, self.path = run_dir, os.path.join(run_dir, "metrics.csv")
        self._file = open(self.path, "w", newline="")  # noqa: SIM115 - closed in finish()
        faults = config.get("faults") or {}
        drops = bool(faults.get("drop_probability") or any(faults.get("drop", {}).values()))
        self._columns = [c for c in COLUMNS if c != "nodes_alive" or drops]  # only runs that drop nodes
        self._writer = csv.DictWriter(self._file, fieldnames=self._columns)
        self._writer.writeheader()
        logger.debug("writing metrics to %s", self.path)

    def log(self, metrics: dict[str, Any]) -> None:
        unknown = set(metrics) - set(self._columns)
        if unknown:
            raise KeyError(f"CSVLogger got metrics {sorted(unknown)} that are not among its columns {self._columns}")
        self._writer.writerow(metrics)
        self._file.flush()

    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class WandbLogger:
    """Logs to Weights & Biases (the ``[wandb]`` extra). Works offline with ``WANDB_MODE=offline``
    or ``mode="offline"`` (files under ``save_dir/wandb``).

    Args:
        project: the W&B project.
        experiment_name: the run's name (default: the run name of ``fit``).
        entity: the W&B entity (team or user), if not the default.
        mode: ``"online"``, ``"offline"`` or ``"disabled"``; ``None`` follows ``WANDB_MODE``.
        save_dir: where W&B keeps its files.
    """

    def __init__(
        self,
        project: str,
        experiment_name: str | None = None,
        entity: str | None = None,
        mode: str | None = None,
        save_dir: str = "exogym_runs",
    ) -> None:
        try:
            import wandb  # noqa: F401
        except ImportError as e:
            raise ImportError("WandbLogger needs wandb: pip install 'exogym[wandb]'") from e
        self.project, self.experiment_name, self.entity, self.mode, self.save_dir = (
            project,
            experiment_name,
            entity,
            mode,
            save_dir,
        )
        self._run: Any = None

    def start(self, run_name: str, config: dict[str, Any]) -> None:
        import wandb

        os.makedirs(self.save_dir, exist_ok=True)
        self._run = wandb.init(
            project=self.project,
            name=self.experiment_name or run_name,
            entity=self.entity,
            mode=self.mode,
            dir=self.save_dir,
            config=json.loads(json.dumps(config, default=str)),
            reinit=True,
        )

    def log(self, metrics: dict[str, Any]) -> None:
        self._run.log({k: v for k, v in metrics.items() if k != "step" and v is not None}, step=int(metrics["step"]))

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


class TensorBoardLogger:
    """Writes TensorBoard event files to a folder of the run's own,
    ``<log_dir>/<run_name>/version_N``, with ``<log_dir>/<run_name>/latest`` naming the newest
    (the ``[tensorboard]`` extra).

    Args:
        log_dir: parent folder of the run folders.
    """

    def __init__(self, log_dir: str = "exogym_runs") -> None:
        try:
            import tensorboard  # noqa: F401
        except ImportError as e:
            raise ImportError("TensorBoardLogger needs tensorboard: pip install 'exogym[tensorboard]'") from e
        self.log_dir = log_dir
        self._writer: Any = None

    def start(self, run_name: str, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(runs.new_version(os.path.join(self.log_dir, check_name(run_name, "run_name"))))
        self._writer.add_text("config", json.dumps(config, indent=2, default=str))

    def log(self, metrics: dict[str, Any]) -> None:
        step = int(metrics["step"])
        for k, v in metrics.items():
            if k != "step" and v is not None:
                self._writer.add_scalar(k, v, step)

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


#: Logger names ``fit(logger=...)`` accepts, each built with its defaults.
LOGGER_NAMES = ("csv", "wandb", "tensorboard")


def resolve_logger(logger: Any) -> Any:
    """``fit(logger=...)``: ``None`` (a [`CSVLogger`][exogym.logger.CSVLogger]), ``False`` (none), a
    name in ``LOGGER_NAMES``, or an object with ``start``, ``log`` and ``finish``. Raises before any
    process starts otherwise."""
    if logger is None:
        return CSVLogger()
    if logger is False:
        return None
    if isinstance(logger, str):
        if logger == "csv":
            return CSVLogger()
        if logger == "wandb":
            return WandbLogger(project="exogym")
        if logger == "tensorboard":
            return TensorBoardLogger()
        raise ValueError(f"logger must be one of {LOGGER_NAMES}, a Logger object, None or False; got {logger!r}")
    missing = [m for m in ("start", "log", "finish") if not callable(getattr(logger, m, None))]
    if missing:
        raise TypeError(
            f"logger must have start(), log() and finish() (see exogym.logger.Logger); "
            f"{type(logger).__name__} lacks {', '.join(missing)}"
        )
    return logger


def default_run_name(strategy_name: str) -> str:
    """The strategy's name: each run of it gets a ``version_N`` folder under it (see
    [`CSVLogger`][exogym.logger.CSVLogger])."""
    return strategy_name


__all__ = ["CSVLogger", "Logger", "TensorBoardLogger", "WandbLogger"]
