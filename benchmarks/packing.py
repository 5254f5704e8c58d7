"""A sweep of small runs, packed onto the cores against one run after the other.

The grid: DDP, DiLoCo and SPARTA (the presets) x H in ``--H`` x seeds in ``--seeds`` on the
digits task, ``--nodes`` nodes (K=4) hosted by ``--workers`` worker processes (1: the K nodes
are virtual nodes of one process), ``--steps`` steps (200) of batch 32 each. H applies to DiLoCo
only: DDP and SPARTA run once per seed. Each side is ``exogym.sweep`` over that grid in a fresh
Python process, timed from its start (torch's import included) to its end, into a folder of its
own:

* ``one-by-one``: ``parallel=1``, one run after the other;
* ``packed``: ``parallel='auto'``, as many runs side by side as the cores hold (each run's
  workers take one core each).

Both sides give every worker one intra-op thread, and the benchmark checks that their
``runs.csv`` rows agree in every column but wall time. "CPU s" is the CPU time of the side's
process and all its descendants (fork server, workers): on a loaded machine it moves far less
than wall time.

    python benchmarks/packing.py
    python benchmarks/packing.py --workers 2     # runs that fill 2 cores: nothing to pack there
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import tempfile

from timed_children import run_child  # this folder is the script's first import path

from exogym.cli import int_at_least, quiet_interrupt, script_parser

logger = logging.getLogger("benchmarks.packing")
STRATEGIES = ("ddp", "diloco", "sparta")
SIDES = {"one-by-one": 1, "packed": "auto"}


def _child(args: argparse.Namespace) -> dict:
    """Runs inside the timed subprocess: the whole sweep on one side."""
    import exogym

    exogym.prestart()  # a script's first statement, as the docs recommend
    logging.getLogger("exogym").setLevel(logging.ERROR)
    result = exogym.sweep(
        "digits",
        list(STRATEGIES),
        grid={"H": args.H},
        seeds=args.seeds,
        nodes=args.nodes,
        workers=args.workers,
        steps=args.steps,
        out_dir=args.out,
        progress=False,
        parallel=SIDES[args.side],
    )
    assert not result.failures, result.failures
    rows = [{k: v for k, v in r.items() if k != "wall_time"} for r in result.runs]
    walls = [r["wall_time"] for r in result.runs]
    return {"runs": len(rows), "parallel": result.parallel, "rows": rows, "run_s": sum(walls)}


@quiet_interrupt
def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--H", type=lambda s: [int(x) for x in s.split(",")], default=[10, 20, 50])
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    parser.add_argument("--nodes", type=int_at_least(1), default=4)
    parser.add_argument("--workers", type=int_at_least(1), default=1, help="worker processes per run")
    parser.add_argument("--steps", type=int_at_least(1), default=200)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", default="packed", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.stdout.write(json.dumps(_child(args), default=str) + "\n")
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    flags = ["--H", ",".join(map(str, args.H)), "--seeds", ",".join(map(str, args.seeds))]
    flags += ["--nodes", str(args.nodes), "--workers", str(args.workers), "--steps", str(args.steps)]
    with tempfile.TemporaryDirectory() as tmp:
        out = {side: _timed(side, [*flags, "--out", os.path.join(tmp, side)]) for side in SIDES}
    base, packed = out["one-by-one"], out["packed"]
    assert base["rows"] == packed["rows"], "packing changed a run's results"
    logger.info(
        "%s x H=%s x seeds %s on digits: %d runs of %d steps, K=%d on %d worker(s) each, %d cores",
        "/".join(STRATEGIES), args.H, args.seeds, base["runs"], args.steps, args.nodes, args.workers,
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    )  # fmt: skip
    logger.info(
        "%-11s %9s %9s %8s %8s %8s %14s", "side", "at once", "total s", "x 1-by-1", "CPU s", "x 1-by-1", "sum of runs s"
    )
    for side, r in out.items():
        logger.info(
            "%-11s %9d %9.2f %8.2f %8.2f %8.2f %14.2f",
            side, r["parallel"], r["total_s"], r["total_s"] / base["total_s"], r["cpu_s"], r["cpu_s"] / base["cpu_s"],
            r["run_s"],
        )  # fmt: skip
    logger.info("runs.csv rows equal on both sides in every column but wall time")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({side: {k: v for k, v in r.items() if k != "rows"} for side, r in out.items()}, f, indent=2)


def _timed(side: str, flags: list[str]) -> dict:
    """One side in a fresh Python (``run_child``), with ``cpu_s``: the CPU seconds of that
    process and every process under it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = run_child(__file__, [*flags, "--side", side])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {**out, "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)}


if __name__ == "__main__":
    main()
