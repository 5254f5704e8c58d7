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
from collections.abc import Iterator, Sequence

import torch

from exogym.core.comm.entries import Entries
from exogym.core.comm.groups import Groups, nbytes, partition_index, shared, staged, subset, world_members
from exogym.core.comm.handles import CollectiveHandle, LocalClock, start
from exogym.core.comm.ledger import Ledger
from exogym.core.comm.protocol import Comm
from exogym.core.comm.transport import REDUCE_OPS, Transport

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


class NodeComm:
    """Collectives of one node, with accounting.

    Args:
        rank: this node's rank in ``[0, world_size)``.
        world_size: number of nodes.
        transport: the raw world-wide collectives.
    """

    def __init__(self, rank: int, world_size: int, transport: Transport) -> None:
        self.rank = rank
        self.world_size = world_size
        self.transport = transport
        #: Where the node's collectives are charged.
        self.ledger = Ledger()
        #: Wall seconds spent inside the transport (the simulator's own communication cost).
        self.transport_seconds = 0.0
        #: Ranks dropped from the current step (fault injection; see ``leaving_out``).
        self.dropped: frozenset[int] = frozenset()
        self._everyone = world_members(world_size)  # the members when groups is None (shared)
        #: The node's own simulated clock, which times its handles (``exogym.core.comm.handles``).
        self.clock = LocalClock()

    # -- modes (set by the runtime) ---------------------------------------------------------
    @contextlib.contextmanager
    def leaving_out(self, dropped: frozenset[int]) -> Iterator[None]:
        """Within the block, ``dropped`` ranks are left out (the same set on every rank): a
        ``sum`` or ``mean`` all-reduce takes their share as zeros, ``mean`` divides by the
        present members, and only present members are charged (an all-reduce among them). A
        dropped rank still calls every collective, so the calls line up; what it receives is
        not meaningful (it rejoins afterwards, see ``exogym.runtime.faults``). Other
        collectives raise while a rank is dropped. The node loop wraps the strategy's step in
        this; its own measurement collectives run outside."""
        previous, self.dropped = self.dropped, frozenset(dropped)
        try:
            yield
        finally:
            self.dropped = previous

    # -- bookkeeping ------------------------------------------------------------------------
    def present(self, groups: Groups | None = None) -> list[int]:
        """The members of this rank's group that are not ``dropped``. Not a collective."""
        return [r for r in self._group(groups) if r not in self.dropped]

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

    def _group(self, groups: Groups | None) -> Sequence[int]:
        """The members of this rank's group of a partition of the world."""
        if groups is None:
            return self._everyone
        index, members = partition_index(groups, self.world_size)
        return members[index[self.rank]]

    def _members(self, members: Sequence[int], dropped: frozenset[int] = frozenset()) -> tuple[int, ...]:
        """The participants of a collective over ``members`` less ``dropped``, as a tuple shared
        between nodes and calls (ledger records point to it)."""
        if members is self._everyone and not dropped:
            return self._everyone
        return shared(tuple(r for r in members if r not in dropped))

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
        """``Comm.all_reduce``: ``op`` is ``sum``, ``mean``, ``max``, ``min`` or ``product``;
        ``groups`` is a partition of the ranks, the same on every rank (groups may carry tensors
        of different sizes). Charged as one all_reduce of ``tensor``'s bytes over this rank's
        group; ``entries`` is for wire transforms (this comm moves the values as they are).
        Collective."""
        if async_op:
            return start(self, "all_reduce", tensor, lambda t: self.all_reduce(t, op, groups, charge, tag, entries))
        if op not in ALL_REDUCE_OPS:
            raise ValueError(f"op must be one of sum, mean, max, min, product; got {op!r}")
        members = self._group(groups)
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
        if op not in REDUCE_OPS:
            raise ValueError(
                "all_reduce_contribute: op must be one of sum, max, min, product (mean counts every member); "
                f"got {op!r}"
            )
        self._refuse_dropped("all_reduce_contribute")
        members = self._group(groups)
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
        """``Comm.all_gather``, charged as one all_gather of ``tensor``'s bytes over this rank's
        group. Collective."""
        if async_op:
            return start(self, "all_gather", tensor, lambda t: self.all_gather(t, groups, charge, tag), False)
        self._refuse_dropped("all_gather")
        members = self._group(groups)
        with staged(tensor) as t, self._timed():
            gathered = self.transport.all_gather(t, subset(groups, members))
        if charge:
            self.charge("all_gather", len(members), nbytes(tensor), tag, members=self._members(members))
        return gathered.to(tensor.device)

    def all_gather_contribute(self, tensor: torch.Tensor, groups: Groups | None = None) -> None:
        """``all_reduce_contribute`` for an all-gather: the peers call ``all_gather`` (or this)
        with the same ``groups`` and sizes; the caller must not write to ``tensor`` afterwards.
        Nothing is charged. Collective."""
        self._refuse_dropped("all_gather_contribute")
        members = self._group(groups)
        with staged(tensor) as t, self._timed():
            self.transport.all_gather_contribute(t, subset(groups, members))

    def broadcast(
        self, tensor: torch.Tensor, src: int = 0, charge: bool = True, tag: str = "", async_op: bool = False
    ) -> torch.Tensor | CollectiveHandle:
        """``Comm.broadcast``, charged as one broadcast of ``tensor``'s bytes over the world.
        Collective."""
        if not 0 <= src < self.world_size:
            raise ValueError(f"src must be a rank in [0, {self.world_size}), got {src}")
        if async_op:
            return start(self, "broadcast", tensor, lambda t: self.broadcast(t, src, charge, tag))
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


__all__ = ["ALL_REDUCE_OPS", "Comm", "Groups", "NodeComm", "current", "set_current"]
