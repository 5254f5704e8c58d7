"""A virtual node's collective calls and its transport.

Each call of a virtual node becomes a ``Call`` queued at its worker's ``VirtualHub``;
``VirtualTransport`` is the ``Transport`` a virtual node's comm talks through.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from exogym.core.comm.transport import Transport

if TYPE_CHECKING:
    from exogym.runtime.virtual import VirtualHub


@dataclass
class Call:
    """One node's call of a collective, as its worker's hub queues and runs it."""

    kind: str
    op: str | None = None
    members: tuple[int, ...] | None = None
    tensor: torch.Tensor | None = None
    src: int | None = None
    #: The node contributes ``tensor`` but needs no result: it does not wait for the call.
    detached: bool = False
    #: The node waits for this call (a real one, or the last one a full queue takes).
    waits: bool = False
    #: The node's contribution was reduced on arrival (``tensor`` is a stand-in on "meta").
    folded: bool = False
    result: torch.Tensor | None = None

    def describe(self) -> str:
        if self.tensor is None:
            return self.kind
        extra = f" op={self.op}" if self.op else (f" src={self.src}" if self.src is not None else "")
        group = "" if self.members is None else f" group={list(self.members)}"
        return f"{self.kind}({self.tensor.numel()} x {self.tensor.dtype}{extra}{group})"


class VirtualTransport(Transport):
    """The ``Transport`` of one virtual node: every call parks
    the node at its worker's ``VirtualHub`` until the worker's nodes have all arrived."""

    def __init__(self, hub: VirtualHub, index: int) -> None:
        self.hub, self.index = hub, index
        self.rank = hub.ranks[index]
        self.world_size = hub.num_nodes

    def all_reduce(self, tensor: torch.Tensor, op: str, members: Sequence[int] | None = None) -> None:
        self.hub.collective(self.index, Call("all_reduce", op, _key(members), tensor))

    def all_gather(self, tensor: torch.Tensor, members: Sequence[int] | None = None) -> torch.Tensor:
        out = self.hub.collective(self.index, Call("all_gather", None, _key(members), tensor)).result
        assert out is not None
        return out

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.hub.collective(self.index, Call("broadcast", None, None, tensor, src))

    def barrier(self) -> None:
        self.hub.collective(self.index, Call("barrier"))

    def all_reduce_contribute(self, tensor: torch.Tensor, op: str, members: Sequence[int] | None = None) -> None:
        """Returns at once: the hub reads ``tensor`` when the collective runs."""
        self.hub.enqueue(self.index, Call("all_reduce", op, _key(members), tensor, detached=True))

    def all_gather_contribute(self, tensor: torch.Tensor, members: Sequence[int] | None = None) -> None:
        """Returns at once: the hub reads ``tensor`` when the collective runs."""
        self.hub.enqueue(self.index, Call("all_gather", None, _key(members), tensor, detached=True))


def _key(members: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if members is None else tuple(map(int, members))


__all__ = ["Call", "VirtualTransport"]
