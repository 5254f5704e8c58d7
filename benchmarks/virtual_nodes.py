"""Federated rounds with client sampling at scale: start-up and memory against the clients' count.

The work is the one Flower's simulation engine was measured on (see ``benchmarks/README.md``):
the bundled digits, the MLP 64-256-256-10, FedAvg with plain SGD, 10 local steps of batch 8 per
sampled client per round. Each client owns 80 examples drawn from the digits with its own seed
(1,000 clients cannot each hold a disjoint batch of the 1,437 digits). Sampled FedAvg runs as a
server on the simulated clock (``FedAvgStrategy(client_sampling=...)`` is a ``ServerStrategy``
running ``FedAvgServer``): each round's drawn clients run as tasks, and a client no round draws is
never built. ExoGym runs in a fresh Python process timed from its start (torch import included)
to the end of ``fit``, starting the fork server first (``exogym.prestart()``); the in-process loop
trains the same sampled clients of every round in one process and averages their parameters in
memory.

    python benchmarks/virtual_nodes.py fedavg --clients 1000 --sampling 0.01 --rounds 20 --repeat 3
    python benchmarks/virtual_nodes.py scaling --clients 16,64,256,1000
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import sys
import time

from timed_children import run_child  # this folder is the script's first import path

from exogym.cli import int_at_least, quiet_interrupt, script_parser

logger = logging.getLogger("benchmarks.virtual_nodes")
H, BATCH, PER_CLIENT = 10, 8, 80


@functools.cache
def _digits():
    from exogym.tasks import digits_datasets

    return digits_datasets()[0]


def client_data(rank: int, num_nodes: int, train: bool):
    """Client ``rank``'s 80 digits (drawn with its own seed), a ``dataset_factory``."""
    import torch
    from torch.utils.data import Subset

    data = _digits()
    g = torch.Generator().manual_seed(rank)
    return Subset(data, torch.randint(0, len(data), (PER_CLIENT,), generator=g).tolist())


def _strategy(sampling: float):
    """FedAvg with client sampling (a server on the clock)."""
    from exogym.strategy import FedAvgStrategy

    return FedAvgStrategy(H=H, client_sampling=sampling, optim_spec="sgd", lr=0.05)


def _exogym(clients: int, sampling: float, rounds: int, workers: int | None) -> dict:
    from exogym import Trainer
    from exogym.tasks import MLPClassifier

    trainer = Trainer(MLPClassifier(), client_data)
    t0 = time.perf_counter()
    trainer.fit(
        _strategy(sampling),
        num_nodes=clients,
        workers=workers,
        max_steps=H * rounds,  # equal speeds and links: a round is H ticks of the clock
        batch_size=BATCH,
        log_interval=H,
        progress=False,
        logger=False,
        device="cpu",
    )
    end = time.perf_counter()
    train = trainer.history[-1]["wall_time"]  # the clock's run: every round, the drawn clients' tasks
    return {
        "fit_s": end - t0,
        "startup_s": (end - t0) - train,
        "train_s": train,
        "round_s": train / rounds,
        "examples": trainer.history[-1]["examples"],
        "peak_rss_worker_mb": trainer.result["peak_memory"] / 2**20,
        "workers": trainer.result["config"].workers,
    }


def _inprocess(clients: int, sampling: float, rounds: int) -> dict:
    """The same sampled work in one process (``fedavg_loop``, clients drawn from seed 42)."""
    import torch

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    t0 = time.perf_counter()
    examples = fedavg_loop(clients, sampling, rounds, 42)
    return {"fit_s": time.perf_counter() - t0, "examples": examples}


def fedavg_loop(clients: int, sampling: float, rounds: int, seed: int) -> int:
    """ExoGym's sampled FedAvg work in one process: per round, the sampled clients (drawn from
    ``seed`` as ExoGym draws them) train H steps from the global model on their own data; the
    global model becomes their mean. Returns the examples trained on."""
    import torch
    from torch.utils.data import DataLoader

    from communicators.islands import draw_participants
    from exogym.tasks import MLPClassifier

    glob = MLPClassifier()
    model = MLPClassifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    examples = 0
    for rnd in range(rounds):
        acc = [torch.zeros_like(p) for p in glob.parameters()]
        sampled = draw_participants(list(range(clients)), sampling, seed, rnd)
        for c in sampled:
            model.load_state_dict(glob.state_dict())
            it = iter(DataLoader(client_data(c, clients, True), batch_size=BATCH, shuffle=True))
            for _ in range(H):
                opt.zero_grad()
                model(next(it)).backward()
                opt.step()
                examples += BATCH
            for a, p in zip(acc, model.parameters(), strict=True):
                a += p.detach()
        with torch.no_grad():
            for g, a in zip(glob.parameters(), acc, strict=True):
                g.copy_(a / len(sampled))
    return examples


def _fedavg_pairs(k: str, common: list[str], sampling: float, rounds: int, repeat: int) -> None:
    """Time ExoGym and the in-process loop ``repeat`` times, alternating which goes first (this
    machine's speed drifts between runs); a row per pair, the median ratio at the end."""
    logger.info(
        "FedAvg, %s clients, sampling %s, %d rounds of H=%d, batch %d, 2-core CPU", k, sampling, rounds, H, BATCH
    )
    logger.info(
        "%-6s %9s %9s %9s %11s %11s %9s %9s", "pair", "loop s", "total s", "x loop", "start-up s", "training s",
        "s/round", "RSS/w MB",
    )  # fmt: skip
    ratios = []
    for i in range(repeat):
        sides = ["exogym", "inprocess"] if i % 2 == 0 else ["inprocess", "exogym"]
        out = {side: run_child(__file__, ["fedavg", "--clients", k, "--side", side, *common]) for side in sides}
        ex, base = out["exogym"], out["inprocess"]
        assert ex["examples"] == base["examples"], (ex["examples"], base["examples"])  # the same sampled work
        ratios.append(ex["total_s"] / base["total_s"])
        logger.info(
            "%-6d %9.2f %9.2f %9.2f %11.2f %11.2f %9.3f %9.0f", i + 1, base["total_s"], ex["total_s"],
            ratios[-1], ex["startup_s"], ex["train_s"], ex["round_s"], ex["peak_rss_worker_mb"],
        )  # fmt: skip
    if repeat > 1:
        logger.info("median x loop over %d pairs: %.2f", repeat, statistics.median(ratios))


@quiet_interrupt
def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("scenario", choices=["fedavg", "scaling"], help="what to measure")
    parser.add_argument("--clients", default="1000", help="number of clients (comma-separated for 'scaling')")
    parser.add_argument("--sampling", type=float, default=0.01, help="fraction of clients sampled per round")
    parser.add_argument("--rounds", type=int, default=20, help="FedAvg rounds (H=10 local steps each)")
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: fit's)")
    parser.add_argument(
        "--repeat",
        type=int_at_least(1),
        default=1,
        help="pairs of runs, in the order ExoGym-loop, loop-ExoGym, ... (fedavg)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", default="exogym", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.side == "exogym":  # a script's first statement, as the docs recommend
            import exogym

            exogym.prestart()
        clients = int(args.clients)
        if args.side == "inprocess":
            out = _inprocess(clients, args.sampling, args.rounds)
        else:
            out = _exogym(clients, args.sampling, args.rounds, args.workers)
        sys.stdout.write(json.dumps(out) + "\n")
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    common = ["--sampling", str(args.sampling), "--rounds", str(args.rounds)]
    if args.workers:
        common += ["--workers", str(args.workers)]
    if args.scenario == "fedavg":
        _fedavg_pairs(args.clients, common, args.sampling, args.rounds, args.repeat)
        return
    logger.info("Start-up and memory per client (FedAvg, sampling %s, %d rounds)", args.sampling, args.rounds)
    logger.info(
        "%-8s %8s %10s %11s %13s %16s", "clients", "workers", "total s", "start-up s", "RSS/worker MB", "MB per client"
    )
    first = None
    for k in args.clients.split(","):
        ex = run_child(__file__, ["fedavg", "--clients", k, *common])
        per_worker = int(k) / ex["workers"]
        if first is None:
            first = (per_worker, ex["peak_rss_worker_mb"])
        per_node = (
            (ex["peak_rss_worker_mb"] - first[1]) / (per_worker - first[0]) if per_worker > first[0] else float("nan")
        )
        logger.info(
            "%-8s %8d %10.2f %11.2f %13.0f %16.2f",
            k,
            ex["workers"],
            ex["total_s"],
            ex["startup_s"],
            ex["peak_rss_worker_mb"],
            per_node,
        )


if __name__ == "__main__":
    main()
