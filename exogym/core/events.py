"""The simulated clock of a server algorithm: events in simulated-time order, ticks, the drain.

[`ServerLoop`][exogym.core.events.ServerLoop] runs a [`Server`][exogym.Server]'s rules on the
clock. Every event is a tuple ordered by (simulated second, kind, key, the order it was
scheduled): kinds at one instant run as ``receive`` (a client's result reaches the server), the
server's own kinds, ``serve`` (a send: the state is read now), ``start`` (a client starts a
training step). Times are kept to the nanosecond (``TIME_DIGITS``), so instants meant to coincide
do.

Tick ``k`` is the ``k``-th distinct instant at which a step starts; the run executes the steps of
its first ``max_ticks`` ticks. At the first step start past them the run *drains*: no step starts
and no send is made any more, results whose last step ran still arrive, and the server's
``drain_kinds`` still happen.

The values follow the clock, never the other way round: a task is computed once the clock has
passed the start of its last step (its steps' ticks, and so their learning rates, are known),
in *waves*: every task ready by the time a result is needed is computed at once
(``execute``, which the runtime spreads over its workers). Whatever the machine's speed or the
number of workers, the server sees the same results in the same order.
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Callable
from dataclasses import astuple, dataclass, field
from typing import Any

import torch

from exogym.core.server import Result, Server, ServerContext, Train, _Services, setup_server, staleness_summary

#: Simulated times are kept to the nanosecond: instants meant to coincide (segments of 8 x
#: 0.0025 s and 2 x 0.01 s) do, where float sums would leave them a few 1e-18 s apart.
TIME_DIGITS = 9
#: The event kinds whose payload is a client's task in flight.
_TASK_KINDS = ("start", "receive")


class DeadlockError(RuntimeError):
    """No event is left before the run's last tick: the server sends nothing more."""

    def __init__(self, time: float, ticks: int, max_ticks: int, waiting: list[int]) -> None:
        who = f"client(s) {waiting[:10]} wait for the server" if waiting else "no client is in flight"
        super().__init__(
            f"deadlock at simulated time {time:.6g} s after {ticks} of {max_ticks} steps: {who}, and the server "
            "sends nothing more. Check the algorithm's quorum, buffer size and concurrency against the number of "
            "clients"
        )
        self.time = time


@dataclass
class Task:
    """One task in flight: what was sent, the ticks of its steps, and (once computed) its result."""

    client: int
    train: Train
    start: torch.Tensor
    info: Any
    #: Seconds of its result's transfer from the client to the server it talks to (the upload).
    seconds: float = 0.0
    #: Whether the result is sent to the server (a transfer of ``seconds``).
    upload: bool = True
    #: The simulated second it was sent, and the seconds of its download (``0``: none), charged
    #: when its first step starts (a task the drain stops before its first step cost nothing).
    sent_at: float = 0.0
    download: float = 0.0
    #: The tick of each of its steps that ran.
    ticks: list[int] = field(default_factory=list)
    #: Whether its last step has started (or the run drained first): it can be computed.
    ready: bool = False
    local: torch.Tensor | None = None
    #: Per step that ran, its training loss.
    losses: list[float] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        """The task as plain data (checkpoints): its fields by name, ``train`` as ``(steps,
        fresh_optimizer)``."""
        train = (self.train.steps, self.train.fresh_optimizer)
        return {**vars(self), "train": train, "ticks": list(self.ticks), "losses": list(self.losses)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Task:
        """The task ``state_dict`` gave."""
        return cls(**{**state, "train": Train(*state["train"])})


@dataclass(frozen=True)
class _Send:
    """What a ``Server.send`` asked for, read when its ``serve`` event happens."""

    train: Train
    state: Any
    info: Any
    transfer: bool
    seconds: float | None
    upload: bool


@dataclass
class ClientClock:
    """What the clock counted of one client: steps, compute and transfer seconds, bytes."""

    steps: int = 0
    compute: float = 0.0
    comm: float = 0.0
    sent: int = 0
    received: int = 0


class ServerLoop:
    """Runs ``server`` on the clock (the same on every rank).

    Args:
        server: the algorithm (its ``setup`` is called here).
        ctx: what it gets at setup.
        max_ticks: the run's steps.
        execute: ``execute(tasks)`` computes ``tasks`` (sets each one's ``local`` and ``losses``).
        between_ticks: ``between_ticks(done)``, called after the events of ``done`` ticks and
            before the next tick's steps (``done = 0`` first), then once more after the drain
            with ``done = max_ticks``: where the runtime validates and checkpoints.
    """

    def __init__(
        self,
        server: Server,
        ctx: ServerContext,
        max_ticks: int,
        execute: Callable[[list[Task]], None],
        between_ticks: Callable[[int], None] | None = None,
    ) -> None:
        self.server, self.ctx, self.max_ticks, self.execute = server, ctx, max_ticks, execute
        self.between_ticks = between_ticks
        kinds = ("receive", *server.kinds, "serve", "start")
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"{type(server).__name__}.kinds {server.kinds} repeats or uses a runtime kind {kinds}")
        self._order = {k: i for i, k in enumerate(kinds)}
        self._drain = {"receive", *server.drain_kinds}
        self._handlers = {k: getattr(server, f"on_{k}") for k in server.kinds}
        self._heap: list[tuple[float, int, int, int, str, Any]] = []
        self._seq = 0
        self.time = 0.0
        self.draining = False
        #: The simulated second of each tick, and per tick its steps and their summed losses.
        self.ticks: list[float] = []
        self.tick_steps: list[int] = []
        self.tick_loss: list[float] = []
        self.end_time = 0.0
        #: Results the server has received.
        self.received = 0
        self.clients: dict[int, ClientClock] = {}
        self.in_flight: dict[int, Task] = {}
        self._ready: list[Task] = []
        #: Tasks the drain cut short (computed at the end: their steps' losses count).
        self._cut: list[Task] = []
        self._between = -1  # the last ``done`` between_ticks was called with
        #: Every transfer: ``(simulated second it starts, bytes clients sent, bytes they received)``.
        self.transfers: list[tuple[float, int, int]] = []
        self.nbytes = ctx.nbytes or ctx.params.numel() * ctx.params.element_size()
        server._services = _Services(lambda: self.time, self._open, self._send, self._schedule, self._transfer)
        setup_server(server, ctx)
        self._started = False

    # -- scheduling ----------------------------------------------------------------------------
    def _push(self, time: float, kind: str, key: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (round(time, TIME_DIGITS), self._order[kind], key, self._seq, kind, payload))

    def _send(self, client: int, *args: Any) -> None:
        send = _Send(*args)
        if not isinstance(send.train, Train):
            raise TypeError(f"send: task must be a Train(steps), got {send.train!r}")
        if not (isinstance(client, int) and 0 <= client < self.ctx.num_clients):
            raise ValueError(f"send: client must be a rank in [0, {self.ctx.num_clients}), got {client!r}")
        self._push(self.time, "serve", client, send)

    def _schedule(self, delay: float, kind: str, key: int, data: tuple) -> None:
        self._push(self.time + delay, kind, key, data)

    def _transfer(self, client: int, sent: int, received: int, seconds: float, at: float | None = None) -> None:
        """Count a transfer of ``client`` that starts at ``at`` (default: now)."""
        c = self.clients.setdefault(client, ClientClock())
        c.comm += seconds
        c.sent += sent
        c.received += received
        self.transfers.append((self.time if at is None else at, sent, received))

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        """Run to the end of the drain (from where a loaded state stopped); ``DeadlockError``
        where events run out first."""
        if not self._started:
            self._started = True
            self.server.start()
        while self._heap:
            time, _, key, _, kind, payload = self._heap[0]
            if kind == "start" and self._opens_tick(time):
                self.time = time  # between the ticks: the next one's instant
                self._call_between(len(self.ticks))
            heapq.heappop(self._heap)
            self.time = time
            if kind == "start":
                if self._tick(time):
                    self._on_start(payload)
                continue
            if self.draining and kind not in self._drain:
                continue
            if kind == "receive":
                self.end_time = max(self.end_time, time)
                self._on_receive(payload)
            elif kind == "serve":
                self._on_serve(key, payload)
            else:
                self.end_time = max(self.end_time, time)
                self._handlers[kind](key, *payload)
        if len(self.ticks) < self.max_ticks:
            raise DeadlockError(self.time, len(self.ticks), self.max_ticks, sorted(self.in_flight))
        self._compute(self._cut)  # cut short by the drain: their losses
        self._cut = []
        self._call_between(self.max_ticks)

    def _open(self) -> bool:
        """Whether a step could still start: not draining, and not past the last tick's instant."""
        last = len(self.ticks) == self.max_ticks and self.time > self.ticks[-1]
        return not (self.draining or last)

    def _opens_tick(self, time: float) -> bool:
        return not self.draining and len(self.ticks) < self.max_ticks and (not self.ticks or time > self.ticks[-1])

    def _call_between(self, done: int) -> None:
        if self.between_ticks is not None and done > self._between:
            self._between = done
            self.between_ticks(done)

    def _tick(self, time: float) -> bool:
        """Whether a step starting at ``time`` runs (it may open a tick, or begin the drain)."""
        if self.draining:
            return False
        if not self.ticks or time > self.ticks[-1]:
            if len(self.ticks) == self.max_ticks:
                self._begin_drain()
                return False
            self.ticks.append(time)
            self.tick_steps.append(0)
            self.tick_loss.append(0.0)
        self.tick_steps[-1] += 1
        return True

    def _begin_drain(self) -> None:
        self.draining = True
        for task in self.in_flight.values():  # cut short: they ran what they ran
            if task.ticks and not task.ready:
                task.ready = True
                self._cut.append(task)

    def _on_serve(self, client: int, send: _Send) -> None:
        if client in self.in_flight:
            raise RuntimeError(
                f"{type(self.server).__name__} sent client {client} a task at {self.time:.6g} s while its last one "
                "is in flight: a client runs one task at a time"
            )
        state = send.state() if callable(send.state) else send.state
        start = (self.server.params if state is None else state).detach().clone()
        if send.seconds is None:
            down = self.ctx.transfer_seconds(client, direction="down")
            up = self.ctx.transfer_seconds(client, direction="up")
        else:
            down = up = send.seconds
        delay = down if send.transfer else 0.0
        info = send.info() if callable(send.info) else send.info
        task = self.in_flight[client] = Task(client, send.train, start, info, up, send.upload, self.time, delay)
        self.clients.setdefault(client, ClientClock())  # (a client a send names is in the table)
        self._push(self.time + delay, "start", client, task)

    def _on_start(self, task: Task) -> None:
        if not task.ticks and task.download > 0:  # its download, charged as its first step runs
            self._transfer(task.client, 0, self.nbytes, task.download, at=task.sent_at)
        c = self.clients.setdefault(task.client, ClientClock())
        seconds = self.ctx.step_seconds(task.client)
        c.steps += 1
        c.compute += seconds
        end = round(self.time + seconds, TIME_DIGITS)
        self.end_time = max(self.end_time, end)
        task.ticks.append(len(self.ticks) - 1)
        if len(task.ticks) < task.train.steps:
            self._push(end, "start", task.client, task)
            return
        task.ready = True
        self._ready.append(task)
        up = task.seconds if task.upload else 0.0
        if task.upload:
            self._transfer(task.client, self.nbytes, 0, up, at=end)
        self._push(end + up, "receive", task.client, task)

    def _on_receive(self, task: Task) -> None:
        if task.local is None:
            self._compute(self._ready)
        del self.in_flight[task.client]
        self.received += 1
        assert task.local is not None
        result = Result(task.client, task.start, task.local, task.info, self.time, len(task.ticks))
        self.server.on_result(result)

    def _compute(self, tasks: list[Task]) -> None:
        """Compute ``tasks`` (a wave), count their losses, and empty the ready list."""
        wave = [t for t in tasks if t.local is None]
        if wave:
            self.execute(wave)
            for task in wave:
                for tick, loss in zip(task.ticks, task.losses, strict=True):
                    self.tick_loss[tick] += loss
        self._ready = [t for t in self._ready if t.local is None]

    # -- checkpoints ---------------------------------------------------------------------------
    #: The loop's own counters, ticks and transfers, which a checkpoint holds as they are.
    _SAVED = ("_seq", "time", "end_time", "received", "ticks", "tick_steps", "tick_loss", "transfers", "_between")

    def state_dict(self) -> dict[str, Any]:
        """The clock between two ticks (``between_ticks``), as plain data: its events, the tasks
        in flight with what was sent and computed, the ticks, the clients' clocks, the server.

        Every task an event or the ready list names is its client's task in flight, so they name
        it by the client (an event's ``key``)."""
        server = self.server
        return {
            **{name: copy.copy(getattr(self, name)) for name in self._SAVED},
            "events": [e if e[4] not in _TASK_KINDS else (*e[:5], None) for e in self._heap],
            "tasks": {c: t.state_dict() for c, t in self.in_flight.items()},
            "ready": [t.client for t in self._ready],
            "clients": {c: astuple(k) for c, k in self.clients.items()},
            "params": server.params,
            "server": server.state_dict(),
            "updates": list(server.updates),
            "records": {k: list(v) for k, v in server.records.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict`` (after ``setup``; the server does not start again)."""
        for name in self._SAVED:
            setattr(self, name, state[name])
        self.in_flight = {c: Task.from_state(t) for c, t in state["tasks"].items()}
        self._heap = [e if e[4] not in _TASK_KINDS else (*e[:5], self.in_flight[e[2]]) for e in state["events"]]
        heapq.heapify(self._heap)
        self._ready = [self.in_flight[c] for c in state["ready"]]
        self.clients = {c: ClientClock(*v) for c, v in state["clients"].items()}
        self.server.params.copy_(state["params"])
        self.server.load_state_dict(state["server"])
        self.server.updates, self.server.records = state["updates"], state["records"]
        self._started = True

    # -- what the run reports ------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Every client's steps and utilisation (compute over the run's simulated seconds), the
        staleness of the updates the server recorded, the simulated end, and the server's own."""
        k = self.ctx.num_clients
        steps, util = [0] * k, [0.0] * k
        for r, c in self.clients.items():
            steps[r], util[r] = c.steps, self._utilisation(c)
        return {
            "steps": steps,
            "utilisation": util,
            **staleness_summary(self.server.updates),
            "end_time": self.end_time,
            **self.server.summary(),
        }

    def node_table(self) -> list[dict[str, float]]:
        """Per client that took part, its clock: ``rank``, ``clock`` (the run's end), ``compute``,
        ``comm`` (its transfers), ``wait`` (the rest) and ``utilisation`` (compute / clock)."""
        end = self.end_time
        return [
            {
                "rank": r,
                "clock": end,
                "compute": c.compute,
                "comm": c.comm,
                "wait": max(0.0, end - c.compute - c.comm),
                "utilisation": self._utilisation(c),
            }
            for r, c in sorted(self.clients.items())
        ]

    def _utilisation(self, c: ClientClock) -> float:
        """A client's compute over the run's simulated seconds."""
        return c.compute / self.end_time if self.end_time > 0 else 0.0


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    """``model``'s trainable parameters, flattened into one tensor (``TypeError`` where their
    dtypes differ: the server keeps one flat state)."""
    params = [p for p in model.parameters() if p.requires_grad]
    dtypes = {p.dtype for p in params}
    if len(dtypes) > 1:
        raise TypeError(f"a server algorithm keeps the parameters as one flat tensor; the model's are {dtypes}")
    return torch.cat([p.detach().reshape(-1) for p in params]).clone()


def load_flat(model: torch.nn.Module, flat: torch.Tensor) -> None:
    """Copy ``flat`` into ``model``'s trainable parameters, in place."""
    i = 0
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                n = p.numel()
                p.copy_(flat[i : i + n].view_as(p))
                i += n


__all__ = ["TIME_DIGITS", "ClientClock", "DeadlockError", "ServerLoop", "Task", "flat_params", "load_flat"]
