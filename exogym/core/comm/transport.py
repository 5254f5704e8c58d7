"""Transports: how the simulator physically moves tensors between nodes.

A ``Transport`` implements the raw collectives; ``exogym.core.comm.comm.NodeComm`` adds
the group partition, accounting and device staging on top. Two implementations exist:
``TorchDistTransport`` over the default ``torch.distributed`` process group (gloo on CPU,
nccl with one GPU per node; the same code runs on a real cluster) and
``exogym.core.comm.shm.ShmTransport`` over shared memory on one machine. Both are made by a
``exogym.core.comm.plan.TransportPlan``, never by hand.

Every wait has a deadline (``collective_timeout``): a collective that a peer never joins, or joins
with another operation or size, raises ``CollectiveTimeoutError`` or
``CollectiveMismatchError`` naming the operations and ranks involved.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from exogym.core.comm.groups import nbytes

#: Reduce operations every transport supports, world-wide and within a group.
REDUCE_OPS = ("sum", "max", "min", "product")

#: Seconds a failing rank waits for its peers to say which collective they were in.
_PEER_REPORT_S = 3.0


class CollectiveError(RuntimeError):
    """A collective could not complete; the message names the operation and the ranks."""


class CollectiveTimeoutError(CollectiveError):
    """A rank waited longer than ``collective_timeout`` for its peers."""


class CollectiveMismatchError(CollectiveError):
    """Ranks called different collectives, or the same one with different sizes, at one point."""


class Transport:
    """Raw collectives over the world, or over ``members`` (a sorted rank list that contains the
    caller; every rank passes its own group of one partition of the world).

    Collective: every rank must call each method in the same order, with the same sizes within a
    group. Tensors are contiguous and on the transport's device.

    A transport implements ``all_reduce``, ``all_gather``, ``broadcast`` and
    ``barrier``. The contribute-only calls (``all_reduce_contribute``,
    ``all_gather_contribute``: the runtime's measurements) have defaults here made of
    ``all_reduce`` and ``all_gather``; a transport overrides them where it can do less work
    (virtual nodes queue a call they need no result from and run on).
    """

    rank: int
    world_size: int

    def all_reduce(self, tensor: torch.Tensor, op: str, members: Sequence[int] | None = None) -> None:
        """Reduce ``tensor`` in place with ``op`` (``REDUCE_OPS``) over the world or ``members``."""
        raise NotImplementedError

    def all_gather(self, tensor: torch.Tensor, members: Sequence[int] | None = None) -> torch.Tensor:
        """A new tensor ``[len(members) or world, *tensor.shape]``: every member's tensor, in order."""
        raise NotImplementedError

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """Overwrite ``tensor`` in place with rank ``src``'s (world-wide)."""
        raise NotImplementedError

    def barrier(self) -> None:
        """Return once every rank has called it."""
        raise NotImplementedError

    def all_reduce_contribute(self, tensor: torch.Tensor, op: str, members: Sequence[int] | None = None) -> None:
        """Contribute ``tensor`` to an all-reduce whose result this rank does not need (the
        caller hands ``tensor`` over: its contents afterwards are undefined)."""
        self.all_reduce(tensor, op, members)

    def all_gather_contribute(self, tensor: torch.Tensor, members: Sequence[int] | None = None) -> None:
        """Contribute ``tensor`` to an all-gather whose result this rank does not need (the
        caller hands ``tensor`` over: it must not write to it afterwards)."""
        self.all_gather(tensor, members)

    def peers_waiting(self) -> bool:
        """Whether every other rank already waits for this rank's next collective (a hint, not
        a collective: a worker of virtual nodes runs a collective at once where its peers wait
        for it, and otherwise lets its nodes work on first). ``True`` where the transport cannot
        tell."""
        return True

    def close(self) -> None:
        """Release what the transport holds (the process group)."""


def reduce_rows(parts: torch.Tensor, op: str) -> torch.Tensor:
    """Reduce ``parts [m, n]`` over its rows in row order; half precision accumulates in float32."""
    out = torch.empty(parts.shape[1:], dtype=parts.dtype, device=parts.device)
    reduce_rows_into(parts, op, out)
    return out


def reduce_rows_into(parts: torch.Tensor | Sequence[torch.Tensor], op: str, out: torch.Tensor) -> None:
    """``reduce_rows`` of ``parts`` (a 2-D tensor or a list of equal-shaped rows) written into
    ``out``, with no temporary for float sums (large all-reduces are bound by memory traffic):
    ``((p0 + p1) + p2) + ...``, the same order on every rank."""
    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")
    if op == "sum" and out.dtype in (torch.float16, torch.bfloat16):
        out.copy_(torch.stack(list(parts)).sum(0, dtype=torch.float32))
        return
    if len(parts) == 1:
        out.copy_(parts[0])
        return
    combine = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum, "product": torch.mul}[op]
    combine(parts[0], parts[1], out=out)
    for row in parts[2:]:
        combine(out, row, out=out)


def describe_op(kind: str, nbytes: int, detail: str = "") -> str:
    """``all_reduce(sum) of 40 bytes`` and the like, for error messages."""
    return f"{kind}({detail}) of {nbytes} bytes" if detail else f"{kind} of {nbytes} bytes"


class TorchDistTransport(Transport):
    """A ``Transport`` over the default ``torch.distributed`` process group.

    Grouped collectives pad every rank's payload to the largest one and gather world-wide, so
    groups may carry different sizes (e.g. each island's own index union) without a process
    group per island. When a collective fails (gloo's deadline, a lost peer), the rank writes
    what it was doing to the rendezvous ``store`` and names its peers' operations in the error.

    Args:
        store: the run's rendezvous store (for error reports), or ``None``.
        timeout_s: the deadline the process group was created with (for messages).
        owns_group: ``close`` destroys the process group (``False`` when someone else,
            e.g. ``torchrun``'s script, owns it).
    """

    def __init__(self, store: dist.Store | None = None, timeout_s: float = 300.0, owns_group: bool = True) -> None:
        if not dist.is_initialized():
            raise RuntimeError("TorchDistTransport needs torch.distributed.init_process_group() first")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.store, self.timeout_s, self.owns_group = store, timeout_s, owns_group
        self._seq = 0

    def _run(self, what: str, fn: object, *args: object) -> object:
        self._seq += 1
        try:
            return fn(*args)  # type: ignore[operator]
        except RuntimeError as e:
            raise self._explain(what, e) from e

    def _explain(self, what: str, error: RuntimeError) -> CollectiveError:
        mine = f"collective #{self._seq}: {what}"
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        peers: list[str] = []
        with contextlib.suppress(RuntimeError):  # the store is gone with the parent: report what we know
            if self.store is not None:
                self.store.set(f"exogym/failed/{self.rank}", mine)
                others = [f"exogym/failed/{r}" for r in range(self.world_size) if r != self.rank]
                with contextlib.suppress(RuntimeError):  # not every peer reported in time
                    self.store.wait(others, timedelta(seconds=_PEER_REPORT_S))
                for r in range(self.world_size):
                    if r != self.rank and self.store.check([f"exogym/failed/{r}"]):
                        peers.append(f"rank {r}: {self.store.get(f'exogym/failed/{r}').decode()}")
        theirs = "; ".join(peers) if peers else "no other rank reported"
        differ = any(p.split(": ", 1)[1] != mine for p in peers)
        cls = CollectiveMismatchError if differ else CollectiveTimeoutError
        hint = (
            "every rank must call the same collectives in the same order with the same sizes"
            if differ
            else f"a peer did not join within collective_timeout={self.timeout_s:g}s, or died"
        )
        return cls(f"rank {self.rank}: {mine} failed ({first_line}); {theirs}. {hint}")

    def all_reduce(self, tensor: torch.Tensor, op: str, members: Sequence[int] | None = None) -> None:
        what = describe_op("all_reduce", nbytes(tensor), op)
        if members is None:
            self._run(what, dist.all_reduce, tensor, getattr(dist.ReduceOp, op.upper()))
            return
        rows = self._gather_padded(tensor, members, what)
        tensor.copy_(reduce_rows(rows, op).view_as(tensor))

    def all_gather(self, tensor: torch.Tensor, members: Sequence[int] | None = None) -> torch.Tensor:
        what = describe_op("all_gather", nbytes(tensor))
        if members is None:
            parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
            self._run(what, dist.all_gather, parts, tensor.contiguous())
            return torch.stack(parts)
        return self._gather_padded(tensor, members, what).view(len(members), *tensor.shape)

    def _gather_padded(self, tensor: torch.Tensor, members: Sequence[int], what: str) -> torch.Tensor:
        """``[len(members), numel]``: the members' flat tensors, through one world-wide gather of
        byte buffers padded to the largest payload of any group."""
        size = nbytes(tensor)
        longest = torch.tensor([size], dtype=torch.int64, device=tensor.device)
        self._run(what, dist.all_reduce, longest, dist.ReduceOp.MAX)
        buf = torch.zeros(int(longest.item()), dtype=torch.uint8, device=tensor.device)
        buf[:size].copy_(tensor.contiguous().view(-1).view(torch.uint8))
        parts = [torch.empty_like(buf) for _ in range(self.world_size)]
        self._run(what, dist.all_gather, parts, buf)
        rows = torch.stack([parts[r][:size] for r in members])
        return rows.view(tensor.dtype).view(len(members), tensor.numel())

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self._run(describe_op("broadcast", nbytes(tensor), f"src={src}"), dist.broadcast, tensor, src)

    def barrier(self) -> None:
        self._run("barrier", dist.barrier)

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
