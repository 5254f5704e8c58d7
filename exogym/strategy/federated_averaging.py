"""``FedAvgStrategy``: local training with periodic model averaging (McMahan et al. 2017)."""

from __future__ import annotations

from typing import Any

from communicators.aggregation import Rule
from communicators.averaging import AveragingCommunicator
from communicators.fedavg import FedAvgServer
from exogym.compat import legacy_keywords
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.core.server import ServerStrategy
from exogym.core.strategy import check_strategy_kwargs


@legacy_keywords
class FedAvgStrategy(CommunicateOptimizeStrategy):
    """Each node trains locally; every ``H`` steps the models are averaged, optionally within random
    islands; with ``client_sampling``, each round trains only a sampled fraction of the clients.

    Without ``client_sampling``: every node takes part in every round, a pipeline
    ``[AveragingCommunicator(H, target="params", island_size)]``.

    With ``client_sampling=f``: the constructor returns a
    [`ServerStrategy`][exogym.ServerStrategy] running
    [`FedAvgServer(H, f, island_size, local_epochs=...)`][communicators.FedAvgServer] on the
    simulated clock (modelled compute: FLOPs or seconds per step). Each round the server sends the
    drawn clients the model and averages their results; a client no round draws is never built.
    ``fit``'s steps are ticks of the clock: with equal speeds and links a round is ``H`` ticks.

    Args:
        H: steps between averaging rounds (default 1). Give ``H`` or ``local_epochs``, not both.
        island_size: nodes per island, re-drawn every round from the shared seed.
        client_sampling: fraction of each island's clients that train in a round, in ``(0, 1]``.
        local_epochs: rounds every this many passes over a node's data (``H = local_epochs *
            steps_per_epoch``, resolved inside the run).
        aggregate: how the models are combined ([`communicators.aggregation`][communicators.aggregation]):
            ``"mean"`` (default), a robust rule or one of your own (with ``client_sampling``, on
            the clients' updates at the server, without islands).
        **strategy_kwargs: ``optim_spec`` (alias ``inner_optim``), ``lr``, ``lr_scheduler``,
            ``lr_scheduler_kwargs``, ``warmup_steps``, ``max_norm``, as for ``Strategy``.

    Raises:
        TypeError: ``H`` and ``local_epochs`` both given, or an unknown keyword.
        ValueError: an argument out of its range (the message names it).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is not FedAvgStrategy:  # a subclass is a pipeline; its __init__ refuses client_sampling
            return super().__new__(cls)
        return _sampled_server(*args, **kwargs) or super().__new__(cls)

    def __init__(
        self,
        H: int | None = None,
        island_size: int | None = None,
        client_sampling: float | None = None,
        local_epochs: int | None = None,
        aggregate: str | Rule = "mean",
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        if client_sampling is not None:
            raise TypeError(
                f"{type(self).__name__}: a subclass of FedAvgStrategy is the lock-step pipeline, without client "
                f"sampling (client_sampling={client_sampling!r}); for sampled FedAvg build "
                "ServerStrategy(FedAvgServer(H, client_sampling, island_size), ...) (or subclass FedAvgServer)"
            )
        _check_local_work(H, local_epochs)
        self.averaging = AveragingCommunicator(
            1 if H is None else H, "params", island_size, local_epochs=local_epochs, aggregate=aggregate
        )
        self.local_epochs = local_epochs
        super().__init__([self.averaging], **strategy_kwargs)


def _check_local_work(H: int | None, local_epochs: int | None) -> None:
    if H is not None and local_epochs is not None:
        raise TypeError("give the averaging period once: H (steps) or local_epochs, not both")


def _sampled_server(
    H: int | None = None,
    island_size: int | None = None,
    client_sampling: float | None = None,
    local_epochs: int | None = None,
    aggregate: str | Rule = "mean",
    **strategy_kwargs: Any,
) -> ServerStrategy | None:
    """What ``FedAvgStrategy(...)`` returns with ``client_sampling``: a ``ServerStrategy`` running
    ``FedAvgServer``; ``None`` without it (the pipeline)."""
    if client_sampling is None:
        return None

    check_strategy_kwargs(FedAvgStrategy, strategy_kwargs)
    _check_local_work(H, local_epochs)
    server = FedAvgServer(H, client_sampling, island_size, local_epochs=local_epochs, aggregate=aggregate)
    return ServerStrategy(server, **strategy_kwargs)


__all__ = ["AveragingCommunicator", "FedAvgStrategy"]
