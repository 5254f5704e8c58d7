"""``EagerDiLoCoStrategy``: DiLoCo whose outer all-reduce overlaps the next inner phase."""

from __future__ import annotations

from typing import Any

from communicators.aggregation import Rule
from communicators.eager import EagerDiLoCoCommunicator
from exogym.compat import legacy_keywords
from exogym.core.optim import OptimSpec
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.core.strategy import check_strategy_kwargs
from exogym.strategy.diloco import inner_lr_alias, outer_spec


@legacy_keywords
class EagerDiLoCoStrategy(CommunicateOptimizeStrategy):
    """DiLoCo with eager updates (Kale et al. 2025): every ``H`` steps each node sends its
    pseudo-gradient to an all-reduce that overlaps the next ``H`` steps, and steps its outer
    optimizer at once on its own fresh share plus the other nodes' shares of the previous
    round's mean (see ``communicators.eager``). The nodes' models differ by their own last
    shares: ``fit`` returns their average.

    Pipeline: ``[EagerDiLoCoCommunicator(H, outer)]``.

    Args:
        H: inner steps between outer steps (default 100).
        outer_optim, outer_lr, outer_momentum, nesterov: the outer optimizer, as for
            [`DiLoCoStrategy`][exogym.strategy.DiLoCoStrategy] (``'sgd'``: Nesterov SGD, lr 0.7,
            momentum 0.9; ``'sgd_normalized'`` is refused).
        aggregate: how the pseudo-gradients are combined (``"mean"``, default, or a robust rule
            of [`communicators.aggregation`][communicators.aggregation], which gathers them; see
            [`EagerDiLoCoCommunicator`][communicators.EagerDiLoCoCommunicator]).
        inner_lr: alias of ``lr``.
        **strategy_kwargs: ``optim_spec`` (alias ``inner_optim``), ``lr``, ``lr_scheduler``,
            ``lr_scheduler_kwargs``, ``warmup_steps``, ``max_norm``, as for ``Strategy``.
    """

    def __init__(
        self,
        H: int = 100,
        outer_optim: str | OptimSpec = "sgd",
        outer_lr: float | None = None,
        outer_momentum: float | None = None,
        nesterov: bool | None = None,
        aggregate: str | Rule = "mean",
        inner_lr: float | None = None,
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        spec, normalize = outer_spec(outer_optim, outer_lr, outer_momentum, nesterov)
        if normalize:
            raise ValueError("outer_optim='sgd_normalized' is not available for eager DiLoCo; use 'sgd'")
        module = EagerDiLoCoCommunicator(H, spec, aggregate=aggregate)
        super().__init__([module], **inner_lr_alias(strategy_kwargs, inner_lr))


__all__ = ["EagerDiLoCoCommunicator", "EagerDiLoCoStrategy"]
