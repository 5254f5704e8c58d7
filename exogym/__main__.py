"""The ``exogym`` command (also ``python -m exogym``).

``exogym compare`` trains several strategies on a built-in task from the same initial model and
reports, for each, the final validation loss and accuracy, bytes sent per node, the simulated
time on a chosen network and the wall time; it writes per-run CSVs, ``summary.csv`` and plots.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from exogym.core.comm.network import PRESETS as NETWORKS
from exogym.strategy.registry import PRESETS
from exogym.tasks import TASKS

logger = logging.getLogger("exogym.cli")

DEFAULT_STRATEGIES = "ddp,fedavg,diloco,sparta,demo"


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``exogym`` console script."""
    parser = argparse.ArgumentParser(
        prog="exogym", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "compare",
        help="compare strategies on a task",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", default="digits", choices=TASKS, help="digits and chars need no download (default digits)")
    p.add_argument(
        "--strategies",
        default=DEFAULT_STRATEGIES,
        # argparse %-formats help strings: the presets' descriptions may hold a literal '%'
        help=f"comma-separated, from: {', '.join(f'{k} ({v[1]})' for k, v in PRESETS.items())}".replace("%", "%%"),
    )
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--workers", type=int, default=None, help="processes hosting the nodes (default: one per core)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32, help="examples per node per step")
    p.add_argument("--lr", type=float, default=None, help="inner learning rate (default: the task's)")
    p.add_argument("--H", type=int, default=20, help="communication period of fedavg and diloco")
    p.add_argument("--network", default="internet", choices=sorted(NETWORKS))
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="exogym_runs/compare", help="folder for CSVs and plots")
    p.add_argument("--data-dir", default="data", help="where mnist and shakespeare are downloaded")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        parser.error(f"unknown strategies {unknown}; choose from {sorted(PRESETS)}")
    if args.workers is not None and not 1 <= args.workers <= args.nodes:
        parser.error(f"--workers must be between 1 and --nodes={args.nodes}, got {args.workers}")

    from exogym.cli.compare import compare, format_table

    summary = compare(
        args.task,
        names,
        nodes=args.nodes,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        H=args.H,
        network=args.network,
        out_dir=args.out,
        device=args.device,
        data_dir=args.data_dir,
        seed=args.seed,
        progress=not args.no_progress,
        workers=args.workers,
    )
    logger.info("\n%s\n", format_table(summary))
    logger.info("wrote %s/summary.csv, per-run metrics.csv and val_loss_vs_{step,bytes,sim_time}.png", args.out)


if __name__ == "__main__":
    main()
