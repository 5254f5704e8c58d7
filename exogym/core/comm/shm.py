"""A shared-memory transport for nodes that run on one machine.

gloo on loopback costs milliseconds per collective whatever the size, so a simulation that
talks every step is latency-bound. Here the parent creates one shared-memory segment before the
nodes start (``exogym.core.comm.plan.TransportPlan``)::

    [ flags: one 64-byte line per rank ][ slots: K x slot bytes ][ result: slot bytes ]

A collective streams its payload through the slots in pieces of at most ``slot`` bytes. Per
piece, each node writes its part into its own slot, meets the others at a barrier, and reads:

* all_reduce over the world (reduce-scatter style): node ``j`` reduces element range ``j`` of
  every slot into ``result``, in rank order (deterministic); a second barrier; everyone copies
  ``result``;
* all_reduce within a group: every member reduces its members' slots itself; a second barrier;
* all_gather: everyone copies the members' slots; a second barrier frees them;
* broadcast: everyone copies the source's slot; a second barrier.

The barrier (``exogym.ops.sync.shm_barrier``) publishes with release and waits with acquire
atomics, so the protocol holds on any CPU; every barrier carries the collective's tag and size
and has a deadline, so mismatched or missing peers raise instead of hanging or returning
garbage.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import torch.distributed as dist

from exogym.core.comm.transport import (
    REDUCE_OPS,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    Transport,
    reduce_rows,
    reduce_rows_into,
)
from exogym.ops import sync

LINE = 64  # bytes per flag line: one cache line each, so ranks do not share lines
_SPLIT_COPY_BYTES = 1 << 20
_SPIN_US, _SPIN_US_OVERSUBSCRIBED = 2000, 300

# Collective kinds in the tag's top four bits; the low twelve carry the reduce op or the root.
_BARRIER, _ALL_REDUCE, _GROUP_REDUCE, _ALL_GATHER, _GROUP_GATHER, _BROADCAST = range(1, 7)
_KIND_NAMES = {
    _BARRIER: "barrier",
    _ALL_REDUCE: "all_reduce",
    _GROUP_REDUCE: "all_reduce over groups",
    _ALL_GATHER: "all_gather",
    _GROUP_GATHER: "all_gather over groups",
    _BROADCAST: "broadcast",
}


def supported() -> bool:
    """True where the barrier is correct: with the compiled extension anywhere, else on x86-64."""
    return sync.available()


def segment_bytes(world_size: int, slot: int) -> int:
    """Size of the segment for ``world_size`` nodes and ``slot`` bytes per slot."""
    return world_size * LINE + (world_size + 1) * slot


def round_slot(nbytes: int) -> int:
    """``nbytes`` rounded up to a whole number of flag lines (keeps every view aligned)."""
    return max(LINE, -(-nbytes // LINE) * LINE)


def create_segment(world_size: int, slot: int) -> torch.Tensor:
    """A zeroed shared-memory tensor for ``world_size`` nodes, created in the parent: passed to
    the nodes with their plan (its file descriptor travels, not its bytes), freed when the last
    process drops it, so nothing is left behind in ``/dev/shm`` even if a node dies. Its pages
    are allocated only when first written."""
    nbytes = segment_bytes(world_size, round_slot(slot))
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def check_room(nbytes: int, path: str = "/dev/shm") -> None:
    """Raise ``RuntimeError`` with the fix when ``path`` cannot hold ``nbytes`` more."""
    if not os.path.isdir(path):
        return
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    if free < nbytes:
        raise RuntimeError(
            f"the shared-memory transport needs {nbytes / 2**20:.0f} MiB in {path}, which has "
            f"{free / 2**20:.0f} MiB free. Give it more room (e.g. `docker run --shm-size=2g`), lower "
            "the slot size with fit(shm_slot_mb=...), or use fit(transport='gloo')."
        )


class ShmTransport(Transport):
    """A ``Transport`` over the parent's shared segment.

    Args:
        segment: the tensor ``create_segment`` made in the parent.
        rank, world_size: this node and the number of nodes.
        slot: bytes per slot (as passed to ``create_segment``).
        timeout_s: how long a barrier waits for its peers before raising.
    """

    def __init__(self, segment: torch.Tensor, rank: int, world_size: int, slot: int, timeout_s: float) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.slot = round_slot(slot)
        if not segment.is_shared() or segment.numel() != segment_bytes(world_size, self.slot):
            raise ValueError("segment must be the shared tensor create_segment() made for this world and slot")
        head = world_size * LINE
        self._flags = segment[:head].view(torch.int64).view(world_size, sync.WORDS)
        self._slots = segment[head : head + world_size * self.slot].view(world_size, self.slot)
        self._result = segment[head + world_size * self.slot :]
        self._generation = int(self._flags[rank, 0]) >> 32
        self._barrier = sync.barrier_function()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        # Spin while every node can have a core; sleep soon when nodes outnumber the cores.
        self._spin_us = _SPIN_US if world_size <= cores else _SPIN_US_OVERSUBSCRIBED
        # Typed views of the slots and the result, per dtype: slicing a fresh view per call
        # costs more than a small collective's copy.
        self._typed: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def _views(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(slots [K, n], own slot [n], result [n])`` viewed as ``dtype``."""
        views = self._typed.get(dtype)
        if views is None:
            slots = self._slots.view(dtype)
            views = self._typed[dtype] = (slots, slots[self.rank], self._result.view(dtype))
        return views

    # -- synchronisation -------------------------------------------------------------------
    def peers_waiting(self) -> bool:
        """Whether every other rank has published this rank's next generation (it waits at the
        barrier of this rank's next collective). A plain read: a hint only, the barrier itself
        synchronises."""
        nxt = self._generation + 1
        return all(w >> 32 >= nxt for r, w in enumerate(self._flags[:, 0].tolist()) if r != self.rank)

    def _sync(self, kind: int, detail: int, group: int, nbytes: int) -> None:
        self._generation += 1
        tag = (kind << 12) | (detail & 0xFFF)
        r = self._barrier(self._flags, self.rank, self._generation, tag, group, nbytes, self.timeout_s, self._spin_us)
        if r == sync.PASSED:
            return
        mine = _describe(tag, nbytes)
        if r == sync.TIMED_OUT:
            missing = [i for i in range(self.world_size) if int(self._flags[i, 0]) >> 32 < self._generation]
            raise CollectiveTimeoutError(
                f"rank {self.rank}: {mine} waited collective_timeout={self.timeout_s:g}s for rank(s) {missing}, "
                "which never arrived (a peer is stuck, died, or called fewer collectives)"
            )
        other, w0, w1 = (int(v) for v in self._flags[self.rank, 2:5])
        theirs = _describe((w0 >> 16) & 0xFFFF, w1 & ((1 << 48) - 1))
        raise CollectiveMismatchError(
            f"rank {self.rank} called {mine} but rank {other} called {theirs} at the same point: every rank "
            "must call the same collectives in the same order with the same sizes"
        )

    def barrier(self) -> None:
        self._sync(_BARRIER, 0, 0, 0)

    # -- collectives -----------------------------------------------------------------------
    def _pieces(self, tensor: torch.Tensor) -> list[tuple[int, int]]:
        """``(offset, count)`` element ranges of at most one slot each (one empty piece for an
        empty tensor, so that even it meets its peers)."""
        per, n = max(1, self.slot // tensor.element_size()), tensor.numel()
        return [(off, min(per, n - off)) for off in range(0, max(n, 1), per)]

    def all_reduce(self, tensor: torch.Tensor, op: str, members: Sequence[int] | None = None) -> None:
        if op not in REDUCE_OPS:
            raise ValueError(f"op must be one of {REDUCE_OPS}, got {op!r}")
        flat = tensor.view(-1)
        nbytes = tensor.numel() * tensor.element_size()
        detail = REDUCE_OPS.index(op)
        k = self.world_size
        slots, own, result = self._views(tensor.dtype)
        for off, c in self._pieces(tensor):
            if members is None:
                lo, hi = self.rank * c // k, (self.rank + 1) * c // k
                if c * tensor.element_size() < _SPLIT_COPY_BYTES:
                    own[:c].copy_(flat[off : off + c])
                    rows = slots[:, lo:hi]
                else:
                    # Only this rank reads its slot's range [lo, hi): reduce it from the tensor
                    # itself and copy the rest (1/K less memory traffic on large payloads).
                    own[:lo].copy_(flat[off : off + lo])
                    own[hi:c].copy_(flat[off + hi : off + c])
                    rows = [flat[off + lo : off + hi] if r == self.rank else slots[r, lo:hi] for r in range(k)]
                self._sync(_ALL_REDUCE, detail, 0, nbytes)
                if hi > lo:
                    reduce_rows_into(rows, op, result[lo:hi])
                self._sync(_ALL_REDUCE, detail, 0, nbytes)
                flat[off : off + c].copy_(result[:c])
            else:
                own[:c].copy_(flat[off : off + c])
                self._sync(_GROUP_REDUCE, detail, members[0], nbytes)
                total = reduce_rows(slots[list(members), :c], op)
                self._sync(_GROUP_REDUCE, detail, members[0], nbytes)
                flat[off : off + c].copy_(total)

    def all_gather(self, tensor: torch.Tensor, members: Sequence[int] | None = None) -> torch.Tensor:
        rows = list(range(self.world_size)) if members is None else list(members)
        kind, group = (_ALL_GATHER, 0) if members is None else (_GROUP_GATHER, rows[0])
        flat = tensor.reshape(-1)
        nbytes = tensor.numel() * tensor.element_size()
        out = torch.empty((len(rows), tensor.numel()), dtype=tensor.dtype)
        slots, own, _ = self._views(tensor.dtype)
        for off, c in self._pieces(tensor):
            own[:c].copy_(flat[off : off + c])
            self._sync(kind, 0, group, nbytes)
            out[:, off : off + c].copy_(slots[:, :c] if members is None else slots[rows, :c])
            self._sync(kind, 0, group, nbytes)
        return out.view(len(rows), *tensor.shape)

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        flat = tensor.view(-1)
        nbytes = tensor.numel() * tensor.element_size()
        slots, own, _ = self._views(tensor.dtype)
        for off, c in self._pieces(tensor):
            if self.rank == src:
                own[:c].copy_(flat[off : off + c])
            self._sync(_BROADCAST, src, 0, nbytes)
            if self.rank != src:
                flat[off : off + c].copy_(slots[src, :c])
            self._sync(_BROADCAST, src, 0, nbytes)

    def close(self) -> None:
        """Leave the process group the node joined beside this transport (see ``connect``); the
        segment itself is freed when the last process drops it."""
        if dist.is_initialized():
            dist.destroy_process_group()


def _describe(tag: int, nbytes: int) -> str:
    kind, detail = tag >> 12, tag & 0xFFF
    name = _KIND_NAMES.get(kind, f"collective {kind}")
    if kind in (_ALL_REDUCE, _GROUP_REDUCE):
        name += f"({REDUCE_OPS[detail] if detail < len(REDUCE_OPS) else detail})"
    elif kind == _BROADCAST:
        name += f"(src={detail})"
    return name if kind == _BARRIER else f"{name} of {nbytes} bytes"


__all__ = ["LINE", "ShmTransport", "check_room", "create_segment", "round_slot", "segment_bytes", "supported"]
