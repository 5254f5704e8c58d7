"""Fixed-width codes packed into bytes: what a compressed payload puts on the wire.

A tensor of ``m`` non-negative integer codes, each below ``2**width``, packs into
``ceil(m * width / 8)`` bytes (least significant bit first, codes back to back with no
alignment); several such tensors of different widths pack into one stream whose length is the
sum of their bits, rounded up to whole bytes once. Pure torch, on any device.
``all_gather_bytes`` all-gathers tensors of any dtypes and shapes in one byte buffer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from exogym.core.comm.comm import Comm


def packed_bytes(bits: int) -> int:
    """Bytes that hold ``bits`` bits: ``ceil(bits / 8)``."""
    return -(-bits // 8)


def _bits(codes: torch.Tensor, width: int) -> torch.Tensor:
    """``[m * width]`` uint8 zeros and ones: each code's bits, least significant first."""
    shifts = torch.arange(width, device=codes.device, dtype=torch.int64)
    return ((codes.to(torch.int64).view(-1, 1) >> shifts) & 1).to(torch.uint8).view(-1)


def pack(codes: Sequence[torch.Tensor], widths: Sequence[int]) -> torch.Tensor:
    """``codes[i]`` at ``widths[i]`` bits each, back to back, as a ``uint8`` tensor of
    ``packed_bytes(sum_i codes[i].numel() * widths[i])`` bytes.

    Raises:
        ValueError: a code does not fit its width, or the lengths of ``codes`` and ``widths`` differ.
    """
    if len(codes) != len(widths):
        raise ValueError(f"pack: {len(codes)} code tensors but {len(widths)} widths")
    parts = []
    for c, w in zip(codes, widths, strict=True):
        if c.numel() and not c.is_meta and (int(c.min()) < 0 or int(c.max()) >= 1 << w):  # (meta: no values)
            raise ValueError(f"pack: codes must lie in [0, 2**{w}) for width {w}")
        parts.append(_bits(c, w))
    stream = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)
    pad = packed_bytes(stream.numel()) * 8 - stream.numel()
    stream = torch.cat([stream, stream.new_zeros(pad)]).view(-1, 8).to(torch.int64)
    weights = 1 << torch.arange(8, device=stream.device, dtype=torch.int64)
    return (stream * weights).sum(dim=1).to(torch.uint8)


def unpack(data: torch.Tensor, counts: Sequence[int], widths: Sequence[int]) -> list[torch.Tensor]:
    """The inverse of ``pack``: ``counts[i]`` int64 codes of ``widths[i]`` bits each from the
    ``uint8`` stream ``data`` (a width of 0 gives zeros)."""
    stream = _bits(data, 8)
    out, offset = [], 0
    for m, w in zip(counts, widths, strict=True):
        bits = stream[offset : offset + m * w].view(m, w)
        out.append((bits << torch.arange(w, device=data.device, dtype=torch.int64)).sum(dim=1))
        offset += m * w
    return out


def all_gather_bytes(comm: Comm, tensors: Sequence[torch.Tensor], **kwargs: Any) -> list[torch.Tensor]:
    """Every node's ``tensors`` (any dtypes and shapes), all-gathered in one byte buffer
    (``comm.all_gather(buffer, **kwargs)``): per tensor, ``[nodes, *shape]``. Collective."""
    payload = torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in tensors])
    gathered = comm.all_gather(payload, **kwargs)
    out, offset = [], 0
    for t in tensors:
        n = t.numel() * t.element_size()
        out.append(gathered[:, offset : offset + n].contiguous().view(t.dtype).view(-1, *t.shape))
        offset += n
    return out


__all__ = ["all_gather_bytes", "pack", "packed_bytes", "unpack"]
