"""The 4-bit float of the OCP Microscaling formats, e2m1: codes, rounding and packing.

A code is 1 sign bit (bit 3), 2 exponent bits (bits 2-1, bias 1) and 1 mantissa bit (bit 0);
codes 0-7 are the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (0.5 is the one subnormal step), codes
8-15 the same with the sign set. There is no infinity and no NaN: 6 is the largest magnitude.
Rounding is to the nearest magnitude, ties to the even code (the one whose mantissa bit is 0),
as IEEE 754's round-to-nearest-even: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
3.5 -> 4, 5 -> 4. A negative value keeps its sign bit when it rounds to 0 (``-0``). Magnitudes
above 6 saturate to 6 (a per-chunk scale keeps them at most 6).

Two codes travel in one byte, the first in the low nibble: ``byte k = code[2k] | code[2k+1] << 4``
(an odd count pads the last high nibble with ``0``).
"""

from __future__ import annotations

import torch

#: Largest e2m1 magnitude.
E2M1_MAX = 6.0
#: The magnitude of each of the codes 0-7.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: The midpoints between consecutive magnitudes.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """The e2m1 code (``uint8`` in ``[0, 15]``, one per entry) nearest to each entry of the
    float tensor ``x`` (ties to the even code; saturating at 6)."""
    m = x.abs().to(torch.float32)
    mids = torch.tensor(_MIDPOINTS, dtype=torch.float32, device=x.device)
    code = torch.bucketize(m, mids)  # a midpoint goes to the lower code
    odd_tie = (code % 2 == 1) & (m == mids[code.clamp_max(len(_MIDPOINTS) - 1)])
    code = code + odd_tie.to(code.dtype)  # ... unless that code is odd: ties to even
    return (code | (torch.signbit(x).to(code.dtype) << 3)).to(torch.uint8)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Float32 values of e2m1 ``codes`` (``uint8`` in ``[0, 15]``)."""
    signed = E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES)  # codes 8-15: the sign set (8: -0)
    return torch.tensor(signed, dtype=torch.float32, device=codes.device)[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``ceil(n / 2)`` bytes holding the ``n`` 4-bit ``codes`` (``uint8``), two per byte."""
    pairs = torch.nn.functional.pad(codes.reshape(-1), (0, codes.numel() % 2)).view(-1, 2)
    return pairs[:, 0] | (pairs[:, 1] << 4)


def unpack_nibbles(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The ``n`` 4-bit codes ``pack_nibbles`` packed."""
    return torch.stack([packed & 15, packed >> 4], dim=1).reshape(-1)[:n]


__all__ = ["E2M1_MAGNITUDES", "E2M1_MAX", "decode_e2m1", "encode_e2m1", "pack_nibbles", "unpack_nibbles"]
