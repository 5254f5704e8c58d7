"""``FedBuffStrategy``: buffered asynchronous federated averaging."""

from __future__ import annotations

from typing import Any

from communicators.aggregation import Rule
from communicators.fedbuff import FedBuffServer
from exogym.core.server import ServerStrategy
from exogym.core.strategy import check_strategy_kwargs


class FedBuffStrategy(ServerStrategy):
    """FedBuff (Nguyen et al. 2022, arXiv 2106.06639): ``concurrency`` of the run's nodes
    (clients) train at once on their own clocks; the server buffers their staleness-scaled
    updates and steps once ``buffer_size`` have arrived; each arrival frees a slot for a client
    drawn from the shared seed.

    Server: [`FedBuffServer`][communicators.FedBuffServer]. Runs as a server and tasks on the
    simulated clock (modelled compute: FLOPs or seconds per step); a client no draw names is
    never built. ``fit``'s steps are ticks of the clock;
    [`run_summary`][exogym.ServerStrategy.run_summary] gives each client's steps and the updates'
    staleness.

    Args:
        local_steps: a client's steps per participation (default 10).
        buffer_size: updates per server step (default 10).
        concurrency: clients training at once (default 20; at most the number of nodes;
            ``None``: half the nodes).
        server_lr: the server's learning rate (default 1.0).
        aggregate: how a full buffer's updates become the server's step (``"mean"``, default, or a
            robust rule of [`communicators.aggregation`][communicators.aggregation]).
        **strategy_kwargs: the clients' ``optim_spec``, ``lr``, ``max_norm``, ... as for ``Strategy``.
    """

    def __init__(
        self,
        local_steps: int = 10,
        buffer_size: int = 10,
        concurrency: int | None = 20,
        server_lr: float = 1.0,
        aggregate: str | Rule = "mean",
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        server = FedBuffServer(local_steps, buffer_size, concurrency, server_lr, aggregate=aggregate)
        super().__init__(server, **strategy_kwargs)


__all__ = ["FedBuffStrategy"]
