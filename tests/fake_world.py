"""An in-process transport: K threads act as K ranks, for fast unit tests of collectives and
communicators without spawning processes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from exogym.core.comm.comm import NodeComm

_REDUCE = {
    "sum": lambda xs: torch.stack(xs).sum(0),
    "max": lambda xs: torch.stack(xs).amax(0),
    "min": lambda xs: torch.stack(xs).amin(0),
    "product": lambda xs: torch.stack(xs).prod(0),
}


class ThreadTransport:
    """A :class:`exogym.core.comm.transport.Transport` over shared memory between threads."""

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


def train_ranks(
    k: int,
    make_strategy: Callable[[], Any],
    steps: int,
    make_model: Callable[[], torch.nn.Module] | None = None,
    dataset: Any = None,
    batch_size: int = 8,
    seed: int = 0,
    steps_per_epoch: int | None = None,
) -> list[dict[str, Any]]:
    """Run the real strategy code of ``k`` ranks on threads: each rank trains its own model copy
    on its DistributedSampler shard and calls ``strategy.step()`` as the node loop does.

    Returns per rank ``{"params": [tensor], "records": [[CollectiveRecord] per step], "strategy"}``.
    """
    import copy

    from torch.utils.data import DataLoader, DistributedSampler

    from tests.helpers import TinyNet, regression_data

    base = (make_model or TinyNet)()  # built once: the global RNG is not thread-safe
    ds = dataset if dataset is not None else regression_data(n=k * batch_size * steps)

    def body(rank: int, comm: NodeComm) -> dict[str, Any]:
        model = copy.deepcopy(base)
        sampler = DistributedSampler(ds, k, rank, shuffle=True, seed=seed)
        loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, drop_last=True)
        strategy = make_strategy()
        strategy._attach(comm, steps, seed, steps_per_epoch or len(loader))
        strategy._init_node(model, rank, k)
        records = []
        batches = iter(loader)
        for _ in range(steps):
            try:
                batch = next(batches)
            except StopIteration:
                batches = iter(loader)
                batch = next(batches)
            strategy.zero_grad()
            model(batch).backward()
            strategy.step()
            records.append(comm.ledger.end_step())
        return {"params": [p.detach().clone() for p in model.parameters()], "records": records, "strategy": strategy}

    return run_ranks(k, body)
