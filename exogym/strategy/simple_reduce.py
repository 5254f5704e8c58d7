"""``SimpleReduceStrategy``: DDP, i.e. gradients averaged over all nodes every step."""

from __future__ import annotations

from typing import Any

from communicators.averaging import AveragingCommunicator
from exogym.compat import legacy_keywords
from exogym.core.optim import OptimSpec
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.core.strategy import check_strategy_kwargs


@legacy_keywords
class SimpleReduceStrategy(CommunicateOptimizeStrategy):
    """Data-parallel training: one all-reduce (mean) of the flattened gradients per step, then the
    inner optimizer step. Equivalent to PyTorch DDP.

    Pipeline: ``[AveragingCommunicator(H=1, target="grads")]``.

    Args:
        optim_spec: the inner optimizer (alias ``inner_optim``).
        **strategy_kwargs: ``lr``, ``lr_scheduler``, ``lr_scheduler_kwargs``, ``warmup_steps``,
            ``max_norm``, ``inner_optim``, as for ``Strategy``.
    """

    def __init__(self, optim_spec: OptimSpec | str | None = None, **strategy_kwargs: Any) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        super().__init__([AveragingCommunicator(H=1, target="grads")], optim_spec, **strategy_kwargs)
