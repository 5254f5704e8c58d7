"""NoLoCo's outer step (Kolehmainen et al. 2025, arXiv 2506.10911): no all-reduce over the world;
every ``H`` steps each node averages with one peer and takes a modified Nesterov step.

Each node ``i`` keeps its own outer weights ``phi_i`` and outer momentum ``delta_i`` (they differ
between nodes: no step makes them equal). Every ``H`` inner steps the nodes are split into random
pairs, drawn from the shared seed for the round
([`communicators.islands.draw_islands`][communicators.draw_islands] with islands of two: a random
perfect matching; with an odd number of nodes one node is alone and steps on its own). With
``theta`` the local (inner) weights and means taken over the pair, the paper's outer step (its Eq.
2, local group size ``n = 2``)::

    delta_i = alpha * delta_i - beta * mean(phi - theta) - gamma * (phi_i - mean(phi))
    phi_i   = phi_i + delta_i
    theta_i = phi_i

``beta`` is the outer learning rate, ``alpha`` the outer momentum, and the ``gamma`` term pulls
each node's outer weights towards its peer's, which keeps the replicas from drifting apart
without any global synchronisation. The signs and the heavy-ball form of the momentum step are
those of the authors' released code (``outer_step`` in ``src/noloco/sparse_optimizer_c.py`` of
gensyn-ai/noloco), which uses ``gamma == beta``; its NoLoCo runs use ``H = 50``, ``beta = 0.7``,
``alpha = 0.5``, the defaults here. With ``gamma == beta`` the two terms fold into
``-beta * (phi_i - mean(theta))``, so only the local weights travel; otherwise the outer weights
travel with them. With two nodes (always one pair) this is DiLoCo with outer SGD momentum
``alpha`` (heavy ball, not Nesterov) and learning rate ``beta``. The paper's random routing of
activations between pipeline stages has no counterpart here (the nodes hold whole models).

Bytes per node and round (ledger): one all-reduce between two nodes of the local weights
(``gamma == beta``) or of the local and outer weights: ``P`` or ``2P`` bytes sent per node for
``P`` parameter bytes, whatever the number of nodes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from communicators.checks import check_number
from communicators.islands import draw_islands
from exogym.core.comm.flat import dtype_buckets
from exogym.core.pipeline import Communicator, NodeContext


class NoLoCoCommunicator(Communicator):
    """Every ``H`` steps: average with a random peer and take NoLoCo's outer step (module
    docstring). State: the node's outer weights and outer momentum.

    Args:
        H: inner steps between outer steps (default 50, the paper's runs).
        outer_lr: ``beta`` (default 0.7).
        outer_momentum: ``alpha`` (default 0.5).
        gamma: weight of the pull towards the peer's outer weights (default: ``outer_lr``).
    """

    space: ClassVar[str] = "param"
    #: Every payload holds the same entries every round.
    payloads: ClassVar[str] = "stable"
    #: A mean all-reduce within each pair: a node whose peer is dropped steps on its own.
    supports_dropout: ClassVar[bool] = True

    def __init__(
        self, H: int = 50, outer_lr: float = 0.7, outer_momentum: float = 0.5, gamma: float | None = None
    ) -> None:
        super().__init__(H)
        gamma = outer_lr if gamma is None else gamma
        for name, value in (("outer_lr", outer_lr), ("outer_momentum", outer_momentum), ("gamma", gamma)):
            check_number(name, value, 0)
        self.outer_lr, self.outer_momentum, self.gamma = float(outer_lr), float(outer_momentum), float(gamma)

    @property
    def sends_outer_weights(self) -> bool:
        """Whether a round sends the outer weights besides the local ones (``gamma != outer_lr``)."""
        return self.gamma != self.outer_lr

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.buckets = dtype_buckets(self.params)
        self.outer = [b.buffer.pack(b.tensors).clone() for b in self.buckets]  # phi, flat per dtype
        self.momentum = [torch.zeros_like(o) for o in self.outer]  # delta

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        pairs = draw_islands(self.ctx.num_nodes, 2, self.ctx.seed, step // self.H)
        alpha, beta, gamma = self.outer_momentum, self.outer_lr, self.gamma
        for bucket, phi, delta in zip(self.buckets, self.outer, self.momentum, strict=True):
            theta = bucket.buffer.pack(bucket.tensors)
            delta.mul_(alpha)
            if self.sends_outer_weights:
                both = torch.cat([theta, phi])
                self.ctx.comm.all_reduce(both, op="mean", groups=pairs, tag="noloco")
                mean_theta, mean_phi = both.split(theta.numel())
                delta.sub_(mean_phi - mean_theta, alpha=beta).sub_(phi - mean_phi, alpha=gamma)
            else:
                self.ctx.comm.all_reduce(theta, op="mean", groups=pairs, tag="noloco")
                delta.sub_(phi - theta, alpha=beta)  # gamma == beta: both terms in one
            phi.add_(delta)
            theta.copy_(phi)
            bucket.buffer.unpack(bucket.tensors)

    def state_dict(self) -> dict[str, Any]:
        return {"outer": list(self.outer), "momentum": list(self.momentum)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for t, s in zip(self.outer + self.momentum, state["outer"] + state["momentum"], strict=True):
            t.copy_(s)

    def describe(self) -> str:
        return f"NoLoCo(H={self.H}, outer_lr={self.outer_lr}, momentum={self.outer_momentum}, gamma={self.gamma})"


__all__ = ["NoLoCoCommunicator"]
