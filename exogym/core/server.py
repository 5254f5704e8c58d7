"""Server algorithms: a server on the simulated clock, and the tasks it starts on clients.

Sampled and asynchronous methods (FedBuff, Async DiLoCo, HALoS, ...) are written as their papers
write them: a server keeps state and rules; it *sends* a client a task ("train ``Q`` steps from
these parameters"); the client's *result* arrives at a later simulated instant and the server
applies it. A subclass of [`Server`][exogym.Server] gives the rules:

- ``setup(ctx)``: its state (``self.params``, the server's flat parameters, is made for it);
- ``start()``: what happens at simulated second 0 (the first sends);
- ``on_result(result)``: a client's result arrived; apply it, maybe send again;
- optional: its own server-side events (``kinds``, ``schedule`` and an ``on_<kind>`` handler per
  kind), ``summary()``, ``state_dict()``/``load_state_dict()``, ``describe()``.

What the runtime owns: the clock (a transfer takes the time of the links between the client and
the server; a training step the client's modelled compute), the run's steps (*ticks*: tick ``k``
is the ``k``-th distinct instant at which some client starts a training step; a run of
``max_steps`` executes the steps of its first ``max_steps`` ticks, then *drains*: results whose
last step ran still arrive, nothing else starts), and the clients: a client no event names is
never built; a client's optimizer state, data position and random stream persist between its
tasks, stored per client. Events at one instant happen in this order: results received (by
ascending client), the server's own kinds in the order of ``kinds``, sends, step starts.

Example, FedAsync with a constant mixing weight (one client at a time per slot)::

    class FedAsync(Server):
        def __init__(self, local_steps=10, concurrency=4, alpha=0.5):
            super().__init__()
            self.local_steps, self.concurrency, self.alpha = local_steps, concurrency, alpha

        def start(self):
            for client in range(self.concurrency):
                self.send(client, Train(self.local_steps))

        def on_result(self, result):
            self.params.lerp_(result.local, self.alpha)  # x <- (1 - a) x + a x_client
            if self.open:
                self.send(result.client, Train(self.local_steps))
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from exogym.core.strategy import Strategy


@dataclass(frozen=True)
class Train:
    """A task: ``steps`` training steps from the parameters sent; the result is the client's
    parameters after them.

    Attributes:
        steps: training steps (>= 1).
        fresh_optimizer: start from a fresh inner optimizer state (FedBuff); ``False``: the
            client's own, kept from its last task (Async DiLoCo).
    """

    steps: int
    fresh_optimizer: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"Train(steps=...) must be an int >= 1, got {self.steps!r}")


@dataclass
class Result:
    """A task's result, as the server receives it.

    Attributes:
        client: the client that ran it.
        start: the flat parameters it was sent (read only).
        local: the client's flat parameters after the task (read only).
        info: what [`Server.send`][exogym.Server.send] attached (e.g. the version sent).
        time: the simulated second it arrived.
        steps: the training steps it ran.
    """

    client: int
    start: torch.Tensor
    local: torch.Tensor
    info: Any
    time: float
    steps: int


@dataclass
class ServerContext:
    """What a server gets at ``setup``.

    Attributes:
        num_clients: the run's clients (its ``num_nodes``); ranks ``0..num_clients-1``.
        seed: the run's seed: derive random draws from it (every rank draws the same).
        params: the model's initial trainable parameters, flattened.
        step_seconds: ``step_seconds(client)``, the simulated seconds of one training step.
        transfer_seconds: ``transfer_seconds(client, nbytes=None, *, direction)``, of one
            transfer between the client and the server (``nbytes=None``: the parameters,
            ``nbytes`` bytes), ``direction="up"`` from the client (at its upload) or ``"down"``
            to it (at its download).
        steps_per_epoch: a client's full batches in one pass over its data (client 0's, as
            ``fit`` counts the epochs of a run): what a task of ``E`` epochs is in steps.
        region_of: ``region_of(client)``, the client's region (``0`` without regions).
        regions: the world's regions (``1`` without regions).
        network: the run's network ([`Network`][exogym.Network]).
        nbytes: what one transfer of the model carries: the bytes of ``params``, or with a
            [`Scale`][exogym.Scale] the target's (a part of the model carries its share of them).
        adversaries: the run's malicious clients
            ([`AdversaryPlan`][exogym.adversaries.AdversaryPlan]; ``None``: every client is
            honest): a server that aggregates results attacks their rows with it.
    """

    num_clients: int
    seed: int
    params: torch.Tensor
    step_seconds: Callable[[int], float]
    transfer_seconds: Callable[..., float]
    steps_per_epoch: int
    region_of: Callable[[int], int] = lambda client: 0
    regions: int = 1
    network: Any = None
    nbytes: int = 0
    adversaries: Any = None


@dataclass
class _Services:
    """What the runtime lends a server (bound at setup)."""

    now: Callable[[], float]
    open: Callable[[], bool]
    send: Callable[..., None]
    schedule: Callable[..., None]
    transfer: Callable[..., None]


class Server:
    """Base of server algorithms (see the module docstring).

    A subclass overrides ``start`` and ``on_result`` (and ``setup`` to make its state, calling
    ``super().setup(ctx)`` first). The runtime calls them on every rank in the same order with
    the same results, so every rank holds the same server state.
    """

    #: The server's own event kinds, in their order at one instant (each handled by ``on_<kind>``).
    kinds: ClassVar[tuple[str, ...]] = ()
    #: Those of ``kinds`` still handled while the run drains.
    drain_kinds: ClassVar[frozenset[str]] = frozenset()
    #: Whether the server reads the network's availability trace (``ctx.network.availability``)
    #: and keeps absent clients out itself; a run with a trace that takes clients away refuses
    #: a server that does not.
    follows_availability: ClassVar[bool] = False

    def __init__(self) -> None:
        self._services: _Services | None = None
        self.updates: list[tuple[float, int, int]] = []
        self.records: dict[str, list[tuple]] = {}

    # -- what a subclass writes ----------------------------------------------------------------
    def setup(self, ctx: ServerContext) -> None:
        """Make the server's state; ``self.params`` is a copy of ``ctx.params``. Subclasses call
        ``super().setup(ctx)`` first."""
        self.ctx = ctx
        self.params = ctx.params.clone()
        self.updates, self.records = [], {}

    def start(self) -> None:
        """What happens at simulated second 0."""
        raise NotImplementedError(f"{type(self).__name__} must implement start()")

    def on_result(self, result: Result) -> None:
        """Client ``result.client``'s result arrived."""
        raise NotImplementedError(f"{type(self).__name__} must implement on_result(result)")

    def summary(self) -> dict[str, Any]:
        """Further figures of the run for ``Trainer.result["summary"]`` (the runtime adds every
        client's steps and utilisation, the updates' staleness and the simulated end)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The server's state for checkpoints (``self.params`` is saved by the runtime)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    def describe(self) -> str:
        """A label with the settings (logs; the check that a resumed run matches)."""
        return type(self).__name__

    # -- what the runtime lends ------------------------------------------------------------------
    @property
    def now(self) -> float:
        """The simulated second of the event being handled."""
        return self._bound().now()

    @property
    def open(self) -> bool:
        """Whether the run still takes steps (``False`` once it drains: sends are ignored)."""
        return self._bound().open()

    def send(
        self,
        client: int,
        task: Train,
        *,
        state: torch.Tensor | Callable[[], torch.Tensor] | None = None,
        info: Any = None,
        transfer: bool = True,
        seconds: float | None = None,
        upload: bool = True,
    ) -> None:
        """Send ``client`` the task ``task`` from ``state`` (default ``self.params``; a function
        returning it is called then) as it is at this instant, after the results and server
        events of this instant: the client starts once
        the transfer arrives (``transfer=False``: at once, where it holds the state already, e.g.
        the initial model at second 0), and its [`Result`][exogym.Result] reaches
        [`on_result`][exogym.Server.on_result] one transfer after its last step. ``info`` comes
        back with the result; a function given as ``info`` is called when the state is read, so
        that it sees what the state has then (``info=lambda: self.version``: the version sent,
        after every result of this instant). ``seconds``: of one transfer each way, where the state
        does not come from the server's own place (``None``: ``ctx.transfer_seconds(client,
        direction=...)``, down for the state and up for the result;
        HALoS's workers talk to a server in their own region). ``upload=False``: the result is not
        sent (the client keeps its parameters, and the server reads them where it has them:
        Decoupled DiLoCo's learners, whose every step is a task); it reaches ``on_result`` at the
        end of the last step. A client runs one task at a time."""
        if seconds is not None and not (seconds >= 0 and math.isfinite(seconds)):
            raise ValueError(f"send: seconds must be a finite number >= 0 or None, got {seconds!r}")
        self._bound().send(client, task, state, info, transfer, seconds, upload)

    def transfer(self, client: int, sent: int = 0, received: int = 0, seconds: float = 0.0) -> None:
        """Count a transfer the server's own events make with ``client``: ``sent`` bytes from it,
        ``received`` bytes to it, and ``seconds`` the client waits for it (``0`` for one it does
        not wait for, a fragment sent while it trains on). The run's bytes and the client's
        clock include it."""
        self._bound().transfer(client, sent, received, seconds)

    def schedule(self, delay: float, kind: str, key: int, *data: Any) -> None:
        """A server-side event ``kind`` (one of ``kinds``) ``delay`` seconds after this instant, handled by
        ``on_<kind>(key, *data)`` (events at one instant: by ``kinds``, then ``key``)."""
        if kind not in self.kinds:
            raise ValueError(f"{type(self).__name__}.schedule: kind {kind!r} is not one of its kinds {self.kinds}")
        if not (delay >= 0 and math.isfinite(delay)):
            raise ValueError(f"{type(self).__name__}.schedule: delay must be a finite number >= 0, got {delay!r}")
        self._bound().schedule(delay, kind, key, data)

    def record_update(self, client: int, staleness: int, time: float | None = None) -> None:
        """Note that an update of ``client`` received at ``time`` (default: now) was applied
        ``staleness`` server steps after what it started from: the run summary's staleness
        figures."""
        self.updates.append((self.now if time is None else time, client, staleness))

    def record(self, name: str, *values: Any) -> None:
        """Append ``values`` to the record ``name`` (an algorithm's own figures, in time order)."""
        self.records.setdefault(name, []).append(values)

    def _bound(self) -> _Services:
        if self._services is None:
            raise RuntimeError(f"{type(self).__name__} is not running: the runtime binds it at the start of a run")
        return self._services


def setup_server(server: Server, ctx: ServerContext) -> None:
    """``server.setup(ctx)``, then a ``TypeError`` naming the fix where a subclass's ``setup``
    did not call ``super().setup(ctx)`` (which makes ``self.params``)."""
    server.setup(ctx)
    if not isinstance(getattr(server, "params", None), torch.Tensor) or getattr(server, "ctx", None) is not ctx:
        raise TypeError(
            f"{type(server).__name__}.setup(ctx) must call super().setup(ctx) first: it keeps ctx and makes "
            "self.params, the server's parameters"
        )


def staleness_summary(updates: list[tuple[float, int, int]]) -> dict[str, Any]:
    """Of ``updates`` (``(time, client, staleness)``): their number, the staleness histogram
    (``{staleness: count}``), its mean and maximum."""
    hist = Counter(s for _, _, s in updates)
    n = len(updates)
    return {
        "updates": n,
        "staleness": dict(sorted(hist.items())),
        "staleness_mean": sum(s * c for s, c in hist.items()) / n if n else 0.0,
        "staleness_max": max(hist, default=0),
    }


class ServerStrategy(Strategy):
    """A strategy whose communication is a server algorithm: the clients' inner optimizer, LR
    schedule and clipping (as for any [`Strategy`][exogym.strategy.Strategy]) around the
    [`Server`][exogym.Server]'s rules. The runtime runs it as a server and tasks on the simulated
    clock: ``fit``'s ``max_steps`` counts the run's ticks.

    Args:
        server: the algorithm.
        optim_spec, lr_scheduler, lr_scheduler_kwargs, max_norm, inner_optim, lr, warmup_steps: the
            clients' inner optimizer, as for [`Strategy`][exogym.strategy.Strategy].
    """

    def __init__(
        self,
        server: Server,
        optim_spec: Any = None,
        lr_scheduler: Any = None,
        lr_scheduler_kwargs: dict[str, Any] | None = None,
        max_norm: float | None = None,
        *,
        inner_optim: Any = None,
        lr: float | None = None,
        warmup_steps: int | None = None,
    ) -> None:
        if not isinstance(server, Server):
            raise TypeError(f"server must be a Server (exogym.Server subclass), got {server!r}")
        super().__init__(
            optim_spec, lr_scheduler, lr_scheduler_kwargs, max_norm, inner_optim=inner_optim, lr=lr,
            warmup_steps=warmup_steps,
        )  # fmt: skip
        self.server = server
        self._summary: dict[str, Any] = {}

    @property
    def needs_step_seconds(self) -> bool:
        return True

    @property
    def follows_availability(self) -> bool:
        """Whether the server reads the network's availability trace itself
        ([`Server.follows_availability`][exogym.Server]): the runtime never turns a trace into
        rounds that a server's clients drop out of."""
        return self.server.follows_availability

    def step(self) -> None:
        """A client's training step: clip, the inner optimizer's step, the step counter."""
        self.update_parameters()
        super().step()

    def run_summary(self) -> dict[str, Any]:
        """Every client's steps and utilisation, the staleness of the updates, the simulated end,
        and the server's own figures (set by the runtime at the end of a run)."""
        return dict(self._summary)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "server": self.server.describe()}


__all__ = ["Result", "Server", "ServerContext", "ServerStrategy", "Train", "setup_server", "staleness_summary"]
