"""DiLoCo with eager updates (Kale, Douillard & Donchev 2025, arXiv 2502.12996): the outer
all-reduce overlaps the next inner phase, and a node does not wait for it.

Every ``H`` steps each node ``m`` of the ``n`` present computes its pseudo-gradient
``delta_m = theta_m - theta_local`` (its own last outer parameters minus its local ones) and
sends it to an all-reduce whose mean arrives only at the end of the next inner phase. Its outer
optimizer steps at once with the eager mix

    g_m(t) = delta_m(t) / n  +  (mean(t-1) - delta_m(t-1) / n)

its own fresh share at once, the other nodes' shares of the previous round's mean one round late
(none in the first round). Every node's pseudo-gradient thus enters every node's outer step
exactly once, weighted ``1/n``: the paper's eager variant (its Algorithm 3), "a mixture of the
current local outer gradient with the delayed mixture of all other replicas' outer gradients",
read with DiLoCo's ``1/n`` weight per replica (docs/algorithms/eager-diloco.md says which parts
of the paper this reading rests on). Each node keeps its own outer parameters and optimizer state,
so the nodes' parameters differ by their own last shares (``fit`` returns their average). With
one node this is DiLoCo. The last round's mean would land after training and is not applied;
a checkpoint keeps it.

Bytes per node and round: DiLoCo's, one all-reduce of the pseudo-gradient, marked as
overlapping the next ``H`` steps of compute (``ledger.overlapping(H)``), so the network model
counts only what those steps cannot hide.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from communicators.aggregation import Rule, aggregate_all_reduce, describe_rule
from communicators.diloco import DiLoCoCommunicator
from exogym.core.optim import OptimSpec
from exogym.core.pipeline import NodeContext


class EagerDiLoCoCommunicator(DiLoCoCommunicator):
    """Every ``H`` steps: an outer step on this node's fresh pseudo-gradient share plus the other
    nodes' shares of the previous round, while the round's all-reduce overlaps the next ``H``
    steps. ``global_params`` are this node's own outer parameters.

    With the mean it averages among the nodes present (``comm.present()``), so faults may drop
    nodes: a dropped node rejoins with the state of a survivor. Another rule gathers every node's
    pseudo-gradient, which a round with nodes dropped does not have: faults are refused with it.

    Args:
        H: inner steps between outer steps.
        outer_optim: the outer optimizer (default Nesterov SGD, lr 0.7, momentum 0.9).
        aggregate: how the nodes' pseudo-gradients become one
            ([`communicators.aggregation`][communicators.aggregation]; ``"mean"``, the default,
            is the paper's all-reduce). With another rule the aggregate takes the mean's place: a
            node applies its own share ``delta_m / n`` at once and the rest of the aggregate one
            round late.
    """

    #: The mean pseudo-gradient holds every entry every round.
    payloads: ClassVar[str] = "stable"
    supports_dropout: ClassVar[bool] = True

    def __init__(self, H: int = 100, outer_optim: OptimSpec | None = None, aggregate: str | Rule = "mean") -> None:
        super().__init__(H, outer_optim, aggregate=aggregate)
        #: Steps of compute each round's all-reduce overlaps (the next inner phase).
        self.overlap_steps = H

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        # The other nodes' shares of the last round's mean, applied at the next outer step.
        self.delayed = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        n = len(self.ctx.comm.present())
        grads: list[Any] = [None] * len(self.params)
        for bucket in self.buckets:
            mean = bucket.buffer.pack([self.global_params[i] - self.params[i] for i in bucket.indices])
            shares = (mean / n).split(bucket.buffer.numels)  # this node's own, before the all-reduce
            with self.ctx.comm.ledger.overlapping(self.overlap_steps):
                aggregate_all_reduce(self.ctx, mean, self.rule, step, "eager_diloco_pseudo_grad")
            for i, share, total in zip(bucket.indices, shares, mean.split(bucket.buffer.numels), strict=True):
                share = share.view_as(self.params[i])
                grads[i] = share + self.delayed[i]
                self.delayed[i].copy_(total.view_as(share) - share)
        self._outer_step(grads)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "delayed": list(self.delayed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for t, s in zip(self.delayed, state["delayed"], strict=True):
            t.copy_(s)

    def describe(self) -> str:
        rule = describe_rule(self.rule)
        return f"EagerDiLoCo(H={self.H}, outer={self.outer_spec!r}{rule})"


__all__ = ["EagerDiLoCoCommunicator"]
