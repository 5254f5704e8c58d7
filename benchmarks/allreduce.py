"""All-reduce microbenchmark: the shared-memory transport against gloo, in real node processes.

    .venv/bin/python benchmarks/allreduce.py [--worlds 2 4 8] [--sizes 1KB 1MB 40MB 100MB]

For each K and payload (float32), each node times a run of all-reduces (sum) after a warm-up;
the slowest node's mean is reported (with ``--repeats N``, the best of N runs of each side,
alternated, which tames a noisy machine). Payloads above the shared-memory slot (16 MiB by default)
are streamed through it in pieces.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch

from exogym.cli import quiet_interrupt, script_parser

logger = logging.getLogger("benchmarks.allreduce")
SIZES = {"1KB": 256, "1MB": 256 * 1024, "40MB": 10 * 1024 * 1024, "100MB": 25 * 1024 * 1024}


def _node(rank: int, job: tuple[int, int], plan: Any) -> float:
    from exogym.core.comm.comm import NodeComm

    numel, iters = job
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // plan.world_size))
    transport = plan.connect(rank)
    try:
        comm = NodeComm(rank, plan.world_size, transport)
        t = torch.ones(numel)
        for _ in range(3):
            comm.all_reduce(t, charge=False)
        t0 = time.perf_counter()
        for _ in range(iters):
            comm.all_reduce(t, charge=False)
        return (time.perf_counter() - t0) / iters
    finally:
        transport.close()


def measure(world: int, numel: int, transport: str) -> float:
    """Mean seconds per all-reduce (slowest node)."""
    from exogym.core.comm.plan import TransportPlan
    from exogym.runtime.launch import run_nodes

    iters = 200 if numel < 10**6 else 10
    plan = TransportPlan.create(transport, "cpu", world, numel * 4, timeout_s=600)
    try:
        out = run_nodes(_node, world, (numel, iters), (plan,))
    finally:
        plan.close()
    return max(out.values())


@quiet_interrupt
def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8], help="node counts K")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES), help="payloads")
    parser.add_argument(
        "--repeats", type=int, default=1, help="alternate gloo and shm runs this many times; report each one's best"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger.info("%-4s %-6s %12s %12s %8s", "K", "size", "gloo ms", "shm ms", "gloo/shm")
    for world in args.worlds:
        for name in args.sizes:
            numel = SIZES[name]
            g = s = float("inf")
            for _ in range(args.repeats):
                g = min(g, measure(world, numel, "gloo"))
                s = min(s, measure(world, numel, "shm"))
            logger.info("%-4d %-6s %12.3f %12.3f %8.1f", world, name, 1e3 * g, 1e3 * s, g / s)


if __name__ == "__main__":
    main()
