"""Replay INTELLECT-1's compute utilisation by region set with ExoGym's clock, then ask what
Streaming DiLoCo and SparseLoCo would have given on the same links.

Jaghouar et al. 2024, "INTELLECT-1 Technical Report" (arXiv 2412.01152): a 10B Llama-3 model
(42 layers, hidden size 4096, 32 heads, 8 key-value heads, vocabulary 128,256) trained with
DiLoCo, H = 100 inner steps, pseudo-gradients all-reduced in int8, on up to 14 nodes of 8 H100
on three continents. Its Table 2 gives, per region set, the median all-reduce time and the
compute utilisation (the share of time not spent communicating), with 100 inner steps taking 38
minutes throughout:

==============  ==================  ====================
region set      median all-reduce   compute utilisation
==============  ==================  ====================
USA             103 s               95.7 %
USA + Europe    382 s               85.6 %
Global          469 s               83.0 %
==============  ==================  ====================

The report states no bandwidth per region set, only that the bandwidth it met fluctuated
between 500 Mbit/s and 4 Gbit/s; PRIME's README gives the 4 Gbit/s it aimed at and reached
across the United States. It states no latencies and no node count per region set either.
Assumed here (``NODES``, ``LATENCY``): 8 nodes in the USA, 4 in Europe, 2 in Asia, and one-way
latencies of public internet routes.

Nothing is trained. ``exogym.bandwidth.schedule`` records each method's collectives on the
target's meta tensors (exact shapes: 10,211,381,248 parameters) over six of its longest periods
from step 1000, a long run's steady state (600 steps at H = 100), and ``Schedule.utilisation``
prices them on a world of regions (``Network.regions``) with the clock every run uses, a step
lasting 38 min / 100 = 22.8 s. Seconds per 100 steps are the schedule's over its length, scaled
to 100 steps. PRIME starts the all-reduce after the 100th inner step, so no part of it
hides behind a backward pass: the worlds here have ``backward_share=0``.

The script prints three tables and writes ``DIR/intellect1.csv``:

1. Table 2 beside ExoGym's figures with every link at 4 Gbit/s and at 500 Mbit/s, the bounds the
   report gives, and the bottleneck bandwidth at which ExoGym's all-reduce takes the report's
   median time (``implied``).
2. The implied links as one world (USA inside, USA-Europe, and the crossings to Asia).
3. On that world: DiLoCo as run, Streaming DiLoCo (14 fragments of equal size, as many as
   3-layer fragments of 42 layers; int8 as INTELLECT-1 sent, or FP4 as Streaming DiLoCo's paper
   sends; each update applied 1 or 5 steps late) and SparseLoCo (the top 64 of each 64x64 block,
   2-bit values).

    python benchmarks/intellect1.py --out intellect1

See docs/user-guide/replaying-a-run.md for the figures and why they differ.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable

import torch
from torch import nn

from communicators.diloco import DiLoCoCommunicator
from communicators.quantize import Int8
from exogym import Link, Network
from exogym.bandwidth import START, Schedule, schedule
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.core.strategy import Strategy
from exogym.scale import Scale
from exogym.strategy import SparseLoCoStrategy, StreamingDiLoCoStrategy

logger = logging.getLogger("intellect1")

#: Region set -> (median all-reduce seconds, compute utilisation %): the report's Table 2.
REPORT = {"USA": (103, 95.7), "USA + Europe": (382, 85.6), "Global": (469, 83.0)}
#: 100 inner steps take 38 minutes in every region set (the report, beside Table 2).
STEP_SECONDS = 38 * 60 / 100
H = 100
#: Nodes per region in each region set. Assumed: the report gives up to 14 nodes at once, not
#: the count of each region set.
NODES = {
    "USA": {"us": 8},
    "USA + Europe": {"us": 8, "eu": 4},
    "Global": {"us": 8, "eu": 4, "asia": 2},
}
#: One-way latency of each pair of regions. Assumed (the report gives none): typical public
#: internet routes. A ring all-reduce of 14 nodes waits 26 of them, a few seconds in all.
LATENCY = {
    ("us", "us"): "30ms",
    ("eu", "eu"): "10ms",
    ("asia", "asia"): "10ms",
    ("us", "eu"): "45ms",
    ("eu", "asia"): "70ms",
    ("asia", "us"): "100ms",
}
#: Tokens per node and step: PRIME's INTELLECT-1 configuration (``configs/10B/H100_intellect1.toml``:
#: 128 sequences of 8192 tokens); used only for the cross-check of the step time from FLOPs.
TOKENS_PER_STEP = 128 * 8192
#: Dense BF16 peak of an H100 SXM, FLOP/s (NVIDIA's datasheet); for the same cross-check.
H100_FLOPS = 989e12
#: The bandwidths the report gives: what PRIME aimed at and reached, and the low end it met.
STATED = {"4 Gbit/s": 4e9, "500 Mbit/s": 0.5e9}


class _Block(nn.Module):
    def __init__(self, d: int, kv: int, ffn: int) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(d)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, kv, bias=False)
        self.wv = nn.Linear(d, kv, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.ffn_norm = nn.RMSNorm(d)
        self.w1 = nn.Linear(d, ffn, bias=False)
        self.w3 = nn.Linear(d, ffn, bias=False)
        self.w2 = nn.Linear(ffn, d, bias=False)


class Llama3(nn.Module):
    """The tensors of a Llama-3 model (no forward: it is priced, never run). INTELLECT-1's:
    42 layers, hidden size 4096, 32 query heads of 128 and 8 key-value heads (1024), MLP width
    14,336, vocabulary 128,256, input and output embeddings untied."""

    def __init__(
        self, layers: int = 42, d: int = 4096, kv: int = 1024, ffn: int = 14_336, vocab: int = 128_256
    ) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(_Block(d, kv, ffn) for _ in range(layers))
        self.norm = nn.RMSNorm(d)
        self.output = nn.Linear(d, vocab, bias=False)


def intellect1_scale() -> Scale:
    """INTELLECT-1 on the meta device, a step lasting 22.8 s."""
    with torch.device("meta"):
        model = Llama3()
    return Scale(model=model, step_seconds=STEP_SECONDS)


def world(nodes: dict[str, int], bandwidth: dict[tuple[str, str], float]) -> Network:
    """The regions of ``nodes`` joined by links of ``bandwidth`` (bits/s per pair of regions)
    and ``LATENCY``; a step computes 22.8 s and its collectives wait for it to end."""
    ranks, first = {}, 0
    for region, n in nodes.items():
        ranks[region] = list(range(first, first + n))
        first += n
    links = {(a, b): Link(bandwidth[(a, b)], LATENCY[(a, b)]) for (a, b) in LATENCY if a in ranks and b in ranks}
    net = Network.regions(ranks, links=links, compute=STEP_SECONDS, name="+".join(nodes))
    return dataclasses.replace(net, backward_share=0.0)


def everywhere(bits: float) -> dict[tuple[str, str], float]:
    """Every pair of regions at ``bits`` bits/s."""
    return {pair: bits for pair in LATENCY}


def diloco_int8() -> CommunicateOptimizeStrategy:
    """INTELLECT-1's algorithm: DiLoCo, H = 100, pseudo-gradients all-reduced in int8."""
    return CommunicateOptimizeStrategy([DiLoCoCommunicator(H)], wire=Int8())


def streaming(wire: str, tau: int) -> Callable[[], Strategy]:
    """Streaming DiLoCo, H = 100, in 14 fragments (as many as 3-layer fragments of 42 layers),
    each all-reduced in ``wire`` and applied ``tau`` steps late."""
    return lambda: StreamingDiLoCoStrategy(H=H, num_fragments=42 // 3, overlap_steps=tau, quantize=wire)


def sparseloco() -> Strategy:
    """SparseLoCo, H = 100, at its defaults: the top 64 of each 64x64 block, 2-bit values."""
    return SparseLoCoStrategy(H=H, chunk=64, k=64, bits=2)


#: The methods priced on the implied links beside DiLoCo as run.
METHODS: dict[str, Callable[[], Strategy]] = {
    "Streaming DiLoCo int8, tau=1": streaming("int8", 1),
    "Streaming DiLoCo int8, tau=5": streaming("int8", 5),
    "Streaming DiLoCo fp4, tau=1": streaming("fp4", 1),
    "Streaming DiLoCo fp4, tau=5": streaming("fp4", 5),
    "SparseLoCo 64x64 top-64, 2 bits": sparseloco,
}


def payload(sched: Schedule) -> int:
    """The largest payload (bytes of one node's input) of a collective in ``sched``, blocking or
    started by a handle."""
    records = [r for s in sched.steps for r in s.records] + [r for h in sched.handles for r in h]
    return max(r.payload for r in records)


def wait_per_sync(sched: Schedule, network: Network) -> float:
    """Seconds of communication not hidden by compute, per H steps: the schedule's over its
    ``len(sched.steps)`` steps, scaled to H."""
    compute, total = sched.seconds(network)
    return max(0.0, total - compute) * H / len(sched.steps)  # (rounding leaves -0.0 where all is hidden)


def implied_bandwidth(sched: Schedule, nodes: dict[str, int], known: dict, pairs: list, seconds: float) -> float:
    """The bandwidth of the links ``pairs`` (the others as in ``known``) at which DiLoCo's
    all-reduce takes ``seconds`` on ExoGym's ring: ``2(n-1) (a + 8 (b/n) / B) = seconds`` for
    the slowest hop, found by bisection."""
    lo, hi = 1e6, 1e12
    while hi / lo > 1 + 1e-6:
        mid = math.sqrt(lo * hi)
        net = world(nodes, {**known, **{p: mid for p in pairs}})
        lo, hi = (lo, mid) if wait_per_sync(sched, net) <= seconds else (mid, hi)
    return hi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="intellect1", help="folder for intellect1.csv (default intellect1)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    scale = intellect1_scale()
    logger.info(
        "INTELLECT-1: %s parameters, %.1f s per step (simulated; nothing is trained)",
        f"{scale.num_params:,}",
        STEP_SECONDS,
    )
    flops = dataclasses.replace(
        scale, step_seconds=None, tokens_per_step=TOKENS_PER_STEP, accelerators=8, peak_flops=H100_FLOPS, mfu=0.433
    )
    logger.info(
        "(From FLOPs, 6 x parameters x %s tokens on 8 H100 at 43.3%% MFU, a step would take %.1f s; "
        "the replay uses the report's %.1f s.)",
        f"{TOKENS_PER_STEP:,}", flops.seconds_per_step(), STEP_SECONDS,
    )  # fmt: skip
    rows: list[dict] = []

    def row(region_set: str, method: str, links: str, wait: float, util: float) -> str:
        report_wait, report_util = REPORT[region_set]
        rows.append(
            {
                "region_set": region_set,
                "nodes": sum(NODES[region_set].values()),
                "method": method,
                "links": links,
                "wait_s_per_100_steps": round(wait, 1),
                "utilisation_pct": round(100 * util, 2),
                "report_all_reduce_s": report_wait,
                "report_utilisation_pct": report_util,
            }
        )
        return f"{wait:7.0f} s {100 * util:6.1f}%"

    # 1. Table 2 beside ExoGym at the stated bandwidths, and the bandwidth that matches it.
    schedules = {rs: schedule(diloco_int8(), scale, sum(n.values()), label="DiLoCo int8") for rs, n in NODES.items()}
    steps = len(schedules["USA"].steps)
    logger.info(
        "DiLoCo H=%d, int8 wire: %.2f GB all-reduced per node every %d steps (schedules of %d steps from step %d)\n",
        H, payload(schedules["USA"]) / 1e9, H, steps, START,
    )  # fmt: skip
    logger.info("Table 2 (all-reduce per 100 steps, compute utilisation):")
    header = f"{'region set':<14} {'nodes':>5}   {'report':>16}   " + "   ".join(f"{'ExoGym ' + k:>16}" for k in STATED)
    logger.info("%s   %s", header, "implied bottleneck")
    implied: dict[tuple[str, str], float] = {}
    new_pairs = {
        "USA": [("us", "us"), ("eu", "eu"), ("asia", "asia")],
        "USA + Europe": [("us", "eu")],
        "Global": [("eu", "asia"), ("asia", "us")],
    }
    for rs, nodes in NODES.items():
        sched, (report_wait, report_util) = schedules[rs], REPORT[rs]
        cells = []
        for name, bits in STATED.items():
            net = world(nodes, everywhere(bits))
            cells.append(row(rs, "DiLoCo H=100 int8", name, wait_per_sync(sched, net), sched.utilisation(net)))
        known = {**everywhere(implied.get(("us", "us"), 4e9)), **implied}
        bw = implied_bandwidth(sched, nodes, known, new_pairs[rs], report_wait)
        implied.update({p: bw for p in new_pairs[rs]})
        logger.info(
            "%-14s %5d   %7d s %6.1f%%   %s   %8.0f Mbit/s",
            rs, sum(nodes.values()), report_wait, report_util, "   ".join(cells), bw / 1e6,
        )  # fmt: skip

    overlapped = []
    for rs, nodes in NODES.items():
        net = dataclasses.replace(world(nodes, implied), backward_share=2 / 3)
        overlapped.append(f"{rs} {100 * schedules[rs].utilisation(net):.1f}%")
    logger.info(
        "(Started with the last step's backward pass, ExoGym's default backward_share of 2/3, each all-reduce "
        "would hide %.1f s: %s on the implied links.)",
        STEP_SECONDS * 2 / 3, ", ".join(overlapped),
    )  # fmt: skip

    # 2. The implied links as one world.
    logger.info("\nImplied links (bandwidth; latency assumed):")
    for (a, b), lat in LATENCY.items():
        logger.info("  %-4s - %-4s  %6.0f Mbit/s  %s", a, b, implied[(a, b)] / 1e6, lat)

    # 3. What other methods would have given on those links.
    logger.info("\nOn the implied links (communication not hidden per 100 steps, compute utilisation):")
    logger.info("%-32s %s", "method", "".join(f"{rs:>22}" for rs in NODES))
    results: dict[str, list[str]] = {}
    recorded: dict[str, Schedule] = {}
    for rs, nodes in NODES.items():
        net = world(nodes, implied)
        n = sum(nodes.values())
        method = "DiLoCo H=100 int8"
        sched = schedules[rs]
        results.setdefault(method, []).append(
            row(rs, method, "implied", wait_per_sync(sched, net), sched.utilisation(net))
        )
        for method, make in METHODS.items():
            recorded[method] = sched = schedule(make(), scale, n, label=method)
            results.setdefault(method, []).append(
                row(rs, method, "implied", wait_per_sync(sched, net), sched.utilisation(net))
            )
    for method, cells in results.items():
        logger.info("%-32s %s", method, "".join(f"{c:>22}" for c in cells))
    logger.info(
        "(Per node and round: a Streaming DiLoCo fragment all-reduces %.2f GB in int8, %.2f GB in fp4; "
        "SparseLoCo all-gathers %s bytes, of which every node receives the other nodes'.)",
        payload(recorded["Streaming DiLoCo int8, tau=1"]) / 1e9,
        payload(recorded["Streaming DiLoCo fp4, tau=1"]) / 1e9,
        f"{payload(recorded['SparseLoCo 64x64 top-64, 2 bits']):,}",
    )

    path = os.path.join(args.out, "intellect1.csv")
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    logger.info("\n%.1f s. Wrote %s", time.perf_counter() - t0, path)


if __name__ == "__main__":
    main()
