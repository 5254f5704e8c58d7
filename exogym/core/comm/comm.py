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
import time
from collections.abc import Iterator, Sequence

import torch

from exogym.core.comm.ledger import Ledger
from exogym.core.comm.transport import Transport

Groups = Sequence[Sequence[int]]

_CURRENT: NodeComm | None = None


def current() -> NodeComm:
    """The communication object of the node running in this process.

    Raises ``RuntimeError`` outside a running node (e.g. a strategy method called by hand).
    """
    if _CURRENT is None:
        raise RuntimeError(
            "no ExoGym node is running in this process: collectives are only available inside "
            "Trainer.fit (or after exogym.core.comm.comm.set_current(...) in a test)"
        )
    return _CURRENT


def set_current(comm: NodeComm | None) -> None:
    """Install ``comm`` as this process's node communication object (the node loop does this)."""
    global _CURRENT
    _CURRENT = comm


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

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.transport_seconds += time.perf_counter() - t0

    # -- groups ---------------------------------------------------------------------------
    def _my_group(self, groups: Groups | None) -> tuple[int, list[int]]:
        """(index of this rank's group, its members) for a partition of the world."""
        if groups is None:
            return 0, list(range(self.world_size))
        seen: set[int] = set()
        mine: tuple[int, list[int]] | None = None
        for i, g in enumerate(groups):
            members = [int(r) for r in g]
            if not members or seen.intersection(members):
                raise ValueError(f"groups must partition the ranks into disjoint non-empty groups, got {groups}")
            seen.update(members)
            if self.rank in members:
                mine = (i, members)
        if seen != set(range(self.world_size)) or mine is None:
            raise ValueError(f"groups must cover every rank 0..{self.world_size - 1} exactly once, got {groups}")
        return mine

    def charge(self, kind: str, group_size: int, payload: int, tag: str = "", is_root: bool = False) -> None:
        """Charge a logical collective without moving data (for algorithms whose physical
        implementation differs from what they would send, e.g. client sampling)."""
        self.ledger.record(kind, group_size, payload, tag, is_root)

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

        ``op`` is ``sum``, ``mean``, ``max``, ``min`` or ``product``; with ``groups`` (a partition
        of the ranks, the same on every rank) only ``sum`` and ``mean`` are supported. Charged as
        one all_reduce of ``tensor``'s bytes over this rank's group. Collective.
        """
        if op not in ("sum", "mean", "max", "min", "product"):
            raise ValueError(f"op must be one of sum, mean, max, min, product; got {op!r}")
        index, members = self._my_group(groups)
        n_groups = 1 if groups is None else len(groups)
        with _staged(tensor) as t, self._timed():
            if n_groups == 1:
                self.transport.all_reduce(t, "sum" if op == "mean" else op)
            elif op not in ("sum", "mean"):
                raise ValueError(f"all_reduce over groups supports op sum or mean, got {op!r}")
            elif hasattr(self.transport, "all_reduce_group") and self.transport.fits(t):
                self.transport.all_reduce_group(t, "sum", members)
            else:
                # Each group reduces into its own slot of a world-wide buffer.
                slots = t.new_zeros((n_groups, *t.shape))
                slots[index].copy_(t)
                self.transport.all_reduce(slots, "sum")
                t.copy_(slots[index])
            if op == "mean":
                t.div_(len(members))
        if charge:
            self.ledger.record("all_reduce", len(members), _nbytes(tensor), tag)
        return tensor

    def all_gather(
        self, tensor: torch.Tensor, groups: Groups | None = None, charge: bool = True, tag: str = ""
    ) -> torch.Tensor:
        """Return ``[len(group), *tensor.shape]``: every group member's ``tensor`` in group order.

        Charged as one all_gather of ``tensor``'s bytes over this rank's group. Collective.
        """
        _, members = self._my_group(groups)
        with _staged(tensor) as t, self._timed():
            gathered = self.transport.all_gather(t)
        if groups is not None:
            gathered = gathered[members]
        if charge:
            self.ledger.record("all_gather", len(members), _nbytes(tensor), tag)
        return gathered.to(tensor.device)

    def broadcast(self, tensor: torch.Tensor, src: int = 0, charge: bool = True, tag: str = "") -> torch.Tensor:
        """Overwrite ``tensor`` in place with rank ``src``'s and return it. Collective."""
        if not 0 <= src < self.world_size:
            raise ValueError(f"src must be a rank in [0, {self.world_size}), got {src}")
        with _staged(tensor) as t, self._timed():
            self.transport.broadcast(t, src)
        if charge:
            self.ledger.record("broadcast", self.world_size, _nbytes(tensor), tag, is_root=self.rank == src)
        return tensor

    def barrier(self) -> None:
        """Block until every rank arrives. Collective; costs no bytes."""
        with self._timed():
            self.transport.barrier()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@contextlib.contextmanager
def _staged(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """Yield ``tensor`` itself, or for MPS a CPU copy that is written back on exit."""
    if tensor.device.type != "mps":
        yield tensor
        return
    cpu = tensor.detach().to("cpu")
    yield cpu
    tensor.copy_(cpu)
