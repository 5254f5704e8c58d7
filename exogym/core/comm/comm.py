"""The per-node communication object every strategy and communicator talks through.

:class:`NodeComm` offers all_reduce, all_gather, broadcast and barrier over the world or over a
partition of it (islands), charges each *logical* collective to the node's
:class:`~exogym.core.comm.ledger.Ledger`, and is the one place that stages MPS tensors through the CPU
(gloo cannot read MPS memory).

All methods are collectives: every rank must call them in the same order with the same
``groups`` partition, or the run deadlocks (the launcher then tears it down).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import torch

from exogym.core.comm.ledger import Ledger
from exogym.core.comm.transport import Transport, reduce_identity

Groups = Sequence[Sequence[int]]


@runtime_checkable
class Comm(Protocol):
    """The collectives a strategy or communicator may call, with accounting.

    :class:`NodeComm` is the node's own; wrappers such as
    :class:`communicators.quantize.QuantizedComm` implement the same protocol around it. Every
    method but :meth:`charge` is a collective: every rank must call it, in the same order.
    """

    rank: int
    world_size: int
    ledger: Ledger

    def all_reduce(
        self, tensor: torch.Tensor, op: str = "sum", groups: Groups | None = None, charge: bool = True, tag: str = ""
    ) -> torch.Tensor:
        """Reduce ``tensor`` in place within this rank's group; return it."""
        ...

    def all_gather(
        self, tensor: torch.Tensor, groups: Groups | None = None, charge: bool = True, tag: str = ""
    ) -> torch.Tensor:
        """``[len(group), *tensor.shape]``: every group member's ``tensor``, in group order."""
        ...

    def broadcast(self, tensor: torch.Tensor, src: int = 0, charge: bool = True, tag: str = "") -> torch.Tensor:
        """Overwrite ``tensor`` in place with rank ``src``'s; return it."""
        ...

    def barrier(self) -> None:
        """Block until every rank arrives."""
        ...

    def charge(
        self, kind: str, group_size: int, payload: int, tag: str = "", is_root: bool = False, count: int = 1
    ) -> None:
        """Record a logical collective in the ledger without moving data (``count``: that many
        identical ones in a row, e.g. for rounds a node sits out). Not a collective."""
        ...

    def present(self, groups: Groups | None = None) -> list[int]:
        """The members of this rank's group taking part now (all of them unless faults drop
        nodes, see :mod:`exogym.runtime.faults`). Not a collective."""
        ...


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
        ledger: where charges go (a fresh one by default).
    """

    def __init__(self, rank: int, world_size: int, transport: Transport, ledger: Ledger | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.transport = transport
        self.ledger = ledger if ledger is not None else Ledger()
        #: Wall seconds spent inside the transport (the simulator's own communication cost).
        self.transport_seconds = 0.0
        #: Ranks missing from the current step (fault injection; see :meth:`leaving_out`).
        self.absent: frozenset[int] = frozenset()
        self._everyone = list(range(world_size))  # the members when groups is None (read only)

    def leaving_out(self, absent: frozenset[int]) -> contextlib.AbstractContextManager[None]:
        """Within the block, ``absent`` ranks are missing (the same set on every rank): a ``sum``
        or ``mean`` all-reduce takes their share as zeros, ``mean`` divides by the present
        members, and only present members are charged (an all-reduce among them). An absent
        rank still calls every collective, so the calls line up; what it receives is not
        meaningful (it rejoins afterwards, see :mod:`exogym.runtime.faults`). Other
        collectives raise while a rank is missing. The node loop wraps the strategy's step in
        this; its own measurement collectives run outside."""
        if not absent and not self.absent:
            return _NOTHING_MISSING  # every step of a run without faults: no generator to make
        return self._leaving_out(frozenset(absent))

    @contextlib.contextmanager
    def _leaving_out(self, absent: frozenset[int]) -> Iterator[None]:
        previous, self.absent = self.absent, absent
        try:
            yield
        finally:
            self.absent = previous

    def present(self, groups: Groups | None = None) -> list[int]:
        """The members of this rank's group that are not :attr:`absent`. Not a collective."""
        _, members = self._my_group(groups)
        if not self.absent:
            return list(members)
        return [r for r in members if r not in self.absent]

    def _refuse_absent(self, what: str) -> None:
        if self.absent:
            raise RuntimeError(
                f"{what} with node(s) {sorted(self.absent)} missing from the round: only sum and mean all-reduces "
                "can leave a node out (Communicator.supports_dropout)"
            )

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.transport_seconds += time.perf_counter() - t0

    # -- groups ---------------------------------------------------------------------------
    def _my_group(self, groups: Groups | None) -> tuple[int, list[int]]:
        """(index of this rank's group, its members) for a partition of the world. The list is
        shared between calls: read it, do not change it."""
        if groups is None:
            return 0, self._everyone
        index, members = _partition_index(groups, self.world_size)
        i = index[self.rank]
        return i, members[i]

    def charge(
        self, kind: str, group_size: int, payload: int, tag: str = "", is_root: bool = False, count: int = 1
    ) -> None:
        """Charge a logical collective without moving data (for algorithms whose physical
        implementation differs from what they would send, e.g. client sampling); ``count``
        identical ones in a row."""
        self.ledger.record(kind, group_size, payload, tag, is_root, count)

    # -- collectives ----------------------------------------------------------------------
    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: str = "sum",
        groups: Groups | None = None,
        charge: bool = True,
        tag: str = "",
    ) -> torch.Tensor:
        """Reduce ``tensor`` in place within this rank's group and return it.

        ``op`` is ``sum``, ``mean``, ``max``, ``min`` or ``product``; ``groups`` is a partition of
        the ranks, the same on every rank (groups may carry tensors of different sizes). Charged
        as one all_reduce of ``tensor``'s bytes over this rank's group. Collective.
        """
        if op not in ("sum", "mean", "max", "min", "product"):
            raise ValueError(f"op must be one of sum, mean, max, min, product; got {op!r}")
        _, members = self._my_group(groups)
        n = len(members)
        if self.absent:
            if op not in ("sum", "mean"):
                self._refuse_absent(f"all_reduce(op={op!r})")
            n = sum(r not in self.absent for r in members)
            if self.rank in self.absent:
                tensor.zero_()
                charge = False
        with _staged(tensor) as t, self._timed():
            self.transport.all_reduce(t, "sum" if op == "mean" else op, _subset(groups, members))
            if op == "mean":
                t.div_(max(1, n))
        if charge and n:
            self.ledger.record("all_reduce", n, _nbytes(tensor), tag)
        return tensor

    def all_reduce_absent(
        self, like: torch.Tensor, op: str = "sum", groups: Groups | None = None, repeat: int = 1
    ) -> None:
        """Take part in an all-reduce without contributing or receiving; ``repeat`` times: as
        many consecutive all-reduces of the same ``op``, ``groups``, dtype and size.

        For a node whose share is ``op``'s identity (zeros for a sum) and whose result would be
        overwritten before anything reads it, e.g. a FedAvg client that sits this round and the
        next out. ``like`` gives the payload's dtype and size (it is neither read nor written);
        the peers call :meth:`all_reduce` (or this) with the same ``op`` and ``groups``. Nothing
        is charged: charge what the algorithm sends with :meth:`charge`. Virtual nodes queue
        the call (once, whatever ``repeat``) and run on at once; other transports reduce the
        identity. Collective.
        """
        if op not in ("sum", "max", "min", "product"):
            raise ValueError(f"op must be one of sum, max, min, product (mean counts every member); got {op!r}")
        if repeat < 1:
            raise ValueError(f"repeat must be >= 1, got {repeat}")
        _, members = self._my_group(groups)
        absent = getattr(self.transport, "all_reduce_absent", None)
        t0 = time.perf_counter()  # (what _timed does, inline: idle virtual nodes call this a lot)
        try:
            if absent is not None:
                absent(like, op, _subset(groups, members), repeat)
            else:
                for _ in range(repeat):
                    self._reduce_identity(like, op, _subset(groups, members))
        finally:
            self.transport_seconds += time.perf_counter() - t0

    def all_reduce_contribute(self, tensor: torch.Tensor, op: str = "sum", groups: Groups | None = None) -> None:
        """Contribute ``tensor`` to an all-reduce whose result this node does not need.

        For a node that only sends its share of a measurement (e.g. metrics that rank 0 alone
        turns into rows): the peers call :meth:`all_reduce` (or this) with the same ``op`` and
        ``groups``. The caller hands ``tensor`` over: it must not write to it afterwards, and its
        contents after the call are undefined (virtual nodes queue it and run on at once; the
        reduction reads it later; other transports reduce it in place). Nothing is charged.
        Collective.
        """
        if op not in ("sum", "max", "min", "product"):
            raise ValueError(f"op must be one of sum, max, min, product (mean divides the result); got {op!r}")
        self._refuse_absent("all_reduce_contribute")
        _, members = self._my_group(groups)
        # Virtual nodes queue the tensor (or its staged copy, which nobody writes to later).
        reduce = getattr(self.transport, "all_reduce_contribute", self.transport.all_reduce)
        with _staged(tensor) as t, self._timed():
            reduce(t, op, _subset(groups, members))

    def all_reduce_receive(self, like: torch.Tensor, op: str = "sum", groups: Groups | None = None) -> torch.Tensor:
        """Take part in an all-reduce contributing nothing (``op``'s identity) and return the
        result.

        For a node whose share is the identity and that needs the result, e.g. a FedAvg client
        that was not sampled receiving the participants' sum: it need not write zeros anywhere.
        ``like`` gives the payload's dtype and size (it is neither read nor written); the peers
        call :meth:`all_reduce` (or this) with the same ``op`` and ``groups``. The result is
        valid until this node's next collective and may be shared with other nodes: read it,
        do not change it (virtual nodes of a worker that receive the same result share one
        tensor). Nothing is charged. Collective.
        """
        if op not in ("sum", "max", "min", "product"):
            raise ValueError(f"op must be one of sum, max, min, product (mean counts every member); got {op!r}")
        self._refuse_absent("all_reduce_receive")
        _, members = self._my_group(groups)
        receive = getattr(self.transport, "all_reduce_receive", None)
        with self._timed():
            if receive is not None:
                return receive(like, op, _subset(groups, members))
            return self._reduce_identity(like, op, _subset(groups, members))

    def _reduce_identity(self, like: torch.Tensor, op: str, members: list[int] | None) -> torch.Tensor:
        """All-reduce ``op``'s identity shaped like ``like`` through the transport; return the
        result (how a transport without absent or receive-only calls takes part in one)."""
        out = reduce_identity(like, op)
        with _staged(out) as t:
            self.transport.all_reduce(t, op, members)
        return out

    def all_gather(
        self, tensor: torch.Tensor, groups: Groups | None = None, charge: bool = True, tag: str = ""
    ) -> torch.Tensor:
        """Return ``[len(group), *tensor.shape]``: every group member's ``tensor`` in group order.

        Charged as one all_gather of ``tensor``'s bytes over this rank's group. Collective.
        """
        self._refuse_absent("all_gather")
        _, members = self._my_group(groups)
        with _staged(tensor) as t, self._timed():
            gathered = self.transport.all_gather(t, _subset(groups, members))
        if charge:
            self.ledger.record("all_gather", len(members), _nbytes(tensor), tag)
        return gathered.to(tensor.device)

    def broadcast(self, tensor: torch.Tensor, src: int = 0, charge: bool = True, tag: str = "") -> torch.Tensor:
        """Overwrite ``tensor`` in place with rank ``src``'s and return it. Collective."""
        if not 0 <= src < self.world_size:
            raise ValueError(f"src must be a rank in [0, {self.world_size}), got {src}")
        self._refuse_absent("broadcast")
        with _staged(tensor) as t, self._timed():
            self.transport.broadcast(t, src)
        if charge:
            self.ledger.record("broadcast", self.world_size, _nbytes(tensor), tag, is_root=self.rank == src)
        return tensor

    def barrier(self) -> None:
        """Block until every rank arrives. Collective; costs no bytes."""
        with self._timed():
            self.transport.barrier()


#: What :meth:`NodeComm.leaving_out` returns when no rank is missing.
_NOTHING_MISSING = contextlib.nullcontext()

#: Partitions checked lately, by ``id``: (the groups object, a copy of it as lists, world size,
#: rank -> group index). The virtual nodes of a worker pass the same groups object for a
#: collective (a round's islands); the check and the index are then made once for all of them
#: instead of once per node. They run a few rounds apart, so several rounds' partitions are kept.
_checked: OrderedDict[int, tuple[object, list[list[int]], int, dict[int, int]]] = OrderedDict()
_CHECKED_MAX = 64
_checked_lock = threading.Lock()


def _partition_index(groups: Groups, world_size: int) -> tuple[dict[int, int], list[list[int]]]:
    """(rank -> index of its group, the groups as lists of ints), after checking that ``groups``
    partition ``range(world_size)`` into disjoint non-empty groups (``ValueError`` otherwise)."""
    last = _checked.get(id(groups))  # the entry holds the object: its id is not reused meanwhile
    if last is not None and last[0] is groups and last[2] == world_size and last[1] == groups:
        return last[3], last[1]  # the same object with the same contents (the copy is compared)
    index: dict[int, int] = {}
    copy: list[list[int]] = []
    for i, g in enumerate(groups):
        members = [int(r) for r in g]
        if not members or any(r in index for r in members) or len(set(members)) != len(members):
            raise ValueError(f"groups must partition the ranks into disjoint non-empty groups, got {groups}")
        index.update(dict.fromkeys(members, i))
        copy.append(members)
    if len(index) != world_size or set(index) != set(range(world_size)):
        raise ValueError(f"groups must cover every rank 0..{world_size - 1} exactly once, got {groups}")
    if isinstance(groups, list) and all(isinstance(g, list) for g in groups):  # comparable with its copy
        with _checked_lock:
            _checked[id(groups)] = (groups, copy, world_size, index)
            while len(_checked) > _CHECKED_MAX:
                _checked.popitem(last=False)
    return index, copy


def _subset(groups: Groups | None, members: list[int]) -> list[int] | None:
    """The member list a transport needs, or ``None`` when the group is the whole world."""
    return None if groups is None or len(groups) == 1 else members


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@contextlib.contextmanager
def _staged(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """Yield ``tensor`` itself when the transport can use it, else a contiguous copy (on the CPU
    for MPS, which gloo and shared memory cannot read) that is written back on exit."""
    if tensor.device.type != "mps" and tensor.is_contiguous():
        yield tensor
        return
    work = tensor.detach().to("cpu" if tensor.device.type == "mps" else tensor.device).contiguous()
    yield work
    tensor.copy_(work)
