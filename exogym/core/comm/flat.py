"""Flat buffers: many tensors packed into one contiguous buffer per dtype, so a step costs one
collective per dtype instead of one per parameter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: Released buffers by (elements, dtype, device), for the next buffer of that shape in this
#: process: a FedAvg client makes its buffer again in every round it is sampled for, and taking
#: a released one costs no allocation (nor the page faults of fresh memory). It holds at most
#: as many buffers per shape as were in use at once. (List appends and pops are atomic: the
#: threads of virtual nodes may share it.)
_RELEASED: dict[tuple[int, torch.dtype, torch.device], list[torch.Tensor]] = {}


class FlatBuffer:
    """A persistent contiguous buffer laid out for a fixed list of same-dtype tensors.

    Args:
        like: the tensors whose shapes define the layout (all one dtype and device).
        lazy: allocate the buffer at its first use rather than now. With ``release``, for
            a node that communicates now and then (a FedAvg client sampled in few rounds): its
            buffer then costs memory only while it communicates, not a model's worth for the
            whole run.
    """

    def __init__(self, like: Sequence[torch.Tensor], lazy: bool = False) -> None:
        if not like:
            raise ValueError("FlatBuffer needs at least one tensor")
        self.numels = [t.numel() for t in like]
        #: Elements in the buffer.
        self.numel = sum(self.numels)
        #: A stand-in with the buffer's dtype, size and device that holds one element (a
        #: zero-stride view): for calls that read only those, e.g.
        #: ``all_reduce_absent``. It moves with the node's
        #: state (``exogym.runtime.offload``), so the buffer is made where the state is.
        self.like = torch.zeros(1, dtype=like[0].dtype, device=like[0].device).expand(self.numel)
        self._buffer: torch.Tensor | None = None
        self._views: list[torch.Tensor] | None = None
        if not lazy:
            self._allocate()

    def _allocate(self) -> torch.Tensor:
        like = self.like
        released = _RELEASED.get((self.numel, like.dtype, like.device))
        try:
            self._buffer = released.pop() if released else None
        except IndexError:  # (another thread took the last one)
            self._buffer = None
        if self._buffer is None:
            self._buffer = torch.empty(self.numel, dtype=like.dtype, device=like.device)
        self._views = list(torch.split(self._buffer, self.numels))
        return self._buffer

    @property
    def buffer(self) -> torch.Tensor:
        """The flat buffer (made on first use after ``release``; its contents are then
        undefined)."""
        return self._allocate() if self._buffer is None else self._buffer

    @property
    def views(self) -> list[torch.Tensor]:
        """One view of ``buffer`` per tensor of the layout, flattened."""
        if self._views is None:
            self._allocate()
        assert self._views is not None
        return self._views

    @property
    def allocated(self) -> bool:
        """Whether the buffer exists now (it holds memory)."""
        return self._buffer is not None

    def release(self) -> None:
        """Let the buffer go (its contents are lost); the next use makes it again. The memory is
        kept for the process's next buffer of this shape."""
        buf = self._buffer
        if buf is None:
            return
        self._buffer = self._views = None
        _RELEASED.setdefault((buf.numel(), buf.dtype, buf.device), []).append(buf)

    @torch.no_grad()
    def pack(self, tensors: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """Copy ``tensors`` into the buffer (``None`` counts as zeros) and return it."""
        for view, t in zip(self.views, tensors, strict=True):
            if t is None:
                view.zero_()
            else:
                view.copy_(t.reshape(-1))
        return self.buffer

    @torch.no_grad()
    def unpack(self, tensors: Sequence[torch.Tensor]) -> None:
        """Copy the buffer back into ``tensors`` in place."""
        for view, t in zip(self.views, tensors, strict=True):
            t.copy_(view.view_as(t))

    @torch.no_grad()
    def unpack_divided(self, source: torch.Tensor, tensors: Sequence[torch.Tensor], divisor: float) -> None:
        """Write ``source / divisor`` into ``tensors`` in place; ``source`` is laid out as this
        buffer (e.g. a collective's result) and is only read. ``like`` itself holds no
        values (what a receive sat out returns, see
        ``sitting_out``): nothing is written."""
        if source is self.like:
            return
        for piece, t in zip(torch.split(source, self.numels), tensors, strict=True):
            torch.div(piece.view_as(t), divisor, out=t)


def group_by_dtype(tensors: Sequence[torch.Tensor]) -> list[list[int]]:
    """Indices of ``tensors`` grouped by (dtype, device), in first-seen order."""
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    return list(groups.values())


@dataclass
class Bucket:
    """Same-dtype tensors (and their positions in the original list) with a flat buffer laid
    out for them: one collective moves the whole bucket."""

    indices: list[int]
    tensors: list[torch.Tensor]
    buffer: FlatBuffer


def dtype_buckets(tensors: Sequence[torch.Tensor], lazy: bool = False) -> list[Bucket]:
    """One ``Bucket`` per (dtype, device) of ``tensors``, in first-seen order (``lazy``:
    see ``FlatBuffer``)."""
    return [
        Bucket(idx, [tensors[i] for i in idx], FlatBuffer([tensors[i] for i in idx], lazy))
        for idx in group_by_dtype(tensors)
    ]
