"""Random islands and sampled clients, drawn from the shared seed (same on every rank).

Salts keep the draws of different purposes independent for the same round.
"""

from __future__ import annotations

import torch

from exogym.core.seeding import generator

ISLAND_SALT = 0x15A
CLIENT_SALT = 0xC11


def draw_islands(num_nodes: int, island_size: int, seed: int, round_: int) -> list[list[int]]:
    """Partition ``range(num_nodes)`` into random islands of ``island_size`` ranks for a round.

    The ranks are shuffled with the shared generator and cut into consecutive groups; when
    ``island_size`` does not divide ``num_nodes`` the last island is smaller. An ``island_size``
    of ``num_nodes`` or more gives one island of everyone. Members are sorted within an island.
    """
    if island_size < 1:
        raise ValueError(f"island_size must be >= 1, got {island_size}")
    if island_size >= num_nodes:
        return [list(range(num_nodes))]
    perm = torch.randperm(num_nodes, generator=generator(seed, ISLAND_SALT, round_)).tolist()
    return [sorted(perm[i : i + island_size]) for i in range(0, num_nodes, island_size)]


def participants(n: int, fraction: float) -> int:
    """How many of ``n`` members take part in a round: ``max(1, round(fraction * n))``, at most ``n``."""
    return min(n, max(1, round(fraction * n)))


def draw_participants(members: list[int], fraction: float, seed: int, round_: int) -> list[int]:
    """The sorted ranks of ``members`` that take part in a round: ``participants(n, fraction)``
    of them, drawn without replacement from the shared generator."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"client_sampling must be in (0, 1], got {fraction}")
    m = participants(len(members), fraction)
    if m >= len(members):
        return list(members)
    g = generator(seed, CLIENT_SALT, round_, min(members))
    pick = torch.randperm(len(members), generator=g)[:m].tolist()
    return sorted(members[i] for i in pick)
