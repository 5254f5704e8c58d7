"""Optimizer restarts: drop an optimizer's state every N steps (``OptimSpec(..., restart_every=N)``).

Outer-momentum restarts (Topollai et al. 2026, arXiv 2605.28585) reset the outer optimizer's
momentum of a DiLoCo-family method every N outer steps: the stale momentum is discarded while
the parameters keep the progress made. In general form, ``restart_every`` clears an
optimizer's per-parameter state before its steps ``N+1, 2N+1, ...``, so each of those steps
starts as the first step did: SGD's momentum buffer restarts from the step's gradient (the
zero buffer of the paper, after one update), an Adam-family optimizer's moments and step count
from zero.

The count of steps since the last restart lives in each parameter group
(``"steps_since_restart"``), so the optimizer's own ``state_dict`` carries it and a resumed run
restarts at the same steps; the period is the spec's (a group loaded without a count starts
from zero).
"""

from __future__ import annotations

from typing import Any

import torch


def restart_every(optimizer: torch.optim.Optimizer, every: int) -> torch.optim.Optimizer:
    """Make ``optimizer`` drop its per-parameter state before every ``every``-th step after the
    first (steps ``every + 1``, ``2 * every + 1``, ...); returns ``optimizer``.

    Raises:
        ValueError: ``every`` is not a positive int.
    """
    check_restart_every(every)
    for group in optimizer.param_groups:
        group["steps_since_restart"] = 0

    def before_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in opt.param_groups:
            if group.get("steps_since_restart", 0) >= every:
                for p in group["params"]:
                    opt.state.pop(p, None)
                group["steps_since_restart"] = 0
            group["steps_since_restart"] = group.get("steps_since_restart", 0) + 1

    optimizer.register_step_pre_hook(before_step)
    return optimizer


def check_restart_every(every: Any) -> None:
    """Raise ``ValueError`` naming ``restart_every`` unless it is a positive int or ``None``."""
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise ValueError(
            f"restart_every must be a positive int (steps between restarts of the optimizer's state) or None, "
            f"got {every!r}"
        )


__all__ = ["check_restart_every", "restart_every"]
