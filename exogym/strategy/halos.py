"""``HALoSStrategy``: hierarchical asynchronous local SGD, regional and global parameter servers."""

from __future__ import annotations

from typing import Any

from communicators.halos import HALoSServer
from exogym.core.server import ServerStrategy
from exogym.core.strategy import check_strategy_kwargs


class HALoSStrategy(ServerStrategy):
    """HALoS (Kim et al. 2025, arXiv 2506.04531): each node pushes its pseudo-gradient to its
    region's local parameter server (LPS) after its local steps, on its own clock; each LPS
    applies updates at once with delayed Nesterov momentum, and every ``accumulation`` updates
    pushes its progress to the global parameter server (GPS), whose parameters it merges back
    with weight ``merge_weight`` when they arrive.

    Server: [`HALoSServer`][communicators.HALoSServer], on the simulated clock. Regions come from
    the network's world (``fit(..., network="two-datacenters")``, ``Network.regions``); on a
    homogeneous network every node is in one region. Needs modelled compute; node speeds come
    from ``compute_slowdown``.
    [`run_summary`][exogym.ServerStrategy.run_summary] gives each node's steps
    and utilisation, the staleness of the workers' and the LPSs' updates, and the bytes moved
    between the servers.

    Args:
        H: local steps per segment (the fastest node's, with ``dylu``; default 50).
        accumulation: worker updates per LPS push (default: each region's own number of workers).
        merge_weight: the global model's weight when an LPS merges it (default 0.25, the paper's).
        lps_lr, lps_momentum, lps_period: each LPS's delayed Nesterov (defaults 0.7, 0.5, the
            workers of its region).
        gps_lr, gps_momentum, gps_period: the GPS's (defaults 0.5, 0.5, the number of regions).
        dylu: dynamic local updates: slower nodes take proportionally fewer local steps
            (default ``True``).
        **strategy_kwargs: ``optim_spec``, ``lr``, ``lr_scheduler``, ``max_norm``, ... as for
            ``Strategy``.
    """

    def __init__(
        self,
        H: int = 50,
        accumulation: int | None = None,
        merge_weight: float = 0.25,
        lps_lr: float = 0.7,
        lps_momentum: float = 0.5,
        lps_period: int | None = None,
        gps_lr: float = 0.5,
        gps_momentum: float = 0.5,
        gps_period: int | None = None,
        dylu: bool = True,
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        super().__init__(
            HALoSServer(
                H, accumulation, merge_weight, lps_lr, lps_momentum, lps_period, gps_lr, gps_momentum, gps_period, dylu
            ),
            **strategy_kwargs,
        )


__all__ = ["HALoSStrategy"]
