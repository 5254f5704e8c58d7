"""What pricing on a world costs: the virtual-node FedAvg run of ``virtual_nodes.py`` (1,000
clients, sampling 0.01, 20 rounds of H=10) with the homogeneous ``internet`` preset beside the
same run on a world of regions, alternating which goes first; the wall time of ``fit`` per run
and the median ratio (the target: at most 1.10). ``--traces`` gives the world a bandwidth trace
too (the crossing between two regions changes every simulated second for the first 200
seconds), so that every step is priced on the bandwidths of its start. ``--pricing-only`` times
the pricing alone:
every node pricing a step of three records (a world-wide all-reduce with its members, and two
charges that name none) for 20 rounds of H=10 steps, homogeneous beside the world.

    python benchmarks/world_pricing.py --clients 1000 --rounds 20 --repeat 3
    python benchmarks/world_pricing.py --clients 1000 --rounds 20 --repeat 3 --traces
    python benchmarks/world_pricing.py --clients 1000 --pricing-only
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time

from timed_children import run_child  # this folder is the script's first import path

from exogym.cli import int_at_least, quiet_interrupt, script_parser

logger = logging.getLogger("benchmarks.world_pricing")


def _world(clients: int, traces: bool = False):
    """Four regions of equal size joined by a matrix of links, each node on an access link; with
    ``traces``, the us-eu crossing alternates between 1 Gbit/s and 500 Mbit/s every simulated
    second for 200 seconds."""
    from exogym import Link, Network

    names = ["us", "eu", "asia", "sa"]
    regions = {n: range(i * clients // 4, (i + 1) * clients // 4) for i, n in enumerate(names)}
    links = {("us", "asia"): Link("500Mbit/s", "150ms"), ("eu", "sa"): Link("200Mbit/s", "200ms")}
    return Network.regions(
        regions,
        Link("100Gbit/s", "10us"),
        Link("1Gbit/s", "80ms"),
        links=links,
        access=Link("10Gbit/s", "1ms"),
        traces=[{"time": t, "region_a": "us", "region_b": "eu", "bandwidth": 1e9 / (1 + t % 2)} for t in range(200)]
        if traces
        else None,
        name="four-regions",
    )


def _fit(clients: int, rounds: int, network: str, traces: bool) -> dict:
    from virtual_nodes import BATCH, H, _strategy, client_data

    from exogym import Trainer
    from exogym.tasks import MLPClassifier

    net = "internet" if network == "internet" else _world(clients, traces)
    trainer = Trainer(MLPClassifier(), client_data)
    t0 = time.perf_counter()
    trainer.fit(
        _strategy(0.01),
        num_nodes=clients,
        max_steps=H * rounds,
        batch_size=BATCH,
        log_interval=H,
        progress=False,
        logger=False,
        device="cpu",
        network=net,
    )
    return {"fit_s": time.perf_counter() - t0, "sim_time": trainer.history[-1].get("sim_time")}


def _pricing(clients: int, rounds: int, traces: bool) -> None:
    from exogym.core.comm.groups import world_members
    from exogym.core.comm.ledger import Ledger
    from exogym.core.comm.network import PRESETS

    ledger = Ledger()
    ledger.record("all_reduce", clients, 10**6, members=world_members(clients))
    ledger.record("all_reduce", 10, 10**6)
    ledger.record("broadcast", clients - 9, 10**6)
    records = ledger.end_step()
    seconds = {}
    for net in (PRESETS["internet"], _world(clients, traces).for_run(clients, 0)) * 2:
        t0 = time.perf_counter()
        for i in range(clients * rounds * 10):
            net.records_time(records, 0.1, at=i * 0.001)  # (with traces: a change every 1,000 node-steps)
        seconds[net.name] = min(seconds.get(net.name, float("inf")), time.perf_counter() - t0)
    logger.info(
        "pricing %d node-steps: internet %.3f s, world %.3f s, world / internet %.3f",
        clients * rounds * 10,
        seconds["internet"],
        seconds["four-regions"],
        seconds["four-regions"] / seconds["internet"],
    )


@quiet_interrupt
def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--clients", type=int_at_least(4), default=1000)
    parser.add_argument("--rounds", type=int_at_least(1), default=20)
    parser.add_argument("--repeat", type=int_at_least(1), default=3)
    parser.add_argument("--pricing-only", action="store_true", help="time the pricing alone, in this process")
    parser.add_argument("--traces", action="store_true", help="give the world a bandwidth trace")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", default="internet", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import exogym

        exogym.prestart()
        sys.stdout.write(json.dumps(_fit(args.clients, args.rounds, args.side, args.traces)) + "\n")
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.pricing_only:
        _pricing(args.clients, args.rounds, args.traces)
        return
    common = ["--clients", str(args.clients), "--rounds", str(args.rounds), *(["--traces"] if args.traces else [])]
    ratios = []
    for i in range(args.repeat):
        sides = ["internet", "world"] if i % 2 == 0 else ["world", "internet"]
        out = {side: run_child(__file__, [*common, "--side", side]) for side in sides}
        ratios.append(out["world"]["fit_s"] / out["internet"]["fit_s"])
        logger.info(
            "pair %d: internet %.2f s, world %.2f s, world / internet %.3f",
            i + 1,
            out["internet"]["fit_s"],
            out["world"]["fit_s"],
            ratios[-1],
        )
    logger.info("median world / internet over %d pairs: %.3f", args.repeat, statistics.median(ratios))


if __name__ == "__main__":
    main()
