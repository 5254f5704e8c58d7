"""Simulated timelines of asynchronous algorithms: who computes when, and what reaches whom when.

In an asynchronous algorithm every node trains on its own clock and talks to a simulated server:
it *pushes* an update (the server receives it after the transfer and applies updates in the
order they arrive) and *pulls* the server's state (served at the simulated instant the request
arrives, received after the transfer). What a node receives therefore depends on simulated
times only. With modelled compute (a number of seconds per step, times each node's
``compute_slowdown``) neither a step's duration nor a transfer's depends on the values being
trained, so the timing can be simulated first, alone, as a discrete-event simulation (a heap of
timed events, no tensors): ``Simulation``. Its result, a ``Timeline``, is the same on
every rank, in every layout and in every run, and the values then follow it in simulated-time
order (``communicators.server``).

The run's step counter counts *ticks*: tick ``k`` is the ``k``-th distinct simulated instant at
which some node starts a training step. At a tick the nodes starting a step train (the others sit
it out), then every event up to the next tick happens, in simulated-time order. With equal speeds
every node trains at every tick, and ticks are the synchronous run's steps.

Events at one instant happen in this order: pushes captured (a node's update leaves it), pushes
received by the server (by ascending rank), pulls served (by ascending rank), pulls delivered,
steps started. A run of ``max_steps`` ticks then *drains*: the pushes of segments whose last step
was taken are still received and applied; nothing else happens.

A simulation that runs out of events before its last tick is a deadlock: ``DeadlockError``
names the nodes and what each waits for.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

#: Simulated times are kept to the nanosecond (this many decimals of a second): instants meant to
#: coincide (two nodes' segments of 8 x 0.0025 s and 2 x 0.01 s) then do, where float sums
#: would leave them a few 1e-18 s apart and split one tick into several.
TIME_DIGITS = 9

#: Event kinds in their order at one simulated instant (a ``Simulation`` may declare more).
KINDS = ("capture", "receive", "serve", "deliver", "start")


class DeadlockError(RuntimeError):
    """No event is left before the run's last tick: every node waits for something no one will
    send. ``waiting`` maps each waiting node to what it waits for."""

    def __init__(self, time: float, waiting: dict[int, str], ticks: int, max_ticks: int) -> None:
        who = "; ".join(f"node {r} waits for {what}" for r, what in sorted(waiting.items())) or "no node runs"
        super().__init__(
            f"deadlock at simulated time {time:.6g} s after {ticks} of {max_ticks} steps: {who}. Nothing "
            "will be sent to them: check the algorithm's quorum, buffer size and concurrency against the "
            "number of nodes"
        )
        self.time, self.waiting = time, waiting


@dataclass(frozen=True)
class Event:
    """One timed event of a node or the server.

    Attributes:
        time: its simulated second.
        kind: one of its simulation's ``Simulation.kinds`` (``KINDS`` by default).
        rank: the node it concerns.
        segment: the node's push it concerns (its count of pushes before it), else ``0``.
        staleness: for ``receive``: server versions applied between the version the node
            started the segment from and the one the update is applied to.
        source: for ``serve``: the node whose copy of the server's state is sent to ``rank``
            (a node that holds it current), or ``-1`` where ``rank`` holds it itself.
        data: what else an algorithm's own kinds of event carry (e.g. the nodes a merge takes,
            with their weights).
    """

    time: float
    kind: str
    rank: int
    segment: int = 0
    staleness: int = 0
    source: int = -1
    data: tuple = ()


@dataclass
class Timeline:
    """A simulated run, as every rank computes it.

    Attributes:
        ticks: the simulated second of each tick (the run's steps).
        trains: per tick, the nodes that start a training step at it.
        after: per tick, the events after its steps and before the next tick's, in order (the
            last tick's: those before the first step the run does not take).
        before: the events before the first tick (deliveries of the initial state).
        drain: the events after the run's last tick: the pushes still received and applied.
        steps: per node, the training steps it takes.
        updates: per update the server applies: ``(time received, rank, staleness)``.
        compute: per node, its seconds of compute.
        end_time: the simulated second the run ends: its last step's end or the server's last
            receipt, whichever is later.
        holders: the nodes that hold a replica of the server through the run (apply every
            update and send its state to the nodes served from them, as a ``serve``'s
            ``source``); ``None``: every node.
        following: per tick, where only ``holders`` hold the server, the nodes that take
            part in the communication after it: the holders and the nodes its events name (as
            their node or source). The others take no part in it and may sleep through it.
        records: an algorithm's further records, by name (e.g. HALoS's updates between its
            servers), each a list of tuples in simulated-time order.
    """

    ticks: list[float] = field(default_factory=list)
    trains: list[frozenset[int]] = field(default_factory=list)
    after: list[list[Event]] = field(default_factory=list)
    before: list[Event] = field(default_factory=list)
    drain: list[Event] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    updates: list[tuple[float, int, int]] = field(default_factory=list)
    compute: list[float] = field(default_factory=list)
    end_time: float = 0.0
    holders: frozenset[int] | None = None
    following: list[frozenset[int]] | None = None
    records: dict[str, list[tuple]] = field(default_factory=dict)

    @property
    def final_holder(self) -> int:
        """The node that sends the server's final state to the others (the first of
        ``holders``), or ``-1`` where every node holds the server."""
        return -1 if not self.holders else min(self.holders)

    def summary(self) -> dict[str, object]:
        """Per node its steps and utilisation (its compute seconds over the run's simulated
        seconds); over updates the staleness distribution (``{staleness: count}``), its mean and
        maximum; the number of updates and the simulated end."""
        hist: dict[int, int] = {}
        for _, _, s in self.updates:
            hist[s] = hist.get(s, 0) + 1
        n = len(self.updates)
        return {
            "steps": list(self.steps),
            "utilisation": [c / self.end_time if self.end_time > 0 else 0.0 for c in self.compute],
            "updates": n,
            "staleness": dict(sorted(hist.items())),
            "staleness_mean": sum(s * c for s, c in hist.items()) / n if n else 0.0,
            "staleness_max": max(hist, default=0),
            "end_time": self.end_time,
        }


def format_summary(summary: dict[str, object]) -> str:
    """A strategy's [`run_summary`][exogym.strategy.Strategy.run_summary] in one line for logs:
    ``key=value`` pairs, floats (also in lists) to 4 significant digits."""

    def text(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        if isinstance(v, list):
            return "[" + ", ".join(text(x) for x in v) + "]"
        return str(v)

    return ", ".join(f"{k}={text(v)}" for k, v in summary.items())


class Simulation:
    """The timing of an asynchronous algorithm: subclasses schedule events in ``begin`` and
    react to them in ``on_start``, ``on_capture``, ``on_receive``, ``on_serve``
    and ``on_deliver`` (each may ``schedule`` more, and may return the event with what
    it found, e.g. a receipt's staleness, which the timeline then keeps).

    A subclass with events of its own (e.g. between two servers) lists every kind in
    ``kinds``, in their order at one instant, and handles kind ``k`` in ``on_k``; ``start``
    stays the last kind (steps start after everything else at their instant).

    Args:
        step_seconds: per node, the simulated seconds one training step lasts.
        max_ticks: the run's steps (ticks).
    """

    #: The event kinds, in their order at one simulated instant.
    kinds: tuple[str, ...] = KINDS
    #: The kinds still handled after the run's last tick (the drain).
    drain_kinds: frozenset[str] = frozenset({"capture", "receive"})

    def __init__(self, step_seconds: Sequence[float], max_ticks: int) -> None:
        if self.kinds[-1] != "start":
            raise ValueError(f"{type(self).__name__}.kinds must end with 'start', got {self.kinds}")
        self._order = {k: i for i, k in enumerate(self.kinds)}
        if any(not (s >= 0 and math.isfinite(s)) for s in step_seconds):
            raise ValueError(f"step seconds must be finite and >= 0, got {list(step_seconds)}")
        self.step_seconds = list(step_seconds)
        self.num_nodes = len(self.step_seconds)
        self.max_ticks = max_ticks
        self._heap: list[tuple[float, int, int, int, Event]] = []
        self._seq = 0
        #: Per node, what it waits for while it has no event scheduled (deadlock reports).
        self.waiting: dict[int, str] = {}
        self.timeline = Timeline(steps=[0] * self.num_nodes, compute=[0.0] * self.num_nodes)
        self.draining = False
        self.clock = 0.0

    def schedule(self, time: float, kind: str, rank: int, segment: int = 0, source: int = -1, data: tuple = ()) -> None:
        """Make event ``kind`` of node ``rank`` happen at simulated second ``time`` (``segment``,
        ``source`` and ``data`` as in ``Event``). Events at one instant run in the order of
        ``kinds``, then by ``rank``, then in the order they were scheduled."""
        self._seq += 1
        time = round(time, TIME_DIGITS)
        ev = Event(time, kind, rank, segment, source=source, data=data)
        heapq.heappush(self._heap, (time, self._order[kind], rank, self._seq, ev))

    def step_end(self, rank: int, start: float) -> float:
        """The end of node ``rank``'s step that starts at ``start`` (its compute counted)."""
        tl = self.timeline
        tl.steps[rank] += 1
        tl.compute[rank] += self.step_seconds[rank]
        end = round(start + self.step_seconds[rank], TIME_DIGITS)
        tl.end_time = max(tl.end_time, end)
        return end

    def record_update(self, time: float, rank: int, staleness: int) -> None:
        """Note an update the server applies (for the staleness report)."""
        self.timeline.updates.append((time, rank, staleness))

    def record(self, name: str, *values: object) -> None:
        """Append ``values`` to the timeline's record ``name`` (see ``Timeline.records``)."""
        self.timeline.records.setdefault(name, []).append(values)

    def touch(self, time: float) -> None:
        """Something happened at ``time``: the run lasts at least until then."""
        self.timeline.end_time = max(self.timeline.end_time, time)

    # -- what subclasses define -------------------------------------------------------------
    def begin(self) -> None:
        raise NotImplementedError

    def on_start(self, ev: Event) -> Event | None:
        raise NotImplementedError

    def on_capture(self, ev: Event) -> Event | None:
        return None

    def on_receive(self, ev: Event) -> Event | None:
        return None

    def on_serve(self, ev: Event) -> Event | None:
        return None

    def on_deliver(self, ev: Event) -> Event | None:
        return None

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> Timeline:
        """Simulate the run; ``DeadlockError`` where events run out before its last tick."""
        tl = self.timeline
        self.begin()
        handlers = {k: getattr(self, f"on_{k}") for k in self.kinds}
        while self._heap:
            time, _, rank, _, ev = heapq.heappop(self._heap)
            self.clock = time
            if ev.kind == "start":
                if self.draining:
                    continue
                if not tl.ticks or time > tl.ticks[-1]:
                    if len(tl.ticks) == self.max_ticks:
                        self.draining = True
                        continue
                    tl.ticks.append(time)
                    tl.trains.append(frozenset())
                    tl.after.append([])
                tl.trains[-1] = tl.trains[-1] | {rank}
                self.waiting.pop(rank, None)
            elif self.draining and ev.kind not in self.drain_kinds:
                continue
            if ev.kind == "receive":
                tl.end_time = max(tl.end_time, time)
            done = handlers[ev.kind](ev) or ev  # a handler may return the event with what it found
            if ev.kind != "start":
                (tl.drain if self.draining else tl.after[-1] if tl.after else tl.before).append(done)
        if len(tl.ticks) < self.max_ticks:
            raise DeadlockError(self.clock, dict(self.waiting), len(tl.ticks), self.max_ticks)
        if tl.holders is not None:
            tl.following = [tl.holders | _named(events) for events in tl.after]
            if tl.following:
                tl.following[0] |= _named(tl.before)
        return tl


def _named(events: list[Event]) -> frozenset[int]:
    """The nodes ``events`` name, as their node or as a ``serve``'s source."""
    return frozenset(r for ev in events for r in (ev.rank, ev.source) if r >= 0)


__all__ = ["KINDS", "TIME_DIGITS", "DeadlockError", "Event", "Simulation", "Timeline", "format_summary"]
