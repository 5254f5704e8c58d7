"""Running under ``torchrun``: each rank of the launcher's process group is one worker of the run.

``Trainer.fit`` called in a script that ``torchrun`` (``python -m torch.distributed.run``)
started finds the launcher's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``) and joins that process group instead of starting processes of
its own. Two modes:

* ``deploy``: ``num_nodes`` equals the world size; every rank is one real node on its own GPU
  (``cuda:LOCAL_RANK``, nccl) or CPU (gloo);
* ``simulate``: ``num_nodes`` is larger; the nodes are virtual nodes spread over the ranks in
  contiguous blocks, exactly as over a local run's worker processes.

The rest is the local run's code path: the same worker body, the same node loop, the same
ledger and network model. Before training, the ranks check that they agree on the run's
arguments (one small all-gather); a rank that raises ends its process with the traceback, and
torchrun's own failure handling (stop, or restart with ``--max-restarts``) takes over.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from exogym.core.comm.rendezvous import join as join
from exogym.runtime.forkserver import TORCHRUN_ENV

#: ``fit(torchrun_mode=...)`` values.
MODES = ("deploy", "simulate")


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in a ``torchrun`` launch.

    Attributes:
        rank: global rank (the worker index).
        world_size: processes over all machines (the number of workers).
        local_rank: rank on this machine (its GPU index).
        local_world_size: processes on this machine (they share its cores).
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def detect() -> LaunchEnv | None:
    """The launch environment of this process, or ``None`` outside ``torchrun`` (or a launcher
    that sets the same variables, e.g. ``srun`` with them exported)."""
    env = os.environ  # LOCAL_RANK and LOCAL_WORLD_SIZE default to RANK and WORLD_SIZE
    if not all(k in env for k in TORCHRUN_ENV):
        return None
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", rank))
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
    except ValueError as e:
        raise ValueError(f"torchrun's environment is malformed ({e}); check RANK, WORLD_SIZE and LOCAL_RANK") from None
    return LaunchEnv(rank, world, local_rank, local_world)


def reporting() -> bool:
    """Whether this process reports (logs results, writes summaries and plots): always outside
    torchrun, only rank 0 under it (the other ranks train and stay quiet)."""
    launch = detect()
    return launch is None or launch.rank == 0


def resolve_mode(mode: str | None, num_nodes: int, world_size: int, workers: int | None) -> str:
    """``'deploy'`` or ``'simulate'`` for ``fit(torchrun_mode=mode)`` (``None``: from
    ``num_nodes`` against the world size). Raises ``ValueError`` naming the argument."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"torchrun_mode must be one of {MODES} or None, got {mode!r}")
    if workers is not None and workers != world_size:
        raise ValueError(
            f"workers={workers} under torchrun: every torchrun process is one worker, so workers is the world "
            f"size ({world_size}); leave workers=None or change --nproc_per_node/--nnodes"
        )
    if num_nodes < world_size:
        raise ValueError(
            f"num_nodes={num_nodes} is smaller than torchrun's world size {world_size}: every process hosts at "
            f"least one node; pass num_nodes >= {world_size} or start fewer processes"
        )
    inferred = "deploy" if num_nodes == world_size else "simulate"
    if mode == "deploy" and inferred != "deploy":
        raise ValueError(
            f"torchrun_mode='deploy' runs one node per torchrun process, but num_nodes={num_nodes} and the world "
            f"size is {world_size}; pass num_nodes={world_size}, or torchrun_mode='simulate' for virtual nodes"
        )
    if mode == "simulate" and inferred != "simulate":
        raise ValueError(
            f"torchrun_mode='simulate' spreads more nodes than processes over the ranks, but num_nodes={num_nodes} "
            f"equals the world size; pass a larger num_nodes, or torchrun_mode='deploy'"
        )
    return inferred


def resolve_transport(kind: str, device: str) -> str:
    """The launcher's transport: nccl for CUDA (``'auto'``), else gloo. Shared memory needs
    ExoGym's own launcher (the segment is made by the parent), so ``'shm'`` raises."""
    if kind == "shm":
        raise ValueError(
            "transport='shm' needs ExoGym's own launcher (a parent process that creates the shared segment); "
            "under torchrun use transport='auto', 'gloo' or 'nccl'"
        )
    if kind == "nccl" and device != "cuda":
        raise ValueError(f"transport='nccl' needs device='cuda', got device={device!r}; use transport='auto' or 'gloo'")
    if kind == "auto":
        return "nccl" if device == "cuda" else "gloo"
    return kind


def check_agreement(fields: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the first argument the ranks disagree on, with every rank's
    value. Collective: every rank must call (one all-gather of ``fields``' reprs)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {k: repr(v) for k, v in fields.items()})
    for key in fields:
        values = [g[key] for g in gathered]
        if len(set(values)) > 1:
            per_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            raise ValueError(
                f"the torchrun ranks called fit with different {key} ({per_rank}); every rank must run the same "
                "script with the same arguments"
            )


@torch.no_grad()
def broadcast_state(model: torch.nn.Module, device: torch.device | None = None) -> None:
    """Overwrite ``model``'s parameters and buffers with rank 0's, in place (through ``device``
    for nccl). Collective: every rank must call. Not charged: it is the launch, not the algorithm."""
    for t in model.state_dict().values():
        buf = t if device is None else t.to(device)
        dist.broadcast(buf, src=0)
        if buf is not t:
            t.copy_(buf)


def worker_device(device: str, devices: tuple[int, ...] | None, env: LaunchEnv) -> tuple[int, ...] | None:
    """The CUDA index this rank trains on, as ``fit(devices=...)``: ``devices[local_rank % len]``
    (default: ``local_rank`` modulo this machine's GPUs); ``None`` off CUDA."""
    if device != "cuda":
        return None
    pool = devices or tuple(range(max(1, torch.cuda.device_count())))
    return (pool[env.local_rank % len(pool)],)
