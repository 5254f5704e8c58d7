"""``FedAvgStrategy``: local training with periodic model averaging (McMahan et al. 2017)."""

from __future__ import annotations

from typing import Any

import torch

from communicators.averaging import AveragingCommunicator
from exogym.compat import legacy_keywords
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.core.strategy import check_strategy_kwargs


@legacy_keywords
class FedAvgStrategy(CommunicateOptimizeStrategy):
    """Each node trains locally; every ``H`` steps the models are averaged, optionally within random
    islands and over a sampled fraction of clients.

    Pipeline: ``[AveragingCommunicator(H, target="params", island_size, client_sampling)]``.

    Args:
        H: steps between averaging rounds (default 1). Give ``H`` or ``local_epochs``, not both.
        island_size: nodes per island, re-drawn every round from the shared seed.
        client_sampling: fraction of each island's nodes that contribute to a round.
        local_epochs: rounds every this many passes over a node's data (``H = local_epochs *
            steps_per_epoch``, resolved inside the nodes).
        **strategy_kwargs: ``optim_spec`` (alias ``inner_optim``), ``lr``, ``lr_scheduler``,
            ``lr_scheduler_kwargs``, ``warmup_steps``, ``max_norm``, as for ``Strategy``.
    """

    def __init__(
        self,
        H: int | None = None,
        island_size: int | None = None,
        client_sampling: float | None = None,
        local_epochs: int | None = None,
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        if H is not None and local_epochs is not None:
            raise TypeError("give the averaging period once: H (steps) or local_epochs, not both")
        if local_epochs is not None and (not isinstance(local_epochs, int) or local_epochs < 1):
            raise ValueError(f"local_epochs must be a positive int, got {local_epochs!r}")
        self.averaging = AveragingCommunicator(1 if H is None else H, "params", island_size, client_sampling)
        self.local_epochs = local_epochs
        super().__init__([self.averaging], **strategy_kwargs)

    def sampled_nodes(self, num_nodes: int, seed: int, step: int) -> list[int] | None:
        """As for any pipeline, but ``None`` with ``local_epochs`` (the round's length is
        known only inside the nodes)."""
        return None if self.local_epochs is not None else super().sampled_nodes(num_nodes, seed, step)

    def _init_node(self, model: torch.nn.Module, rank: int, num_nodes: int) -> None:
        if self.local_epochs is not None:
            self.averaging.H = self.local_epochs * self.steps_per_epoch
        super()._init_node(model, rank, num_nodes)


__all__ = ["AveragingCommunicator", "FedAvgStrategy"]
