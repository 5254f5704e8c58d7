"""``Entries``: where an all-reduce payload's values live in parameter space.

A module whose payload holds different entries of its tensors every round (SPARTA's random
indices, a top-k selection) passes ``entries=Entries(tensors, indices)`` with its all-reduce. A
transform of the wire that keeps state per entry (quantization with error feedback) then keeps
one residual per tensor and adds to each value the residual of the entry it came from, whatever
the round's selection: what was not sent stays in the residual until the entry is sent again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Entries:
    """A payload's values, located: the payload is the concatenation over ``i`` of
    ``tensors[i].flatten()[indices[i]]`` (the layout of
    [`exogym.ops.sparse_gather`][exogym.ops.sparse_gather]).

    Attributes:
        tensors: the tensors the values come from (e.g. the parameters of one dtype).
        indices: one 1-D int64 index tensor per tensor, into its flattened entries.
    """

    tensors: Sequence[torch.Tensor]
    indices: Sequence[torch.Tensor]

    @classmethod
    def of_flat(cls, tensors: Sequence[torch.Tensor], flat_index: torch.Tensor) -> Entries:
        """Entries given by ascending indices into the concatenation of ``tensors``' flattened
        entries (a flat buffer's layout)."""
        indices, offset = [], 0
        for t in tensors:
            n = t.numel()
            lo, hi = torch.searchsorted(flat_index, torch.tensor([offset, offset + n], device=flat_index.device))
            indices.append(flat_index[lo:hi] - offset)
            offset += n
        return cls(list(tensors), indices)

    @classmethod
    def of_range(cls, tensors: Sequence[torch.Tensor], lo: int, hi: int) -> Entries:
        """Entries ``lo`` to ``hi`` (excluded) of the concatenation of ``tensors``' flattened
        entries (a slice of a flat buffer): for each tensor, the part of the range it holds."""
        indices, offset = [], 0
        for t in tensors:
            n = t.numel()
            a, b = min(max(lo - offset, 0), n), min(max(hi - offset, 0), n)
            indices.append(torch.arange(a, b, device=t.device))
            offset += n
        return cls(list(tensors), indices)

    def numel(self) -> int:
        """Values in the payload."""
        return sum(int(i.numel()) for i in self.indices)

    def key(self, tag: str) -> tuple:
        """What identifies these tensors across rounds and checkpoints: the tag, the tensors'
        sizes and dtype."""
        return (tag, tuple(t.numel() for t in self.tensors), self.tensors[0].dtype if self.tensors else None)


__all__ = ["Entries"]
