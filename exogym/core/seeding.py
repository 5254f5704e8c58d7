"""Shared randomness: seeds every rank derives identically, so nothing random is ever sent.

A communicator that needs a random choice all ranks must agree on (islands, sampled clients,
sparse indices) derives a generator from the run's shared seed and a few integers naming the
choice (round, purpose), never from a broadcast.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (imported where it is used: modules the command line's --help reads use this one)
    import torch

_M64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64 finaliser (Steele, Lea, Flood 2014) on a Python int."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (the shared seed first): equal parts give equal seeds."""
    h = 0
    for p in parts:
        h = _splitmix64(h ^ (int(p) & _M64))
    return h >> 1


def named_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed from the shared ``seed`` and ``parts`` of any kind (names, steps, tuples of
    ranks), the same on every rank and platform: the CRC-32 of their ``repr`` in the low 32 bits,
    ``seed`` modulo 2^31 above them."""
    return zlib.crc32(repr((seed, *parts)).encode()) | (int(seed) % (1 << 31)) << 32


def generator(*parts: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with [`derive_seed`][exogym.core.seeding.derive_seed] of
    ``parts``."""
    import torch

    return torch.Generator().manual_seed(derive_seed(*parts))


__all__ = ["derive_seed", "generator", "named_seed"]
