"""A simulated parameter server, and the base of the asynchronous algorithms that talk to it.

A [`ServerCommunicator`][communicators.ServerCommunicator] follows its algorithm's ``Timeline``
(simulated once, the same on every rank): at each tick the nodes the timeline names train; after
it, the events up to the next tick happen in simulated-time order:

- ``capture``: the node's update leaves it
  ([`ServerCommunicator.update`][communicators.ServerCommunicator.update]; charged to its ledger as
  a transfer of the payload to the server);
- ``receive``: the server applies it
  ([`ServerCommunicator.apply`][communicators.ServerCommunicator.apply]). The server is simulated on
  the nodes that hold it (every node, or the timeline's ``holders``): each holds a replica, and the
  update reaches every replica through one uncharged all-reduce to which only its sender
  contributes. Every replica applies the same updates in the same order, so they hold the same bits;
- ``serve``: the server's state at that instant is set aside for the node;
- ``deliver``: the node receives it
  ([`ServerCommunicator.deliver`][communicators.ServerCommunicator.deliver]; charged as a transfer
  of the state from the server).

After the run's last tick the strategy's ``finish`` drains the pushes still in flight (the
server receives and applies them; their transfers are charged after the last metric row) and
every node takes the server's state (the run's result).
The server's state, the updates in flight and what was served but not delivered are part of the
module's [`state_dict`][communicators.Communicator.state_dict], so a checkpoint taken with updates
in flight resumes bit-identically.

Compute must be modelled (``Network(compute=<seconds per step>)``, node speeds from
``compute_slowdown``): with measured compute the timeline would depend on this machine's speed.
A transfer between a node and the server takes ``latency + 8 * bytes / bandwidth`` seconds on a
homogeneous network; on a world, on the link between the node's region and the server's (the
first region) and the node's access link.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections import OrderedDict
from typing import Any

import torch

from exogym.core.comm.network import Network
from exogym.core.communicator import Communicator, NodeContext, Participation
from exogym.core.timeline import Event, Simulation, Timeline


def transfer_seconds(network: Network, rank: int, nbytes: int) -> float:
    """Simulated seconds to move ``nbytes`` between node ``rank`` and the server."""
    world = network.world
    if world is None:
        return network.latency + 8.0 * nbytes / network.bandwidth
    link = world.links[world.region_of[rank]][0]
    if link is None:  # a region of one node, the server's: only the access link
        a, bw = 0.0, float("inf")
    else:
        a, bw = link.latency, link.bandwidth
    if world.access:
        a, bw = a + world.access[rank].latency, min(bw, world.access[rank].bandwidth)
    return a + 8.0 * nbytes / bw


def step_seconds(network: Network, num_nodes: int) -> list[float]:
    """Per node, the simulated seconds of a training step: the network's modelled ``compute``
    times the node's ``compute_slowdown``. ``ValueError`` where compute is not a number."""
    c = network.compute
    if isinstance(c, str):
        raise ValueError(
            f"asynchronous strategies follow a simulated timeline, which needs modelled compute: the "
            f"network has compute={c!r}; pass fit(..., network=Network(..., compute=<seconds per "
            "step>))"
        )
    return [float(c) * network.slowdown(r) for r in range(num_nodes)]


#: Timelines simulated in this process, by their settings (the virtual nodes of a worker share one).
_TIMELINES: OrderedDict[tuple[Any, ...], Timeline] = OrderedDict()


#: Per timeline of this process, what its nodes ask of it (``_Index``, built once).
_INDEXES: OrderedDict[int, _Index] = OrderedDict()

#: Per process, the step seconds and (by payload size) transfer seconds of the runs' networks,
#: by the network's identity and the number of nodes.
_TIMINGS: OrderedDict[tuple[int, int], tuple[Network, list[float], dict[int, list[float]]]] = OrderedDict()

#: Per process, tensors that stand for a payload's dtype and size in absent calls.
_LIKES: dict[tuple[Any, ...], torch.Tensor] = {}


class _Index:
    """What every node of a process asks of one timeline, worked out once: each tick's
    participation statement (made when first asked), per node the ticks at which it trains or
    takes part in the communication (what ``Participation.wakes`` answers), the ticks with an event
    every node acts at, and per node those with an event of its own.

    Args:
        tl: the timeline.
        shared: ``shared(ev)``, whether every node acts at event ``ev``
            ([`ServerCommunicator.concerns_all`][communicators.ServerCommunicator.concerns_all]).
        base_handlers: whether the module handles ``receive`` and ``serve`` as
            [`ServerCommunicator`][communicators.ServerCommunicator] does (then a node that does not
            hold the server sits out the tick's collectives at once, ``absent``).
        one_state: whether it serves every node the same state (then consecutive serves from
            one holder are one collective, ``_handled_together``).
    """

    def __init__(self, tl: Timeline, shared: Any, base_handlers: bool, one_state: bool = False) -> None:
        self.tl = tl
        self.statements: list[Participation | None] = [None] * len(tl.trains)
        active: dict[int, set[int]] = {}
        for per_tick in (tl.trains, tl.following or []):
            for step, ranks in enumerate(per_tick):
                for r in ranks:
                    active.setdefault(r, set()).add(step)
        self.active = {r: sorted(steps) for r, steps in active.items()}
        self.end = len(tl.trains)
        self._shared_ticks: list[int] | None = None  # (made when first asked)
        self._own_sorted: dict[int, list[int]] = {}
        #: The nodes served the initial state before the first tick.
        self.initial = frozenset(ev.rank for ev in tl.before if ev.kind == "serve")
        #: Per tick, 1 where an event concerns every node.
        self.shared = bytearray(len(tl.after))
        #: Per node, the ticks with an event that concerns it alone.
        self.own: dict[int, set[int]] = {}
        #: Per node, the ticks with an event that names it (as its node or the holder that sends).
        self.named: dict[int, set[int]] = {}
        #: Per tick, the collectives a node that neither holds the server nor is named by
        #: an event sits out (the tick's receives and serves from a holder); ``0``: none, or
        #: the tick has other events every node acts at.
        self.absent = [0] * len(tl.after)
        #: Whether consecutive serves from one holder are one collective (``_handled_together``).
        self.merges_serves = base_handlers and one_state
        for step, events in enumerate(tl.after):
            collectives, others = 0, False
            for batch in _handled_together(events, self.merges_serves):
                ev = batch[0]
                for e in batch:
                    for r in (e.rank, e.source) if e.source >= 0 else (e.rank,):
                        self.named.setdefault(r, set()).add(step)
                if not shared(ev):
                    self.own.setdefault(ev.rank, set()).add(step)
                    continue
                self.shared[step] = 1
                if ev.kind in ("receive", "serve"):
                    collectives += 1
                else:
                    others = True
            self.absent[step] = collectives if base_handlers and not others else 0
        #: ``_before[t]``: the absent collectives of the ticks before tick ``t``.
        self._before = [0, *itertools.accumulate(self.absent)]

    def due(self, rank: int, start: int, stop: int) -> list[int]:
        """What ``Participation.due`` answers for a module whose
        [`ServerCommunicator.is_due`][communicators.ServerCommunicator.is_due] is the base's: the
        ticks in ``[start, stop)`` at which it is due on node ``rank`` (the first tick, those with
        an event every node acts at, those with an event of its own, any past the timeline's end),
        less those at which a node that does not hold the server only sits out others' transfers
        (``sits_out``), but the last:
        [`ServerCommunicator.communicate`][communicators.Communicator.communicate] at the next tick
        listed makes their absent calls first, as one."""
        ticks = self._shared_ticks
        if ticks is None:
            ticks = self._shared_ticks = [t for t, v in enumerate(self.shared) if v]
        out = ticks[bisect.bisect_left(ticks, start) : bisect.bisect_left(ticks, stop)]
        own = self._own_sorted.get(rank)
        if own is None:
            own = self._own_sorted.setdefault(rank, sorted({0, *self.own.get(rank, ())}))
        mine = own[bisect.bisect_left(own, start) : bisect.bisect_left(own, stop)]
        mine += range(max(start, self.end), stop)  # (past the timeline: due, as is_due says)
        due = sorted({*out, *mine}) if mine else out
        holders = self.tl.holders
        if len(due) < 2 or holders is None or rank in holders:
            return due
        absent, named, end = self.absent, self.named.get(rank, ()), self.end
        return [t for t in due[:-1] if not (0 < t < end and absent[t] and t not in named)] + due[-1:]

    def sits_out(self, rank: int, after: int, before: int) -> int:
        """The absent collectives of node ``rank`` (which does not hold the server) at the
        ticks strictly between ``after`` and ``before`` where it only sits out others'
        transfers."""
        n = self._before[before] - self._before[after + 1]
        named = self.named.get(rank, ())
        return n - sum(self.absent[t] for t in named if after < t < before) if n else 0

    def wakes(self, step: int, rank: int) -> int:
        """The first tick after ``step`` at which ``rank`` trains or takes part in the
        communication, or the timeline's end."""
        steps = self.active.get(rank)
        if not steps:
            return self.end
        i = bisect.bisect_right(steps, step)
        return steps[i] if i < len(steps) else self.end


def _handled_together(events: list[Event], merge_serves: bool) -> list[list[Event]]:
    """``events`` in order, as the module handles them: one at a time, but (``merge_serves``)
    consecutive serves from one holder together, one collective for all: the server's state
    cannot change between them."""
    out: list[list[Event]] = []
    for ev in events:
        last = out[-1][-1] if out else None
        if merge_serves and ev.kind == "serve" and ev.source >= 0 and last is not None:
            if last.kind == "serve" and last.source == ev.source:
                out[-1].append(ev)
                continue
        out.append([ev])
    return out


def _shared_zeros(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The process's one flat tensor of ``numel`` zeros of ``dtype`` on ``device`` (never
    written): what absent calls name and what a node keeps in place of state it does not hold."""
    key = (numel, dtype, device)
    zeros = _LIKES.get(key)
    if zeros is None:  # (setdefault: nodes on threads of their own all get the one kept)
        zeros = _LIKES.setdefault(key, torch.zeros(numel, dtype=dtype, device=device))
    return zeros


def unheld(like: torch.Tensor) -> torch.Tensor:
    """Zeros of ``like``'s size, dtype and device, one tensor per process, standing for state a
    node does not keep (a client that does not hold the server): never written, never read
    for its values (``is_unheld`` tells it apart)."""
    return _shared_zeros(like.numel(), like.dtype, like.device)


def is_unheld(t: torch.Tensor) -> bool:
    """Whether ``t`` is the shared zeros of ``unheld``."""
    return _LIKES.get((t.numel(), t.dtype, t.device)) is t


def _cached(key: tuple[Any, ...], build: Any) -> Timeline:
    tl = _TIMELINES.get(key)
    if tl is None:
        tl = _TIMELINES[key] = build()
        while len(_TIMELINES) > 8:
            _TIMELINES.popitem(last=False)
    return tl


class ServerCommunicator(Communicator):
    """Base of asynchronous modules that push to and pull from a simulated server.

    Subclasses give [`simulation`][communicators.ServerCommunicator.simulation] (the algorithm's
    timing) and define the values: [`update`][communicators.ServerCommunicator.update] (what a node
    pushes), [`apply`][communicators.ServerCommunicator.apply] (how the server applies an update)
    and [`deliver`][communicators.ServerCommunicator.deliver] (what a node does with the state it
    pulls); [`server_state_dict`][communicators.ServerCommunicator.server_state_dict] and
    ``load_server_state_dict`` for the server's own state (e.g. its optimizer's).

    A parameter-space module that runs after every tick; its participation statement names the
    nodes that train at each tick (the others sit it out: they neither compute nor read data).
    """

    space = "param"
    needs_step_seconds = True

    def __init__(self) -> None:
        super().__init__(H=1)
        self.timeline: Timeline | None = None
        self._index: _Index | None = None
        self._due: bytearray | None = None
        #: The tick of the last call of ``communicate`` (``None``: none yet), from which it
        #: makes the absent calls of the ticks a sleep skipped (``_Index.due``).
        self._last_tick: int | None = None

    # -- what subclasses define -------------------------------------------------------------
    def simulation(self, step_seconds: list[float], transfer: list[float], max_steps: int, seed: int) -> Simulation:
        """The algorithm's timing: ``step_seconds`` and ``transfer`` (seconds to move the model
        between each node and the server) per node."""
        raise NotImplementedError

    def timing_key(self) -> tuple[Any, ...]:
        """The settings the timing depends on (the timeline's cache key, with the world's)."""
        raise NotImplementedError

    def update(self, start: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """What a node pushes at the end of a segment, from its flat parameters at the
        segment's start and at its end."""
        raise NotImplementedError

    def apply(self, update: torch.Tensor, ev: Event) -> None:
        """Apply ``update`` (received as ``ev``) to ``server`` in place."""
        raise NotImplementedError

    def deliver(self, state: torch.Tensor) -> None:
        """Load the pulled server state into the node (default: the parameters)."""
        self._write(state)

    def transfers(self, network: Network, num_nodes: int, nbytes: int) -> list[float]:
        """Per node, the seconds to move ``nbytes`` between it and the server it talks to
        (default: ``transfer_seconds``)."""
        return [transfer_seconds(network, r, nbytes) for r in range(num_nodes)]

    def served_state(self, rank: int) -> torch.Tensor:
        """The server state a pull of node ``rank`` is served (default: ``server``)."""
        return self.server

    def server_state_dict(self) -> dict[str, Any]:
        """The server's own state (e.g. its optimizer's), for checkpoints; what a node that does
        not hold the server keeps of it is never read."""
        return {}

    def load_server_state_dict(self, state: dict[str, Any]) -> None:
        pass

    # -- the runtime's side -----------------------------------------------------------------
    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        dtype = functools.reduce(torch.promote_types, (p.dtype for p in self.params))  # (as _read's cat)
        self.nbytes = self.numel * torch.empty((), dtype=dtype).element_size()
        #: The server's state (a replica on every node that holds the server; all hold the
        #: same bits). A node that does not keeps shared zeros (``unheld``), never read.
        self.server = _shared_zeros(self.numel, dtype, self.params[0].device)
        #: This node's parameters at the start of its segment (shared zeros on a node that does
        #: not hold the server, outside its segments).
        self.start = self.server
        #: This node's updates in flight, by segment.
        self.pending: dict[int, torch.Tensor] = {}
        #: The state served to this node and not yet delivered.
        self.incoming: torch.Tensor | None = None
        #: Whether this node holds a replica of the server (``Timeline.holders``; the same
        #: for the whole run).
        self.holding = True
        network = ctx.network
        if network is None:
            self.timeline, self._index, self._due = None, None, None
            self.start = self._read()
            self.server = self.start.clone()
            return
        k = ctx.num_nodes
        seconds, transfer = self._timings(network, k)
        key = (type(self).__name__, self.timing_key(), tuple(seconds), tuple(transfer), ctx.max_steps, ctx.seed)
        self.timeline = tl = _cached(key, lambda: self.simulation(seconds, transfer, ctx.max_steps, ctx.seed).run())
        ix = _INDEXES.get(id(tl))
        if ix is None or ix.tl is not tl:  # one per timeline, shared by a worker's nodes
            as_base, one_state = self._handles_as_base()
            ix = _INDEXES[id(tl)] = _Index(tl, self.concerns_all, as_base, one_state)
            while len(_INDEXES) > 8:
                _INDEXES.popitem(last=False)
        self._index = ix
        own = ix.own.get(ctx.rank, ())
        #: Per tick, 1 where this node is due (``is_due``).
        self._due = bytearray(ix.shared)
        for step in (0, *own):
            self._due[step] = 1
        self._named_ticks = frozenset(ix.named.get(ctx.rank, ()))
        holders = self.timeline.holders
        self.holding = holders is None or ctx.rank in holders
        # (1,000 FedBuff clients would hold a model's worth each)
        if self.holding or ctx.rank in ix.initial:
            self.start = self._read()
        if self.holding:
            self.server = self.start.clone()

    def _timings(self, network: Network, k: int) -> tuple[list[float], list[float]]:
        """``step_seconds`` and [`transfers`][communicators.ServerCommunicator.transfers] of the
        run: the former, and the latter where a subclass keeps the default, worked out once per
        process (a worker's nodes share its network: 1,000 clients would ask them a million
        times)."""
        key = (id(network), k)
        hit = _TIMINGS.get(key)
        if hit is None or hit[0] is not network:
            hit = _TIMINGS[key] = (network, step_seconds(network, k), {})
            while len(_TIMINGS) > 8:
                _TIMINGS.popitem(last=False)
        if type(self).transfers is not ServerCommunicator.transfers:  # (it may keep what it works out)
            return hit[1], self.transfers(network, k, self.nbytes)
        transfer = hit[2].get(self.nbytes)
        if transfer is None:
            transfer = hit[2][self.nbytes] = self.transfers(network, k, self.nbytes)
        return hit[1], transfer

    def participation(self, step: int, num_nodes: int, seed: int) -> Participation | None:
        tl = self.timeline
        if tl is None or step >= len(tl.trains):
            return None
        ix = self._index
        st = ix.statements[step]
        if st is None:
            if tl.following is None:  # every node holds the server: everyone takes part
                st = Participation(period=1, trains=tl.trains[step], replaces=False)
            else:  # the others take no part in the tick's communication: it cannot concern them
                wakes = functools.partial(ix.wakes, step)
                base = type(self).is_due is ServerCommunicator.is_due
                due = ix.due if base and type(self).communicate is ServerCommunicator.communicate else None
                st = Participation(1, tl.trains[step], True, tl.following[step], wakes, due)
            ix.statements[step] = st
        return st

    def concerns_all(self, ev: Event) -> bool:
        """Whether every node acts at ``ev`` (a collective, or a change to every replica of the
        server), or only the node it names (``ev.rank``). The default: every kind but
        ``capture`` and ``deliver``, and ``serve`` where a node that holds the server's state
        sends it. A subclass whose events of a kind of its own concern one node says so here."""
        if ev.kind in ("capture", "deliver"):
            return False
        return ev.kind != "serve" or ev.source >= 0

    def is_due(self, step: int) -> bool:
        """Per node, the ticks after which something concerns it before the next
        ([`concerns_all`][communicators.ServerCommunicator.concerns_all], or an event of its own),
        and the first tick, which hands out the initial state. Every node is due where a collective
        runs; most ticks of a run of unequal nodes concern only the few nodes whose transfers happen
        then."""
        due = self._due
        return due is None or step >= len(due) or due[step] == 1

    def communicate(self, step: int) -> None:
        tl = self.timeline
        if tl is None:
            raise RuntimeError(
                f"{type(self).__name__} needs the run's network to simulate its timeline (run it with fit)"
            )
        last, self._last_tick = self._last_tick, step
        if last is not None and step > last + 1 and not self.holding:
            # the ticks a sleep skipped (the statement's due), where it only sat out others' transfers
            skipped = self._index.sits_out(self.ctx.rank, last, min(step, len(tl.after)))  # type: ignore[union-attr]
            if skipped:
                self.ctx.comm.all_reduce_absent(self.server, repeat=skipped)
        events = tl.after[step]
        if not events and step:  # most ticks of a run of unequal nodes: nothing happens between them
            return
        sits_out = self._index.absent[step] if step and not self.holding else 0  # type: ignore[union-attr]
        if sits_out and step not in self._named_ticks:  # only others' transfers: what _run would do, at once
            self.ctx.comm.all_reduce_absent(self.server, repeat=sits_out)  # (the shared stand-in)
            return
        with torch.no_grad():
            if step == 0:  # what happened before the first tick: every node holds the initial state
                for ev in tl.before:
                    if ev.kind == "serve":  # its delivery may come after the first tick
                        self._on_serve(ev)
                    elif ev.kind == "deliver" and ev.rank == self.ctx.rank:
                        self.incoming = None
                        self._charge(is_root=False)
            self._run(events)

    @torch.no_grad()
    def finish(self) -> None:
        """The drain, after the run's last step: the pushes in flight are received and applied;
        then the node takes the server's state (the run's result). Collective."""
        tl = self.timeline
        final = self.server
        if tl is not None:
            self._run(tl.drain)
            if tl.final_holder >= 0:  # the nodes that do not hold the server are sent its state
                comm = self.ctx.comm
                if self.ctx.rank == tl.final_holder:
                    comm.all_reduce_contribute(self.server.clone())
                else:
                    final = comm.all_reduce_receive(unheld(self.server))
        self._write(final)

    @classmethod
    def _handles_as_base(cls) -> tuple[bool, bool]:
        """Whether the class handles ``receive`` and ``serve`` events as this base does, and
        whether it also serves every node the same state
        ([`served_state`][communicators.ServerCommunicator.served_state])."""
        base = ServerCommunicator
        as_base = all(getattr(cls, h) is getattr(base, h) for h in ("_on_receive", "_on_serve", "concerns_all"))
        return as_base, as_base and cls.served_state is base.served_state

    def _run(self, events: list[Event]) -> None:
        """Handle ``events`` in order: kind ``k`` by ``_on_k`` (a subclass whose simulation
        declares kinds of its own defines their handlers); consecutive serves from one holder
        at once (``_handled_together``)."""
        for batch in _handled_together(events, self._index.merges_serves):  # type: ignore[union-attr]
            if len(batch) > 1:
                self._on_serves(batch)
            else:
                getattr(self, f"_on_{batch[0].kind}")(batch[0])

    def _on_capture(self, ev: Event) -> None:
        if ev.rank == self.ctx.rank:
            self.pending[ev.segment] = self.update(self.start, self._read())
            if not self.holding:  # nothing reads it before the node's next delivery
                self.start = unheld(self.start)
            self._charge(is_root=True)

    def _on_receive(self, ev: Event) -> None:
        comm, me = self.ctx.comm, self.ctx.rank
        # where only some nodes hold the server, every collective of the module names the one
        # shared stand-in, so that a sleeping node's absent calls coalesce
        like = self.server if self.timeline.holders is None else unheld(self.server)
        if ev.rank == me and not self.holding:  # it sends, and needs nothing back
            comm.all_reduce_contribute(self.pending.pop(ev.segment))
            return
        if ev.rank == me:
            update = comm.all_reduce(self.pending.pop(ev.segment), charge=False)
        elif self.holding:
            update = comm.all_reduce_receive(like)
        else:  # a node that does not hold the server: only the sender contributes
            comm.all_reduce_absent(like)
            return
        self.apply(update, ev)

    def _on_serve(self, ev: Event) -> None:
        comm, me = self.ctx.comm, self.ctx.rank
        if ev.source >= 0:  # the served node gets the server's state from a node that holds it
            if me == ev.source:
                comm.all_reduce_contribute(self.served_state(ev.rank).clone())
            elif me == ev.rank:
                self.incoming = comm.all_reduce_receive(unheld(self.server)).clone()
            else:
                comm.all_reduce_absent(unheld(self.server))
        elif ev.rank == me:  # served by itself: a holder, or any node served the initial state
            state = self.served_state(me) if self.holding else self.start
            assert not is_unheld(state), "served from a replica of the server it does not hold"
            self.incoming = state.clone()

    def _on_serves(self, batch: list[Event]) -> None:
        """Serves from one holder in a row: one collective hands the server's state to all."""
        comm, me = self.ctx.comm, self.ctx.rank
        if me == batch[0].source:
            comm.all_reduce_contribute(self.served_state(batch[0].rank).clone())
        elif any(ev.rank == me for ev in batch):
            self.incoming = comm.all_reduce_receive(unheld(self.server)).clone()
        else:
            comm.all_reduce_absent(unheld(self.server))

    def _on_deliver(self, ev: Event) -> None:
        if ev.rank == self.ctx.rank:
            assert self.incoming is not None
            self.start = self.incoming  # (a copy of its own)
            self.deliver(self.incoming)
            self.incoming = None
            self._charge(is_root=False)

    def _charge(self, is_root: bool) -> None:
        r = self.ctx.rank
        self.ctx.comm.charge("broadcast", 2, self.nbytes, type(self).__name__, is_root=is_root, members=(r, r))

    def _read(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def _write(self, flat: torch.Tensor) -> None:
        i = 0
        for p in self.params:
            n = p.numel()
            p.copy_(flat[i : i + n].view_as(p))
            i += n

    def summary(self) -> dict[str, Any]:
        """The run as simulated: per node its steps; the staleness of the updates (see
        ``exogym.core.timeline.Timeline.summary``)."""
        return self.timeline.summary() if self.timeline is not None else {}

    def state_dict(self) -> dict[str, Any]:
        # a node that does not hold the server keeps shared zeros in its place: saved as None
        return {
            "server": self.server if self.holding else None,
            "start": None if is_unheld(self.start) else self.start,
            "pending": dict(self.pending),
            "incoming": self.incoming,
            "server_state": self.server_state_dict(),
            # the tick of its last communication: a sleep after the resume makes the absent
            # calls of the ticks it skips from there (its first tick may come later)
            "last_tick": self._last_tick,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._last_tick = state.get("last_tick")
        if self.holding:
            self.server.copy_(state["server"])
        self.start = unheld(self.server) if state["start"] is None else state["start"].clone()
        self.pending = {int(k): v.clone() for k, v in state["pending"].items()}
        self.incoming = None if state["incoming"] is None else state["incoming"].clone()
        self.load_server_state_dict(state["server_state"])


__all__ = ["ServerCommunicator", "step_seconds", "transfer_seconds"]
