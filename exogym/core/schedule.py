"""Learning-rate schedules a Strategy can own, by name or as any torch scheduler class."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

#: Spellings accepted for ``lr_scheduler`` (``'cosine'`` means lambda_cosine with annealing).
SCHEDULES = ("lambda_cosine", "cosine", "constant")


def lambda_cosine(
    max_steps: int, warmup_steps: int = 0, cosine_anneal: bool = True, min_lr_factor: float = 0.1
) -> Callable[[int], float]:
    """LR factor for step ``s``: linear warmup ``(s+1)/warmup_steps``, then a cosine from 1 to
    ``min_lr_factor`` at ``max_steps`` (or a flat 1 when ``cosine_anneal`` is False)."""
    if warmup_steps < 0 or not 0.0 <= min_lr_factor <= 1.0:
        raise ValueError(f"need warmup_steps >= 0 and 0 <= min_lr_factor <= 1, got {warmup_steps}, {min_lr_factor}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if not cosine_anneal:
            return 1.0
        span = max(1, max_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_lr_factor + (1.0 - min_lr_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def check_scheduler(spec: str | type[LRScheduler] | None, kwargs: dict[str, Any]) -> None:
    """Raise early (in the parent) for an unknown schedule name or keyword."""
    if spec is None or spec == "constant":
        if kwargs and spec == "constant":
            raise TypeError(f"lr_scheduler='constant' takes no lr_scheduler_kwargs, got {sorted(kwargs)}")
        return
    if isinstance(spec, str):
        if spec not in SCHEDULES:
            raise ValueError(f"unknown lr_scheduler {spec!r}; use one of {SCHEDULES} or a torch LRScheduler class")
        allowed = {"warmup_steps", "cosine_anneal", "min_lr_factor"}
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise TypeError(f"lr_scheduler={spec!r} got unexpected keyword(s) {unknown}; valid: {sorted(allowed)}")
        return
    if not (isinstance(spec, type) and issubclass(spec, LRScheduler)):
        raise TypeError(f"lr_scheduler must be a name in {SCHEDULES}, a torch LRScheduler class or None, got {spec!r}")


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    spec: str | type[LRScheduler] | None,
    kwargs: dict[str, Any],
    max_steps: int,
) -> LRScheduler | None:
    """The scheduler for ``optimizer``, stepped once per training step; ``None`` for constant LR."""
    check_scheduler(spec, kwargs)
    if spec is None or spec == "constant":
        return None
    if isinstance(spec, str):
        kw = dict(kwargs)
        if spec == "cosine":
            kw.setdefault("cosine_anneal", True)
        return LambdaLR(optimizer, lambda_cosine(max_steps, **kw))
    return spec(optimizer, **kwargs)
