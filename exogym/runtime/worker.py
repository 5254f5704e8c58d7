"""The node process: connect the transport, build the node's comm, run :class:`TrainNode`.

:func:`node_process` is what :func:`exogym.runtime.launch.run_nodes` runs in each process of a
local run. Everything process-specific lives here (threads, seeds, the process group), so that
``TrainNode`` runs unchanged on threads and, later, as virtual nodes or ``torchrun`` ranks.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from exogym.core.comm.comm import NodeComm, set_current
from exogym.core.comm.plan import TransportPlan
from exogym.runtime.node import NodeJob, TrainNode

logger = logging.getLogger(__name__)


def node_process(rank: int, job: NodeJob, plan: TransportPlan) -> dict[str, Any] | None:
    """Process entry of node ``rank``: train, and return (rank 0) the final averaged state, the
    metric rows and the run's figures. Collective: every rank of ``plan`` must run it."""
    cfg = job.config
    logging.basicConfig(level=cfg.log_level, format=f"[node {rank}] %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(cfg.threads_per_node)
    torch.manual_seed(cfg.seed + rank)
    device = cfg.node_device(rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    transport = plan.connect(rank)
    comm = NodeComm(rank, cfg.num_nodes, transport)
    set_current(comm)
    # On an exception the transport is deliberately left open: closing it here would make the
    # peers fail with "connection closed" before this node has reported the real error. The
    # launcher ends the process right after the report.
    result = TrainNode(job, rank, comm, device).train()
    set_current(None)
    transport.close()
    return result
