"""FedBuff (Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous Aggregation", arXiv
2106.06639): ``concurrency`` clients train at once, each on its own clock; a client that has
taken its ``local_steps`` pushes its update ``local - start`` to the server, which scales it by
its staleness ``s(tau) = 1 / sqrt(1 + tau)`` (``tau``: server steps since the client's download)
and adds it to a buffer; once ``buffer_size`` updates are buffered the server steps:
``x <- x + server_lr * buffer / buffer_size``. Each receipt frees a slot: a client drawn from
those not in flight downloads the server's model at that instant and starts training when it
arrives (with a fresh local optimizer).

Client draws follow ``draw_free_client``, from the run's seed (the same on every rank), in
``O(concurrency)`` per draw whatever the number of clients.
[`FedBuffServer`][communicators.FedBuffServer] writes these rules as a server on the simulated
clock ([`Server`][exogym.Server]): a client no draw names is never built.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np
import torch

from communicators.aggregation import Rule, describe_rule, is_mean, resolve
from communicators.checks import check_int, check_number
from exogym.core.server import Result, Server, ServerContext, Train


def staleness_weight(tau: int) -> float:
    """FedBuff's staleness scaling ``1 / sqrt(1 + tau)``."""
    return 1.0 / math.sqrt(1.0 + tau)


class FedBuffServer(Server):
    """FedBuff as a server (Algorithm 1 of the paper, as the module docstring states it).

    Args:
        local_steps: ``Q``, a client's steps per task.
        buffer_size: ``B``, results per server step.
        concurrency: ``C``, clients training at once (``None``: half the clients).
        server_lr: ``eta_g``.
        aggregate: how a full buffer's staleness-scaled updates become the server's step
            ([`communicators.aggregation`][communicators.aggregation]): ``"mean"`` (default, the
            paper's ``buffer / B``) or a robust rule; the run's adversaries attack the buffered
            updates of malicious clients.
    """

    def __init__(
        self,
        local_steps: int = 10,
        buffer_size: int = 10,
        concurrency: int | None = 20,
        server_lr: float = 1.0,
        aggregate: str | Rule = "mean",
    ):
        super().__init__()
        #: The aggregation rule (``aggregate``).
        self.rule = resolve(aggregate)
        check_int("local_steps", local_steps)
        check_int("buffer_size", buffer_size)
        check_int("concurrency", concurrency, none="half the clients")
        check_number("server_lr", server_lr, 0, above=True)
        self.local_steps, self.buffer_size, self.concurrency, self.server_lr = (
            local_steps, buffer_size, concurrency, server_lr,
        )  # fmt: skip

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        self.clients = self.concurrency if self.concurrency is not None else max(1, ctx.num_clients // 2)
        if self.clients > ctx.num_clients:
            raise ValueError(
                f"concurrency={self.concurrency} is more than num_nodes={ctx.num_clients} (each node is a client)"
            )
        self.buffer = torch.zeros_like(self.params)
        self.buffered = self.version = self.draws = 0
        self.in_flight: list[int] = []  # ascending
        #: With a robust rule or adversaries, the buffered updates one by one and their clients.
        self.rows: list[tuple[int, torch.Tensor]] = []
        self.keeps_rows = not is_mean(self.rule) or ctx.adversaries is not None

    def aggregation_group(self, num_clients: int, attacked: bool) -> int:
        """The updates a server step's rule combines: a full buffer's."""
        return self.buffer_size

    def _draw(self) -> None:
        """Send the next client drawn (uniform among those not in flight) the model as it is."""
        client = draw_free_client(self.ctx.seed, self.draws, self.ctx.num_clients, self.in_flight)
        self.draws += 1
        bisect.insort(self.in_flight, client)
        self.send(client, Train(self.local_steps, fresh_optimizer=True), info=lambda: self.version)

    def start(self) -> None:
        for _ in range(self.clients):
            self._draw()

    def on_result(self, result: Result) -> None:
        staleness = self.version - result.info
        self.record_update(result.client, staleness)
        update = (result.local - result.start) * staleness_weight(staleness)
        if self.keeps_rows:
            self.rows.append((result.client, update))
        else:
            self.buffer.add_(update)
        self.buffered += 1
        if self.buffered == self.buffer_size:
            if self.keeps_rows:
                self.params.add_(self._aggregate() * self.server_lr)
                self.rows = []
            else:
                self.params.add_(self.buffer / self.buffer_size * self.server_lr)
                self.buffer.zero_()
            self.buffered = 0
            self.version += 1
        del self.in_flight[bisect.bisect_left(self.in_flight, result.client)]
        if self.open:
            self._draw()

    def _aggregate(self) -> torch.Tensor:
        """The rule over the buffered updates, the malicious clients' attacked first."""
        clients = [c for c, _ in self.rows]
        rows = torch.stack([u for _, u in self.rows])
        adversaries, step = self.ctx.adversaries, self.version * self.local_steps
        if adversaries is not None:
            rows = adversaries.attack_rows(rows, clients, step, "fedbuff")
        return self.rule(rows).to(self.params.dtype)

    def state_dict(self) -> dict[str, Any]:
        keys = ("buffered", "version", "draws", "in_flight")
        state = {"buffer": self.buffer, **{k: getattr(self, k) for k in keys}}
        if self.keeps_rows:
            state["rows"] = [(c, u) for c, u in self.rows]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = [(int(c), u) for c, u in state.get("rows", [])]
        self.buffer.copy_(state["buffer"])
        self.buffered, self.version, self.draws = int(state["buffered"]), int(state["version"]), int(state["draws"])
        self.in_flight = list(state["in_flight"])

    def describe(self) -> str:
        return (
            f"FedBuff(local_steps={self.local_steps}, buffer_size={self.buffer_size}, "
            f"concurrency={self.concurrency}, server_lr={self.server_lr}" + describe_rule(self.rule) + ")"
        )


def draw_free_client(seed: int, draw: int, num_clients: int, in_flight: list[int]) -> int:
    """The ``draw``-th client drawn from ``seed``: uniform among the clients not in flight, in
    ascending order (``free[rng.integers(len(free))]`` with ``rng`` seeded by ``(seed, draw)``);
    ``in_flight`` is ascending. Costs ``O(len(in_flight))``, whatever the number of clients."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, draw])))
    i = int(rng.integers(num_clients - len(in_flight)))
    for busy in in_flight:  # the i-th free client: skip the busy ones at or below it
        if busy <= i:
            i += 1
        else:
            break
    return i


__all__ = [
    "FedBuffServer",
    "draw_free_client",
    "staleness_weight",
]
