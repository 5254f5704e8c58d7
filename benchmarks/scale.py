"""Cost against the number of clients at equal sampled work: a server algorithm on 1,000 and on
1,000,000 clients, each from a dataset factory, side by side. ``fedbuff``: FedBuff, concurrency
100, buffer 10, ``--ticks`` ticks (default 400), client speeds 1 to 3.2 in seven groups;
``fedavg``: FedAvg with client sampling (``FedAvgStrategy(client_sampling=...)``, a server),
10 clients a round, 20 rounds.

The work: the bundled digits, the MLP 64-256-256-10, 80 digits per client (as
``virtual_nodes.py``), plain SGD (lr 0.05), batch 8, 10 local steps per task; the network:
1 Gbit/s, 10 ms, 10 ms of compute per step. Each side runs in a fresh Python process timed from its
start; its peak memory is that of its whole process tree (the fork server and the workers
included), sampled every 20 ms from ``/proc``. The ratios big / small are the figures:

    python benchmarks/scale.py fedbuff --repeat 3
    python benchmarks/scale.py fedavg --repeat 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time

from virtual_nodes import BATCH, client_data  # this folder is the script's first import path

from exogym.cli import int_at_least, quiet_interrupt, script_parser

logger = logging.getLogger("benchmarks.scale")
LOCAL, BUFFER, CONCURRENCY, LR, ROUND_CLIENTS, ROUNDS = 10, 10, 100, 0.05, 10, 20


def _fit(algorithm: str, clients: int, ticks: int) -> dict:
    from exogym import Network, Trainer
    from exogym.strategy import FedAvgStrategy, FedBuffStrategy
    from exogym.tasks import MLPClassifier

    if algorithm == "fedbuff":
        strategy = FedBuffStrategy(
            local_steps=LOCAL, buffer_size=BUFFER, concurrency=CONCURRENCY, optim_spec="sgd", lr=LR
        )
        speeds = tuple(1.0 + g * 0.37 for g in range(7))  # client r: speeds[r % 7]
    else:  # 10 clients a round, 20 rounds of LOCAL steps
        strategy = FedAvgStrategy(H=LOCAL, client_sampling=ROUND_CLIENTS / clients, optim_spec="sgd", lr=LR)
        speeds, ticks = (), LOCAL * ROUNDS
    trainer = Trainer(MLPClassifier(), client_data)
    t0 = time.perf_counter()
    trainer.fit(
        strategy, num_nodes=clients, max_steps=ticks, batch_size=BATCH, network=Network(1e9, 0.01, compute=0.01,
        compute_slowdown=speeds), log_interval=50, progress=False, logger=False, device="cpu", seed=42, val_size=0,
    )  # fmt: skip
    summary = trainer.result["summary"]
    return {"fit_s": time.perf_counter() - t0, "client_steps": sum(summary["steps"]), "updates": summary["updates"]}


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and every process below it (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(name), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def _side(algorithm: str, clients: int, ticks: int) -> dict:
    """One side in a fresh Python: its result, wall seconds and peak process-tree memory."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), algorithm, "--child", "--clients", str(clients),
         "--ticks", str(ticks)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out, err = proc.communicate()
    sampler.join()
    if proc.returncode:
        raise RuntimeError(f"benchmark child failed:\n{err[-3000:]}")
    return {**json.loads(out.strip().splitlines()[-1]), "total_s": time.perf_counter() - t0, "peak_mb": peak[0] / 1e6}


@quiet_interrupt
def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("algorithm", choices=("fedbuff", "fedavg"), help="the server algorithm")
    parser.add_argument("--repeat", type=int_at_least(1), default=1, help="rounds of the two sides")
    parser.add_argument("--ticks", type=int_at_least(1), default=400, help="ticks of each run (default 400)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--clients", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import exogym

        exogym.prestart()
        sys.stdout.write(json.dumps(_fit(args.algorithm, args.clients, args.ticks)) + "\n")
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    small, big = 1_000, 1_000_000
    if args.algorithm == "fedbuff":
        logger.info(
            "FedBuff, concurrency %d, buffer %d, %d local steps, %d ticks", CONCURRENCY, BUFFER, LOCAL, args.ticks
        )
    else:
        logger.info(
            "FedAvg with client sampling, %d clients a round, %d rounds of %d steps", ROUND_CLIENTS, ROUNDS, LOCAL
        )
    logger.info("%-4s %9s %9s %11s %11s %8s %8s %14s", "run", "1e3 s", "1e6 s", "1e3 MB", "1e6 MB", "time x",
                "memory x", "client steps")  # fmt: skip
    times, memory = [], []
    for i in range(args.repeat):
        order = [small, big] if i % 2 == 0 else [big, small]
        out = {k: _side(args.algorithm, k, args.ticks) for k in order}
        times.append(out[big]["total_s"] / out[small]["total_s"])
        memory.append(out[big]["peak_mb"] / out[small]["peak_mb"])
        logger.info(
            "%-4d %9.2f %9.2f %11.0f %11.0f %8.2f %8.2f %14s", i + 1, out[small]["total_s"], out[big]["total_s"],
            out[small]["peak_mb"], out[big]["peak_mb"], times[-1], memory[-1],
            f"{out[small]['client_steps']}/{out[big]['client_steps']}",
        )  # fmt: skip
    if args.repeat > 1:
        logger.info("median time x %.2f, memory x %.2f", statistics.median(times), statistics.median(memory))


if __name__ == "__main__":
    main()
