"""An in-process transport: K threads act as K ranks, for fast unit tests of collectives and
communicators without spawning processes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from exogym.core.comm.comm import NodeComm
from exogym.core.comm.transport import Transport, reduce_rows


class ThreadTransport(Transport):
    """A ``exogym.core.comm.transport.Transport`` between threads of one process."""

    def __init__(self, world: _World, rank: int) -> None:
        self.world, self.rank, self.world_size = world, rank, world.size

    def _exchange(self, t: torch.Tensor) -> list[torch.Tensor]:
        w = self.world
        w.slots[self.rank] = t.detach().clone()
        w.barrier.wait()
        values = list(w.slots)
        w.barrier.wait()
        return values

    def all_reduce(self, tensor: torch.Tensor, op: str, members: Sequence[int] | None = None) -> None:
        values = self._exchange(tensor)
        rows = values if members is None else [values[r] for r in members]
        tensor.copy_(reduce_rows(torch.stack([v.reshape(-1) for v in rows]), op).view_as(tensor))

    def all_gather(self, tensor: torch.Tensor, members: Sequence[int] | None = None) -> torch.Tensor:
        values = self._exchange(tensor)
        return torch.stack(values if members is None else [values[r] for r in members])

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        tensor.copy_(self._exchange(tensor)[src])

    def barrier(self) -> None:
        self.world.barrier.wait()

    def close(self) -> None:
        pass


class _World:
    def __init__(self, k: int) -> None:
        self.size = k
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


def _config(
    k: int,
    steps: int,
    batch_size: int,
    seed: int,
    workers: int,
    network: Any = None,
    faults: Any = None,
    rounds: int = 1,
    val_interval: int | None = None,
    adversaries: Any = None,
) -> Any:
    from exogym.config import FitConfig
    from exogym.core.comm.network import resolve_network

    return FitConfig(
        num_nodes=k,
        workers=workers,
        max_steps=steps,
        num_epochs=1,
        batch_size=batch_size,
        minibatch_size=batch_size,
        device="cpu",
        devices=None,
        transport="threads",
        collective_timeout=30.0,
        val_size=0 if val_interval is None else 10**9,
        val_interval=val_interval,
        autocast=None,
        seed=seed,
        log_interval=1,
        shuffle=True,
        progress=False,
        threads_per_worker=1,
        log_level=30,
        network=resolve_network(network, num_nodes=k, seed=seed),
        faults=faults,
        fault_round_steps=rounds,
        adversaries=adversaries,
    )


def _node_body(
    base: Any, make_strategy: Callable[[], Any], ds: Any, cfg: Any, val: Any = None
) -> Callable[[int, Any], Any]:
    """``body(rank, comm)``: train the real node loop, return params, per-step records, node."""
    from exogym.runtime.node import NodeJob, TrainNode

    def body(rank: int, comm: NodeComm) -> dict[str, Any]:
        from exogym.core.comm.comm import set_current

        set_current(comm)  # for strategies that call exogym.strategy.communicate inline
        job = NodeJob(base, make_strategy(), ds, val, cfg, "threads")
        node = TrainNode(job, rank, comm, torch.device("cpu"))
        records: list[Any] = []
        end_step = comm.ledger.end_step

        def record_step() -> Any:
            records.append(end_step())
            return records[-1]

        comm.ledger.end_step = record_step  # type: ignore[method-assign]
        node.train()
        params = [p.detach().clone() for p in node.model.parameters()]
        return {"params": params, "records": records, "strategy": node.strategy, "node": node}

    return body


def train_ranks(
    k: int,
    make_strategy: Callable[[], Any],
    steps: int,
    make_model: Callable[[], torch.nn.Module] | None = None,
    dataset: Any = None,
    batch_size: int = 8,
    seed: int = 0,
    workers: int | None = None,
    network: Any = None,
    faults: Any = None,
    val_dataset: Any = None,
    val_interval: int | None = None,
    adversaries: Any = None,
) -> list[dict[str, Any]]:
    """Run the real node loop (``exogym.runtime.node.TrainNode``) of ``k`` ranks on threads,
    each rank on its DistributedSampler shard of ``dataset``. With ``workers=W``, the ``k`` nodes
    are virtual nodes of ``W`` workers (threads of this process, each a
    ``exogym.runtime.virtual.VirtualHub`` whose nodes take turns; the workers talk over
    ``ThreadTransport``); otherwise the ranks run concurrently over ``ThreadTransport``.

    ``network``: what ``fit(network=...)`` takes (default ``ethernet``); ``faults``: what
    ``fit(faults=...)`` takes; ``adversaries``: what ``fit(adversaries=...)`` takes;
    ``val_dataset`` is validated (all of it, split over the nodes)
    every ``val_interval`` steps and after the last.

    Returns per rank ``{"params": [tensor], "records": [[CollectiveRecord] per step], "strategy",
    "node"}``.
    """
    from exogym.runtime.placement import Placement
    from exogym.runtime.virtual import VirtualHub
    from tests.helpers import TinyNet, regression_data

    base = (make_model or TinyNet)()  # built once: the global RNG is not thread-safe
    ds = dataset if dataset is not None else regression_data(n=k * batch_size * steps)
    from exogym.runtime.faults import round_steps

    interval = (val_interval or steps) if val_dataset is not None else None
    rounds = round_steps(make_strategy())
    cfg = _config(k, steps, batch_size, seed, workers or k, network, faults, rounds, interval, adversaries)
    body = _node_body(base, make_strategy, ds, cfg, val_dataset)
    if workers is None:
        return run_ranks(k, body)
    placement = Placement(k, workers)  # as fit places them
    hubs = [
        VirtualHub(placement, w, None, torch.device("cpu"), seed) for w in range(workers)
    ]  # made here, one after another: each seeds its nodes' random streams through the global one

    def worker(w: int, outer: NodeComm) -> dict[int, Any]:
        hubs[w].outer = outer.transport if workers > 1 else None
        return hubs[w].run(lambda rank, transport: body(rank, NodeComm(rank, k, transport)))

    out: dict[int, Any] = {}
    for part in run_ranks(workers, worker):
        out.update(part)
    return [out[r] for r in range(k)]


def train_server(
    k: int,
    make_strategy: Callable[[], Any],
    steps: int,
    dataset: Any = None,
    batch_size: int = 8,
    seed: int = 0,
    workers: int = 1,
    network: Any = None,
    val_dataset: Any = None,
    adversaries: Any = None,
    make_model: Callable[[], torch.nn.Module] | None = None,
) -> list[dict[str, Any]]:
    """Run a server strategy (``exogym.ServerStrategy``) for ``k`` clients on ``workers`` ranks
    (threads over ``ThreadTransport``), as ``fit`` runs it on worker processes. Returns per rank
    ``exogym.runtime.server_run.ServerRun.run``'s result with ``"strategy"`` (the job's, holding
    the run summary), ``"params"`` (the final parameters as tensors), ``"server"``, ``"loop"``
    and ``"clients"`` (the rank's server, clock and stored client states)."""
    from exogym.runtime.node import NodeJob
    from exogym.runtime.server_run import ServerRun
    from tests.helpers import TinyNet, regression_data

    base = (make_model or TinyNet)()
    ds = dataset if dataset is not None else regression_data(n=k * batch_size * steps)
    cfg = _config(k, steps, batch_size, seed, workers, network, adversaries=adversaries)
    if val_dataset is not None:
        import dataclasses

        cfg = dataclasses.replace(cfg, val_size=256)
    jobs = [NodeJob(base, make_strategy(), ds, val_dataset, cfg, "threads") for _ in range(workers)]

    def body(rank: int, comm: NodeComm) -> dict[str, Any]:
        transport = comm.transport if workers > 1 else None
        run = ServerRun(jobs[rank], rank, workers, transport, torch.device("cpu"))
        out = run.run()
        model = (make_model or TinyNet)()
        model.load_state_dict(out["state_dict"])
        params = [p.detach() for p in model.parameters()]
        extra = {"server": run.server, "loop": run.loop, "clients": run.clients.states}
        return {**out, "strategy": jobs[rank].strategy, "params": params, **extra}

    return run_ranks(workers, body)
