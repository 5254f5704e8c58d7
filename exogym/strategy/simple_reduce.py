"""``SimpleReduceStrategy``: DDP, i.e. gradients averaged over all nodes every step."""

from __future__ import annotations

from typing import Any

from torch.optim.lr_scheduler import LRScheduler

from communicators.averaging import AveragingCommunicator
from exogym.core.optim import OptimSpec
from exogym.core.pipeline import CommunicateOptimizeStrategy


class SimpleReduceStrategy(CommunicateOptimizeStrategy):
    """Data-parallel training: one all-reduce (mean) of the flattened gradients per step, then the
    inner optimizer step. Equivalent to PyTorch DDP.

    Pipeline: ``[AveragingCommunicator(H=1, target="grads")]``. Arguments as for
    :class:`~exogym.core.strategy.Strategy`.
    """

    def __init__(
        self,
        optim_spec: OptimSpec | str | None = None,
        lr_scheduler: str | type[LRScheduler] | None = None,
        lr_scheduler_kwargs: dict[str, Any] | None = None,
        max_norm: float | None = None,
        *,
        inner_optim: OptimSpec | str | None = None,
        lr: float | None = None,
        warmup_steps: int | None = None,
    ) -> None:
        super().__init__(
            [AveragingCommunicator(H=1, target="grads")],
            optim_spec, lr_scheduler, lr_scheduler_kwargs, max_norm,
            inner_optim=inner_optim, lr=lr, warmup_steps=warmup_steps,
        )
