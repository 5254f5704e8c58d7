"""``NoLoCoStrategy``: local steps, then an outer step averaged with one random peer."""

from __future__ import annotations

from typing import Any

from communicators.noloco import NoLoCoCommunicator
from exogym.compat import legacy_keywords
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.core.strategy import check_strategy_kwargs


@legacy_keywords
class NoLoCoStrategy(CommunicateOptimizeStrategy):
    """NoLoCo (Kolehmainen et al. 2025): no all-reduce over the world; every ``H`` steps each node
    averages with one peer drawn from the shared seed (a random perfect matching per round) and
    takes a momentum outer step whose extra term pulls its outer weights towards its peer's (see
    ``communicators.noloco``). The nodes' models are not made equal: ``fit`` returns their
    average.

    Pipeline: ``[NoLoCoCommunicator(H, outer_lr, outer_momentum, gamma)]``.

    Args:
        H: inner steps between outer steps (default 50, as in the paper's runs).
        outer_lr: the outer learning rate beta (default 0.7).
        outer_momentum: the outer momentum alpha (default 0.5).
        gamma: the pull towards the peer's outer weights (default ``outer_lr``: then only the
            local weights are sent).
        **strategy_kwargs: ``optim_spec`` (alias ``inner_optim``), ``lr``, ``lr_scheduler``,
            ``lr_scheduler_kwargs``, ``warmup_steps``, ``max_norm``, as for ``Strategy``.
    """

    def __init__(
        self,
        H: int = 50,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.5,
        gamma: float | None = None,
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        super().__init__([NoLoCoCommunicator(H, outer_lr, outer_momentum, gamma)], **strategy_kwargs)


__all__ = ["NoLoCoCommunicator", "NoLoCoStrategy"]
