"""Average one of the inner optimizer's state tensors (e.g. Adam's moments) over the nodes.

With [`AveragingCommunicator`][communicators.AveragingCommunicator] on the parameters this composes
Local Adam (every state on one period) and DES-LOC (each on its own period, Iacob et al. 2025,
arXiv 2505.22549).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from communicators.aggregation import Rule, aggregate_all_reduce, describe_rule, is_mean, resolve
from exogym.core.comm.flat import FlatBuffer, group_by_dtype
from exogym.core.pipeline import Communicator, NodeContext


class OptimizerStateAveraging(Communicator):
    """Every ``H`` steps (after the optimizer step) replace the inner optimizer's state tensor
    ``name`` of every parameter by its mean over the nodes: one all-reduce per dtype, through a
    flat buffer. The tensors are read from the optimizer at each round
    ([`optimizer_state`][communicators.NodeContext.optimizer_state]), so a checkpoint loaded or a
    node rejoining in between is taken into account.

    Not at the run's last step: the optimizer's state after its last step is never read again
    by the run (its parameters are final), so averaging it would send bytes that buy nothing.

    Args:
        name: the state's name, e.g. ``"exp_avg"`` or ``"exp_avg_sq"`` (Adam, AdamW).
        H: communicate every ``H`` steps.
        aggregate: how the nodes' values become one
            ([`communicators.aggregation`][communicators.aggregation]): ``"mean"`` (the default,
            an all-reduce) or a robust rule (an all-gather), on the state's values themselves.

    Raises:
        ValueError (at its first round): the optimizer holds no such state.
    """

    space: ClassVar[str] = "param"
    #: Every payload holds the same entries every round.
    payloads: ClassVar[str] = "stable"
    #: A mean all-reduce: averages among the present nodes.
    supports_dropout: ClassVar[bool] = True

    def __init__(self, name: str, H: int = 1, aggregate: str | Rule = "mean") -> None:
        super().__init__(H)
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be the name of an optimizer state, e.g. 'exp_avg', got {name!r}")
        self.name = name
        #: The aggregation rule (``aggregate``), applied through ``aggregate_all_reduce``.
        self.rule = resolve(aggregate)
        #: A robust rule gathers every node's values, which a round with dropped nodes cannot.
        self.supports_dropout = is_mean(self.rule)  # type: ignore[misc]

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        self._layout: list[tuple[list[int], FlatBuffer]] | None = None

    def is_due(self, step: int) -> bool:
        """Every ``H`` steps, except the run's last (``ctx.max_steps - 1``; a module not yet set
        up on a node knows no run: every ``H`` steps)."""
        ctx = getattr(self, "ctx", None)
        return super().is_due(step) and (ctx is None or step != ctx.max_steps - 1)

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        tensors = self.ctx.optimizer_state(self.name)
        if self._layout is None:  # the state exists from the optimizer's first step on
            self._layout = [(idx, FlatBuffer([tensors[i] for i in idx])) for idx in group_by_dtype(tensors)]
        for idx, buf in self._layout:
            group = [tensors[i] for i in idx]
            aggregate_all_reduce(self.ctx, buf.pack(group), self.rule, step, f"average_{self.name}")
            buf.unpack(group)

    def describe(self) -> str:
        rule = describe_rule(self.rule)
        return f"AverageOptimizerState({self.name}, H={self.H}{rule})"


__all__ = ["OptimizerStateAveraging"]
