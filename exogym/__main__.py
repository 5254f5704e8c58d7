"""The ``exogym`` command.

``exogym train`` runs one strategy on a built-in task (no download) and logs a summary.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence

from exogym.strategy.registry import PRESETS, build

logger = logging.getLogger("exogym.cli")


def _train(args: argparse.Namespace) -> None:
    from exogym import Trainer
    from exogym.logger import CSVLogger
    from exogym.tasks import MLPClassifier, digits_datasets

    train, val = digits_datasets()
    trainer = Trainer(MLPClassifier(), train, val)
    strategy = build(args.strategy, args.lr, args.H)
    t0 = time.perf_counter()
    trainer.fit(
        strategy,
        num_nodes=args.nodes,
        max_steps=args.steps,
        batch_size=args.batch_size,
        device=args.device,
        logger=CSVLogger(args.out),
        val_size=len(val),
        seed=args.seed,
    )
    wall = time.perf_counter() - t0
    last = trainer.history[-1]
    train_rows = [r for r in trainer.history if "bytes_sent" in r]
    logger.info(
        "%s on digits, %d nodes x %d steps: val loss %.4f (average model), %.1f MB sent per node, %.1f s wall",
        args.strategy, args.nodes, trainer.result["max_steps"], last.get("val_loss_global", float("nan")),
        train_rows[-1]["bytes_sent"] / 1e6, wall,
    )
    logger.info("metrics: %s/%s/metrics.csv", args.out, trainer.result["run_name"])


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``exogym`` console script and ``python -m exogym``."""
    parser = argparse.ArgumentParser(prog="exogym", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train one strategy on the built-in digits task")
    p.add_argument("--strategy", default="ddp", choices=sorted(PRESETS))
    p.add_argument("--H", type=int, default=20, help="communication period of fedavg/diloco")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default="exogym_runs", help="folder for the run's CSV and config")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    _train(args)


if __name__ == "__main__":
    main()
