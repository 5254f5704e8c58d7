"""``exogym compare``'s sweep options: ``--grid``, ``--seeds``, ``--confidence``, ``--parallel`` (a
sweep also reads ``compare``'s ``--target-loss``)."""

from __future__ import annotations

import argparse
from typing import Any

from exogym.cli import finite_float

__all__ = ["SWEEP_OUT", "add_sweep_options", "is_sweep", "parallel_runs", "run_sweep", "seed_list"]

#: The folder of a sweep whose ``--out`` is not given (a sweep resumes in its folder, so it has
#: no ``version_N`` of its own).
SWEEP_OUT = "exogym_runs/sweep"


def seed_list(text: str) -> list[int]:
    """An argparse ``type``: comma-separated distinct integers (``0,1,2``)."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers such as 0,1,2, got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"must list distinct integers such as 0,1,2, got {text!r}")
    return seeds


def _confidence(text: str) -> float:
    value = finite_float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (0.95 for 95%), got {text}")
    return value


def parallel_runs(text: str) -> int | str:
    """An argparse ``type``: ``auto`` or a positive integer (``--parallel``)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be 'auto' (as many runs at once as the cores hold) or a positive integer (1: one after the "
            f"other), got {text!r}"
        )
    return value


def add_sweep_options(p: argparse.ArgumentParser) -> None:
    """``--grid NAME=V1,V2`` (repeatable), ``--seeds``, ``--confidence``, ``--parallel``: with
    ``--grid`` or ``--seeds``, ``compare`` runs a sweep
    ([`exogym.cli.sweep.sweep`][exogym.sweep])."""
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="NAME=V1,V2,...",
        help="sweep NAME over the values (repeat for a product): a run argument (nodes, steps, batch_size, "
        "network, compute, val_size, workers), a strategy parameter (lr, H, p_sparta, k) or a fit keyword "
        "(log_interval, minibatch_size, ...); a strategy that does not take NAME runs once. E.g. --grid H=10,50,100. "
        f"A sweep writes into --out (default {SWEEP_OUT}) and, run again, trains only the runs not finished there",
    )
    p.add_argument(
        "--seeds",
        type=seed_list,
        default=None,
        help="run every point once per seed and report mean, std and confidence interval (e.g. 0,1,2; replaces --seed)",
    )
    p.add_argument(
        "--confidence", type=_confidence, default=0.95, help="of the sweep's intervals (Student t; default 0.95)"
    )
    p.add_argument(
        "--parallel",
        type=parallel_runs,
        default="auto",
        metavar="N|auto",
        help="the most runs of a sweep trained at once: 'auto' (default) packs runs whose workers leave cores "
        "idle (e.g. --workers 1) side by side, one core per worker; 1 trains one after the other. Results do "
        "not depend on it",
    )


def is_sweep(args: argparse.Namespace) -> bool:
    """Whether the options ask for a sweep rather than a single comparison."""
    return bool(args.grid) or args.seeds is not None


def run_sweep(parser: argparse.ArgumentParser, args: argparse.Namespace, task: Any, names: list[str]) -> None:
    """Check the sweep's options (``parser.error``, exit 2, naming the option, before any
    process starts), run it into ``--out`` (default ``SWEEP_OUT``) and report it."""
    from exogym.cli.attack import adversaries_from_args
    from exogym.cli.bandwidth import scale_from_args
    from exogym.cli.grid import parse_grid
    from exogym.cli.sweep import report_sweep, sweep

    if args.partition is not None:
        parser.error("argument --partition: not available with --grid or --seeds (a sweep splits IID)")
    try:
        grid = parse_grid(args.grid)
    except ValueError as e:
        parser.error(f"argument --grid: {e}")
    out = SWEEP_OUT if args.out == parser.get_default("out") else args.out
    scale = scale_from_args(parser, args)
    adversaries = adversaries_from_args(parser, args, sweep=True)
    if adversaries is not None and len(args.malicious) > 1:
        if "malicious" in grid:
            parser.error("argument --malicious: give the shares once, in --malicious or in --grid malicious=...")
        grid["malicious"] = args.malicious
    try:
        result = sweep(
            task, names, grid=grid, seeds=args.seeds or [args.seed], nodes=args.nodes, steps=args.steps,
            batch_size=args.batch_size, lr=args.lr, H=args.H, network=args.network, compute=args.compute, out_dir=out,
            device=args.device, data_dir=args.data_dir, progress=not args.no_progress, workers=args.workers,
            target_loss=args.target_loss, confidence=args.confidence, flops_per_second=args.flops_per_second,
            parallel=args.parallel, scale=scale, adversaries=adversaries,
        )  # fmt: skip
    except (ValueError, TypeError) as e:  # the checks before the first run; what fails later is raised
        text = str(e)
        if not text.startswith(("grid: ", "parallel")):
            raise
        option = "--parallel" if text.startswith("parallel") else "--grid"
        parser.error(f"argument {option}: {text.removeprefix('grid: ')}")
    report_sweep(result)
