"""``--attack`` and ``--malicious``: a comparison's malicious nodes
([`Adversaries`][exogym.Adversaries]) from the command line."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from exogym.cli import finite_float, int_at_least

if TYPE_CHECKING:
    from exogym.adversaries import Adversaries


def add_attack_options(p: argparse.ArgumentParser) -> None:
    """``--attack``, ``--malicious``, ``--attack-start``, ``--attack-strength``."""
    from exogym.adversaries import ATTACKS

    p.add_argument(
        "--attack",
        default=None,
        choices=ATTACKS,
        help="malicious nodes attack where the updates are aggregated (label_flip poisons their data); "
        "with --malicious",
    )
    p.add_argument(
        "--malicious",
        type=fractions,
        default=None,
        help="the share of the nodes that are malicious, in [0, 1), drawn from --seed (with --attack); "
        "in a sweep (--grid, --seeds) a list, e.g. 0.1,0.2,0.3",
    )
    p.add_argument("--attack-start", type=int_at_least(0), default=0, help="the first step the attack acts (default 0)")
    p.add_argument(
        "--attack-strength",
        type=finite_float,
        default=None,
        help="the attack's parameter: sign_flip's factor (1), noise's std (1), alie's z (z_max), ipm's epsilon (0.5)",
    )


def fractions(text: str) -> list[float]:
    """``--malicious``: one share or a comma-separated list of them."""
    try:
        return [finite_float(v) for v in text.split(",")]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (give shares such as 0.25, or 0.1,0.2 in a sweep)") from None


def adversaries_from_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace, sweep: bool = False
) -> Adversaries | None:
    """The [`Adversaries`][exogym.Adversaries] the options ask for (``None`` without
    ``--attack``), with the first ``--malicious`` share (a sweep varies the others, ``grid``'s
    ``malicious``); a bad or missing value is a ``parser.error`` naming its flag."""
    if args.attack is None:
        for flag, given in (
            ("--malicious", args.malicious is not None),
            ("--attack-start", args.attack_start != 0),
            ("--attack-strength", args.attack_strength is not None),
        ):
            if given:
                parser.error(f"argument {flag}: needs --attack (the attack the malicious nodes make)")
        return None
    if args.malicious is None:
        parser.error("argument --attack: needs --malicious (the share of malicious nodes, e.g. --malicious 0.25)")
    from exogym.adversaries import Adversaries

    if len(args.malicious) > 1 and not sweep:
        parser.error("argument --malicious: several shares make a sweep; add --seeds (e.g. --seeds 0,1,2)")
    from exogym.tasks import CLASSES

    classes = CLASSES.get(args.task, 10)
    try:
        adversaries = Adversaries(args.attack, args.malicious[0], args.attack_start, args.attack_strength, classes)
    except ValueError as e:
        parser.error(f"argument {'--attack-strength' if 'strength=' in str(e) else '--malicious'}: {e}")
    for share in args.malicious:
        try:
            Adversaries(args.attack, share, num_classes=classes).check_run(args.nodes)
        except ValueError as e:
            parser.error(f"argument --malicious: {e} (--nodes {args.nodes})")
    return adversaries


__all__ = ["add_attack_options", "adversaries_from_args"]
