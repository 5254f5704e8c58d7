"""Time to target: when a run's average model first reached a validation loss.

The comparison a decentralized-training paper makes: not the loss after N steps, but what it
cost to get to a given loss. ``time_to_target`` reads a run's ``Trainer.history`` rows (or a
``metrics.csv`` read back as dicts) and returns the simulated seconds, steps and MB sent per
node at which ``val_loss_global`` first reached the target, interpolated linearly between the
two validations around the crossing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Columns ``target_columns`` adds to a summary row.
TARGET_COLUMNS = ("target_sim_time", "target_steps", "target_mb_per_node")


@dataclass(frozen=True)
class Reached:
    """Where a run first reached a target validation loss.

    Attributes:
        sim_time: simulated seconds.
        steps: training steps (a fraction when interpolated between validations).
        mb_per_node: MB (1e6 bytes) sent per node.
    """

    sim_time: float
    steps: float
    mb_per_node: float


def time_to_target(rows: Iterable[Mapping[str, Any]], target: float) -> Reached | None:
    """Where the average model's validation loss (``val_loss_global``) first reached ``target``
    (``<= target``), or ``None`` if it never did.

    The validation rows (those with ``val_loss_global``; their ``step``, ``sim_time`` and
    ``bytes_sent`` are read) are taken in order. If the first is at or below ``target``, its
    values are returned. Otherwise, for the first pair of consecutive validations with losses
    ``l0 > target >= l1``, at ``f = (l0 - target) / (l0 - l1)`` of the way from the first to
    the second: ``x = x0 + f (x1 - x0)`` for each of simulated seconds, steps and bytes. Values
    in the rows may be numbers or numeric strings (a CSV read back); ``ValueError`` when
    ``target`` is not a finite number.
    """
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target):
        raise ValueError(f"target loss must be a finite number, got {target!r}")
    points = [
        (float(r["val_loss_global"]), float(r["sim_time"]), float(r["step"]), float(r["bytes_sent"]))
        for r in rows
        if r.get("val_loss_global") not in (None, "")
    ]
    previous = None
    for point in points:
        loss, t, step, sent = point
        if loss <= target:
            if previous is None:
                return Reached(t, step, sent / 1e6)
            l0, t0, s0, b0 = previous
            f = (l0 - target) / (l0 - loss)
            return Reached(t0 + f * (t - t0), s0 + f * (step - s0), (b0 + f * (sent - b0)) / 1e6)
        previous = point
    return None


def target_columns(rows: Iterable[Mapping[str, Any]], target: float) -> dict[str, float | None]:
    """``TARGET_COLUMNS`` of a summary row: ``time_to_target``'s values, or ``None``
    each (an empty cell) when the run never reached ``target``."""
    reached = time_to_target(rows, target)
    if reached is None:
        return dict.fromkeys(TARGET_COLUMNS)
    return dict(zip(TARGET_COLUMNS, (reached.sim_time, reached.steps, reached.mb_per_node), strict=True))


__all__ = ["TARGET_COLUMNS", "Reached", "target_columns", "time_to_target"]
