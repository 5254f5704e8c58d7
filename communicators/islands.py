"""Random islands and sampled clients, drawn from the shared seed (same on every rank).

Salts keep the draws of different purposes independent for the same round.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

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


def draw_participants(members: list[int], fraction: float, seed: int, round_: int) -> list[int]:
    """The sorted ranks of ``members`` that take part in a round: ``max(1, round(fraction * n))``
    of them, drawn without replacement from the shared generator."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"client_sampling must be in (0, 1], got {fraction}")
    m = max(1, round(fraction * len(members)))
    if m >= len(members):
        return list(members)
    g = generator(seed, CLIENT_SALT, round_, min(members))
    pick = torch.randperm(len(members), generator=g)[:m].tolist()
    return sorted(members[i] for i in pick)


class RoundGroups(NamedTuple):
    """One round's draw for every rank: ``islands`` (``None``: one group of everyone), the
    groups that average (the islands, or ``[all ranks]``), per rank the index of its group
    (``island_of``), per group its participants, and every group's participants together
    (``trains``). Shared by the virtual nodes of a process: treat it as read-only."""

    islands: list[list[int]] | None
    groups: list[list[int]]
    island_of: list[int]
    participants: list[list[int]]
    trains: frozenset[int]
    charged_ranks: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]

    def charged(self, group: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The ranks of group ``group``'s two charged collectives: the participants' all-reduce,
        and the broadcast of their mean from the first participant to the other members (made
        at the first call: placement draws many rounds and never asks)."""
        got = self.charged_ranks.get(group)
        if got is None:
            participants = self.participants[group]
            got = (tuple(participants), _receivers(self.groups[group], participants))
            self.charged_ranks[group] = got
        return got


@functools.lru_cache(maxsize=8)
def _one_group(num_nodes: int) -> tuple[list[int], list[int]]:
    """All ranks, and every rank's group index (0), shared by the rounds without islands."""
    return list(range(num_nodes)), [0] * num_nodes


@functools.lru_cache(maxsize=64)
def draw_round(num_nodes: int, island_size: int | None, fraction: float | None, seed: int, round_: int) -> RoundGroups:
    """[`draw_islands`][communicators.draw_islands] and
    [`draw_participants`][communicators.draw_participants] of a round for all ranks at once, cached:
    the virtual nodes of a worker draw each round once, not once per node, while the rounds they ask
    about stay within 64 of each other (a sleeping client plans up to its next participation or
    metrics flush; beyond that a round is drawn again, the same draw)."""
    islands = draw_islands(num_nodes, island_size, seed, round_) if island_size else None
    if islands is None:  # one group of everyone: the same lists every round (nodes keep rounds)
        everyone, island_of = _one_group(num_nodes)
        groups = [everyone]
    else:
        groups = islands
        island_of = [0] * num_nodes
        for i, g in enumerate(groups):
            for r in g:
                island_of[r] = i
    participants = [g if fraction is None else draw_participants(g, fraction, seed, round_) for g in groups]
    trains = frozenset(r for group in participants for r in group)
    return RoundGroups(islands, groups, island_of, participants, trains, {})


def _receivers(members: list[int], participants: list[int]) -> tuple[int, ...]:
    """The first participant, then the members that do not take part (a broadcast's ranks)."""
    if len(participants) == len(members):
        return (participants[0],)
    taking = set(participants)
    return (participants[0], *(r for r in members if r not in taking))
