"""A shared-memory transport for nodes that run on one machine.

gloo on loopback costs milliseconds per collective whatever the size, so a simulation that
talks every step is latency-bound. Here the parent creates one shared-memory segment before the
nodes start::

    [ flags: one 64-byte line per rank ][ slots: K x capacity bytes ][ result: capacity bytes ]

A collective writes the node's tensor into its slot, meets the others at a barrier, and reads:

* all_reduce (reduce-scatter style): node ``j`` reduces element slice ``j`` of every slot into
  ``result``, in rank order (deterministic); a second barrier; everyone copies ``result``;
* all_gather: everyone copies every slot; a second barrier frees the slots;
* broadcast: everyone copies the source's slot; a second barrier.

The barrier is sense-free: node ``r`` stores its own generation number in its own flag line and
waits until every flag has reached it, yielding the CPU while it waits (many nodes may share few
cores). It relies on x86's store ordering (data written before the flag is visible before it);
elsewhere :func:`supported` is False and the trainer uses gloo. Payloads larger than the
segment's capacity go through the fallback transport (gloo). A node that dies leaves the others
waiting at the barrier; the launcher then terminates them (no hang).
"""

from __future__ import annotations

import os
import platform

import torch

from exogym.core.comm.transport import Transport

_LINE = 64  # bytes per flag: one cache line each, so ranks do not share lines
_SPINS_BEFORE_YIELD = 64


def supported() -> bool:
    """True where the barrier's memory-ordering assumption holds (x86-64)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def segment_bytes(world_size: int, capacity: int) -> int:
    """Size of the segment for ``world_size`` nodes and ``capacity`` bytes per slot."""
    return world_size * _LINE + (world_size + 1) * capacity


def create_segment(world_size: int, capacity: int) -> torch.Tensor:
    """The zeroed segment, created in the parent as a torch shared-memory tensor: passed to the
    nodes with their job (its file descriptor travels, not its bytes) and freed when the last
    process drops it, so nothing is left behind even if a node dies."""
    capacity = -(-capacity // _LINE) * _LINE
    return torch.zeros(segment_bytes(world_size, capacity), dtype=torch.uint8).share_memory_()


class ShmTransport:
    """A :class:`~exogym.core.comm.transport.Transport` over the parent's shared segment.

    Args:
        segment: the tensor :func:`create_segment` made in the parent.
        rank, world_size: this node and the number of nodes.
        capacity: bytes per slot (as passed to :func:`create_segment`, rounded up to 64).
        fallback: the transport for payloads larger than ``capacity`` (every rank falls back for
            the same collectives, since they pass the same sizes).
    """

    def __init__(self, segment: torch.Tensor, rank: int, world_size: int, capacity: int, fallback: Transport) -> None:
        self.rank, self.world_size = rank, world_size
        self.capacity = -(-capacity // _LINE) * _LINE
        if not segment.is_shared() or segment.numel() != segment_bytes(world_size, self.capacity):
            raise ValueError("segment must be the shared tensor create_segment() made for this world and capacity")
        self.fallback = fallback
        buf = segment
        head = world_size * _LINE
        # numpy view of each rank's flag (first int64 of its cache line): plain loads and stores
        self._flags = buf[:head].numpy().view("int64").reshape(world_size, _LINE // 8)[:, 0]
        self._slots = buf[head : head + world_size * self.capacity].view(world_size, self.capacity)
        self._result = buf[head + world_size * self.capacity : head + (world_size + 1) * self.capacity]
        self._generation = int(self._flags[rank])

    def barrier(self) -> None:
        """Wait until every node has reached the same barrier."""
        self._generation += 1
        gen = self._generation
        flags = self._flags
        flags[self.rank] = gen
        spins = 0
        while flags.min() < gen:
            spins += 1
            if spins > _SPINS_BEFORE_YIELD:
                os.sched_yield()

    def fits(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` travels through shared memory (else through the fallback)."""
        return tensor.numel() * tensor.element_size() <= self.capacity and tensor.device.type == "cpu"

    def _write_slot(self, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        self._slots[self.rank, :nbytes].view(tensor.dtype).copy_(tensor.reshape(-1))

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        if not self.fits(tensor):
            self.fallback.all_reduce(tensor, op)
            return
        n, k = tensor.numel(), self.world_size
        nbytes = n * tensor.element_size()
        self._write_slot(tensor)
        self.barrier()
        lo, hi = self.rank * n // k, (self.rank + 1) * n // k
        if hi > lo:
            parts = self._slots[:, :nbytes].view(tensor.dtype)[:, lo:hi]
            out = self._result[:nbytes].view(tensor.dtype)[lo:hi]
            low_precision = tensor.dtype in (torch.float16, torch.bfloat16)
            if op == "sum":
                out.copy_(parts.sum(0, dtype=torch.float32) if low_precision else parts.sum(0))
            elif op == "max":
                out.copy_(parts.amax(0))
            elif op == "min":
                out.copy_(parts.amin(0))
            elif op == "product":
                out.copy_(parts.prod(0))
            else:
                raise ValueError(f"unsupported reduce op {op!r}")
        self.barrier()
        tensor.copy_(self._result[:nbytes].view(tensor.dtype).view_as(tensor))

    def all_reduce_group(self, tensor: torch.Tensor, op: str, members: list[int]) -> None:
        """Sum (``op='sum'``) ``tensor`` over ``members`` only; every rank calls it with its own
        group of a partition, so each group reduces independently. Collective over the world."""
        if op != "sum":
            raise ValueError(f"all_reduce_group supports op 'sum', got {op!r}")
        nbytes = tensor.numel() * tensor.element_size()
        self._write_slot(tensor.contiguous())
        self.barrier()
        parts = self._slots[members, :nbytes].view(tensor.dtype)
        low_precision = tensor.dtype in (torch.float16, torch.bfloat16)
        total = parts.sum(0, dtype=torch.float32) if low_precision else parts.sum(0)
        self.barrier()
        tensor.copy_(total.view_as(tensor))

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self.fits(tensor):
            return self.fallback.all_gather(tensor)
        nbytes = tensor.numel() * tensor.element_size()
        self._write_slot(tensor.contiguous())
        self.barrier()
        out = self._slots[:, :nbytes].view(tensor.dtype).clone().view(self.world_size, *tensor.shape)
        self.barrier()
        return out

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        if not self.fits(tensor):
            self.fallback.broadcast(tensor, src)
            return
        nbytes = tensor.numel() * tensor.element_size()
        if self.rank == src:
            self._write_slot(tensor.contiguous())
        self.barrier()
        if self.rank != src:
            tensor.copy_(self._slots[src, :nbytes].view(tensor.dtype).view_as(tensor))
        self.barrier()
