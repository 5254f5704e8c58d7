"""Transports: how the simulator physically moves tensors between node processes.

A transport implements the raw collectives over the whole world; :class:`exogym.core.comm.comm.NodeComm`
adds groups, accounting and device staging on top. :class:`TorchDistTransport` uses the default
``torch.distributed`` process group (gloo on CPU, nccl with one GPU per node), which also
works unchanged on a real cluster.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist

_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}


class Transport(Protocol):
    """Raw world-wide collectives. Collective: every rank must call each method, in the same order."""

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        """Reduce ``tensor`` in place over all ranks with ``op`` in ``sum|max|min|product``."""

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return a new tensor of shape ``[world, *tensor.shape]`` holding every rank's tensor."""

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        """Overwrite ``tensor`` in place with rank ``src``'s."""

    def barrier(self) -> None:
        """Return once every rank has called it."""


class TorchDistTransport:
    """A :class:`Transport` over the default ``torch.distributed`` process group."""

    def __init__(self) -> None:
        if not dist.is_initialized():
            raise RuntimeError("TorchDistTransport needs torch.distributed.init_process_group() first")
        self.world_size = dist.get_world_size()

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        dist.all_reduce(tensor, op=_REDUCE_OPS[op])

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts)

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        dist.broadcast(tensor, src=src)

    def barrier(self) -> None:
        dist.barrier()
