"""``Comm``: the protocol every communication object implements; strategies and communicators
talk only through it."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from exogym.core.comm.entries import Entries
from exogym.core.comm.groups import Groups
from exogym.core.comm.handles import CollectiveHandle, LocalClock
from exogym.core.comm.ledger import Ledger


@runtime_checkable
class Comm(Protocol):
    """The collectives a strategy or communicator may call, with accounting.

    ``NodeComm`` is the node's own; ``CommWrapper`` (e.g.
    ``communicators.quantize.QuantizedComm``) implements the same protocol around another one.
    Every method but ``charge`` and ``present`` is a collective: every rank must call it, in
    the same order.
    """

    rank: int
    world_size: int
    ledger: Ledger
    #: The node's own simulated clock, which times non-blocking collectives.
    clock: LocalClock
    #: Ranks dropped from the current round (fault injection).
    dropped: frozenset[int]

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
        """Reduce ``tensor`` in place within this rank's group; return it. ``entries``: where
        its values live in parameter space, for wire transforms that keep state per entry.
        ``async_op=True``: start it on ``tensor``'s values at the call and return a
        [`CollectiveHandle`][exogym.strategy.CollectiveHandle] instead, whose ``wait()`` writes
        the result into ``tensor`` (``exogym.core.comm.handles``)."""
        ...

    def all_gather(
        self,
        tensor: torch.Tensor,
        groups: Groups | None = None,
        charge: bool = True,
        tag: str = "",
        async_op: bool = False,
    ) -> torch.Tensor | CollectiveHandle:
        """``[len(group), *tensor.shape]``: every group member's ``tensor``, in group order
        (``async_op=True``: a handle whose ``wait()`` returns it)."""
        ...

    def broadcast(
        self, tensor: torch.Tensor, src: int = 0, charge: bool = True, tag: str = "", async_op: bool = False
    ) -> torch.Tensor | CollectiveHandle:
        """Overwrite ``tensor`` in place with rank ``src``'s; return it (``async_op=True``: a
        handle whose ``wait()`` writes rank ``src``'s values, as they were at the start)."""
        ...

    def barrier(self) -> None:
        """Block until every rank arrives."""
        ...

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
        """Record a logical collective in the ledger without moving data (``count``: that many
        identical ones in a row; ``members``: the participating ranks, when known). Not a
        collective."""
        ...

    def present(self, groups: Groups | None = None) -> list[int]:
        """The members of this rank's group taking part now (all of them unless faults drop
        nodes, see ``exogym.runtime.faults``). Not a collective."""
        ...

    def wire_payload(self, tensor: torch.Tensor, tag: str = "") -> tuple[int, str]:
        """``(bytes, tag)`` that ``all_reduce`` charges for ``tensor`` (a transform of the
        wire, such as quantization, sends less), for a caller that charges itself. Not a
        collective."""
        ...


__all__ = ["Comm"]
