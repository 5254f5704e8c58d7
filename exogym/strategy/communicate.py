"""Collectives for custom strategies, with ``torch.distributed``-like signatures.

They go through the running node's ``NodeComm``, so every call is charged
to the byte ledger (at the dtype of the tensor passed: an int32 all-reduce is charged 4 bytes
per element). Each is a collective: every rank must call it in the same order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from exogym.core.comm.comm import current
from exogym.core.comm.handles import CollectiveHandle

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.PRODUCT: "product",
}


def all_reduce(
    tensor: torch.Tensor, op: dist.ReduceOp | str = dist.ReduceOp.SUM, async_op: bool = False
) -> torch.Tensor | CollectiveHandle:
    """Reduce ``tensor`` in place over all nodes (``op``: a ``ReduceOp`` or ``'sum'|'mean'|'max'|'min'``).
    ``async_op=True``: start it and return a handle whose ``wait()`` writes the result into
    ``tensor`` (``exogym.core.comm.handles``)."""
    name = op if isinstance(op, str) else _OPS.get(op)
    if name is None:
        raise ValueError(f"unsupported reduce op {op!r}; use SUM, MAX, MIN or PRODUCT")
    return current().all_reduce(tensor, op=name, tag="user", async_op=async_op)


def broadcast(tensor: torch.Tensor, src: int = 0, async_op: bool = False) -> torch.Tensor | CollectiveHandle:
    """Overwrite ``tensor`` in place with node ``src``'s copy (``async_op=True``: at the handle's
    ``wait()``)."""
    return current().broadcast(tensor, src=src, tag="user", async_op=async_op)


def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor) -> list[torch.Tensor]:
    """Fill ``tensor_list`` (one tensor per node) with every node's ``tensor``, like
    ``torch.distributed.all_gather``; returns the list."""
    comm = current()
    if len(tensor_list) != comm.world_size:
        raise ValueError(f"tensor_list needs one tensor per node ({comm.world_size}), got {len(tensor_list)}")
    gathered = comm.all_gather(tensor, tag="user")
    for out, g in zip(tensor_list, gathered, strict=True):
        out.copy_(g)
    return tensor_list


def barrier() -> None:
    """Wait until every node arrives."""
    current().barrier()


__all__ = ["all_gather", "all_reduce", "barrier", "broadcast"]
