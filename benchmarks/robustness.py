"""Attacks against defences: DiLoCo and FedAvg on the digits, each attack at a share of malicious
nodes, with the mean and every robust rule, over seeds, against the same runs without attack.

    python benchmarks/robustness.py --out exogym_runs/robustness           # 8 nodes, 25%, 3 seeds
    python benchmarks/robustness.py --quick --out /tmp/robustness          # 8 nodes, 2 seeds, fewer steps

One sweep per attack (``exogym.sweep``: the strategies times the rules times the seeds, the
malicious nodes drawn from each seed) and one without adversaries; ``<out>/robustness.md`` is the
table of validation accuracy (mean and 95% interval over the seeds) per strategy, attack and rule,
each cell marked "holds" when its interval overlaps the clean run's with the same rule, and the
bytes each rule sends per node. Each sweep's ``summary.csv`` and ``runs.csv`` are under
``<out>/<attack>/``.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from exogym import Adversaries, sweep
from exogym.adversaries import ATTACKS
from exogym.stats import estimate

logger = logging.getLogger("robustness")

RULES = ("mean", "median", "trimmed_mean", "krum", "centered_clip")
STRATEGIES = ("diloco", "fedavg")


def run(out: str, nodes: int, steps: int, seeds: list[int], fraction: float, H: int) -> dict:
    """Every sweep; returns ``{(attack or "none", strategy, rule): (accuracies, bytes per node)}``."""
    results: dict = {}
    for attack in ("none", *ATTACKS):
        adversaries = None if attack == "none" else Adversaries(attack, fraction)
        logger.info("attack %s", attack)
        result = sweep(
            "digits", list(STRATEGIES), grid={"aggregate": list(RULES)}, seeds=seeds, nodes=nodes, steps=steps,
            batch_size=16, H=H, out_dir=os.path.join(out, attack), progress=False, adversaries=adversaries,
        )  # fmt: skip
        for row in result.runs:
            key = (attack, row["strategy"], row["aggregate"])
            accs, sent = results.setdefault(key, ([], []))
            accs.append(row["val_accuracy"])
            sent.append(row["bytes_sent_per_node"])
    return results


def report(results: dict, out: str, caption: str) -> str:
    """``<out>/robustness.md``; returns its path."""
    lines = [
        "# Attacks against defences",
        "",
        caption,
        "",
        "Validation accuracy, mean [95% interval] over the seeds; 'holds': the interval overlaps the same rule's "
        "without attack.",
        "",
    ]
    broken_mean, held = [], []
    for strategy in STRATEGIES:
        lines += [f"## {strategy}", "", "| attack | " + " | ".join(RULES) + " |", "|---|" + "---|" * len(RULES)]
        for attack in ("none", *ATTACKS):
            cells = []
            for rule in RULES:
                accs, _ = results[(attack, strategy, rule)]
                e, clean = estimate(accs), estimate(results[("none", strategy, rule)][0])
                lo, hi = (e.mean, e.mean) if e.n < 2 else (e.low, e.high)
                c_lo, c_hi = (clean.mean, clean.mean) if clean.n < 2 else (clean.low, clean.high)
                holds = hi >= c_lo and lo <= c_hi
                mark = "" if attack == "none" else (" holds" if holds else " breaks")
                cells.append(f"{e.describe('.3f')}{mark}")
                if attack != "none" and rule == "mean" and not holds:
                    broken_mean.append((strategy, attack))
                if attack != "none" and rule != "mean" and holds:
                    held.append((strategy, attack, rule))
            lines.append(f"| {attack} | " + " | ".join(cells) + " |")
        sent = [sum(results[("none", strategy, r)][1]) / len(results[("none", strategy, r)][1]) for r in RULES]
        per_rule = ", ".join(f"{r} {s / 1e6:.3g}" for r, s in zip(RULES, sent, strict=True))
        lines += ["", f"MB sent per node: {per_rule}", ""]
    both = sorted({(s, a) for s, a in broken_mean} & {(s, a) for s, a, _ in held})
    lines += [
        "The mean breaks where a robust rule holds: "
        + (", ".join(f"{s} under {a}" for s, a in both) if both else "nowhere at this scale")
        + ".",
        "Attacks that beat every rule: "
        + (
            ", ".join(f"{s} under {a}" for s in STRATEGIES for a in ATTACKS if not any(h[:2] == (s, a) for h in held))
            or "none"
        )
        + ".",
    ]
    path = os.path.join(out, "robustness.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="exogym_runs/robustness", help="folder of the sweeps and the table")
    parser.add_argument("--quick", action="store_true", help="2 seeds, 60 steps")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    nodes, fraction, H = 8, 0.25, 10
    steps, seeds = (60, [0, 1]) if args.quick else (200, [0, 1, 2])
    t0 = time.perf_counter()
    results = run(args.out, nodes, steps, seeds, fraction, H)
    minutes = (time.perf_counter() - t0) / 60
    caption = (
        f"digits, {nodes} nodes ({fraction:.0%} malicious, drawn per seed), {steps} steps, batch 16, H={H}, seeds "
        f"{seeds}; each attack at its default strength; {minutes:.1f} min wall"
    )
    logger.info("wrote %s", report(results, args.out, caption))


if __name__ == "__main__":
    main()
