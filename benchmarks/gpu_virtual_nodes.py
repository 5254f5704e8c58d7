"""Virtual nodes on one GPU: K nodes of the char-level GPT against a one-process loop over the
same models, and sampled FedAvg of a CNN over 1,000 and more clients.

``gpt``: DDP (``SimpleReduceStrategy`` with AdamW) on the bundled ``chars`` task (the Python
standard library's source), K CharGPT nodes hosted by one worker on one device, against a loop
in one process that trains K models, averages their gradients in memory and steps each
optimizer. Each side runs in a fresh Python process timed from its start to its end; the
table gives the wall times, their ratio and the peak device memory (CUDA's allocator peak).
``--processes`` adds ExoGym with one process per node (K CUDA contexts on the GPU) for the
smallest K. ``--device cpu`` runs the same comparison on the CPU (a smoke test of the script).

``fedavg``: FedAvg of ``SmallCNN(width)`` clients (synthetic 32x32 images, each client its own)
with client sampling, a server on the simulated clock (``FedAvgStrategy(client_sampling=...)``),
one worker on one GPU; per number of clients (10 clients a round at the defaults, whatever the
total: a client no round draws is never built): wall time and peak device memory. Needs CUDA.

    python benchmarks/gpu_virtual_nodes.py gpt --nodes 8,64 --steps 30
    python benchmarks/gpu_virtual_nodes.py fedavg --clients 1000,100000 --round-clients 10 --width 64
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from e2e import average_gradients
from timed_children import run_child  # this folder is the script's first import path

from exogym.cli import int_at_least, quiet_interrupt, script_parser

logger = logging.getLogger("benchmarks.gpu_virtual_nodes")
BATCH = 16
PER_CLIENT = 32


def _peak(device: str) -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else float("nan")


def _gpt_exogym(nodes: int, steps: int, device: str, workers: int) -> dict:
    from exogym import Trainer
    from exogym.strategy import SimpleReduceStrategy
    from exogym.tasks import load

    task = load("chars")
    trainer = Trainer(task.make_model(), task.train)
    trainer.fit(
        SimpleReduceStrategy(optim_spec="adamw", lr=task.lr),
        num_nodes=nodes,
        workers=workers,
        max_steps=steps,
        batch_size=BATCH,
        device=device,
        progress=False,
        logger=False,
    )
    peak = trainer.result["peak_memory"]
    return {"peak_mb": peak / 2**20 if device == "cuda" and peak else float("nan")}


def _gpt_loop(nodes: int, steps: int, device: str) -> dict:
    """K models, each on its own shard (random batches drawn with its own seed), gradients
    averaged in memory, one AdamW per model."""
    import torch

    from exogym.tasks import load

    task = load("chars")
    torch.manual_seed(0)
    models = [task.make_model().to(device) for _ in range(nodes)]
    opts = [torch.optim.AdamW(m.parameters(), lr=task.lr) for m in models]
    gens = [torch.Generator().manual_seed(r) for r in range(nodes)]
    n = len(task.train)
    for _ in range(steps):
        for m, g in zip(models, gens, strict=True):
            idx = torch.randint(0, n, (BATCH,), generator=g).tolist()
            x = torch.stack([task.train[i][0] for i in idx]).to(device)
            y = torch.stack([task.train[i][1] for i in idx]).to(device)
            m((x, y)).backward()
        average_gradients(models)
        for o in opts:
            o.step()
            o.zero_grad()
    if device == "cuda":
        torch.cuda.synchronize()
    return {"peak_mb": _peak(device)}


def client_images(rank: int, num_nodes: int, train: bool):
    """Client ``rank``'s synthetic CIFAR-shaped data (its own seed), a ``dataset_factory``."""
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(rank)
    images = torch.randn(PER_CLIENT, 3, 32, 32, generator=g)
    return TensorDataset(images, torch.randint(0, 10, (PER_CLIENT,), generator=g))


def _fedavg_run(clients: int, round_clients: int, rounds: int, width: int) -> dict:
    from exogym import Trainer
    from exogym.strategy import FedAvgStrategy
    from exogym.tasks import SmallCNN

    trainer = Trainer(SmallCNN(width), client_images)
    trainer.fit(
        FedAvgStrategy(H=5, client_sampling=round_clients / clients, optim_spec="sgd", lr=0.05),
        num_nodes=clients,
        workers=1,
        max_steps=5 * rounds,  # equal speeds and links: a round is H=5 ticks of the clock
        batch_size=BATCH,
        device="cuda",
        progress=False,
        logger=False,
    )
    return {"peak_mb": trainer.result["peak_memory"] / 2**20}


def _child(args: list[str]) -> dict:
    return run_child(__file__, args)


def _run_child(args: argparse.Namespace) -> dict:
    if args.scenario == "gpt":
        k = int(args.nodes)
        if args.side == "loop":
            return _gpt_loop(k, args.steps, args.device)
        return _gpt_exogym(k, args.steps, args.device, k if args.side == "processes" else 1)
    return _fedavg_run(int(args.clients), args.round_clients, args.rounds, args.width)


@quiet_interrupt
def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("scenario", choices=["gpt", "fedavg"], help="what to measure")
    parser.add_argument("--nodes", default="8,64", help="numbers of GPT nodes, comma-separated (gpt)")
    parser.add_argument("--steps", type=int_at_least(1), default=30, help="training steps (gpt)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where the nodes train (gpt)")
    parser.add_argument("--processes", action="store_true", help="also one process per node, smallest K (gpt)")
    parser.add_argument("--clients", default="1000,100000", help="FedAvg clients, comma-separated (fedavg)")
    parser.add_argument("--round-clients", type=int_at_least(1), default=10, help="clients per round (fedavg)")
    parser.add_argument("--rounds", type=int_at_least(1), default=5, help="FedAvg rounds of H=5 (fedavg)")
    parser.add_argument("--width", type=int_at_least(1), default=64, help="SmallCNN width (fedavg)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", default="exogym", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.stdout.write(json.dumps(_run_child(args)) + "\n")
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import torch

    if (args.scenario == "fedavg" or args.device == "cuda") and not torch.cuda.is_available():
        parser.error(f"the {args.scenario!r} scenario needs CUDA (no GPU here); 'gpt --device cpu' runs on the CPU")
    if args.scenario == "gpt":
        logger.info("CharGPT DDP, batch %d, %d steps, device %s, one worker", BATCH, args.steps, args.device)
        logger.info("%-6s %-12s %9s %9s %12s", "K", "side", "total s", "x loop", "peak MB")
        ks = [k.strip() for k in args.nodes.split(",")]
        for k in ks:
            sides = ["loop", "exogym"] + (["processes"] if args.processes and k == ks[0] else [])
            common = ["gpt", "--nodes", k, "--steps", str(args.steps), "--device", args.device]
            out = {side: _child([*common, "--side", side]) for side in sides}
            for side in sides:
                r = out[side]
                ratio = r["total_s"] / out["loop"]["total_s"]
                logger.info("%-6s %-12s %9.2f %9.2f %12.0f", k, side, r["total_s"], ratio, r["peak_mb"])
        return
    logger.info(
        "FedAvg SmallCNN(width=%d), %d clients a round, %d rounds of H=5, batch %d, one worker on one GPU",
        args.width, args.round_clients, args.rounds, BATCH,
    )  # fmt: skip
    logger.info("%-10s %9s %12s", "clients", "total s", "peak MB")
    for k in (k.strip() for k in args.clients.split(",")):
        common = ["fedavg", "--clients", k, "--round-clients", str(args.round_clients), "--rounds", str(args.rounds)]
        r = _child([*common, "--width", str(args.width)])
        logger.info("%-10s %9.2f %12.0f", k, r["total_s"], r["peak_mb"])


if __name__ == "__main__":
    main()
