"""``StreamingDiLoCoStrategy``: DiLoCo on staggered fragments with overlapped outer updates."""

from __future__ import annotations

from typing import Any

from communicators.aggregation import Rule
from communicators.quantize import FORMATS, QuantizeCommunicator
from communicators.streaming import StreamingDiLoCoCommunicator
from exogym.compat import legacy_keywords
from exogym.core.optim import OptimSpec
from exogym.core.pipeline import CommunicateOptimizeStrategy, Communicator
from exogym.core.strategy import check_strategy_kwargs
from exogym.strategy.diloco import inner_lr_alias, outer_spec


@legacy_keywords
class StreamingDiLoCoStrategy(CommunicateOptimizeStrategy):
    """Streaming DiLoCo (Douillard et al. 2025): the model in ``num_fragments`` fragments, each
    synchronised every ``H`` steps at staggered offsets, its outer update applied
    ``overlap_steps`` later and merged with the local values by ``alpha`` (see
    ``communicators.streaming``).

    Pipeline: ``[StreamingDiLoCoCommunicator(...)]``, wrapped in ``QuantizeCommunicator`` when
    ``quantize`` is given.

    Args:
        H: inner steps between two synchronisations of a fragment (default 100).
        num_fragments: F (default 2); ``1`` with ``overlap_steps=0`` and ``alpha=0`` is DiLoCo.
        overlap_steps: tau, steps between sending a fragment and applying its update (default 0),
            or ``"auto"``: at the first step at which its transfer has arrived on the simulated
            clock (needs modelled compute).
        alpha: share of the local values kept when an update is applied (default 0.0).
        outer_optim, outer_lr, outer_momentum, nesterov: the outer optimizer, as for
            [`DiLoCoStrategy`][exogym.strategy.DiLoCoStrategy] (``'sgd'``: Nesterov SGD, lr 0.7,
            momentum 0.9).
        quantize: send the pseudo-gradients as ``'int8'``, ``'fp8'``, ``'fp4'``, ``'fp16'`` or ``'bf16'``
            (``None``: float32).
        aggregate: how the fragments' pseudo-gradients are combined (``"mean"``, default, or a
            robust rule of [`communicators.aggregation`][communicators.aggregation], which gathers
            them).
        inner_lr: alias of ``lr``.
        **strategy_kwargs: ``optim_spec``, ``lr``, ``lr_scheduler``, ``warmup_steps``, ``max_norm``, ...
    """

    def __init__(
        self,
        H: int = 100,
        num_fragments: int = 2,
        overlap_steps: int | str = 0,
        alpha: float = 0.0,
        outer_optim: str | OptimSpec = "sgd",
        outer_lr: float | None = None,
        outer_momentum: float | None = None,
        nesterov: bool | None = None,
        quantize: str | None = None,
        aggregate: str | Rule = "mean",
        inner_lr: float | None = None,
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        spec, normalize = outer_spec(outer_optim, outer_lr, outer_momentum, nesterov)
        if normalize:
            raise ValueError("outer_optim='sgd_normalized' is not available for Streaming DiLoCo; use 'sgd'")
        module: Communicator = StreamingDiLoCoCommunicator(
            H, num_fragments, overlap_steps, alpha, spec, aggregate=aggregate
        )
        if quantize is not None:
            if quantize not in FORMATS:
                raise ValueError(f"quantize must be one of {FORMATS} or None, got {quantize!r}")
            module = QuantizeCommunicator(module, quantize)
        super().__init__([module], **inner_lr_alias(strategy_kwargs, inner_lr))


__all__ = ["StreamingDiLoCoStrategy"]
