"""Flat buffers: many tensors packed into one contiguous buffer per dtype, so a step costs one
collective per dtype instead of one per parameter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


class FlatBuffer:
    """A persistent contiguous buffer laid out for a fixed list of same-dtype tensors.

    Args:
        like: the tensors whose shapes define the layout (all one dtype and device).
    """

    def __init__(self, like: Sequence[torch.Tensor]) -> None:
        if not like:
            raise ValueError("FlatBuffer needs at least one tensor")
        self.numels = [t.numel() for t in like]
        #: Elements in the buffer.
        self.numel = sum(self.numels)
        #: The flat buffer.
        self.buffer = torch.empty(self.numel, dtype=like[0].dtype, device=like[0].device)
        #: One view of ``buffer`` per tensor of the layout, flattened.
        self.views = list(torch.split(self.buffer, self.numels))

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


def dtype_buckets(tensors: Sequence[torch.Tensor]) -> list[Bucket]:
    """One ``Bucket`` per (dtype, device) of ``tensors``, in first-seen order."""
    return [
        Bucket(idx, [tensors[i] for i in idx], FlatBuffer([tensors[i] for i in idx])) for idx in group_by_dtype(tensors)
    ]
