"""The per-node communication object every strategy and communicator talks through.

``NodeComm`` offers all_reduce, all_gather, broadcast and barrier over the world or over a
partition of it (islands), charges each *logical* collective to the node's
``Ledger``, and is the one place that stages MPS tensors through the CPU
(gloo cannot read MPS memory).

One mode changes what the collectives do, set by the runtime, never by a communicator:
*dropped* nodes (``NodeComm.leaving_out``), which fault injection drops from a round. The
runtime's own measurements (metrics, validation) contribute to collectives whose result a node
does not need (``NodeComm.all_reduce_contribute``, ``NodeComm.all_gather_contribute``); those
two are not part of the ``Comm`` protocol communicators talk through.

All methods but ``NodeComm.charge`` and ``NodeComm.present`` are collectives: every
rank must call them in the same order with the same ``groups`` partition, or the run deadlocks
(the launcher then tears it down).

``all_reduce``, ``all_gather`` and ``broadcast`` take ``async_op=True``: the collective starts
and returns a [`CollectiveHandle`][exogym.strategy.CollectiveHandle] whose result arrives at a
simulated time (``exogym.core.comm.handles``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import torch

from exogym.core.comm.entries import Entries
from exogym.core.comm.groups import (
    Groups,
    members_tuple,
    nbytes,
    partition_index,
    staged,
    subset,
    world_list,
    world_members,
)
from exogym.core.comm.handles import CollectiveHandle, LocalClock, start
from exogym.core.comm.ledger import Ledger
from exogym.core.comm.protocol import Comm
from exogym.core.comm.transport import Transport

#: The reduce operations of ``NodeComm.all_reduce``.
ALL_REDUCE_OPS = ("sum", "mean", "max", "min", "product")


# Per thread: a process runs one node, the thread-world tests and virtual nodes run several.
_LOCAL = threading.local()


def current() -> Comm:
    """The communication object of the node running in this thread.

    Raises ``RuntimeError`` outside a running node (e.g. a strategy method called by hand).
    """
    comm = getattr(_LOCAL, "comm", None)
    if comm is None:
        raise RuntimeError(
            "no ExoGym node is running in this thread: collectives are only available inside "
            "Trainer.fit (or after exogym.core.comm.comm.set_current(...) in a test)"
        )
    return comm


def set_current(comm: Comm | None) -> None:
    """Install ``comm`` as this thread's node communication object (the node loop does this)."""
    _LOCAL.comm = comm


def _check_identity_op(op: str, what: str) -> None:
    if op not in ("sum", "max", "min", "product"):
        raise ValueError(f"{what}: op must be one of sum, max, min, product (mean counts every member); got {op!r}")


class NodeComm:
    """Collectives of one node, with accounting.

    Args:
        rank: this node's rank in ``[0, world_size)``.
        world_size: number of nodes.
        transport: the raw world-wide collectives.
        ledger: where charges go (a fresh one by default).
    """

    def __init__(self, rank: int, world_size: int, transport: Transport, ledger: Ledger | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.transport = transport
        self.ledger = ledger if ledger is not None else Ledger()
        #: Wall seconds spent inside the transport (the simulator's own communication cost).
        self.transport_seconds = 0.0
        #: Ranks dropped from the current step (fault injection; see ``leaving_out``).
        self.dropped: frozenset[int] = frozenset()
        self._everyone = world_list(world_size)  # the members when groups is None (read only, shared)
        #: The node's own simulated clock, which times its handles (``exogym.core.comm.handles``).
        self.clock = LocalClock()

    # -- modes (set by the runtime) ---------------------------------------------------------
    def leaving_out(self, dropped: frozenset[int]) -> contextlib.AbstractContextManager[None]:
        """Within the block, ``dropped`` ranks are left out (the same set on every rank): a
        ``sum`` or ``mean`` all-reduce takes their share as zeros, ``mean`` divides by the
        present members, and only present members are charged (an all-reduce among them). A
        dropped rank still calls every collective, so the calls line up; what it receives is
        not meaningful (it rejoins afterwards, see ``exogym.runtime.faults``). Other
        collectives raise while a rank is dropped. The node loop wraps the strategy's step in
        this; its own measurement collectives run outside."""
        if not dropped and not self.dropped:
            return _NOTHING_MISSING  # every step of a run without faults: no generator to make
        return self._leaving_out(frozenset(dropped))

    @contextlib.contextmanager
    def _leaving_out(self, dropped: frozenset[int]) -> Iterator[None]:
        previous, self.dropped = self.dropped, dropped
        try:
            yield
        finally:
            self.dropped = previous

    # -- bookkeeping ------------------------------------------------------------------------
    def present(self, groups: Groups | None = None) -> list[int]:
        """The members of this rank's group that are not ``dropped``. Not a collective."""
        _, members = self._my_group(groups)
        if not self.dropped:
            return list(members)
        return [r for r in members if r not in self.dropped]

    def wire_payload(self, tensor: torch.Tensor, tag: str = "") -> tuple[int, str]:
        """``(bytes, tag)``: ``tensor``'s own bytes and ``tag`` (see ``Comm``)."""
        return nbytes(tensor), tag

    def _refuse_dropped(self, what: str) -> None:
        if self.dropped:
            raise RuntimeError(
                f"{what} with node(s) {sorted(self.dropped)} dropped from the round: only sum and mean all-reduces "
                "can leave a node out (Communicator.supports_dropout)"
            )

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.transport_seconds += time.perf_counter() - t0

    def _my_group(self, groups: Groups | None) -> tuple[int, list[int]]:
        """(index of this rank's group, its members) for a partition of the world. The list is
        shared between calls: read it, do not change it."""
        if groups is None:
            return 0, self._everyone
        index, members = partition_index(groups, self.world_size)
        i = index[self.rank]
        return i, members[i]

    def _members(self, members: list[int], dropped: frozenset[int] = frozenset()) -> tuple[int, ...]:
        """The participants of a collective over ``members`` less ``dropped``, as a tuple shared
        between nodes and calls (ledger records point to it)."""
        if members is self._everyone and not dropped:
            return world_members(self.world_size)
        return members_tuple(members, dropped)

    def charge(
        self,
        kind: str,
        group_size: int,
        payload: int,
        tag: str = "",
        is_root: bool = False,
        count: int = 1,
        members: tuple[int, ...] | None = None,
    ) -> None:
        """Charge a logical collective without moving data (for algorithms whose physical
        implementation differs from what they would send, e.g. client sampling); ``count``
        identical ones in a row. ``members``: the participating ranks (a network of regions
        prices the collective on their links); when not given, a group of the world's size is
        the world, and a smaller one is priced as if every hop were the world's slowest."""
        if members is None and group_size == self.world_size:
            members = world_members(self.world_size)
        self.ledger.record(kind, group_size, payload, tag, is_root, count, members)

    # -- collectives ----------------------------------------------------------------------
    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: str = "sum",
        groups: Groups | None = None,
        charge: bool = True,
        tag: str = "",
        entries: Entries | None = None,
        async_op: bool = False,
    ) -> torch.Tensor | CollectiveHandle:
        """Reduce ``tensor`` in place within this rank's group and return it.

        ``op`` is ``sum``, ``mean``, ``max``, ``min`` or ``product``; ``groups`` is a partition of
        the ranks, the same on every rank (groups may carry tensors of different sizes). Charged
        as one all_reduce of ``tensor``'s bytes over this rank's group. ``entries`` (where the
        values come from, see ``Entries``) is for wire
        transforms; the node's own comm moves the values as they are. ``async_op=True``: start
        it on ``tensor``'s values at the call and return a
        [`CollectiveHandle`][exogym.strategy.CollectiveHandle] whose ``wait()`` writes the result
        into ``tensor``. Collective.
        """
        if async_op:
            return start(
                self.clock,
                self.ledger,
                "all_reduce",
                tensor,
                lambda t: self.all_reduce(t, op, groups, charge, tag, entries),
            )
        if op not in ALL_REDUCE_OPS:
            raise ValueError(f"op must be one of sum, mean, max, min, product; got {op!r}")
        _, members = self._my_group(groups)
        n = len(members)
        if self.dropped:
            if op not in ("sum", "mean"):
                self._refuse_dropped(f"all_reduce(op={op!r})")
            n = sum(r not in self.dropped for r in members)
            if self.rank in self.dropped:
                tensor.zero_()
                charge = False
        with staged(tensor) as t, self._timed():
            self.transport.all_reduce(t, "sum" if op == "mean" else op, subset(groups, members))
            if op == "mean":
                t.div_(max(1, n))
        if charge and n:
            self.ledger.record("all_reduce", n, nbytes(tensor), tag, members=self._members(members, self.dropped))
        return tensor

    def all_reduce_contribute(self, tensor: torch.Tensor, op: str = "sum", groups: Groups | None = None) -> None:
        """Contribute ``tensor`` to an all-reduce whose result this node does not need.

        For a node that only sends its share of a measurement (e.g. metrics that rank 0 alone
        turns into rows): the peers call ``all_reduce`` (or this) with the same ``op`` and
        ``groups``. The caller hands ``tensor`` over: it must not write to it afterwards, and its
        contents after the call are undefined (virtual nodes queue it and run on at once; the
        reduction reads it later; other transports reduce it in place). Nothing is charged.
        Collective.
        """
        _check_identity_op(op, "all_reduce_contribute")
        self._refuse_dropped("all_reduce_contribute")
        _, members = self._my_group(groups)
        with staged(tensor) as t, self._timed():
            self.transport.all_reduce_contribute(t, op, subset(groups, members))

    def all_gather(
        self,
        tensor: torch.Tensor,
        groups: Groups | None = None,
        charge: bool = True,
        tag: str = "",
        async_op: bool = False,
    ) -> torch.Tensor | CollectiveHandle:
        """Return ``[len(group), *tensor.shape]``: every group member's ``tensor`` in group order.

        Charged as one all_gather of ``tensor``'s bytes over this rank's group. ``async_op=True``:
        start it on ``tensor``'s values at the call and return a
        [`CollectiveHandle`][exogym.strategy.CollectiveHandle] whose ``wait()`` returns the gathered
        tensor. Collective.
        """
        if async_op:
            return start(
                self.clock, self.ledger, "all_gather", tensor, lambda t: self.all_gather(t, groups, charge, tag), False
            )
        self._refuse_dropped("all_gather")
        _, members = self._my_group(groups)
        with staged(tensor) as t, self._timed():
            gathered = self.transport.all_gather(t, subset(groups, members))
        if charge:
            self.charge("all_gather", len(members), nbytes(tensor), tag, members=self._members(members))
        return gathered.to(tensor.device)

    def all_gather_contribute(self, tensor: torch.Tensor, groups: Groups | None = None) -> None:
        """Contribute ``tensor`` to an all-gather whose result this node does not need.

        For a node that only sends its share of a measurement (e.g. its metric events, which
        rank 0 alone turns into rows): the peers call ``all_gather`` (or this) with the same
        ``groups`` and sizes. The caller hands ``tensor`` over: it must not write to it
        afterwards (virtual nodes queue it and run on at once; the gather reads it later).
        Nothing is charged. Collective.
        """
        self._refuse_dropped("all_gather_contribute")
        _, members = self._my_group(groups)
        with staged(tensor) as t, self._timed():
            self.transport.all_gather_contribute(t, subset(groups, members))

    def broadcast(
        self, tensor: torch.Tensor, src: int = 0, charge: bool = True, tag: str = "", async_op: bool = False
    ) -> torch.Tensor | CollectiveHandle:
        """Overwrite ``tensor`` in place with rank ``src``'s and return it. ``async_op=True``: start
        it at the call and return a [`CollectiveHandle`][exogym.strategy.CollectiveHandle] whose
        ``wait()`` writes rank ``src``'s values (as they were at the start) into ``tensor``.
        Collective."""
        if not 0 <= src < self.world_size:
            raise ValueError(f"src must be a rank in [0, {self.world_size}), got {src}")
        if async_op:
            return start(self.clock, self.ledger, "broadcast", tensor, lambda t: self.broadcast(t, src, charge, tag))
        self._refuse_dropped("broadcast")
        with staged(tensor) as t, self._timed():
            self.transport.broadcast(t, src)
        if charge:
            self.charge("broadcast", self.world_size, nbytes(tensor), tag, is_root=self.rank == src)
        return tensor

    def barrier(self) -> None:
        """Block until every rank arrives. Collective; costs no bytes."""
        with self._timed():
            self.transport.barrier()


#: What ``NodeComm.leaving_out`` returns when no rank is dropped.
_NOTHING_MISSING = contextlib.nullcontext()


__all__ = ["ALL_REDUCE_OPS", "Comm", "Groups", "NodeComm", "current", "set_current"]
