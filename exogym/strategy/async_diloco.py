"""``AsyncDiLoCoStrategy``: asynchronous DiLoCo with delayed Nesterov and dynamic local updates."""

from __future__ import annotations

from typing import Any

from communicators.async_diloco import AsyncDiLoCoServer
from exogym.core.server import ServerStrategy
from exogym.core.strategy import check_strategy_kwargs


class AsyncDiLoCoStrategy(ServerStrategy):
    """Asynchronous DiLoCo (Liu et al. 2024, arXiv 2401.09135): each node pushes its
    pseudo-gradient to a simulated server when its local steps are done, on its own clock; the
    server applies it at once with delayed Nesterov momentum and sends the node its parameters.

    Server: [`AsyncDiLoCoServer`][communicators.AsyncDiLoCoServer]. Runs as a server and tasks
    on the simulated clock (modelled compute: FLOPs or seconds per step; node speeds from the
    network's ``compute_slowdown``); ``fit``'s steps are ticks of the clock, and
    [`run_summary`][exogym.ServerStrategy.run_summary] gives each node's steps and the updates'
    staleness.

    Args:
        H: local steps per segment (the fastest node's, with ``dylu``; default 100).
        outer_lr: the server's learning rate (default 0.7).
        outer_momentum: its Nesterov momentum (default 0.9).
        dn_period: updates per momentum step (default: the number of nodes).
        dn_c: factor of the plain steps between momentum steps (default 0).
        dylu: dynamic local updates: slower nodes take proportionally fewer local steps
            (default ``True``).
        **strategy_kwargs: ``optim_spec``, ``lr``, ``lr_scheduler``, ``max_norm``, ... as for
            ``Strategy``.
    """

    def __init__(
        self,
        H: int = 100,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        dn_period: int | None = None,
        dn_c: float = 0.0,
        dylu: bool = True,
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        super().__init__(AsyncDiLoCoServer(H, outer_lr, outer_momentum, dn_period, dn_c, dylu), **strategy_kwargs)


__all__ = ["AsyncDiLoCoStrategy"]
