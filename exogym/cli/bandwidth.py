"""``exogym bandwidth``: the bandwidth each method needs for a compute utilisation at a scale, or
the utilisation (and a run's wall-clock time) a bandwidth gives, without training
(``exogym.bandwidth``).

``--scale`` and its companions (``add_scale_options``) are ``exogym compare``'s too.
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from exogym.cli import int_at_least, plain_help, positive_float

if TYPE_CHECKING:
    from exogym.scale import Scale

DEFAULT_UTILISATION = "50,80,90,95,99"

logger = logging.getLogger("exogym.cli")


def add_scale_options(p: argparse.ArgumentParser, required: bool = False) -> None:
    """``--scale`` (a parameter count: ``10e9``, ``10B``) and the rest of a
    [`Scale`][exogym.Scale]'s fields as flags."""
    p.add_argument(
        "--scale",
        default=None,
        required=required,
        help="price the run as a model of this many parameters (10e9, 10B, 350M): bytes of its tensors, "
        "its step time (see --step-seconds); the learning stays the trained model's",
    )
    p.add_argument("--layers", type=int_at_least(1), default=None, help="blocks of the --scale model")
    p.add_argument("--wire", default="bf16", help="float payloads' format: bf16 (default), fp16 or fp32")
    p.add_argument("--step-seconds", type=positive_float, default=None, help="compute seconds of one step at --scale")
    p.add_argument(
        "--tokens-per-step", type=positive_float, default=None, help="tokens of one step (with --peak-flops)"
    )
    p.add_argument("--peak-flops", type=positive_float, default=None, help="FLOP/s of one accelerator")
    p.add_argument("--accelerators", type=int_at_least(1), default=1, help="accelerators per node (default 1)")
    p.add_argument("--mfu", type=positive_float, default=0.4, help="model FLOPs utilisation (default 0.4)")


def scale_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Scale | None:
    """The [`Scale`][exogym.Scale] ``add_scale_options``' flags ask for (``None`` without
    ``--scale``); a bad value is a ``parser.error`` naming its flag."""
    if args.scale is None:
        defaults = {"wire": "bf16", "accelerators": 1, "mfu": 0.4}
        given = [f for f in ("layers", "step_seconds", "tokens_per_step", "peak_flops") if getattr(args, f) is not None]
        given += [f for f, d in defaults.items() if getattr(args, f) != d]
        if given:
            parser.error(f"argument --{given[0].replace('_', '-')}: needs --scale (the model whose time it sets)")
        return None
    from exogym.scale import Scale

    try:
        return Scale(
            args.scale, layers=args.layers, wire=args.wire, step_seconds=args.step_seconds,
            tokens_per_step=args.tokens_per_step, accelerators=args.accelerators, peak_flops=args.peak_flops,
            mfu=args.mfu,
        )  # fmt: skip
    except (TypeError, ValueError) as e:
        parser.error(f"argument {_flag_of(str(e))}: {e}")


#: A Scale field named in an error -> the flag that sets it (the first named wins).
_FLAGS = {
    "layers": "--layers", "wire": "--wire", "step_seconds": "--step-seconds", "tokens_per_step": "--tokens-per-step",
    "peak_flops": "--peak-flops", "accelerators": "--accelerators", "mfu": "--mfu",
}  # fmt: skip


def _flag_of(message: str) -> str:
    """The flag whose field ``message`` names first (``--scale`` where it names none)."""
    named = [(message.find(field), flag) for field, flag in _FLAGS.items() if field in message]
    return min(named)[1] if named else "--scale"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``bandwidth`` subcommand's parser."""
    from exogym.strategy.registry import PRESETS

    p = sub.add_parser(
        "bandwidth",
        help="bandwidth each method needs for a compute utilisation at a scale (no training)",
        description=plain_help(__doc__.split("\n\n")[0]),
    )
    p.add_argument(
        "--strategies",
        default="ddp,diloco,streaming_diloco",
        help=f"comma-separated presets, from: {', '.join(PRESETS)}",
    )
    add_scale_options(p, required=True)
    p.add_argument("--nodes", type=int_at_least(2), default=2, help="nodes (datacenters) that talk (default 2)")
    p.add_argument("--H", type=int_at_least(1), default=100, help="communication period of H-based presets (100)")
    p.add_argument(
        "--latency",
        default="0",
        help="latency of the link between nodes (default 0; e.g. 80ms; a bare number is seconds)",
    )
    p.add_argument(
        "--utilisation",
        default=DEFAULT_UTILISATION,
        help=f"compute utilisations in percent to find the bandwidth for (default {DEFAULT_UTILISATION})",
    )
    p.add_argument(
        "--bandwidth",
        default=None,
        help="the opposite question: the utilisation at this bandwidth (e.g. 1Gbit/s; a bare number is bits/s), "
        "and with --tokens the wall-clock time of a run",
    )
    p.add_argument("--tokens", type=positive_float, default=None, help="tokens of a run (with --bandwidth)")
    p.set_defaults(subparser=p)  # the parser that reports this command's bad arguments
    return p


def _number_or_text(text: str) -> float | str:
    """A plain number as a number (seconds, bits/s), anything else as given (with its unit)."""
    try:
        return float(text)
    except ValueError:
        return text


def _percentages(parser: argparse.ArgumentParser, text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        parser.error(f"argument --utilisation: numbers in percent, comma-separated (50,90,99), got {text!r}")
    bad = [v for v in values if not 0 < v <= 100]
    if not values or bad:
        parser.error(f"argument --utilisation: percentages in (0, 100], got {text!r}")
    return values


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, names: Sequence[str]) -> list[dict[str, Any]]:
    """Log the table ``args`` asks for (the ``exogym.cli`` logger); return its rows."""
    import dataclasses

    from exogym.bandwidth import bandwidth_for, schedule
    from exogym.core.comm.links import parse_bandwidth, parse_latency
    from exogym.core.comm.network import Network
    from exogym.core.server import ServerStrategy
    from exogym.strategy.registry import build

    scale = scale_from_args(parser, args)
    assert scale is not None
    seconds = scale.seconds_per_step()
    if seconds is None:
        parser.error("argument --scale: give the step's compute: --step-seconds, or --tokens-per-step and --peak-flops")
    try:
        latency = parse_latency(_number_or_text(args.latency), "--latency")
        bandwidth = parse_bandwidth(_number_or_text(args.bandwidth), "--bandwidth") if args.bandwidth else None
    except ValueError as e:
        parser.error(f"argument {e}")
    if args.tokens is not None and (bandwidth is None or scale.tokens_per_step is None):
        parser.error("argument --tokens: needs --bandwidth and --tokens-per-step (steps = tokens / tokens per step)")
    levels = _percentages(parser, args.utilisation)
    net = Network(1e9, latency, compute=seconds)
    strategies = {name: build(name, 1e-3, args.H) for name in names}
    servers = [name for name, strategy in strategies.items() if isinstance(strategy, ServerStrategy)]
    if servers:
        parser.error(
            f"argument --strategies: {', '.join(servers)}: server algorithms, on a simulated clock of their own "
            "that needs training: price them with exogym compare --scale ... --step-seconds ..."
        )
    rows = []
    logger.info("%s, %d nodes, latency %g ms", scale.describe(), args.nodes, latency * 1e3)
    for name in names:
        s = schedule(strategies[name], scale, num_nodes=args.nodes, label=name)
        if bandwidth is not None:
            util = s.utilisation(dataclasses.replace(net, bandwidth=bandwidth))
            row: dict[str, Any] = {"strategy": name, "gbit_per_s": bandwidth / 1e9, "utilisation": util}
            text = f"{name:>20}: utilisation {100 * util:.1f}% at {bandwidth / 1e9:g} Gbit/s"
            if args.tokens is not None:
                hours = args.tokens / scale.tokens_per_step * seconds / util / 3600
                row["hours"] = hours
                text += f", {hours:.1f} h for {args.tokens:.3g} tokens"
            logger.info("%s", text)
        else:
            found = [bandwidth_for(s, net, u / 100) for u in levels]
            row = {"strategy": name, **{f"{u:g}%": b / 1e9 for u, b in zip(levels, found, strict=True)}}
            cells = " ".join(f"{b / 1e9:>9.3g}" if math.isfinite(b) else f"{'-':>9}" for b in found)
            if not rows:
                logger.info("%s", f"{'Gbit/s for':>20}  " + " ".join(f"{f'{u:g}%':>9}" for u in levels))
            logger.info("%s", f"{name:>20}: {cells}")
        rows.append(row)
    if any(not math.isfinite(v) for row in rows for k, v in row.items() if k.endswith("%")):
        logger.info("%s", "(-: no bandwidth reaches it: the links' latency alone costs more than the compute hides)")
    return rows


__all__ = ["add_parser", "add_scale_options", "run", "scale_from_args"]
