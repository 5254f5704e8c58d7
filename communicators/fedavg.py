"""Federated averaging with client sampling as a server and tasks (McMahan et al. 2017, "Communication-
Efficient Learning of Deep Networks from Decentralized Data", arXiv 1602.05629, Algorithm 1).

Each round the server draws ``max(1, round(client_sampling * K))`` of the ``K`` clients from the
run's seed (or that fraction of each island of ``island_size`` clients, islands redrawn every
round), sends each the model it holds, and once every drawn client's result has arrived replaces
the model by the mean of their results (per island: every member of an island, drawn or not,
then holds its island's mean). A drawn client trains ``H`` local steps, or ``local_epochs``
passes over its data (the paper's ``E``: ``local_epochs * steps_per_epoch`` steps), and keeps its
inner optimizer between rounds. With equal speeds and links a round is that many ticks of the
clock.

Only the drawn clients exist: a round without islands costs ``O(drawn)`` whatever ``K``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from communicators.aggregation import Rule, describe_rule, is_mean, resolve, rule_name
from communicators.checks import check_int, check_number
from communicators.islands import CLIENT_SALT, draw_islands, draw_participants, participants
from exogym.core.seeding import generator
from exogym.core.server import Result, Server, ServerContext, Train

logger = logging.getLogger(__name__)


def drawn_clients(num_clients: int, fraction: float, seed: int, round_: int) -> list[int]:
    """The clients of a round without islands, ascending: what
    [`draw_participants`][communicators.draw_participants] draws from every client, drawn without
    building the list of all ``num_clients``."""
    m = participants(num_clients, fraction)
    if m >= num_clients:
        return list(range(num_clients))
    g = generator(seed, CLIENT_SALT, round_, 0)
    return sorted(torch.randperm(num_clients, generator=g)[:m].tolist())


class FedAvgServer(Server):
    """Sampled federated averaging (see the module docstring).

    Args:
        H: local steps per round (``>= 1``; default 1). Give ``H`` or ``local_epochs``, not both.
        client_sampling: the fraction of the clients (of each island) drawn per round, in ``(0, 1]``.
        island_size: clients per island, redrawn every round from the seed; ``None``: one group.
        local_epochs: local passes over a client's data per round (``>= 1``): ``H =
            local_epochs * ctx.steps_per_epoch``, resolved at ``setup``.
        aggregate: how a round's results become the model
            ([`communicators.aggregation`][communicators.aggregation]): ``"mean"`` (default), or a
            robust rule applied to the clients' updates (result minus the model sent), where the
            run's adversaries attack (without islands). The bytes are the same: every drawn client
            uploads its result either way.

    Raises:
        TypeError: ``H`` and ``local_epochs`` both given.
        ValueError: an argument out of its range (the message names it).
    """

    def __init__(
        self,
        H: int | None = None,
        client_sampling: float = 1.0,
        island_size: int | None = None,
        *,
        local_epochs: int | None = None,
        aggregate: str | Rule = "mean",
    ) -> None:
        super().__init__()
        #: The aggregation rule (``aggregate``).
        self.rule = resolve(aggregate)
        if island_size is not None and not is_mean(self.rule):
            raise ValueError(
                f"FedAvgServer(island_size={island_size!r}, aggregate={rule_name(self.rule)!r}): a robust rule "
                "aggregates one group of clients; give one or the other"
            )
        if H is not None and local_epochs is not None:
            raise TypeError(
                f"FedAvgServer: give the local work once, H={H!r} (steps per round) or local_epochs={local_epochs!r} "
                "(passes over a client's data per round), not both"
            )
        check_int("H", H, why="local steps per round", none="1, or local_epochs")
        check_int("local_epochs", local_epochs, why="passes over a client's data per round", none="H")
        why = "the fraction of the clients drawn a round"
        check_number("client_sampling", client_sampling, 0, 1, why, above=True, upto=True)
        check_int("island_size", island_size, none="one group")
        self.H = 1 if H is None and local_epochs is None else H
        self.local_epochs = local_epochs
        self.client_sampling, self.island_size = client_sampling, island_size

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        #: A drawn client's steps per round: ``H``, or ``local_epochs`` passes over its data.
        self.local_steps = self.H if self.local_epochs is None else self.local_epochs * ctx.steps_per_epoch
        self.round = 0
        #: With islands, the model each client holds (the mean of its last island), by client.
        self.holds: dict[int, torch.Tensor] = {}
        self.islands: list[list[int]] = []
        self.groups: list[list[int]] = []
        self.results: dict[int, torch.Tensor] = {}
        if self.island_size and self.island_size < ctx.num_clients:
            self._warn_island_rounding(ctx.num_clients)
        attacked = ctx.adversaries is not None and ctx.adversaries.config.on_updates
        self.aggregation_group(ctx.num_clients, attacked)

    def aggregation_group(self, num_clients: int, attacked: bool) -> int:
        """The clients whose results a round's rule combines (``participants(num_clients,
        client_sampling)``).

        Raises:
            ValueError: islands under an attack (it acts on one group of clients' results).
        """
        if self.island_size and attacked:
            raise ValueError(
                f"{self.describe()} with adversaries: an attack acts on one group of clients' results; "
                "give island_size or adversaries, not both"
            )
        return participants(num_clients, self.client_sampling)

    def _warn_island_rounding(self, k: int) -> None:
        """Log where drawing ``max(1, round(f * n))`` clients per island trains a fraction of the
        clients 10% or more off ``client_sampling`` (small islands: ``f * n`` below 1)."""
        sizes = [min(self.island_size, k - i) for i in range(0, k, self.island_size)]  # type: ignore[arg-type]
        drawn = sum(participants(n, self.client_sampling) for n in sizes)
        if abs(drawn / k - self.client_sampling) > 0.1 * self.client_sampling:
            per_island = participants(self.island_size, self.client_sampling)  # type: ignore[arg-type]
            logger.warning(
                "%s on %d clients draws %d a round (%.1f%%, not %.1f%%): each island of %d draws max(1, round(%g x "
                "%d)) = %d; choose client_sampling x island_size close to a whole number, or larger islands",
                self.describe(), k, drawn, 100 * drawn / k, 100 * self.client_sampling, self.island_size,
                self.client_sampling, self.island_size, per_island,
            )  # fmt: skip

    def start(self) -> None:
        """Start a round: draw its clients and send each the model it holds."""
        k, seed, r = self.ctx.num_clients, self.ctx.seed, self.round
        if self.island_size:
            self.islands = draw_islands(k, self.island_size, seed, r)
            self.groups = [draw_participants(g, self.client_sampling, seed, r) for g in self.islands]
        else:
            self.islands, self.groups = [], [drawn_clients(k, self.client_sampling, seed, r)]
        self.results = {}
        for group in self.groups:
            for client in group:
                self.send(client, Train(self.local_steps), state=self.holds.get(client, self.params))

    def on_result(self, result: Result) -> None:
        self.results[result.client] = result.local
        self.record_update(result.client, 0)  # every result of a round is averaged in it: none is stale
        if len(self.results) < sum(len(g) for g in self.groups):
            return
        adversaries, step = self.ctx.adversaries, self.round * self.local_steps
        if not is_mean(self.rule) or (adversaries is not None and adversaries.active(step)):
            (group,) = self.groups  # without islands: one group, every client sent ``params``
            rows = torch.stack([self.results[client] - self.params for client in group])
            if adversaries is not None:
                rows = adversaries.attack_rows(rows, group, step, "fedavg")
            self.params.add_(self.rule(rows).to(self.params.dtype))
        else:
            for i, group in enumerate(self.groups):
                mean = sum(self.results[client] for client in group) / len(group)  # ascending: the sum's order
                if self.islands:
                    for member in self.islands[i]:  # every member holds its island's mean
                        self.holds[member] = mean
                else:
                    self.params.copy_(mean)
            if self.islands:  # the run's model: the mean over every client's
                k = self.ctx.num_clients
                self.params.copy_(sum(self.holds[g[0]] * (len(g) / k) for g in self.islands))
        self.round += 1
        if self.open:
            self.start()

    def summary(self) -> dict[str, Any]:
        """The rounds completed."""
        return {"rounds": self.round}

    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round, "holds": dict(self.holds), "islands": self.islands, "groups": self.groups,
            "results": dict(self.results),
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self.holds = {int(c): t for c, t in state["holds"].items()}
        self.islands = [list(g) for g in state["islands"]]
        self.groups = [list(g) for g in state["groups"]]
        self.results = {int(c): t for c, t in state["results"].items()}

    def describe(self) -> str:
        work = f"H={self.H}" if self.local_epochs is None else f"local_epochs={self.local_epochs}"
        islands = "" if self.island_size is None else f", island_size={self.island_size}"
        rule = describe_rule(self.rule)
        return f"FedAvg({work}, client_sampling={self.client_sampling}{islands}{rule})"


__all__ = ["FedAvgServer", "drawn_clients"]
