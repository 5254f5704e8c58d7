"""What a long bandwidth trace costs: 20 DDP steps on 4 nodes (virtual nodes on one worker) in
two regions whose crossing follows a trace of ``--small`` rows beside the same run with a trace
of ``--large`` rows (one row every simulated millisecond, generated into a temporary folder),
alternating which goes first. Each run is a fresh Python process timed from its start to its end
(torch's import, loading the trace, ``fit``), as a user's script runs; it reports the seconds to
load the trace (``Network.regions`` reading and checking the CSV) and to run ``fit``. The large
trace's total over the small one's is the figure (the target: at most 1.5). Each step's
collectives are priced where they start, so a step's cost does not grow with the trace's rows.

    python benchmarks/traces.py --small 1000 --large 1000000 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time

from timed_children import run_child  # this folder is the script's first import path

from exogym.cli import int_at_least, quiet_interrupt, script_parser

logger = logging.getLogger("benchmarks.traces")
NODES, STEPS, BATCH = 4, 20, 8


def write_trace(path: str, rows: int) -> None:
    """``rows`` rows of the us-eu crossing, one every simulated millisecond, between 0.5 and 1
    Gbit/s."""
    with open(path, "w") as f:
        f.write("time,region_a,region_b,bandwidth\n")
        f.writelines(f"{i / 1000:.3f},us,eu,{5e8 + 5e8 * ((i * 7919) % 1000) / 1000:.0f}\n" for i in range(rows))


def load(path: str):
    from exogym import Link, Network

    return Network.regions(
        {"us": [0, 1], "eu": [2, 3]}, Link("10Gbit/s", "1ms"), Link("1Gbit/s", "30ms"), traces=path, compute=0.01
    )


def run(network) -> dict:
    import torch

    from exogym import Trainer
    from exogym.strategy import SimpleReduceStrategy
    from tests.helpers import TinyNet, regression_data

    torch.manual_seed(0)
    trainer = Trainer(TinyNet(), regression_data(NODES * BATCH * STEPS))
    trainer.fit(
        SimpleReduceStrategy(), num_nodes=NODES, max_steps=STEPS, batch_size=BATCH, network=network, workers=1,
        log_interval=5, progress=False, logger=False, device="cpu",
    )  # fmt: skip
    return trainer.history[-1]


def measure(path: str) -> tuple[float, float, float]:
    """``(load seconds, run seconds, simulated seconds)`` of the trace at ``path`` (the modules
    imported before either is timed)."""
    from exogym import Link, Network, Trainer  # noqa: F401

    t0 = time.perf_counter()
    network = load(path)
    t1 = time.perf_counter()
    row = run(network)
    return t1 - t0, time.perf_counter() - t1, float(row["sim_time"])


@quiet_interrupt
def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--small", type=int_at_least(1), default=1000)
    parser.add_argument("--large", type=int_at_least(1), default=1_000_000)
    parser.add_argument("--repeat", type=int_at_least(1), default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trace", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import exogym

        exogym.prestart()
        load_s, run_s, sim = measure(args.trace)
        sys.stdout.write(json.dumps({"load_s": load_s, "run_s": run_s, "sim_time": sim}) + "\n")
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        paths = {n: os.path.join(tmp, f"trace-{n}.csv") for n in (args.small, args.large)}
        for n, path in paths.items():
            write_trace(path, n)
        ratios = []
        for i in range(args.repeat):
            order = [args.small, args.large] if i % 2 == 0 else [args.large, args.small]
            out = {n: run_child(__file__, ["--trace", paths[n]]) for n in order}
            small, large = out[args.small], out[args.large]
            ratios.append(large["total_s"] / small["total_s"])
            for n, o in ((args.small, small), (args.large, large)):
                logger.info(
                    "pair %d: %9d rows: load %.2f s, fit %.2f s, process %.2f s (sim_time %.4f s)",
                    i + 1, n, o["load_s"], o["run_s"], o["total_s"], o["sim_time"],
                )  # fmt: skip
            logger.info("pair %d: %d rows / %d rows: %.2f", i + 1, args.large, args.small, ratios[-1])
        median = statistics.median(ratios)
        logger.info("median ratio over %d pairs: %.2f (target <= 1.5)", args.repeat, median)


if __name__ == "__main__":
    main()
