"""FedBuff on 1,000 clients side by side with synchronous FedAvg of equal client work.

The work: the bundled digits, the MLP 64-256-256-10, 80 digits per client (as
``virtual_nodes.py``), plain SGD (lr 0.05), batch 8, ``Q=10`` local steps per participation,
buffer ``B=10``, concurrency 20, until the server has stepped 20 times (200 client updates); the
network: 1 Gbit/s, 10 ms, 10 ms of compute per step, client speeds 1 to 3.2 (seven groups).
Two children, each a fresh Python process timed from its start, both a server on the simulated
clock:

- ``fedbuff``: ``fit(FedBuffStrategy(...), num_nodes=1000)``;
- ``fedavg``: ``fit(FedAvgStrategy(H=10, client_sampling=...), num_nodes=1000)`` for 10 rounds,
  the synchronous run of equal client work: as many clients per round as bring its client
  steps nearest FedBuff's (21 per round: 2,100 steps to FedBuff's 2,131, whose clients still
  in flight at the end have trained part of a segment).

Each run's length in ticks (until the FedBuff server's 20th step; until FedAvg's 10th round) is
found by running its server's clock with the clients' work left out (its timing does not depend
on the values); it and FedAvg's clients per round are worked out in this script's own process and
passed to the children, whose time is each side's alone.

    python benchmarks/fedbuff.py --repeat 3
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time

from timed_children import run_child  # this folder is the script's first import path
from virtual_nodes import BATCH, PER_CLIENT, client_data

from exogym.cli import int_at_least, quiet_interrupt, script_parser

logger = logging.getLogger("benchmarks.fedbuff")
CLIENTS, CONCURRENCY, BUFFER, LOCAL, SERVER_STEPS, LR = 1000, 20, 10, 10, 20, 0.05
FEDAVG_ROUNDS = SERVER_STEPS * BUFFER // CONCURRENCY


def _network():
    from exogym import Network

    speeds = tuple(1.0 + (r % 7) * 0.37 for r in range(CLIENTS))
    return Network(1e9, 0.01, compute=0.01, compute_slowdown=speeds).for_run(CLIENTS, 0)


def _clock(server, updates: int) -> tuple[int, int]:
    """The ticks until ``server`` has received its ``updates``-th result, and the client steps
    they hold: its clock run with its tasks' values left out (each result is the model it was
    sent)."""
    import torch

    from exogym.core.events import ServerLoop, flat_params
    from exogym.runtime.server_run import server_context
    from exogym.tasks import MLPClassifier

    def no_values(tasks):
        for task in tasks:
            task.local, task.losses = task.start, [0.0] * len(task.ticks)

    ctx = server_context(_network(), CLIENTS, 42, flat_params(MLPClassifier()), PER_CLIENT // BATCH)
    loop = ServerLoop(server, ctx, 4 * updates * LOCAL, no_values)
    with torch.no_grad():
        loop.run()
    last = server.updates[updates - 1][0]
    ticks = sum(1 for t in loop.ticks if t < last)
    return ticks, sum(loop.tick_steps[:ticks])


def _timing() -> tuple[int, int]:
    """The ticks until FedBuff's last server step and the client steps they hold."""
    from communicators.fedbuff import FedBuffServer

    return _clock(FedBuffServer(LOCAL, BUFFER, CONCURRENCY, 1.0), SERVER_STEPS * BUFFER)


def _fedavg_ticks(per_round: int) -> int:
    """The ticks of FedAvg's ``FEDAVG_ROUNDS`` rounds of ``per_round`` clients."""
    from communicators.fedavg import FedAvgServer

    return _clock(FedAvgServer(LOCAL, per_round / CLIENTS), FEDAVG_ROUNDS * per_round)[0]


def _fedbuff(ticks: int) -> dict:
    from exogym import Trainer
    from exogym.strategy import FedBuffStrategy
    from exogym.tasks import MLPClassifier

    trainer = Trainer(MLPClassifier(), client_data)
    t0 = time.perf_counter()
    trainer.fit(
        FedBuffStrategy(local_steps=LOCAL, buffer_size=BUFFER, concurrency=CONCURRENCY, optim_spec="sgd", lr=LR),
        num_nodes=CLIENTS,
        max_steps=ticks,
        batch_size=BATCH,
        network=_network(),
        log_interval=50,
        progress=False,
        logger=False,
        device="cpu",
        seed=42,
    )
    summary = trainer.result["summary"]
    return {"fit_s": time.perf_counter() - t0, "client_steps": sum(summary["steps"]), "updates": summary["updates"]}


def _fedavg(per_round: int, ticks: int) -> dict:
    from exogym import Trainer
    from exogym.strategy import FedAvgStrategy
    from exogym.tasks import MLPClassifier

    trainer = Trainer(MLPClassifier(), client_data)
    t0 = time.perf_counter()
    trainer.fit(
        FedAvgStrategy(H=LOCAL, client_sampling=per_round / CLIENTS, optim_spec="sgd", lr=LR),
        num_nodes=CLIENTS,
        max_steps=ticks,
        batch_size=BATCH,
        network=_network(),
        log_interval=50,
        progress=False,
        logger=False,
        device="cpu",
        seed=42,
    )
    summary = trainer.result["summary"]
    return {"fit_s": time.perf_counter() - t0, "client_steps": sum(summary["steps"]), "rounds": summary["rounds"]}


@quiet_interrupt
def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--repeat", type=int_at_least(1), default=1, help="rounds of the two children")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", default="fedbuff", help=argparse.SUPPRESS)
    parser.add_argument("--ticks", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--per-round", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--fedavg-ticks", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import exogym

        exogym.prestart()
        out = _fedbuff(args.ticks) if args.side == "fedbuff" else _fedavg(args.per_round, args.fedavg_ticks)
        sys.stdout.write(json.dumps(out) + "\n")
        return
    # The runs' lengths and FedAvg's clients per round, worked out here once (not in the timed children).
    ticks, client_steps = _timing()
    per_round = round(client_steps / (LOCAL * FEDAVG_ROUNDS))
    flags = ["--ticks", str(ticks), "--per-round", str(per_round), "--fedavg-ticks", str(_fedavg_ticks(per_round))]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger.info(
        "FedBuff: %d clients, concurrency %d, buffer %d, %d local steps, %d server steps; 2-core CPU",
        CLIENTS, CONCURRENCY, BUFFER, LOCAL, SERVER_STEPS,
    )  # fmt: skip
    logger.info("%-5s %10s %10s %14s %14s", "run", "fedbuff s", "fedavg s", "fedbuff/fedavg", "client steps")
    vs_fedavg = []
    for i in range(args.repeat):
        order = ["fedbuff", "fedavg"] if i % 2 == 0 else ["fedavg", "fedbuff"]
        out = {side: run_child(__file__, ["--side", side, *flags]) for side in order}
        assert out["fedavg"]["rounds"] == FEDAVG_ROUNDS, out["fedavg"]  # its ticks hold its rounds
        vs_fedavg.append(out["fedbuff"]["total_s"] / out["fedavg"]["total_s"])
        steps = f"{out['fedbuff']['client_steps']}/{out['fedavg']['client_steps']}"
        logger.info(
            "%-5d %10.2f %10.2f %14.2f %14s", i + 1, out["fedbuff"]["total_s"], out["fedavg"]["total_s"],
            vs_fedavg[-1], steps,
        )  # fmt: skip
    if args.repeat > 1:
        logger.info("median fedbuff/fedavg %.2f", statistics.median(vs_fedavg))


if __name__ == "__main__":
    main()
