"""``DiLoCoStrategy``: H local steps, then an outer step on the averaged pseudo-gradient."""

from __future__ import annotations

from typing import Any

import torch

from communicators.aggregation import Rule
from communicators.diloco import DiLoCoCommunicator
from exogym.compat import legacy_keywords
from exogym.core.optim import OptimSpec
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.core.strategy import check_strategy_kwargs
from exogym.privacy import DifferentialPrivacy

OUTER_NAMES = ("sgd", "sgd_normalized")


def outer_spec(
    outer_optim: str | OptimSpec, outer_lr: float | None, outer_momentum: float | None, nesterov: bool | None
) -> tuple[OptimSpec, bool]:
    """(outer OptimSpec, normalize) from DiLoCo's constructor spellings.

    ``'sgd'`` is SGD with ``outer_lr`` (0.7), ``outer_momentum`` (0.9) and ``nesterov`` (True);
    ``'sgd_normalized'`` is the same applied to the unit-norm pseudo-gradient. An ``OptimSpec`` is
    used as given, and then the three scalars must be left out.
    """
    if isinstance(outer_optim, OptimSpec):
        if any(v is not None for v in (outer_lr, outer_momentum, nesterov)):
            raise TypeError(
                "outer_lr, outer_momentum and nesterov configure the 'sgd' outer optimizer; "
                "put them in the OptimSpec instead"
            )
        return outer_optim, False
    if outer_optim not in OUTER_NAMES:
        raise ValueError(f"outer_optim must be one of {OUTER_NAMES} or an OptimSpec, got {outer_optim!r}")
    lr = 0.7 if outer_lr is None else outer_lr
    momentum = 0.9 if outer_momentum is None else outer_momentum
    nest = (True if nesterov is None else nesterov) and momentum > 0
    return OptimSpec(torch.optim.SGD, lr=lr, momentum=momentum, nesterov=nest), outer_optim == "sgd_normalized"


def inner_lr_alias(strategy_kwargs: dict[str, Any], inner_lr: float | None) -> dict[str, Any]:
    """Fold ``inner_lr`` (the original exo gym's spelling) into ``lr``."""
    if inner_lr is None:
        return strategy_kwargs
    if strategy_kwargs.get("lr") is not None:
        raise TypeError("give the inner learning rate once: lr or its alias inner_lr, not both")
    return {**strategy_kwargs, "lr": inner_lr}


@legacy_keywords
class DiLoCoStrategy(CommunicateOptimizeStrategy):
    """DiLoCo (Douillard et al. 2023): every ``H`` steps the mean pseudo-gradient
    ``theta_global - theta_local`` drives an outer optimizer on every rank (no master rank).

    Pipeline: ``[DiLoCoCommunicator(H, outer, island_size)]``.

    Args:
        H: inner steps between synchronisations (default 100).
        outer_optim: ``'sgd'`` (default), ``'sgd_normalized'`` or an ``OptimSpec``.
        outer_lr: outer learning rate for ``'sgd'`` (default 0.7).
        outer_momentum: outer momentum for ``'sgd'`` (default 0.9).
        nesterov: Nesterov momentum for ``'sgd'`` (default True).
        inner_lr: alias of ``lr``, the inner optimizer's learning rate.
        island_size: average the pseudo-gradient within random islands of this many nodes.
        aggregate: how the pseudo-gradients are combined
            ([`communicators.aggregation`][communicators.aggregation]): ``"mean"`` (default), a
            robust rule (``"median"``, ``"trimmed_mean"``, ``"krum"``, ``"multi_krum"``,
            ``"centered_clip"``) or one of your own.
        privacy: differential privacy of the pseudo-gradients
            ([`DifferentialPrivacy`][exogym.privacy.DifferentialPrivacy]); ``None``: none.
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
        inner_lr: float | None = None,
        island_size: int | None = None,
        aggregate: str | Rule = "mean",
        privacy: DifferentialPrivacy | None = None,
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        spec, normalize = outer_spec(outer_optim, outer_lr, outer_momentum, nesterov)
        super().__init__(
            [DiLoCoCommunicator(H, spec, normalize, island_size, aggregate=aggregate, privacy=privacy)],
            **inner_lr_alias(strategy_kwargs, inner_lr),
        )


__all__ = ["DiLoCoCommunicator", "DiLoCoStrategy"]
