"""Group partitions (islands) and tensor staging shared by the communication objects."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import torch

Groups = Sequence[Sequence[int]]

#: Partitions checked lately, by ``id``: (the groups object, a copy of it as lists, world size,
#: rank -> group index). The virtual nodes of a worker pass the same groups object for a
#: collective (a round's islands); the check and the index are then made once for all of them
#: instead of once per node. They run a few rounds apart, so several rounds' partitions are kept.
_checked: OrderedDict[int, tuple[object, list[list[int]], int, dict[int, int]]] = OrderedDict()
_CHECKED_MAX = 64
_checked_lock = threading.Lock()


def partition_index(groups: Groups, world_size: int) -> tuple[dict[int, int], list[list[int]]]:
    """(rank -> index of its group, the groups as lists of ints), after checking that ``groups``
    partition ``range(world_size)`` into disjoint non-empty groups (``ValueError`` otherwise)."""
    last = _checked.get(id(groups))  # the entry holds the object: its id is not reused meanwhile
    if last is not None and last[0] is groups and last[2] == world_size and last[1] == groups:
        return last[3], last[1]  # the same object with the same contents (the copy is compared)
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
    if isinstance(groups, list) and all(isinstance(g, list) for g in groups):  # comparable with its copy
        with _checked_lock:
            _checked[id(groups)] = (groups, copy, world_size, index)
            while len(_checked) > _CHECKED_MAX:
                _checked.popitem(last=False)
    return index, copy


@functools.lru_cache(maxsize=8)
def world_list(world_size: int) -> list[int]:
    """``[0, ..., world_size - 1]``, one list shared by every node of a process: read only."""
    return list(range(world_size))


@functools.lru_cache(maxsize=8)
def world_members(world_size: int) -> tuple[int, ...]:
    """``(0, ..., world_size - 1)``, one tuple shared by every node of a process (ledger records
    of world-wide collectives all point to it)."""
    return tuple(range(world_size))


#: Member tuples made lately, by the ``id`` of the list they were made from and the ranks left
#: out: (the list, the ranks left out, the tuple). Nodes of one group (virtual nodes of a worker,
#: or a node's consecutive rounds) share one tuple.
_TUPLES_MAX = 1024
_tuples: OrderedDict[tuple[int, frozenset[int]], tuple[list[int], tuple[int, ...]]] = OrderedDict()


def members_tuple(members: list[int], dropped: frozenset[int] = frozenset()) -> tuple[int, ...]:
    """``members`` less ``dropped`` as a tuple, shared between calls with the same list (the
    lists of ``partition_index`` are); read only."""
    key = (id(members), dropped)
    hit = _tuples.get(key)
    if hit is not None and hit[0] is members:
        return hit[1]
    made = tuple(r for r in members if r not in dropped) if dropped else tuple(members)
    with _checked_lock:
        _tuples[key] = (members, made)  # holds the list: its id is not reused meanwhile
        while len(_tuples) > _TUPLES_MAX:
            _tuples.popitem(last=False)
    return made


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
