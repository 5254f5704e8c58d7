"""``SimpleReduceStrategy``: DDP, i.e. gradients averaged over all nodes every step."""

from __future__ import annotations

from typing import Any

from communicators.aggregation import Rule
from communicators.averaging import AveragingCommunicator
from exogym.compat import legacy_keywords
from exogym.core.optim import OptimSpec
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.core.strategy import check_strategy_kwargs
from exogym.privacy import DifferentialPrivacy


@legacy_keywords
class SimpleReduceStrategy(CommunicateOptimizeStrategy):
    """Data-parallel training: one all-reduce (mean) of the flattened gradients per step, then the
    inner optimizer step. Equivalent to PyTorch DDP.

    Pipeline: ``[AveragingCommunicator(H=1, target="grads")]``.

    Args:
        optim_spec: the inner optimizer (alias ``inner_optim``).
        aggregate: how the gradients are combined
            ([`communicators.aggregation`][communicators.aggregation]): ``"mean"`` (default, the
            all-reduce), a robust rule (an all-gather) or one of your own.
        privacy: differential privacy of each node's gradients
            ([`DifferentialPrivacy`][exogym.privacy.DifferentialPrivacy]); ``None``: none.
        **strategy_kwargs: ``lr``, ``lr_scheduler``, ``lr_scheduler_kwargs``, ``warmup_steps``,
            ``max_norm``, ``inner_optim``, as for ``Strategy``.
    """

    def __init__(
        self,
        optim_spec: OptimSpec | str | None = None,
        aggregate: str | Rule = "mean",
        privacy: DifferentialPrivacy | None = None,
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        averaging = AveragingCommunicator(H=1, target="grads", aggregate=aggregate, privacy=privacy)
        super().__init__([averaging], optim_spec, **strategy_kwargs)
