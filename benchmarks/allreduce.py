"""All-reduce microbenchmark: the shared-memory transport against gloo, in real node processes.

    .venv/bin/python benchmarks/allreduce.py

For K in 2, 4, 8 and payloads of 1 KB, 1 MB and 40 MB (float32), each node times a run of
all-reduces (sum) after a warm-up; the slowest node's mean is reported.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger("benchmarks.allreduce")
SIZES = {"1KB": 256, "1MB": 256 * 1024, "40MB": 10 * 1024 * 1024}


def _node(rank: int, world: int, port: int, segment: Any, capacity: int, numel: int, iters: int) -> float:
    from exogym.core.comm.comm import NodeComm
    from exogym.core.comm.shm import ShmTransport
    from exogym.core.comm.transport import TorchDistTransport
    from exogym.runtime.launch import connect_store

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world))
    dist.init_process_group("gloo", store=connect_store(port), rank=rank, world_size=world)
    try:
        transport = TorchDistTransport()
        if segment is not None:
            transport = ShmTransport(segment, rank, world, capacity, fallback=transport)
        comm = NodeComm(rank, world, transport)
        t = torch.ones(numel)
        for _ in range(3):
            comm.all_reduce(t, charge=False)
        t0 = time.perf_counter()
        for _ in range(iters):
            comm.all_reduce(t, charge=False)
        return (time.perf_counter() - t0) / iters
    finally:
        dist.destroy_process_group()


def measure(world: int, numel: int, transport: str) -> float:
    """Mean seconds per all-reduce (slowest node)."""
    from exogym.core.comm import shm
    from exogym.runtime.launch import create_store, run_nodes

    iters = 200 if numel < 10**6 else 10
    store = create_store()
    capacity = numel * 4
    segment = shm.create_segment(world, capacity) if transport == "shm" else None
    try:
        out = run_nodes(_node, world, (world, store.port, segment, capacity, numel, iters))
    finally:
        del segment
    return max(out.values())


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger.info("%-4s %-6s %12s %12s %8s", "K", "size", "gloo ms", "shm ms", "gloo/shm")
    for world in (2, 4, 8):
        for name, numel in SIZES.items():
            g = measure(world, numel, "gloo")
            s = measure(world, numel, "shm")
            logger.info("%-4d %-6s %12.3f %12.3f %8.1f", world, name, 1e3 * g, 1e3 * s, g / s)


if __name__ == "__main__":
    main()
