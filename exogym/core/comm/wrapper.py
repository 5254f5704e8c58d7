"""``CommWrapper``: a ``Comm`` around another one.

Every call goes to ``base`` unchanged; a subclass overrides the calls it transforms (e.g.
``communicators.quantize.QuantizedComm`` quantizes float payloads). The runtime's mode
(dropped nodes) lives on the node's own comm at the bottom, so a wrapper sees it through
``base``.

``async_op=True`` is handled here once for every wrapper: the wrapper's own blocking call runs
on a copy of the payload inside ``start``, so a transform of the wire reaches non-blocking
collectives too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from exogym.core.comm.comm import Comm
from exogym.core.comm.entries import Entries
from exogym.core.comm.groups import Groups
from exogym.core.comm.handles import CollectiveHandle, LocalClock, start
from exogym.core.comm.ledger import Ledger


class CommWrapper:
    """Forwards the whole ``Comm`` protocol to ``base``.

    Args:
        base: the wrapped communication object (the node's own, or another wrapper).
    """

    def __init__(self, base: Comm) -> None:
        self.base = base

    @property
    def rank(self) -> int:
        return self.base.rank

    @property
    def world_size(self) -> int:
        return self.base.world_size

    @property
    def ledger(self) -> Ledger:
        return self.base.ledger

    @property
    def clock(self) -> LocalClock:
        return self.base.clock

    @property
    def dropped(self) -> frozenset[int]:
        return self.base.dropped

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
        if async_op:
            return self.started("all_reduce", tensor, lambda t: self.all_reduce(t, op, groups, charge, tag, entries))
        return self.base.all_reduce(tensor, op, groups, charge, tag, entries)

    def started(
        self, kind: str, tensor: torch.Tensor, run: Callable[[torch.Tensor], Any], in_place: bool = True
    ) -> CollectiveHandle:
        """A handle for ``run`` (this wrapper's blocking ``kind`` call) on a copy of ``tensor``
        (see ``start``): what an override of a collective returns for ``async_op=True``."""
        return start(self, kind, tensor, run, in_place)

    def all_gather(
        self,
        tensor: torch.Tensor,
        groups: Groups | None = None,
        charge: bool = True,
        tag: str = "",
        async_op: bool = False,
    ) -> torch.Tensor | CollectiveHandle:
        if async_op:
            return self.started("all_gather", tensor, lambda t: self.all_gather(t, groups, charge, tag), False)
        return self.base.all_gather(tensor, groups, charge, tag)

    def broadcast(
        self, tensor: torch.Tensor, src: int = 0, charge: bool = True, tag: str = "", async_op: bool = False
    ) -> torch.Tensor | CollectiveHandle:
        if async_op:
            return self.started("broadcast", tensor, lambda t: self.broadcast(t, src, charge, tag))
        return self.base.broadcast(tensor, src, charge, tag)

    def barrier(self) -> None:
        self.base.barrier()

    def charge(self, *args: Any, **kwargs: Any) -> None:
        self.base.charge(*args, **kwargs)

    def present(self, groups: Groups | None = None) -> list[int]:
        return self.base.present(groups)

    def wire_payload(self, tensor: torch.Tensor, tag: str = "") -> tuple[int, str]:
        return self.base.wire_payload(tensor, tag)


__all__ = ["CommWrapper"]
