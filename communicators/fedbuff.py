"""FedBuff (Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous Aggregation", arXiv
2106.06639): ``concurrency`` clients train at once, each on its own clock; a client that has
taken its ``local_steps`` pushes its update ``local - start`` to the server, which scales it by
its staleness ``s(tau) = 1 / sqrt(1 + tau)`` (``tau``: server steps since the client's download)
and adds it to a buffer; once ``buffer_size`` updates are buffered the server steps:
``x <- x + server_lr * buffer / buffer_size``. Each receipt frees a slot: a client drawn from
those not in flight downloads the server's model at that instant and starts training when it
arrives (with a fresh local optimizer).

Client draws follow ``draw_client``, from the run's seed (the same on every rank). One node
holds the server (the first client drawn, the timeline's keeper): it applies every update and
sends the server's model to each client drawn; the others keep no copy of it. The timing
(``FedBuffTiming``) and the values ([`FedBuffCommunicator`][communicators.FedBuffCommunicator])
follow ``communicators.server``.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch

from communicators.server import ServerCommunicator, unheld
from exogym.core.server import Result, Server, ServerContext, Train
from exogym.core.timeline import Event, Simulation


def draw_client(seed: int, draw: int, free: list[int]) -> int:
    """The ``draw``-th client drawn in a run from ``seed``: uniform among ``free`` (the clients not
    in flight, ascending)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, draw])))
    return free[int(rng.integers(len(free)))]


def staleness_weight(tau: int) -> float:
    """FedBuff's staleness scaling ``1 / sqrt(1 + tau)``."""
    return 1.0 / math.sqrt(1.0 + tau)


class FedBuffTiming(Simulation):
    """When clients are drawn, train, push, and when the server steps.

    Args:
        step_seconds, transfer: per client, seconds per step and per model transfer.
        max_ticks: the run's steps (ticks).
        concurrency, buffer_size, local_steps: FedBuff's ``C``, ``B`` and ``Q``.
        seed: the run's seed (client draws).
    """

    def __init__(
        self,
        step_seconds: list[float],
        transfer: list[float],
        max_ticks: int,
        concurrency: int,
        buffer_size: int,
        local_steps: int,
        seed: int,
    ) -> None:
        super().__init__(step_seconds, max_ticks)
        if concurrency > self.num_nodes:
            raise ValueError(f"concurrency={concurrency} is more than the {self.num_nodes} nodes (clients)")
        self.transfer = transfer
        self.concurrency, self.buffer_size, self.local_steps, self.seed = concurrency, buffer_size, local_steps, seed
        #: The clients in flight (served, not yet received from).
        self.in_flight: set[int] = set()
        #: The others, ascending (what a draw picks from).
        self.free: list[int] = list(range(self.num_nodes))
        #: The node that holds the server (``holders``).
        self.keeper = -1
        self.draws = 0
        self.in_segment = [0] * self.num_nodes
        self.segment = [0] * self.num_nodes
        self.pulled = [0] * self.num_nodes
        self.version = 0
        self.buffered = 0

    def _draw(self, time: float, initial: bool = False) -> None:
        r = draw_client(self.seed, self.draws, self.free)
        self.draws += 1
        self.in_flight.add(r)
        del self.free[bisect.bisect_left(self.free, r)]
        # every node starts with the server's initial state; later, the keeper sends it
        source = -1 if initial or r == self.keeper else self.keeper
        self.schedule(time, "serve", r, source=source)

    def begin(self) -> None:
        self.keeper = draw_client(self.seed, 0, list(range(self.num_nodes)))  # the first client drawn
        self.timeline.holders = frozenset({self.keeper})
        for _ in range(self.concurrency):
            self._draw(0.0, initial=True)

    def on_start(self, ev: Event) -> None:
        r = ev.rank
        end = self.step_end(r, ev.time)
        self.in_segment[r] += 1
        if self.in_segment[r] < self.local_steps:
            self.schedule(end, "start", r)
            return
        self.in_segment[r] = 0
        self.schedule(end, "capture", r, self.segment[r])
        self.schedule(end + self.transfer[r], "receive", r, self.segment[r])
        self.segment[r] += 1

    def on_receive(self, ev: Event) -> Event:
        staleness = self.version - self.pulled[ev.rank]
        self.record_update(ev.time, ev.rank, staleness)
        self.buffered += 1
        if self.buffered == self.buffer_size:
            self.version += 1
            self.buffered = 0
        if ev.rank in self.in_flight:
            self.in_flight.discard(ev.rank)
            bisect.insort(self.free, ev.rank)
        if not self.draining:
            self._draw(ev.time)  # the slot it frees goes to the next client
        return replace(ev, staleness=staleness)

    def on_serve(self, ev: Event) -> None:
        self.pulled[ev.rank] = self.version
        self.schedule(ev.time + self.transfer[ev.rank], "deliver", ev.rank)

    def on_deliver(self, ev: Event) -> None:
        self.schedule(ev.time, "start", ev.rank)


class FedBuffCommunicator(ServerCommunicator):
    """FedBuff's module: the client side (update ``local - start``, a fresh local optimizer per
    participation) and the server side (staleness-scaled buffer, a step every ``buffer_size``).

    Args:
        local_steps: ``Q``, a client's steps per participation.
        buffer_size: ``B``, updates per server step.
        concurrency: ``C``, clients training at once (at most the number of nodes); ``None``:
            half the nodes (at least one).
        server_lr: ``eta_g`` (default 1.0).
    """

    #: A client that no event names sits out the same transfers as every other such client and
    #: is sent the same final state.
    uniform_idle_calls: ClassVar[bool] = True

    def __init__(self, local_steps: int, buffer_size: int, concurrency: int | None, server_lr: float = 1.0) -> None:
        super().__init__()
        checked = [("local_steps", local_steps), ("buffer_size", buffer_size)]
        if concurrency is not None:
            checked.append(("concurrency", concurrency))
        for name, v in checked:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if isinstance(server_lr, bool) or not isinstance(server_lr, (int, float)) or not server_lr > 0:
            raise ValueError(f"server_lr must be a number > 0, got {server_lr!r}")
        if not math.isfinite(server_lr):
            raise ValueError(f"server_lr must be finite, got {server_lr!r}")
        self.local_steps, self.buffer_size, self.concurrency, self.server_lr = (
            local_steps,
            buffer_size,
            concurrency,
            server_lr,
        )

    def timing_key(self) -> tuple[Any, ...]:
        return (self.local_steps, self.buffer_size, self.clients)

    def simulation(self, step_seconds: list[float], transfer: list[float], max_steps: int, seed: int) -> Simulation:
        return FedBuffTiming(step_seconds, transfer, max_steps, self.clients, self.buffer_size, self.local_steps, seed)

    def setup(self, ctx: Any) -> None:
        #: The clients training at once in this run.
        self.clients = self.concurrency if self.concurrency is not None else max(1, ctx.num_nodes // 2)
        if self.clients > ctx.num_nodes:
            raise ValueError(
                f"concurrency={self.concurrency} is more than num_nodes={ctx.num_nodes} (each node is a client)"
            )
        super().setup(ctx)
        self.buffer = torch.zeros_like(self.server) if self.holding else unheld(self.server)
        self.buffered = 0

    def update(self, start: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        return local - start

    def apply(self, update: torch.Tensor, ev: Event) -> None:
        self.buffer.add_(update * staleness_weight(ev.staleness))
        self.buffered += 1
        if self.buffered == self.buffer_size:
            self.server.add_(self.buffer / self.buffer_size * self.server_lr)
            self.buffer.zero_()
            self.buffered = 0

    def deliver(self, state: torch.Tensor) -> None:
        super().deliver(state)
        self.ctx.optimizer.state.clear()  # a fresh local optimizer per participation

    def server_state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer if self.holding else None, "buffered": self.buffered}

    def load_server_state_dict(self, state: dict[str, Any]) -> None:
        if self.holding:  # (a node that does not hold the server keeps no buffer)
            self.buffer.copy_(state["buffer"])
        self.buffered = int(state["buffered"])

    def describe(self) -> str:
        return (
            f"FedBuff(local_steps={self.local_steps}, buffer_size={self.buffer_size}, "
            f"concurrency={self.concurrency}, server_lr={self.server_lr})"
        )


class FedBuffServer(Server):
    """FedBuff as a server (Algorithm 1 of the paper): ``concurrency`` clients drawn from the
    seed train ``local_steps`` steps each from the model they are sent, with a fresh inner
    optimizer; each result ``local - start`` is scaled by ``1 / sqrt(1 + staleness)`` into a
    buffer, and every ``buffer_size`` results the server steps ``x <- x + server_lr * buffer /
    buffer_size``. Each result frees a slot for the next client drawn.

    Args:
        local_steps: ``Q``, a client's steps per task.
        buffer_size: ``B``, results per server step.
        concurrency: ``C``, clients training at once (``None``: half the clients).
        server_lr: ``eta_g``.
    """

    def __init__(
        self, local_steps: int = 10, buffer_size: int = 10, concurrency: int | None = 20, server_lr: float = 1.0
    ):
        super().__init__()
        _check_fedbuff(local_steps, buffer_size, concurrency, server_lr)
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
        self.buffer.add_((result.local - result.start) * staleness_weight(staleness))
        self.buffered += 1
        if self.buffered == self.buffer_size:
            self.params.add_(self.buffer / self.buffer_size * self.server_lr)
            self.buffer.zero_()
            self.buffered = 0
            self.version += 1
        del self.in_flight[bisect.bisect_left(self.in_flight, result.client)]
        if self.open:
            self._draw()

    def state_dict(self) -> dict[str, Any]:
        keys = ("buffered", "version", "draws", "in_flight")
        return {"buffer": self.buffer, **{k: getattr(self, k) for k in keys}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.copy_(state["buffer"])
        self.buffered, self.version, self.draws = int(state["buffered"]), int(state["version"]), int(state["draws"])
        self.in_flight = list(state["in_flight"])

    def describe(self) -> str:
        return (
            f"FedBuff(local_steps={self.local_steps}, buffer_size={self.buffer_size}, "
            f"concurrency={self.concurrency}, server_lr={self.server_lr})"
        )


def draw_free_client(seed: int, draw: int, num_clients: int, in_flight: list[int]) -> int:
    """The ``draw``-th client drawn from ``seed``: uniform among the clients not in flight (in
    ascending order), as [`draw_client`][communicators.draw_client] draws; ``in_flight`` is
    ascending. Costs ``O(len(in_flight))``, whatever the number of clients."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, draw])))
    i = int(rng.integers(num_clients - len(in_flight)))
    for busy in in_flight:  # the i-th free client: skip the busy ones at or below it
        if busy <= i:
            i += 1
        else:
            break
    return i


def _check_fedbuff(local_steps: Any, buffer_size: Any, concurrency: Any, server_lr: Any) -> None:
    checked = [("local_steps", local_steps), ("buffer_size", buffer_size)]
    if concurrency is not None:
        checked.append(("concurrency", concurrency))
    for name, v in checked:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if isinstance(server_lr, bool) or not isinstance(server_lr, (int, float)) or not server_lr > 0:
        raise ValueError(f"server_lr must be a number > 0, got {server_lr!r}")
    if not math.isfinite(server_lr):
        raise ValueError(f"server_lr must be finite, got {server_lr!r}")


__all__ = [
    "FedBuffCommunicator",
    "FedBuffServer",
    "FedBuffTiming",
    "draw_client",
    "draw_free_client",
    "staleness_weight",
]
