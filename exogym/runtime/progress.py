"""Rank 0's progress bar: the steps done and, beside them, the loss."""

from __future__ import annotations

import threading
from typing import Any


class Progress:
    """The run's progress bar (shown only where ``enabled``: on rank 0 with ``fit(progress=True)``).

    Beside the step count it shows the training loss of a lock-step run: rank 0's at every
    train row, the row's (the nodes' mean) as metric rows come in.
    """

    def __init__(self, total: int, enabled: bool) -> None:
        from tqdm.auto import tqdm

        # tqdm's default lock is a multiprocessing semaphore; nodes end with os._exit, which would
        # leave it registered with the resource tracker. A thread lock is all one process needs.
        tqdm.set_lock(threading.RLock())
        self._bar = tqdm(total=total, desc="train", unit="step", dynamic_ncols=True, disable=not enabled)
        self._postfix: dict[str, str] = {}

    def resumed(self, step: int) -> None:
        """The run resumes after ``step`` steps: count them as done."""
        self._bar.update(step)

    def loss(self, done: int, log_interval: int, loss: float) -> None:
        """Rank 0's training loss of the step that ends at ``done`` (shown at train rows)."""
        if done % log_interval == 0:
            self._postfix["loss"] = f"{loss:.4f}"

    def row(self, row: dict[str, Any]) -> None:
        """A train row came in: its loss (the nodes' mean)."""
        if row["train_loss"] == row["train_loss"]:  # (not NaN: some node trained in the row)
            self._postfix["loss"] = f"{row['train_loss']:.4f}"

    def advance(self, step: int, done: int) -> None:
        """The work from ``step`` to ``done`` is done."""
        if self._postfix:
            self._bar.set_postfix(self._postfix, refresh=False)
        self._bar.update(done - step)

    def close(self) -> None:
        """The run has ended."""
        self._bar.close()


__all__ = ["Progress"]
