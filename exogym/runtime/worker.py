"""The worker process: connect the transport, host one or more nodes, run ``TrainNode``.

``worker_process`` is what ``exogym.runtime.launch.run_nodes`` runs in each process of a
local run. Worker ``w`` hosts the nodes ``job.placement`` gives it (``exogym.runtime.placement``).
With one node per worker, the node runs on the worker's main thread and talks through the worker's
transport directly; with several, they are virtual nodes (``exogym.runtime.virtual``) that
take turns and combine their collectives before the worker's transport carries them. Everything
process-specific lives here (threads, seeds, the process group), so that ``TrainNode`` runs
unchanged on threads, as virtual nodes and as ``torchrun`` ranks.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
from typing import Any

import torch

from exogym.core.comm.comm import NodeComm, set_current
from exogym.core.comm.plan import TransportPlan
from exogym.core.comm.transport import Transport
from exogym.core.server import ServerStrategy
from exogym.runtime.node import NodeJob, TrainNode
from exogym.runtime.placement import Placement
from exogym.runtime.server_run import server_worker
from exogym.runtime.virtual import VirtualHub, VirtualNodeError


def worker_process(worker: int, job: NodeJob, plan: TransportPlan) -> dict[str, Any] | None:
    """Process entry of worker ``worker``: train its nodes and return rank 0's result (the final
    averaged state, the metric rows and the run's figures) where it hosts rank 0, else ``None``.

    Collective: every worker of ``plan`` must run it. A failing virtual node is raised as
    ``VirtualNodeError``, which names the node.
    """
    if isinstance(job.strategy, ServerStrategy):  # a server and tasks: no node is built
        return server_worker(worker, job, plan)
    cfg = job.config
    placement = job.placement or Placement(cfg.num_nodes, cfg.workers)
    ranks = placement.ranks(worker)
    label = f"node {ranks[0]}" if len(ranks) == 1 else f"worker {worker}: {placement.describe(worker)}"
    logging.basicConfig(level=cfg.log_level, format=f"[{label}] %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(cfg.threads_per_worker)
    device = cfg.worker_device(worker)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # On an exception the transport is deliberately left open: closing it here would make the
    # peers fail with "connection closed" before this worker has reported the real error. The
    # launcher ends the process right after the report.
    # One node per worker: the node uses the worker's transport directly. Otherwise every worker
    # (including one that hosts a single node) goes through a hub, so that all workers make the
    # same transport calls.
    direct = cfg.workers == cfg.num_nodes
    outer = plan.connect(worker) if cfg.workers > 1 or direct else None
    # Under torchrun every rank returns the averaged model: its first node keeps the state.
    keep = cfg.launcher == "torchrun"
    if direct:
        torch.manual_seed(cfg.seed + ranks[0])
        assert outer is not None
        result = _run_node(ranks[0], job, outer, device, keep)
    else:
        _one_malloc_arena()
        hub = VirtualHub(placement, worker, outer, device, cfg.seed)
        built = _AfterBuilding(hub.n)
        try:
            results = hub.run(
                lambda rank, transport: _run_node(rank, job, transport, device, keep and rank == ranks[0], built)
            )
        finally:
            built.restore()
        result = results.get(0, results.get(ranks[0]))
    if outer is not None:
        outer.close()
    return result


_M_ARENA_MAX = -8  # glibc's mallopt parameter


def _one_malloc_arena() -> None:
    """Let every thread of this process allocate from one malloc arena (glibc; elsewhere a
    no-op). glibc gives threads arenas of their own, up to eight per core; the virtual nodes'
    threads take turns, so more arenas bring no speed, only memory freed in one thread's arena
    and never reused by the others, so a worker of hundreds of nodes would grow round after round."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 1)


class _AfterBuilding:
    """The cyclic garbage collector is off while a worker builds its virtual nodes, then on
    again: building hundreds of nodes makes tens of thousands of long-lived objects, and each
    full collection on the way would scan all of those built before (a third of a worker's
    start-up with 500 nodes). ``restore`` leaves the collector as it was (a torchrun rank is
    the user's own process).

    Where nothing is frozen yet (a worker's first run, a torchrun rank), everything built is
    frozen (``gc.freeze``) until ``restore``, so that full collections during training do
    not scan the process's imports (torch) again and again. A warm worker froze what outlives
    its runs after its first (``exogym.runtime.launch._after_run``): its collections scan
    only the current run's objects already, and the nodes stay unfrozen, so that the collection
    after the run frees them without scanning the frozen imports."""

    def __init__(self, nodes: int) -> None:
        self.left = nodes
        self.enabled = gc.isenabled()
        self.freezes = gc.get_freeze_count() == 0
        gc.disable()

    def one_built(self) -> None:
        self.left -= 1  # (virtual nodes take turns: one thread at a time runs this)
        if self.left == 0 and self.enabled:
            if self.freezes:
                gc.freeze()
            gc.enable()

    def restore(self) -> None:
        if self.freezes:
            gc.unfreeze()
        if self.enabled:
            gc.enable()


def _run_node(
    rank: int,
    job: NodeJob,
    transport: Transport,
    device: torch.device,
    keep_state: bool = False,
    built: _AfterBuilding | None = None,
) -> dict[str, Any] | None:
    comm = NodeComm(rank, job.config.num_nodes, transport)
    comm.ledger.projection = job.config.projection
    set_current(comm)
    try:
        node = TrainNode(job, rank, comm, device)
        if built is not None:
            built.one_built()
        try:
            return node.train(keep_state)
        finally:
            node.close()  # freed by reference counting, not by a scan of the collector
    finally:
        set_current(None)


__all__ = ["VirtualNodeError", "worker_process"]
