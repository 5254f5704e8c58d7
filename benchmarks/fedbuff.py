"""FedBuff on 1,000 virtual clients, side by side with an in-process loop doing the same client
work and with synchronous FedAvg of equal client work.

The work: the bundled digits, the MLP 64-256-256-10, 80 digits per client (as
``virtual_nodes.py``), plain SGD (lr 0.05), batch 8, ``Q=10`` local steps per participation,
buffer ``B=10``, concurrency 20, until the server has stepped 20 times (200 client updates); the
network: 1 Gbit/s, 10 ms, 10 ms of compute per step, client speeds 1 to 3.2 (seven groups).
Three children, each a fresh Python process timed from its start:

- ``fedbuff``: ``fit(FedBuffStrategy(...), num_nodes=1000)`` on virtual nodes;
- ``loop``: the same timeline's client work in one process (each participation's steps from the
  model the client downloaded, the server's buffered, staleness-scaled steps), no runtime;
- ``fedavg``: ``fit(FedAvgStrategy(H=10, client_sampling=...), num_nodes=1000)`` for 10 rounds,
  the synchronous run of equal client work: as many clients per round as bring its client
  steps nearest FedBuff's (21 per round: 2,100 steps to FedBuff's 2,131, whose clients still
  in flight at the end have trained part of a segment).

The run's length (the ticks until the server's 20th step, found by simulating a longer timeline)
and FedAvg's clients per round are worked out in this script's own process and passed to the
children, whose time is each side's alone (the loop simulates the timeline it replays, as the
workers do).

    python benchmarks/fedbuff.py --repeat 3
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from typing import Any

from timed_children import run_child  # this folder is the script's first import path
from virtual_nodes import BATCH, client_data

from exogym.cli import int_at_least, quiet_interrupt, script_parser

logger = logging.getLogger("benchmarks.fedbuff")
CLIENTS, CONCURRENCY, BUFFER, LOCAL, SERVER_STEPS, LR = 1000, 20, 10, 10, 20, 0.05
FEDAVG_ROUNDS = SERVER_STEPS * BUFFER // CONCURRENCY


def _network():
    from exogym import Network

    speeds = tuple(1.0 + (r % 7) * 0.37 for r in range(CLIENTS))
    return Network(1e9, 0.01, compute=0.01, compute_slowdown=speeds).for_run(CLIENTS, 0)


def _timeline(ticks: int | None = None):
    """The FedBuff timeline of the run: ``ticks`` ticks, by default those until the server's
    last step (found by a longer probe: the parent's work, not a child's)."""
    from communicators.fedbuff import FedBuffTiming
    from communicators.server import step_seconds, transfer_seconds
    from exogym.tasks import MLPClassifier

    net = _network()
    nbytes = 4 * sum(p.numel() for p in MLPClassifier().parameters())
    seconds = step_seconds(net, CLIENTS)
    transfer = [transfer_seconds(net, r, nbytes) for r in range(CLIENTS)]
    if ticks is None:
        updates = SERVER_STEPS * BUFFER
        # the ticks before the receipt that completes the last server step
        probe = FedBuffTiming(seconds, transfer, 4 * updates * LOCAL, CONCURRENCY, BUFFER, LOCAL, 42).run()
        last = probe.updates[updates - 1][0]
        ticks = sum(1 for t in probe.ticks if t < last)
    return FedBuffTiming(seconds, transfer, ticks, CONCURRENCY, BUFFER, LOCAL, 42).run()


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


def _loop(ticks: int) -> dict:
    """The timeline's client work in one process (its simulation included, as the workers
    simulate it): per tick, each training client's step; the server's events in order."""
    import torch
    from torch.utils.data import DataLoader

    from communicators.fedbuff import staleness_weight
    from exogym.tasks import MLPClassifier

    t0 = time.perf_counter()
    tl = _timeline(ticks)
    server = MLPClassifier()
    flat = lambda m: torch.cat([p.detach().reshape(-1) for p in m.parameters()])  # noqa: E731
    x = flat(server)
    buf, buffered = torch.zeros_like(x), 0
    models: dict[int, tuple] = {}
    data: dict[int, Any] = {}
    incoming: dict[int, torch.Tensor] = {}
    pending: dict[int, torch.Tensor] = {}

    def load(r: int, state: torch.Tensor) -> None:
        m = MLPClassifier()
        torch.nn.utils.vector_to_parameters(state, m.parameters())
        models[r] = (m, torch.optim.SGD(m.parameters(), lr=LR), state.clone())

    for ev in tl.before:
        if ev.kind == "deliver":
            load(ev.rank, x)
    steps = 0
    for trains, after in zip(tl.trains, tl.after, strict=True):
        for r in sorted(trains):
            m, opt, _ = models[r]
            batch = next(data[r], None) if r in data else None
            if batch is None:  # a client's first step, or its data used up: a fresh pass
                shard = client_data(r, CLIENTS, True)
                data[r] = iter(DataLoader(shard, batch_size=BATCH, shuffle=True, drop_last=True))
                batch = next(data[r])
            opt.zero_grad()
            m(batch).backward()
            opt.step()
            steps += 1
        for ev in after:
            if ev.kind == "capture":
                m, _, start = models[ev.rank]
                pending[ev.rank] = flat(m) - start
            elif ev.kind == "receive":
                buf.add_(pending.pop(ev.rank) * staleness_weight(ev.staleness))
                buffered += 1
                if buffered == BUFFER:
                    x.add_(buf / BUFFER * 1.0)
                    buf.zero_()
                    buffered = 0
            elif ev.kind == "serve":
                incoming[ev.rank] = x.clone()
            elif ev.kind == "deliver":
                load(ev.rank, incoming.pop(ev.rank))
    return {"fit_s": time.perf_counter() - t0, "client_steps": steps}


def _fedavg(per_round: int) -> dict:
    from exogym import Trainer
    from exogym.strategy import FedAvgStrategy
    from exogym.tasks import MLPClassifier

    trainer = Trainer(MLPClassifier(), client_data)
    t0 = time.perf_counter()
    trainer.fit(
        FedAvgStrategy(H=LOCAL, client_sampling=per_round / CLIENTS, optim_spec="sgd", lr=LR),
        num_nodes=CLIENTS,
        max_steps=LOCAL * FEDAVG_ROUNDS,
        batch_size=BATCH,
        network=_network(),
        log_interval=LOCAL,
        progress=False,
        logger=False,
        device="cpu",
        seed=42,
    )
    return {"fit_s": time.perf_counter() - t0, "client_steps": trainer.history[-1]["examples"] // BATCH}


@quiet_interrupt
def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--repeat", type=int_at_least(1), default=1, help="rounds of the three children")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", default="fedbuff", help=argparse.SUPPRESS)
    parser.add_argument("--ticks", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--per-round", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.side != "loop":
            import exogym

            exogym.prestart()
        sides = {"fedbuff": lambda: _fedbuff(args.ticks), "loop": lambda: _loop(args.ticks)}
        out = sides.get(args.side, lambda: _fedavg(args.per_round))()
        sys.stdout.write(json.dumps(out) + "\n")
        return
    # The run's length and FedAvg's clients per round, worked out here once (not in the timed children).
    tl = _timeline()
    per_round = round(sum(len(ranks) for ranks in tl.trains) / (LOCAL * FEDAVG_ROUNDS))
    flags = ["--ticks", str(len(tl.ticks)), "--per-round", str(per_round)]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger.info(
        "FedBuff: %d clients, concurrency %d, buffer %d, %d local steps, %d server steps; 2-core CPU",
        CLIENTS, CONCURRENCY, BUFFER, LOCAL, SERVER_STEPS,
    )  # fmt: skip
    logger.info("%-5s %10s %10s %10s %12s %12s %14s", "run", "loop s", "fedbuff s", "fedavg s", "fedbuff/loop",
                "fedbuff/fedavg", "client steps")  # fmt: skip
    vs_loop, vs_fedavg = [], []
    for i in range(args.repeat):
        order = ["fedbuff", "loop", "fedavg"] if i % 2 == 0 else ["fedavg", "loop", "fedbuff"]
        out = {side: run_child(__file__, ["--side", side, *flags]) for side in order}
        vs_loop.append(out["fedbuff"]["total_s"] / out["loop"]["total_s"])
        vs_fedavg.append(out["fedbuff"]["total_s"] / out["fedavg"]["total_s"])
        steps = f"{out['fedbuff']['client_steps']}/{out['loop']['client_steps']}/{out['fedavg']['client_steps']}"
        logger.info(
            "%-5d %10.2f %10.2f %10.2f %12.2f %12.2f %14s", i + 1, out["loop"]["total_s"], out["fedbuff"]["total_s"],
            out["fedavg"]["total_s"], vs_loop[-1], vs_fedavg[-1], steps,
        )  # fmt: skip
    if args.repeat > 1:
        logger.info(
            "median fedbuff/loop %.2f, fedbuff/fedavg %.2f", statistics.median(vs_loop), statistics.median(vs_fedavg)
        )


if __name__ == "__main__":
    main()
