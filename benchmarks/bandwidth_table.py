"""Reproduce the Streaming DiLoCo paper's simulated bandwidth table with ExoGym's clock.

Douillard et al. 2025 ("Streaming DiLoCo with overlapping communication", arXiv 2501.18512),
appendix Table 4: the Gbit/s each method needs between two workers to reach a compute
utilisation of 50, 80, 90, 95 and 99%, for 1B, 10B and 100B parameters (24, 48 and 108 layers;
a step's pure compute 0.1, 0.8 and 4.9 s). DiLoCo and its streaming variants use H = 100;
streaming fragments are 3 layers (8, 16 and 36 fragments); the overlapped variants apply an
update one step late (tau = 1); FP4 sends 4-bit values.

ExoGym records each method's collectives at the scale on the target's meta tensors
(``exogym.bandwidth.schedule``: no training) and prices them with the clock every run uses: a
step's collectives stream through its backward pass (two thirds of its compute), bf16 values on
the wire, two workers joined by one link without latency. The bandwidth for a utilisation is
found by bisection. The script prints the table in the paper's layout with the paper's figures
beside ExoGym's and writes ``DIR/bandwidth.csv`` (``model,method,utilisation,gbit_per_s``).

    python benchmarks/bandwidth_table.py --out bandwidth_table

See docs/scale.md ("The Streaming DiLoCo table") for why some cells differ.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import statistics
import time
from collections.abc import Sequence

import exogym.strategy as S
from exogym.bandwidth import bandwidth_for, schedule
from exogym.core.comm.network import Network
from exogym.scale import Scale

logger = logging.getLogger("bandwidth_table")

UTILISATION = (50, 80, 90, 95, 99)

#: model -> (layers, step seconds): the paper's Table 4 rows.
MODELS = {"1B": (24, 0.1), "10B": (48, 0.8), "100B": (108, 4.9)}

#: (model, method) -> Gbit/s at UTILISATION, as printed in the paper's Table 4.
PAPER = {
    ("1B", "data_parallel"): (86.8, 152.6, 184.2, 222.3, 569.0),
    ("1B", "diloco"): (1.4, 6.2, 13.3, 23.3, 86.8),
    ("1B", "streaming"): (1.4, 5.2, 9.1, 16.0, 28.1),
    ("1B", "streaming_overlap"): (1.4, 4.3, 6.2, 9.1, 11.0),
    ("1B", "streaming_overlap_fp4"): (0.4, 0.9, 1.7, 2.0, 3.0),
    ("10B", "data_parallel"): (104.8, 222.3, 222.3, 268.3, 471.5),
    ("10B", "diloco"): (1.7, 7.5, 16.0, 33.9, 104.8),
    ("10B", "streaming"): (1.7, 5.2, 9.1, 13.3, 19.3),
    ("10B", "streaming_overlap"): (1.7, 3.6, 5.2, 6.2, 7.5),
    ("10B", "streaming_overlap_fp4"): (0.4, 0.9, 1.4, 1.4, 1.7),
    ("100B", "data_parallel"): (184.2, 323.8, 390.7, 390.7, 471.5),
    ("100B", "diloco"): (3.0, 11.0, 23.3, 49.4, 184.2),
    ("100B", "streaming"): (2.4, 6.2, 9.1, 11.0, 19.3),
    ("100B", "streaming_overlap"): (1.7, 3.6, 4.3, 5.2, 5.2),
    ("100B", "streaming_overlap_fp4"): (0.5, 0.9, 1.1, 1.1, 1.4),
}

LABELS = {
    "data_parallel": "Data-Parallel",
    "diloco": "DiLoCo (H=100)",
    "streaming": "Streaming DiLoCo",
    "streaming_overlap": "  w/ overlapped com.",
    "streaming_overlap_fp4": "  w/ overlapped FP4 com.",
}


def strategies(layers: int) -> dict:
    """The paper's five methods as ExoGym strategies (fragments of 3 layers)."""
    fragments = layers // 3
    return {
        "data_parallel": S.SimpleReduceStrategy(),
        "diloco": S.DiLoCoStrategy(H=100),
        "streaming": S.StreamingDiLoCoStrategy(H=100, num_fragments=fragments, overlap_steps=0),
        "streaming_overlap": S.StreamingDiLoCoStrategy(H=100, num_fragments=fragments, overlap_steps=1),
        "streaming_overlap_fp4": S.StreamingDiLoCoStrategy(
            H=100, num_fragments=fragments, overlap_steps=1, quantize="fp4"
        ),
    }


def peak_bytes(sched) -> float:
    """The most bytes one node sends in one step of a schedule (the collectives it waits for and
    those it starts in that step)."""
    return max(
        sum(r.sent for r in step.records)
        + sum(r.sent for is_start, i in step.events if is_start for r in sched.handles[i])
        for step in sched.steps
    )


def measure(models: Sequence[str] = tuple(MODELS)) -> tuple[list[dict], dict[tuple[str, str], float]]:
    """The cells of the table's rows for ``models`` (default all three),
    ``{"model", "method", "utilisation", "gbit_per_s", "paper"}``, and each method's peak bytes per
    step by ``(model, method)``."""
    rows, peaks = [], {}
    for model in models:
        layers, seconds = MODELS[model]
        scale = Scale(model, layers=layers, step_seconds=seconds)
        network = Network(1e9, 0.0, compute=seconds)
        for method, strategy in strategies(layers).items():
            sched = schedule(strategy, scale, num_nodes=2, label=method)
            peaks[(model, method)] = peak_bytes(sched)
            for u, paper in zip(UTILISATION, PAPER[(model, method)], strict=True):
                gbit = bandwidth_for(sched, network, u / 100) / 1e9
                rows.append({"model": model, "method": method, "utilisation": u, "gbit_per_s": gbit, "paper": paper})
    return rows, peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bandwidth_table", help="folder for bandwidth.csv (default bandwidth_table)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    rows, _ = measure()
    ratios = [r["gbit_per_s"] / r["paper"] for r in rows]
    logger.info("%-8s %-26s %s", "model", "method", "  ".join(f"{u:>13}%" for u in UTILISATION))
    logger.info("%-35s %s", "", "  ".join(f"{'exogym paper':>14}" for _ in UTILISATION))
    for i in range(0, len(rows), len(UTILISATION)):
        cells = rows[i : i + len(UTILISATION)]
        row = "  ".join(f"{c['gbit_per_s']:6.1f} {c['paper']:6.1f}" for c in cells)
        logger.info("%-8s %-26s %s", cells[0]["model"], LABELS[cells[0]["method"]], row)
    path = os.path.join(args.out, "bandwidth.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["model", "method", "utilisation", "gbit_per_s"])
        writer.writeheader()
        for r in rows:
            writer.writerow({**{k: r[k] for k in writer.fieldnames}, "gbit_per_s": round(r["gbit_per_s"], 3)})
    within = sum(1 / 1.5 <= r <= 1.5 for r in ratios)
    logger.info(
        "%d of %d cells within 1.5x of the paper's (%.0f%%); median ratio %.2f; %.1f s. Wrote %s",
        within, len(ratios), 100 * within / len(ratios), statistics.median(ratios), time.perf_counter() - t0, path,
    )  # fmt: skip


if __name__ == "__main__":
    main()
