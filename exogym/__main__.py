"""The exogym command (also python -m exogym).

exogym compare trains several strategies on a built-in task from the same initial model and
reports, for each, the final validation loss and accuracy, bytes sent per node, the simulated
time on a chosen network and the wall time; it writes per-run CSVs, summary.csv and plots.
With --target-loss X it also reports the simulated seconds, steps and MB per node at which
each strategy's average model first reached validation loss X. With --scale 1B (and
--step-seconds) the same training is priced as a model of that size: bytes and simulated time are
the large model's, the learning the task's.

exogym bandwidth prints the bandwidth each method needs for a compute utilisation at a scale, or
the utilisation a bandwidth gives, without training.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from exogym import __version__
from exogym.cli import (
    add_partition_options,
    add_run_options,
    finite_float,
    measured_compute,
    partition_from_args,
    plain_help,
    quiet_interrupt,
    run_settings,
    strategy_names,
)
from exogym.cli import int_at_least as _int_at_least
from exogym.cli import positive_float as _positive_float
from exogym.cli.attack import add_attack_options, adversaries_from_args
from exogym.cli.bandwidth import add_parser as add_bandwidth_parser
from exogym.cli.bandwidth import add_scale_options, scale_from_args
from exogym.cli.bandwidth import run as run_bandwidth
from exogym.cli.sweep_args import add_sweep_options, is_sweep, run_sweep
from exogym.strategy.registry import PRESETS, build
from exogym.tasks import TASKS

logger = logging.getLogger("exogym.cli")

DEFAULT_STRATEGIES = "ddp,fedavg,diloco,sparta,demo"


def _compute_model(text: str) -> str | float:
    """An argparse ``type``: ``flops``, ``measured`` or seconds per step (>= 0)."""
    if text in ("flops", "measured"):
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 'flops', 'measured' or seconds per step, got {text!r}") from None
    from exogym.core.comm.network import COMPUTE_RANGE

    if not COMPUTE_RANGE[0] <= value <= COMPUTE_RANGE[1]:
        raise argparse.ArgumentTypeError(f"seconds per step must be >= 0 and at most {COMPUTE_RANGE[1]:g}, got {text}")
    return value


def _flops_per_second(text: str) -> float:
    """An argparse ``type``: a node's FLOP/s, in ``FLOPS_RANGE``."""
    from exogym.core.comm.network import FLOPS_RANGE

    value = _positive_float(text)
    if not FLOPS_RANGE[0] <= value <= FLOPS_RANGE[1]:
        raise argparse.ArgumentTypeError(f"must be in [{FLOPS_RANGE[0]:g}, {FLOPS_RANGE[1]:g}] FLOP/s, got {text}")
    return value


def _parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The ``exogym`` parser and its ``compare`` subparser."""
    parser = argparse.ArgumentParser(
        prog="exogym", description=plain_help(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "compare",
        help="compare strategies on a task",
        description=plain_help(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", default="digits", choices=TASKS, help="digits and chars need no download (default digits)")
    p.add_argument(
        "--strategies",
        default=DEFAULT_STRATEGIES,
        # argparse %-formats help strings: the presets' descriptions may hold a literal '%'
        help=f"comma-separated, from: {', '.join(f'{k} ({v[1]})' for k, v in PRESETS.items())}".replace("%", "%%"),
    )
    p.add_argument(
        "--workers", type=_int_at_least(1), default=None, help="processes hosting the nodes (default: one per core)"
    )
    p.add_argument("--lr", type=_positive_float, default=None, help="inner learning rate (default: the task's)")
    p.add_argument(
        "--compute",
        type=_compute_model,
        default=None,
        help="compute time per step in the simulated time: 'flops' (FLOPs of a step at "
        "--flops-per-second, the same every run), seconds per step, or 'measured' (this machine); "
        "default: a world file's own 'compute', otherwise flops",
    )
    p.add_argument(
        "--flops-per-second",
        type=_flops_per_second,
        default=None,
        help="a node's sustained throughput for --compute flops (default: a world file's own, otherwise 1e13)",
    )
    p.add_argument(
        "--target-loss",
        type=finite_float,
        default=None,
        help="report, per strategy, the simulated seconds, steps and MB per node at which the average "
        "model first reached this validation loss (interpolated between validations)",
    )
    add_partition_options(p)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or mps")
    add_run_options(p, out="exogym_runs/compare", data_help="where mnist, cifar10 and shakespeare are downloaded")
    add_sweep_options(p)
    add_scale_options(p)
    add_attack_options(p)
    add_bandwidth_parser(sub)
    return parser, p


@quiet_interrupt
def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``exogym`` console script; exits 2 on bad arguments (before anything
    starts) and 1 when a strategy failed (after writing the others' results)."""
    top, parser = _parser()
    args = top.parse_args(argv)
    from exogym.runtime import cluster

    # Under torchrun, rank 0 reports.
    logging.basicConfig(level=logging.INFO if cluster.reporting() else logging.WARNING, format="%(message)s")
    if args.command == "bandwidth":
        sub = args.subparser
        run_bandwidth(sub, args, strategy_names(sub, args.strategies, "--strategies"))
        return
    names = strategy_names(parser, args.strategies, "--strategies")
    scale = scale_from_args(parser, args)
    adversaries = adversaries_from_args(parser, args, sweep=is_sweep(args))
    if adversaries is not None:
        from exogym.runtime.plan import check_adversaries

        for name in names:
            try:
                check_adversaries(adversaries, build(name, args.lr or 1e-3, args.H))
            except ValueError as e:
                parser.error(f"argument --attack: {name}: {e}")
    if args.workers is not None and args.workers > args.nodes:
        parser.error(f"--workers must be between 1 and --nodes={args.nodes}, got {args.workers}")
    from exogym.config import resolve_device

    try:
        resolve_device(args.device)
    except ValueError as e:
        parser.error(f"argument --device: {e}")
    from exogym.core.comm.network import resolve_network

    try:  # a world of another size, or a world file with an error: say so before anything starts
        net = resolve_network(args.network, args.compute, num_nodes=args.nodes, seed=args.seed)
    except (OSError, ValueError) as e:
        parser.error(f"argument --network: {e}")
    if is_sweep(args) and cluster.detect() is not None:
        parser.error("argument --grid/--seeds: a sweep runs on this machine's processes; run it without torchrun")
    from exogym.tasks import load

    try:
        task = load(args.task, args.data_dir)  # downloads once; offline, say so before anything starts
    except OSError as e:
        parser.error(
            f"--task {args.task}: its data is not in --data-dir {args.data_dir} and could not be downloaded "
            f"({type(e).__name__}: {e}). Connect to the network once, copy the files there, or pick a "
            "built-in task (--task digits or --task chars)."
        )
    if net.compute == "measured" and (scale is None or scale.seconds_per_step() is None):
        clocked = [n for n in names if build(n, args.lr or task.lr, args.H).needs_step_seconds]
        if clocked:  # the asynchronous presets: say so here, not from inside their nodes
            option = "--compute" if args.compute == "measured" else "--network"
            parser.error(f"argument {option}: {measured_compute(clocked, '--compute flops or seconds per step')}")

    if is_sweep(args):
        run_sweep(parser, args, task, names)  # each run resolves --network for its nodes and seed
        return
    split = partition_from_args(parser, task.train, args, f" (task {args.task})")

    from exogym.cli.compare import compare, report

    result = compare(
        task,
        names,
        **run_settings(args),
        lr=args.lr,
        compute=args.compute,
        device=args.device,
        workers=args.workers,
        partition=split,
        target_loss=args.target_loss,
        flops_per_second=args.flops_per_second,
        scale=scale,
        adversaries=adversaries,
    )
    report(result)


if __name__ == "__main__":
    main()
