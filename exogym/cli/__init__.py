"""Command-line pieces: ``exogym compare`` and its plots (``python -m exogym`` is the entry)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import math
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

_XREF = re.compile(r"\[`?([^\]`]+)`?\]\[[^\]]*\]")  # [`Network`][exogym.Network]
_LITERAL = re.compile(r"``([^`]+)``")


def plain_help(doc: str | None) -> str:
    """A docstring for ``--help``: cross-references and double-backquoted literals become plain
    text (``[`Network`][exogym.Network]`` -> ``Network``, ````fit()```` -> ``fit()``), ``::`` ends
    like ``:``."""
    text = _LITERAL.sub(r"\1", _XREF.sub(r"\1", doc or ""))
    return re.sub(r"(?<=\S)::$", ":", text, flags=re.MULTILINE)


#: The signal that interrupted the command: SIGINT (Ctrl-C) unless the SIGTERM handler of
#: ``sigterm_as_interrupt`` ran.
_stopped_by: int = signal.SIGINT


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM (what ``kill``, SLURM and Kubernetes send) raises
    ``KeyboardInterrupt`` as Ctrl-C does, so that it stops every node and writes the same files
    (on the main thread; elsewhere nothing changes). The previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        global _stopped_by
        _stopped_by = signum
        raise KeyboardInterrupt()

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def quiet_interrupt(main: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a script's ``main``: Ctrl-C, or SIGTERM (``sigterm_as_interrupt``), ends it with
    one line on stderr and exit status 130 (the shell's convention for SIGINT; 143 for SIGTERM)
    instead of a traceback, on a line of its own (a progress bar may have been mid-line),
    followed by the interruption's message, if any (``compare``'s says where its partial
    results are). ``fit`` has stopped every node by then, and what the run wrote stays (metric
    CSVs, ``compare``'s summary and plots of the runs that finished)."""

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _stopped_by
        _stopped_by = signal.SIGINT
        try:
            with sigterm_as_interrupt():
                return main(*args, **kwargs)
        except KeyboardInterrupt as e:
            sys.stderr.write("\n")
            sys.stderr.flush()
            log = logging.getLogger("exogym")
            what = "SIGTERM" if _stopped_by == signal.SIGTERM else "Ctrl-C"
            log.error("interrupted (%s): every node was stopped", what)
            if str(e):
                log.error("%s", e)
            sys.exit(128 + _stopped_by)

    return wrapper


def script_parser(doc: str | None, prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of a script (an example, a tutorial, a benchmark): its module docstring,
    made plain, is the ``--help`` text, with its line breaks kept."""
    return argparse.ArgumentParser(
        prog=prog, description=plain_help(doc), formatter_class=argparse.RawDescriptionHelpFormatter
    )


def finite_float(text: str) -> float:
    """An argparse ``type``: a finite number (argparse names the option in its error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text}")
    return value


def writable_folder(text: str) -> str:
    """An argparse ``type``: a folder that can be created and written (``exogym.runs.folder_problem``)."""
    from exogym.runs import folder_problem

    problem = folder_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}; give a folder that can be created and written")
    return text


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``low`` (argparse names the option in its error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def measured_compute(labels: list[str], fix: str) -> str:
    """What to say when the strategies ``labels`` follow a simulated clock (asynchronous ones,
    or ones whose updates land when their transfer has arrived) and are given measured compute;
    ``fix`` names the settings that work."""
    verb = "follows" if len(labels) == 1 else "follow"
    return (
        f"{' and '.join(labels)} {verb} a simulated clock, which needs modelled compute, not 'measured' (this "
        f"machine's speed): give {fix}"
    )


def strategy_names(parser: argparse.ArgumentParser, text: str, option: str) -> list[str]:
    """The preset names of a comma-separated ``option`` value; ``parser.error`` (exit 2) names
    the unknown ones and the choices."""
    from exogym.strategy.registry import PRESETS

    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in PRESETS]
    if unknown or not names:
        what = f"unknown strategies {unknown}" if unknown else "no strategy given"
        parser.error(f"argument {option}: {what}; choose from {sorted(PRESETS)}")
    return names


def add_run_options(
    p: argparse.ArgumentParser, *, out: str, batch_size: int = 32, data_help: str = "where datasets are downloaded"
) -> None:
    """The options every comparison command has: ``--nodes``, ``--steps``, ``--batch-size``,
    ``--H``, ``--network``, ``--out``, ``--data-dir``, ``--seed``, ``--no-progress``."""
    import os

    from exogym.core.comm.names import PRESET_NAMES, WORLD_FILE_SUFFIXES, WORLD_NAMES

    names = sorted(PRESET_NAMES) + sorted(WORLD_NAMES)

    def network(value: str) -> str:
        if value in names or (value.endswith(WORLD_FILE_SUFFIXES) and os.path.isfile(value)):
            return value
        if value.endswith(WORLD_FILE_SUFFIXES):
            where = os.path.abspath(value)
            raise argparse.ArgumentTypeError(f"world file {value!r} does not exist (no file at {where})")
        raise argparse.ArgumentTypeError(
            f"invalid choice: {value!r}; choose from {names}, or give a world file (.json or .toml)"
        )

    p.add_argument("--nodes", type=int_at_least(1), default=4, help="simulated nodes (default 4)")
    p.add_argument("--steps", type=int_at_least(1), default=200, help="steps per node (default 200)")
    p.add_argument(
        "--batch-size",
        type=int_at_least(1),
        default=batch_size,
        help=f"examples per node per step (default {batch_size})",
    )
    p.add_argument(
        "--H", type=int_at_least(1), default=20, help="communication period of the H-based presets (default 20)"
    )
    p.add_argument(
        "--network",
        default="internet",
        type=network,
        help=f"one of {', '.join(names)}, or a world file (.json or .toml; see the README); default internet",
    )
    p.add_argument("--out", default=out, type=writable_folder, help=f"folder for CSVs and plots (default {out})")
    p.add_argument("--data-dir", default="data", help=data_help)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The [`exogym.cli.compare.compare`][exogym.cli.compare.compare] keywords that
    ``add_run_options``' options set."""
    return {
        "nodes": args.nodes,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "H": args.H,
        "network": args.network,
        "out_dir": args.out,
        "data_dir": args.data_dir,
        "seed": args.seed,
        "progress": not args.no_progress,
    }


def add_partition_options(p: argparse.ArgumentParser) -> None:
    """``--partition``, ``--alpha``, ``--shards-per-node``: a non-IID split of the training set
    (see [`exogym.partition.partition`][exogym.partition.partition]; read back with
    ``partition_from_args``)."""
    from exogym.partition import SCHEMES

    p.add_argument(
        "--partition",
        default=None,
        choices=SCHEMES,
        help="split the training set over the nodes: iid, dirichlet (label skew, --alpha), shards "
        "(--shards-per-node classes per node) or quantity (size skew, --alpha); default: IID shards",
    )
    p.add_argument(
        "--alpha", type=positive_float, default=0.5, help="Dirichlet concentration for --partition (default 0.5)"
    )
    p.add_argument(
        "--shards-per-node", type=int_at_least(1), default=2, help="shards per node for --partition shards (default 2)"
    )


def partition_from_args(
    parser: argparse.ArgumentParser, dataset: Any, args: argparse.Namespace, where: str = ""
) -> Any:
    """The [`Partition`][exogym.partition.Partition] the ``add_partition_options`` options ask for
    (every node gets at least a batch where the data allows), or ``None``; a split that cannot be
    made is a ``parser.error`` (exit 2) naming ``--partition`` and ``where``."""
    if args.partition is None:
        return None
    from exogym.partition import partition

    try:
        return partition(
            dataset,
            args.nodes,
            args.partition,
            alpha=args.alpha,
            shards_per_node=args.shards_per_node,
            min_size=min(args.batch_size, len(dataset) // args.nodes),
            seed=args.seed,
        )
    except (ValueError, TypeError) as e:
        parser.error(f"argument --partition {args.partition}{where}: {e}")
