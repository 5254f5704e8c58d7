"""An in-process transport: K threads act as K ranks, for fast unit tests of collectives and
communicators without spawning processes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from exogym.core.comm import NodeComm

_REDUCE = {
    "sum": lambda xs: torch.stack(xs).sum(0),
    "max": lambda xs: torch.stack(xs).amax(0),
    "min": lambda xs: torch.stack(xs).amin(0),
    "product": lambda xs: torch.stack(xs).prod(0),
}


class ThreadTransport:
    """A :class:`exogym.core.transport.Transport` over shared memory between threads."""

    def __init__(self, world: _World, rank: int) -> None:
        self.world, self.rank = world, rank

    def _exchange(self, t: torch.Tensor) -> list[torch.Tensor]:
        w = self.world
        w.slots[self.rank] = t.detach().clone()
        w.barrier.wait()
        values = list(w.slots)
        w.barrier.wait()
        return values

    def all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        tensor.copy_(_REDUCE[op](self._exchange(tensor)))

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.stack(self._exchange(tensor))

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        tensor.copy_(self._exchange(tensor)[src])

    def barrier(self) -> None:
        self.world.barrier.wait()


class _World:
    def __init__(self, k: int) -> None:
        self.barrier = threading.Barrier(k, timeout=30)
        self.slots: list[Any] = [None] * k


def run_ranks(k: int, fn: Callable[[int, NodeComm], Any]) -> list[Any]:
    """Run ``fn(rank, comm)`` on ``k`` threads sharing one world; return results by rank.

    An exception on any rank is re-raised (the others are released by breaking the barrier).
    """
    world = _World(k)
    results: list[Any] = [None] * k
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            results[rank] = fn(rank, NodeComm(rank, k, ThreadTransport(world, rank)))
        except threading.BrokenBarrierError:
            pass
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            world.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results
