"""Group partitions (islands) and tensor staging shared by the communication objects."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence

import torch

Groups = Sequence[Sequence[int]]


def partition_index(groups: Groups, world_size: int) -> tuple[dict[int, int], list[list[int]]]:
    """(rank -> index of its group, the groups as lists of ints), after checking that ``groups``
    partition ``range(world_size)`` into disjoint non-empty groups (``ValueError`` otherwise)."""
    index: dict[int, int] = {}
    copy: list[list[int]] = []
    for i, g in enumerate(groups):
        members = [int(r) for r in g]
        if not members or any(r in index for r in members) or len(set(members)) != len(members):
            raise ValueError(f"groups must partition the ranks into disjoint non-empty groups, got {groups}")
        index.update(dict.fromkeys(members, i))
        copy.append(members)
    if len(index) != world_size or set(index) != set(range(world_size)):
        raise ValueError(f"groups must cover every rank 0..{world_size - 1} exactly once, got {groups}")
    return index, copy


@functools.lru_cache(maxsize=8)
def world_members(world_size: int) -> tuple[int, ...]:
    """``(0, ..., world_size - 1)``, one tuple shared by every node of a process (ledger records
    of world-wide collectives all point to it)."""
    return tuple(range(world_size))


@functools.lru_cache(maxsize=1024)
def shared(members: tuple[int, ...]) -> tuple[int, ...]:
    """The first of the recent tuples equal to ``members``: the records of one group, of every
    node and call, point to one tuple."""
    return members


def subset(groups: Groups | None, members: list[int]) -> list[int] | None:
    """The member list a transport needs, or ``None`` when the group is the whole world."""
    return None if groups is None or len(groups) == 1 else members


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@contextlib.contextmanager
def staged(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """Yield ``tensor`` itself when the transport can use it, else a contiguous copy (on the CPU
    for MPS, which gloo and shared memory cannot read) that is written back on exit."""
    if tensor.device.type != "mps" and tensor.is_contiguous():
        yield tensor
        return
    work = tensor.detach().to("cpu" if tensor.device.type == "mps" else tensor.device).contiguous()
    yield work
    tensor.copy_(work)
