"""Fidelity report: small versions of the papers' headline comparisons, run in ExoGym.

    python benchmarks/fidelity.py                # the full report: 5 seeds (see its first lines for the wall time)
    python benchmarks/fidelity.py --quick        # a smoke test of the same report: 2 seeds, smaller runs
    python benchmarks/fidelity.py --report-only  # the report again from the saved runs

A run that stops (Ctrl-C, a crash, the machine going away) starts again where it stopped: the same
command reads the sections it finished from ``<runs-dir>/runs.partial.json`` (kept only while the
scale is the same) and trains the rest.

Every algorithm ExoGym ships has one finding or more, each a claim of its paper written as a
criterion in this script before the runs:

- DiLoCo (Douillard et al. 2023, arXiv 2311.08105) against DDP at K=4 and 8 nodes and H in a sweep,
  and its scaling laws (Charles et al. 2025, arXiv 2503.09799): one replica against DDP on one
  node, and 1, 2 and 4 replicas at one global batch; DDP's ring all-reduce bytes.
- SPARTA (Beton et al. 2025) alone and with DiLoCo; DeMo (arXiv 2411.19870) against DDP-AdamW.
- FedAvg (McMahan et al. 2017; Hsu et al. 2019, arXiv 1909.06335): IID against Dirichlet(0.1)
  label skew, every client or a sampled fraction per round, on the digits.
- Streaming DiLoCo (arXiv 2501.18512): fragments and one overlapped step against DiLoCo, and the
  paper's compute-utilisation table (``benchmarks/bandwidth_table.py``).
- SparseLoCo (arXiv 2508.15706) and eager DiLoCo (arXiv 2502.12996) against DiLoCo; PowerSGD
  (arXiv 1905.13727) and top-k with error feedback (arXiv 1712.01887) against DDP; DES-LOC (arXiv
  2505.22549) against Local Adam, and its Rosenbrock toy (``fidelity_rosenbrock.py``); NoLoCo
  (arXiv 2506.10911) against DiLoCo at both node counts; MuLoCo (arXiv 2505.23725) against DiLoCo
  with AdamW at the larger.
- Async DiLoCo, FedBuff, HALoS and Decoupled DiLoCo against their baselines by simulated time to
  a loss (``fidelity_async.py``).

Every run is repeated over the scale's seeds (5; 2 for ``--quick``): a seed sets the model's
initialisation, the data order, the strategies' draws, the FedAvg split and drawn client speeds,
and the runs of one seed start from the same model. Simulated time is on the ``internet`` network
with the FLOP-based compute model unless a study names its world, so everything but wall time is
the same from run to run. Each number of the report is a mean over seeds with its 95% interval
(Student t); comparisons of two methods are taken seed by seed (the ratio of their values in each
seed, then its interval). Each verdict compares intervals (``fidelity_verdicts``): "agrees" or
"does not agree" when they are apart, "cannot tell at this scale" when they overlap; a finding
that follows from the algorithm's definition is "exact". The script writes ``<out>/report.md``
(the summary table of every finding, then the settings and one table per study) and
``<out>/<study>/*.png`` (validation loss against steps, MB sent per node and simulated seconds).
Each run's metrics CSV goes to ``--runs-dir``. The committed ``benchmarks/fidelity/`` is the latest
full run.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import bandwidth_table
import fidelity_async
import fidelity_rosenbrock
import torch
from fidelity_verdicts import (
    AGREES,
    CANNOT_TELL,
    DISAGREES,
    Claim,
    Runs,
    above,
    below,
    bytes_per_step,
    ci,
    claims_table,
    every,
    fmt_mb,
    logger,
    over_seeds,
    per_step_ratio,
    ratio_per_seed,
    scaled,
    within,
)

from exogym.bandwidth import schedule
from exogym.cli import quiet_interrupt, script_parser
from exogym.cli.compare import Comparison, compare
from exogym.cli.sweep_plots import plot_seed_curves
from exogym.core.comm.network import Network
from exogym.core.optim import OptimSpec
from exogym.core.strategy import Strategy
from exogym.partition import partition
from exogym.scale import Scale as ExoScale
from exogym.stats import Estimate, estimate
from exogym.strategy.demo import DeMoStrategy
from exogym.strategy.desloc import DESLOCStrategy
from exogym.strategy.diloco import DiLoCoStrategy
from exogym.strategy.eager_diloco import EagerDiLoCoStrategy
from exogym.strategy.federated_averaging import FedAvgStrategy
from exogym.strategy.muloco import MuLoCoStrategy
from exogym.strategy.noloco import NoLoCoStrategy
from exogym.strategy.powersgd import PowerSGDStrategy
from exogym.strategy.registry import OUTER_MOMENTUM
from exogym.strategy.simple_reduce import SimpleReduceStrategy
from exogym.strategy.sparseloco import SparseLoCoStrategy
from exogym.strategy.sparta import SPARTADiLoCoStrategy, SPARTAStrategy
from exogym.strategy.streaming_diloco import StreamingDiLoCoStrategy
from exogym.strategy.topk_ef import TopKEFStrategy
from exogym.tasks import CharGPT, MLPClassifier, Task, digits_datasets, split_text, stdlib_corpus


@dataclass(frozen=True)
class Scale:
    """How big the report's runs are (``SCALES``)."""

    n_layer: int
    n_embd: int
    block: int
    batch_size: int
    steps: int
    nodes: tuple[int, ...]  # DiLoCo's K sweep; SPARTA, DeMo and the others run at the first
    H: tuple[int, ...]  # DiLoCo's H sweep; SPARTA+DiLoCo runs at the largest, the others at the smallest
    sparta_p: tuple[float, ...]
    fragments: int  # Streaming DiLoCo's, at the smallest H
    clients: int
    client_sampling: float
    fed_H: int
    fed_steps: int
    fed_batch: int
    toy_workers: int  # DES-LOC's Rosenbrock toy
    toy_steps: int
    table_models: tuple[str, ...]  # the rows of Streaming DiLoCo's bandwidth table
    seeds: tuple[int, ...]  # every run is repeated over these seeds
    lr_factors: tuple[float, ...]  # the inner learning rates tried per method, as factors of its base rate
    momenta: tuple[float, ...]  # the outer Nesterov momenta tried per method with an outer step
    tune_seed: int  # the held-out seed the tuning runs on (not one of ``seeds``)


SCALES = {
    "full": Scale(
        n_layer=2, n_embd=64, block=32, batch_size=8, steps=900, nodes=(4, 8), H=(10, 50, 100),
        sparta_p=(0.001, 0.005, 0.05), fragments=4, clients=20, client_sampling=0.2, fed_H=10, fed_steps=400,
        fed_batch=8, toy_workers=256, toy_steps=1152, table_models=("1B", "10B", "100B"), seeds=(0, 1, 2, 3, 4),
        lr_factors=(0.5, 1.0, 2.0, 4.0), momenta=(0.5, 0.9), tune_seed=100,
    ),
    "quick": Scale(
        n_layer=2, n_embd=64, block=32, batch_size=8, steps=40, nodes=(2, 4), H=(5, 20),
        sparta_p=(0.001, 0.005, 0.05), fragments=2, clients=10, client_sampling=0.3, fed_H=5, fed_steps=60,
        fed_batch=8, toy_workers=16, toy_steps=384, table_models=("1B",), seeds=(0, 1),
        lr_factors=(1.0,), momenta=(OUTER_MOMENTUM,), tune_seed=100,
    ),
}  # fmt: skip

LR = 1e-3  # the base inner learning rate: AdamW's (and DeMo's sign-SGD's)
ALPHA = 0.1  # Dirichlet concentration of the non-IID split
POWERSGD_RANK = 4
TOPK = 0.01  # fraction of each gradient tensor top-k with error feedback sends
MUON_LR = 0.02  # MuLoCo's base inner Muon learning rate (AdamW's, LR, for the other parameters)


@dataclass(frozen=True)
class Hyper:
    """One method's settings, chosen by ``tune``: its inner learning rate as a factor of the base
    rate (``LR``; MuLoCo's Muon ``MUON_LR`` and its AdamW ``LR`` both scaled) and, for a method with
    an outer Nesterov step (``OUTER``), that step's momentum (learning rate 0.7)."""

    lr_factor: float = 1.0
    momentum: float = OUTER_MOMENTUM


Tuned = dict[str, Hyper]

#: Every GPT method of the synchronous studies, tuned one by one (``tune``), in this order.
METHODS = (
    "ddp", "diloco", "sparta", "sparta+diloco", "demo", "sparseloco", "eager_diloco", "streaming",
    "streaming tau=1", "noloco", "powersgd", "topk_ef", "desloc", "local adam", "muloco",
)  # fmt: skip
#: The methods with an outer Nesterov step, whose momentum is tuned with the learning rate.
OUTER = frozenset({"diloco", "sparta+diloco", "eager_diloco", "streaming", "streaming tau=1", "noloco", "muloco"})


def method(name: str, hp: Hyper, scale: Scale, H: int | None = None, p: float | None = None) -> Strategy:
    """The report's method ``name`` (one of ``METHODS``) at ``hp``, with its communication period
    ``H`` (default DiLoCo's smallest) and SPARTA's ``p`` (default the middle of the scale's)."""
    H = H or min(scale.H)
    p = p or scale.sparta_p[len(scale.sparta_p) // 2]
    lr, m = LR * hp.lr_factor, hp.momentum
    adamw = OptimSpec(torch.optim.AdamW, lr=lr)
    f = scale.fragments
    builders: dict[str, Callable[[], Strategy]] = {
        "ddp": lambda: SimpleReduceStrategy(adamw),
        "diloco": lambda: DiLoCoStrategy(H=H, outer_momentum=m, optim_spec=adamw),
        "sparta": lambda: SPARTAStrategy(p_sparta=p, optim_spec=adamw),
        "sparta+diloco": lambda: SPARTADiLoCoStrategy(p_sparta=p, H=H, outer_momentum=m, optim_spec=adamw),
        "demo": lambda: DeMoStrategy(OptimSpec(torch.optim.SGD, lr=lr)),
        "sparseloco": lambda: SparseLoCoStrategy(H=H, chunk=64, k=2, chunking="flat", optim_spec=adamw),
        "eager_diloco": lambda: EagerDiLoCoStrategy(H=H, outer_momentum=m, optim_spec=adamw),
        # without overlap (alpha 0: DiLoCo's rule per fragment), and each update applied one step late
        # (alpha 0.5, the paper's suggestion with an overlap)
        "streaming": lambda: StreamingDiLoCoStrategy(
            H=H, num_fragments=f, overlap_steps=0, alpha=0.0, outer_momentum=m, optim_spec=adamw
        ),
        "streaming tau=1": lambda: StreamingDiLoCoStrategy(
            H=H, num_fragments=f, overlap_steps=1, alpha=0.5, outer_momentum=m, optim_spec=adamw
        ),
        "noloco": lambda: NoLoCoStrategy(H=H, outer_momentum=m, optim_spec=adamw),
        "powersgd": lambda: PowerSGDStrategy(rank=POWERSGD_RANK, start_iter=H, optim_spec=adamw),
        "topk_ef": lambda: TopKEFStrategy(k=TOPK, optim_spec=adamw),
        "desloc": lambda: DESLOCStrategy(Kx=H, optim_spec=adamw),
        "local adam": lambda: DESLOCStrategy(Kx=H, Ku=H, Kv=H, optim_spec=adamw),
        "muloco": lambda: MuLoCoStrategy(H=H, outer_momentum=m, lr=MUON_LR * hp.lr_factor, adamw_lr=lr),
    }
    return builders[name]()


def grid(name: str, scale: Scale) -> list[Hyper]:
    """The settings ``tune`` tries for method ``name``: every learning-rate factor, times every
    momentum for a method with an outer step."""
    momenta = scale.momenta if name in OUTER else (OUTER_MOMENTUM,)
    return [Hyper(f, m) for f in scale.lr_factors for m in momenta]


def hyper_label(name: str, hp: Hyper) -> str:
    """How a tuning run is named: ``diloco lr x2 m=0.9``."""
    return f"{name} lr x{hp.lr_factor:g}" + (f" m={hp.momentum:g}" if name in OUTER else "")


def tuned_of(runs: Runs) -> Tuned:
    """The settings ``tune`` chose, per method, from ``runs`` (the defaults for one not tuned)."""
    chosen = runs.exact.get("tuned", {})
    return {name: Hyper(chosen[name]["lr_factor"], chosen[name]["momentum"]) if name in chosen else Hyper()
            for name in METHODS}  # fmt: skip


def best(losses: dict[str, float], name: str, scale: Scale) -> Hyper:
    """The setting of ``grid(name)`` with the lowest validation loss in ``losses`` (label -> loss);
    a run that failed or diverged (missing, NaN) never wins, and a tie goes to the first tried."""

    def loss(hp: Hyper) -> float:
        v = losses.get(hyper_label(name, hp), float("nan"))
        return float("inf") if math.isnan(v) else v

    return min(grid(name, scale), key=loss)


def tune(gpt: Task, scale: Scale, name: str, runs_dir: str, runs: Runs, progress: bool) -> None:
    """Choose method ``name``'s settings on the held-out seed: every setting of its ``grid`` trained
    once on ``scale.tune_seed`` at K = the first node count (MuLoCo: the largest, where its finding
    is) and DiLoCo's smallest H, the lowest final validation loss chosen, then used for every K, H
    and p of the report. A grid of one setting runs nothing."""
    settings = grid(name, scale)
    losses: dict[str, float] = {}
    if len(settings) > 1:
        k = max(scale.nodes) if name == "muloco" else scale.nodes[0]
        strategies = {hyper_label(name, hp): method(name, hp, scale) for hp in settings}
        logger.info("tuning %s on seed %d: %d settings", name, scale.tune_seed, len(strategies))
        result = compare(
            gpt, strategies, out_dir=os.path.join(runs_dir, "tune", name.replace(" ", "_")),
            seed=scale.tune_seed, steps=scale.steps, nodes=k, batch_size=scale.batch_size, H=max(scale.H),
            network="internet", progress=progress,
        )  # fmt: skip
        losses = {row["strategy"]: float(row["val_loss"]) for row in result.summary}
    chosen = best(losses, name, scale)
    runs.exact.setdefault("tuned", {})[name] = {**dataclasses.asdict(chosen), "losses": losses}


def algorithm_runs(scale: Scale, k: int, tuned: Tuned) -> dict[str, Strategy]:
    """The runs of the PowerSGD / top-k / DES-LOC / NoLoCo / MuLoCo study at ``k`` nodes, at
    DiLoCo's smallest H: NoLoCo at every node count, MuLoCo at the largest, the others at the first."""
    h0 = min(scale.H)
    names = ["noloco"]
    if k == scale.nodes[0]:
        names += ["powersgd", "topk_ef", "desloc", "local adam"]
    if k == max(scale.nodes):
        names.append("muloco")
    return {ALGORITHM_LABELS[n].format(h0=h0): method(n, tuned[n], scale) for n in names}


#: How the study's tables name each method's run ({h0}: DiLoCo's smallest H).
ALGORITHM_LABELS = {
    "noloco": "noloco H={h0}",
    "powersgd": f"powersgd rank={POWERSGD_RANK}",
    "topk_ef": f"topk_ef k={TOPK:g}",
    "desloc": "desloc Kx={h0}",
    "local adam": "local adam Kx={h0}",
    "muloco": "muloco H={h0}",
}


def streaming_runs(scale: Scale, tuned: Tuned) -> dict[str, Strategy]:
    """Streaming DiLoCo at DiLoCo's smallest H with ``scale.fragments`` fragments, without overlap
    and one step late."""
    h0, f = min(scale.H), scale.fragments
    return {
        f"streaming F={f} H={h0}": method("streaming", tuned["streaming"], scale),
        f"streaming F={f} H={h0} tau=1": method("streaming tau=1", tuned["streaming tau=1"], scale),
    }


def gpt_model(scale: Scale) -> CharGPT:
    """A fresh byte-level GPT of the scale's size."""
    return CharGPT(block=scale.block, n_layer=scale.n_layer, n_head=4, n_embd=scale.n_embd)


def gpt_task(scale: Scale) -> Task:
    """The byte-level GPT on the standard library's source (no download)."""
    train, val = split_text(stdlib_corpus(), block=scale.block)
    return Task("chars", functools.partial(gpt_model, scale), train, val, LR)


def digits_task() -> Task:
    """The 64-256-256-10 MLP on scikit-learn's digits."""
    train, val = digits_datasets()
    return Task("digits", MLPClassifier, train, val, LR)


def run_all(scale: Scale, runs_dir: str, progress: bool) -> Runs:
    """Every run of the report over the scale's seeds: the synchronous studies grouped into one
    ``compare`` per task, node count and seed, then the asynchronous studies, the Rosenbrock toy
    and the bandwidth table (exact: no seeds)."""
    os.makedirs(runs_dir, exist_ok=True)
    partial = os.path.join(runs_dir, "runs.partial.json")  # what has run so far, should a later run stop
    runs = resumed(partial, scale)

    def section(name: str, run: Callable[[], None]) -> None:
        """``run()`` unless a stopped run of this scale finished it; then save what has run."""
        done = runs.exact["sections"]
        if name in done:
            logger.info("%s: already run, read from %s", name, partial)
            return
        t0 = time.perf_counter()
        run()
        runs.wall += time.perf_counter() - t0
        done.append(name)
        runs.save(partial)

    gpt = gpt_task(scale)
    common = dict(network="internet", progress=progress)
    k0, h0, h_big = scale.nodes[0], min(scale.H), max(scale.H)

    def gpt_runs(strategies: dict[str, Strategy], group: str, **sizes: int) -> None:
        """The GPT ``strategies`` over the seeds, one ``compare`` per seed into
        ``<runs_dir>/gpt-<group>/seed<s>``, added under ``<label> <group as K=4 or M=1>``."""
        out = os.path.join(runs_dir, f"gpt-{group}")
        over_seeds(
            scale.seeds,
            lambda s: compare(
                gpt, strategies, out_dir=os.path.join(out, f"seed{s}"), seed=s, steps=scale.steps, **sizes, **common
            ),
            runs,
            suffix=f" {group[0]}={group[1:]}",
        )

    # each method's settings first, on the held-out seed; every run below uses them
    for name in METHODS:
        section(f"tune-{name}", functools.partial(tune, gpt, scale, name, runs_dir, runs, progress))
    tuned = tuned_of(runs)

    def run(name: str, **config: float) -> Strategy:
        return method(name, tuned[name], scale, **config)

    for k in scale.nodes:
        strategies: dict[str, Strategy] = {"ddp": run("ddp")}
        strategies.update({f"diloco H={h}": run("diloco", H=h) for h in scale.H})
        if k == k0:
            strategies.update({f"sparta p={p:g}": run("sparta", p=p) for p in scale.sparta_p})
            strategies.update(
                {f"sparta+diloco p={p:g} H={h_big}": run("sparta+diloco", p=p, H=h_big) for p in scale.sparta_p}
            )
            strategies["demo"] = run("demo")
            strategies[f"sparseloco H={h0}"] = run("sparseloco")
            strategies[f"eager_diloco H={h0}"] = run("eager_diloco")
            strategies.update(streaming_runs(scale, tuned))
        strategies.update(algorithm_runs(scale, k, tuned))
        logger.info("GPT, K=%d: %d runs x %d seeds", k, len(strategies), len(scale.seeds))
        sizes = dict(nodes=k, batch_size=scale.batch_size, H=h_big)
        section(f"gpt-K{k}", functools.partial(gpt_runs, strategies, f"K{k}", **sizes))
    # DiLoCo's scaling laws: the global batch of K0 nodes (batch_size each) on 1 and 2 replicas
    batch = scale.batch_size * k0
    for m in (1, 2):
        strategies = {f"diloco H={h0}": run("diloco")} | ({"ddp": run("ddp")} if m == 1 else {})
        logger.info(
            "GPT, %d replica(s), global batch %d: %d runs x %d seeds", m, batch, len(strategies), len(scale.seeds)
        )
        section(f"gpt-M{m}", functools.partial(gpt_runs, strategies, f"M{m}", nodes=m, batch_size=batch // m, H=h0))

    digits = digits_task()
    fed = dict(nodes=scale.clients, steps=scale.fed_steps, batch_size=scale.fed_batch, H=scale.fed_H, **common)
    for scheme in ("iid", "dirichlet"):
        strategies = {
            "all clients": FedAvgStrategy(H=scale.fed_H, optim_spec=OptimSpec(torch.optim.AdamW, lr=LR)),
            f"{scale.client_sampling:.0%} sampled": FedAvgStrategy(
                H=scale.fed_H, client_sampling=scale.client_sampling, optim_spec=OptimSpec(torch.optim.AdamW, lr=LR)
            ),
        }
        logger.info("FedAvg, %s: %d runs x %d seeds", scheme, len(strategies), len(scale.seeds))
        out = os.path.join(runs_dir, f"fedavg-{scheme}")

        def fed_run(s: int, scheme: str = scheme, strategies: dict = strategies, out: str = out) -> Comparison:
            split = partition(digits.train, scale.clients, scheme, alpha=ALPHA, min_size=scale.fed_batch, seed=s)
            return compare(digits, strategies, partition=split, out_dir=os.path.join(out, f"seed{s}"), seed=s, **fed)

        section(f"fedavg-{scheme}", functools.partial(over_seeds, scale.seeds, fed_run, runs, suffix=f" {scheme}"))

    section("async", lambda: fidelity_async.run_async(gpt, digits, scale, LR, runs_dir, runs, progress))
    section("rosenbrock", lambda: fidelity_rosenbrock.run_toy(scale, runs_dir, runs, progress))
    t0 = time.perf_counter()
    logger.info("the Streaming DiLoCo bandwidth table and eager DiLoCo's round at 1B (exact)")
    cells, peaks = bandwidth_table.measure(scale.table_models)
    runs.exact["bandwidth_cells"] = cells
    runs.exact["peak_bytes"] = {f"{m}/{method}": v for (m, method), v in peaks.items()}
    runs.exact["eager_seconds"] = eager_at_scale()
    runs.wall += time.perf_counter() - t0
    return runs


def resumed(partial: str, scale: Scale) -> Runs:
    """What a stopped run of the same scale saved in ``partial`` (its finished sections, read
    again rather than trained again), or nothing; a saved run of another scale is set aside."""
    settings = json.loads(json.dumps(dataclasses.asdict(scale)))
    if os.path.exists(partial):
        runs = Runs.load(partial)
        if runs.exact.get("scale") == settings:
            logger.info("resuming: %s holds %s", partial, ", ".join(runs.exact["sections"]) or "nothing yet")
            return runs
        logger.info("%s is of another scale; starting afresh", partial)
    return Runs({}, {}, {}, exact={"scale": settings, "sections": []})


#: Where eager DiLoCo's time is priced: the Streaming DiLoCo table's 1B row (24 layers, 0.1 s of
#: compute a step), H=100, two workers joined by 1 Gbit/s.
EAGER_SCALE = dict(params="1B", layers=24, step_seconds=0.1, H=100, bandwidth=1e9)


def eager_at_scale() -> dict[str, float]:
    """Simulated seconds of DiLoCo's and eager DiLoCo's schedules at ``EAGER_SCALE``, recorded on
    the target's meta tensors (``exogym.bandwidth.schedule``: no training) and priced by the clock."""
    c = EAGER_SCALE
    target = ExoScale(c["params"], layers=c["layers"], step_seconds=c["step_seconds"])
    network = Network(c["bandwidth"], 0.0, compute=c["step_seconds"])
    methods = {"diloco": DiLoCoStrategy(H=c["H"]), "eager": EagerDiLoCoStrategy(H=c["H"])}
    return {name: schedule(s, target, num_nodes=2, label=name).seconds(network)[1] for name, s in methods.items()}


def paired(runs: Runs, a: str, b: str, column: str = "val_loss") -> Estimate:
    """``a``'s ``column`` over ``b``'s, seed by seed (the runs of one seed share their start)."""
    return ratio_per_seed(runs, a, b, column)


def diloco_section(runs: Runs, scale: Scale) -> tuple[list[str], list[Claim]]:
    lines = [
        "| K | run | val loss | vs DDP | MB sent/node | DDP bytes / bytes | sim time s |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios, rises, more_nodes = {}, [], []
    for k in scale.nodes:
        ddp = runs.of(f"ddp K={k}", "val_loss")
        for label in ["ddp", *(f"diloco H={h}" for h in scale.H)]:
            run = f"{label} K={k}"
            ratio = ratio_per_seed(runs, f"ddp K={k}", run, "bytes_sent_per_node")
            loss = runs.of(run, "val_loss")
            lines.append(
                f"| {k} | {label} | {ci(loss)} | {loss.mean / ddp.mean - 1:+.1%} | "
                f"{fmt_mb(runs.of(run, 'bytes_sent_per_node').mean)} | {ratio.mean:.1f} | "
                f"{runs.of(run, 'sim_time').mean:.1f} |"
            )
            if label != "ddp":
                ratios[(k, int(label.split("=")[1]))] = ratio
        rises += [
            above(paired(runs, f"diloco H={b} K={k}", f"diloco H={a} K={k}"), 1.0)
            for a, b in zip(scale.H, scale.H[1:], strict=False)
        ]
    k_small, k_big = min(scale.nodes), max(scale.nodes)
    big_over_small = {h: paired(runs, f"diloco H={h} K={k_big}", f"diloco H={h} K={k_small}") for h in scale.H}
    more_nodes = [below(r, 1.0) for r in big_over_small.values()]
    h0 = min(scale.H)
    near = {k: paired(runs, f"diloco H={h0} K={k}", f"ddp K={k}") for k in scale.nodes}
    source = "DiLoCo (2311.08105)"
    claims = [
        Claim(
            source,
            "DiLoCo communicates H times less than synchronous data parallelism (one all-reduce of "
            "the model per H steps instead of per step)",
            "DDP bytes / DiLoCo bytes within 5% of H, every K and H",
            ", ".join(f"K={k} H={h}: {ci(r, '.1f')}" for (k, h), r in ratios.items()),
            every([within(scaled(r, 1 / h), 0.95, 1.05) for (_, h), r in ratios.items()]),
            exact=True,
        ),
        Claim(
            source,
            "8 workers with H=500 match (slightly beat) the synchronous baseline on C4 at the same "
            "total data (88,000 inner steps)",
            f"DiLoCo's validation loss at the smallest H ({h0}) over DDP's below 1.02, every K",
            ", ".join(f"K={k}: {ci(r)}" for k, r in near.items()),
            every([below(r, 1.02) for r in near.values()]),
            why=(
                "the paper's 88,000 inner steps give the outer optimizer hundreds of steps to catch up with DDP "
                f"at momentum 0.9; here {scale.steps // h0} outer steps at H={h0}, where the tuning chose momentum "
                f"{tuned_of(runs)['diloco'].momentum:g}"
            ),
        ),
        Claim(
            source,
            "the loss degrades gracefully as H grows from 50 to 2,000 inner steps",
            "validation loss over the previous H's above 1 at each larger H, each K",
            "; ".join(
                f"K={k}: " + ", ".join(ci(runs.of(f"diloco H={h} K={k}", "val_loss"), ".3f") for h in scale.H)
                for k in scale.nodes
            ),
            every(rises),
            why=(
                f"at H={max(scale.H)} a run of {scale.steps} steps has {scale.steps // max(scale.H)} outer "
                "steps, so the order of the larger H values rests on a few outer steps"
            ),
        ),
        Claim(
            source,
            "more replicas at the same per-replica steps give a better model",
            f"DiLoCo K={k_big}'s validation loss over K={k_small}'s below 1 at every H",
            ", ".join(f"H={h}: {ci(r)}" for h, r in big_over_small.items()),
            every(more_nodes),
            why=(
                f"with {scale.steps // max(scale.H)} outer steps at H={max(scale.H)} the extra replicas' data "
                "has not yet paid for "
                "averaging models that drifted further apart"
            ),
        ),
    ]
    return lines, claims


def scaling_section(runs: Runs, scale: Scale) -> tuple[list[str], list[Claim]]:
    """DiLoCo's scaling laws (arXiv 2503.09799) and DDP's bytes."""
    k0, h0, batch = scale.nodes[0], min(scale.H), scale.batch_size * scale.nodes[0]
    replicas = {1: f"diloco H={h0} M=1", 2: f"diloco H={h0} M=2"} | {k0: f"diloco H={h0} K={k0}"}
    lines = [
        "| run | replicas | batch per replica | val loss | vs DDP on one node | sim time s |",
        "|---|---|---|---|---|---|",
    ]
    ddp1 = runs.of("ddp M=1", "val_loss")
    for label, m in (("ddp M=1", 1), *((run, m) for m, run in replicas.items())):
        loss = runs.of(label, "val_loss")
        lines.append(
            f"| {label.rsplit(' ', 1)[0]} | {m} | {batch // m} | {ci(loss)} | {loss.mean / ddp1.mean - 1:+.1%} | "
            f"{runs.of(label, 'sim_time').mean:.1f} |"
        )
    one = paired(runs, replicas[1], "ddp M=1")
    counts = sorted(replicas)
    grows = {(a, b): paired(runs, replicas[b], replicas[a]) for a, b in zip(counts, counts[1:], strict=False)}
    params = sum(p.numel() for p in gpt_model(scale).parameters())
    ring_bytes = {k: 2 * (k - 1) / k * 4 * params for k in scale.nodes}  # per node and step
    ring = {k: estimate(b / ring_bytes[k] for b in bytes_per_step(runs, f"ddp K={k}")) for k in scale.nodes}
    source = "DiLoCo scaling laws (2503.09799)"
    claims = [
        Claim(
            source,
            "with one replica, DiLoCo matches or beats data-parallel training at equal steps and batch",
            f"DiLoCo M=1 (H={h0}) over DDP on one node, validation loss, below 1.02 (batch {batch})",
            ci(one),
            below(one, 1.02),
            why=(
                "the paper's advantage of one replica comes from the outer Nesterov step over "
                "thousands of outer steps, tuned per model size"
            ),
        ),
        Claim(
            source,
            "at a fixed compute and token budget, the loss grows with the number of replicas",
            f"validation loss over the previous replica count's above 1, at M = {', '.join(map(str, counts))} "
            f"(global batch {batch})",
            ", ".join(f"M={b} / M={a}: {ci(r)}" for (a, b), r in grows.items()),
            every([above(r, 1.0) for r in grows.values()]),
            why=(
                "at this length the replicas' models drift little between outer steps, so "
                "splitting the batch costs less than in the paper's long runs"
            ),
        ),
        Claim(
            "DDP (ring all-reduce)",
            "a ring all-reduce of the gradients sends 2 (K-1)/K times the model's bytes per node and step",
            "DDP's bytes per node and step over 2 (K-1)/K x 4 x parameters within 1%, every K",
            ", ".join(f"K={k}: {ci(r, '.4f')}" for k, r in ring.items()),
            every([within(r, 0.99, 1.01) for r in ring.values()]),
            exact=True,
        ),
    ]
    return lines, claims


def streaming_section(runs: Runs, scale: Scale) -> tuple[list[str], list[Claim]]:
    """Streaming DiLoCo (arXiv 2501.18512) on the GPT, and the paper's bandwidth table."""
    k, h0, f = scale.nodes[0], min(scale.H), scale.fragments
    base, plain, late = f"diloco H={h0} K={k}", *(f"{r} K={k}" for r in streaming_runs(scale, tuned_of(runs)))
    lines = [
        "| run | val loss | vs DiLoCo | MB sent/node | sim time s |",
        "|---|---|---|---|---|",
    ]
    dil = runs.of(base, "val_loss")
    for run in (base, plain, late):
        loss = runs.of(run, "val_loss")
        lines.append(
            f"| {run.rsplit(' ', 1)[0]} | {ci(loss)} | {loss.mean / dil.mean - 1:+.1%} | "
            f"{fmt_mb(runs.of(run, 'bytes_sent_per_node').mean)} | {runs.of(run, 'sim_time').mean:.1f} |"
        )
    cells = runs.exact["bandwidth_cells"]
    within_cells = sum(1 / 1.5 <= c["gbit_per_s"] / c["paper"] <= 1.5 for c in cells)
    peaks = runs.exact["peak_bytes"]
    fragments_1b = bandwidth_table.MODELS["1B"][0] // 3
    peak_share = peaks["1B/streaming"] / peaks["1B/diloco"]
    lines += [
        "",
        "The paper's Table 4 (Gbit/s between two workers for a compute utilisation; ExoGym / paper):",
        "",
        "| model | method | " + " | ".join(f"{u}%" for u in bandwidth_table.UTILISATION) + " |",
        "|---|---|" + "---|" * len(bandwidth_table.UTILISATION),
    ]
    n = len(bandwidth_table.UTILISATION)
    for i in range(0, len(cells), n):
        row = cells[i : i + n]
        lines.append(
            f"| {row[0]['model']} | {bandwidth_table.LABELS[row[0]['method']].strip()} | "
            + " | ".join(f"{c['gbit_per_s']:.1f} / {c['paper']:.1f}" for c in row)
            + " |"
        )
    loss_plain, loss_late = paired(runs, plain, base), paired(runs, late, plain)
    total = paired(runs, plain, base, "bytes_sent_per_node")
    source = "Streaming DiLoCo (2501.18512)"
    claims = [
        Claim(
            source,
            "syncing fragments in turn divides the peak bandwidth by the number of fragments, the total unchanged",
            f"peak bytes per step at 1B ({fragments_1b} fragments, H=100) over DiLoCo's within 1% of 1/"
            f"{fragments_1b}; total bytes on the GPT ({f} fragments) over DiLoCo's within 1% of 1",
            f"peak {peak_share:.4f} (1/{fragments_1b} = {1 / fragments_1b:.4f}), total {ci(total, '.4f')}",
            every([within(peak_share * fragments_1b, 0.99, 1.01), within(total, 0.99, 1.01)]),
            exact=True,
        ),
        Claim(
            source,
            "streaming fragments match DiLoCo's loss",
            f"Streaming DiLoCo ({f} fragments, H={h0}) over DiLoCo's validation loss below 1.02",
            ci(loss_plain),
            below(loss_plain, 1.02),
            why=(
                "a fragment's outer step sees fewer inner steps of the others' fragments at this "
                "short H than at the paper's H=100"
            ),
        ),
        Claim(
            source,
            "overlapping the communication with one step of compute (tau = 1) costs little loss",
            "tau=1 (alpha 0.5) over tau=0 validation loss below 1.01",
            ci(loss_late),
            below(loss_late, 1.01),
            why=("one step late is a tenth of an outer period at H=10, a hundredth at the paper's H=100"),
        ),
        Claim(
            source,
            "the bandwidth each method needs between two workers for 50-99% compute utilisation "
            "(1B, 10B, 100B parameters; Table 4)",
            f"at least 80% of the {len(cells)} cells within 1.5x of the paper's",
            f"{within_cells} of {len(cells)} within 1.5x",
            AGREES if within_cells >= 0.8 * len(cells) else DISAGREES,
            exact=True,
            why="the paper's simulator hides an outer step's all-reduce differently from ExoGym's clock "
            "(docs/user-guide/scale.md)",
        ),
    ]
    return lines, claims


def sparta_section(runs: Runs, scale: Scale) -> tuple[list[str], list[Claim]]:
    k, h_big = scale.nodes[0], max(scale.H)
    ddp = runs.of(f"ddp K={k}", "val_loss")
    ddp_per_step = runs.rows[f"ddp K={k}"][0]["bytes_sent_per_node"] / runs.rows[f"ddp K={k}"][0]["steps"]
    labels = [
        "ddp",
        *(f"sparta p={p:g}" for p in scale.sparta_p),
        f"diloco H={h_big}",
        *(f"sparta+diloco p={p:g} H={h_big}" for p in scale.sparta_p),
    ]
    lines = [
        "| run | val loss | vs DDP | bytes/step/node | x DDP's | model correlation | sim time s |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in labels:
        run = f"{label} K={k}"
        loss, corr, row = runs.of(run, "val_loss"), runs.last(run, "model_correlation"), runs.rows[run][0]
        per_step = row["bytes_sent_per_node"] / row["steps"]
        lines.append(
            f"| {label} | {ci(loss)} | {loss.mean / ddp.mean - 1:+.1%} | {per_step:,.0f} | "
            f"{per_step / ddp_per_step:.4f} | {'-' if corr is None else ci(corr, '.3f')} | "
            f"{runs.of(run, 'sim_time').mean:.1f} |"
        )
    sparta = [runs.of(f"sparta p={p:g} K={k}", "val_loss") for p in scale.sparta_p]
    steps_down = [
        paired(runs, f"sparta p={b:g} K={k}", f"sparta p={a:g} K={k}")
        for a, b in zip(scale.sparta_p, scale.sparta_p[1:], strict=False)
    ]
    corrs = {p: runs.last(f"sparta p={p:g} K={k}", "model_correlation") for p in scale.sparta_p}
    combo = {
        p: paired(runs, f"sparta+diloco p={p:g} H={h_big} K={k}", f"diloco H={h_big} K={k}") for p in scale.sparta_p
    }
    byte_ratios = {
        p: scaled(ratio_per_seed(runs, f"sparta p={p:g} K={k}", f"ddp K={k}", "bytes_sent_per_node"), 1 / p)
        for p in scale.sparta_p
    }
    source = "SPARTA (Beton et al. 2025)"
    verdicts = {
        "corr": every([CANNOT_TELL if c is None else above(c, 0.9) for c in corrs.values()]),
        "order": every([below(r, 1.0) for r in steps_down]),
        "combo": every([below(r, 0.995) for r in combo.values()]),
    }
    claims = [
        Claim(
            source,
            "averaging a random fraction p of the parameters each step sends p of DDP's bytes",
            "SPARTA bytes / (p x DDP bytes) within 5% of 1",
            ", ".join(f"p={p:g}: {ci(v, '.3f')}" for p, v in byte_ratios.items()),
            every([within(v, 0.95, 1.05) for v in byte_ratios.values()]),
            exact=True,
        ),
        Claim(
            source,
            "the nodes' models stay highly correlated (> 0.9) at p around 0.1%",
            "model correlation at the last validation above 0.9 for every p >= 0.001",
            ", ".join(f"p={p:g}: {ci(c, '.3f')}" for p, c in corrs.items() if c is not None),
            verdicts["corr"],
            why=(
                "the small GPT's replicas drift apart faster per step than the paper's, the more at a larger "
                f"learning rate (here the tuned {LR * tuned_of(runs)['sparta'].lr_factor:g})"
            ),
        ),
        Claim(
            source,
            "SPARTA lands between independent training and DDP, closer to DDP as p grows",
            "validation loss over the previous p's below 1 at each larger p",
            ", ".join(f"p={p:g}: {ci(v, '.3f')}" for p, v in zip(scale.sparta_p, sparta, strict=True))
            + f" (DDP {ci(ddp, '.3f')})",
            verdicts["order"],
            why=("between nearby p the difference is smaller than the spread between seeds"),
        ),
        Claim(
            source,
            "SPARTA between DiLoCo's syncs keeps the replicas aligned at large H: 14.3% lower "
            "perplexity than DiLoCo alone",
            f"SPARTA+DiLoCo over DiLoCo alone at H={h_big}, validation loss, below 0.995 for every p",
            ", ".join(f"p={p:g}: {ci(v)}" for p, v in combo.items()),
            verdicts["combo"],
            why=(
                "the paper's gain is at H in the thousands, where DiLoCo alone degrades; "
                "at this H it degrades little, leaving SPARTA little to recover"
            ),
        ),
    ]
    return lines, claims


def demo_section(runs: Runs, scale: Scale) -> tuple[list[str], list[Claim]]:
    k = scale.nodes[0]
    ddp, demo = runs.of(f"ddp K={k}", "val_loss"), runs.of(f"demo K={k}", "val_loss")
    lines = [
        "| run | val loss | vs DDP | bytes/step/node | x DDP's | sim time s |",
        "|---|---|---|---|---|---|",
    ]
    ddp_row = runs.rows[f"ddp K={k}"][0]
    for label, run, loss in (
        ("ddp (AdamW)", f"ddp K={k}", ddp),
        ("demo (sign-SGD, top-32 of 64)", f"demo K={k}", demo),
    ):
        row = runs.rows[run][0]
        per_step = row["bytes_sent_per_node"] / row["steps"]
        lines.append(
            f"| {label} | {ci(loss)} | {loss.mean / ddp.mean - 1:+.1%} | {per_step:,.0f} | "
            f"{per_step / (ddp_row['bytes_sent_per_node'] / ddp_row['steps']):.3f} | "
            f"{runs.of(run, 'sim_time').mean:.1f} |"
        )
    share = ratio_per_seed(runs, f"demo K={k}", f"ddp K={k}", "bytes_sent_per_node")
    loss = paired(runs, f"demo K={k}", f"ddp K={k}")
    source = "DeMo (2411.19870)"
    claims = [
        Claim(
            source,
            "DeMo matches or beats AdamW DDP at equal tokens (OLMo 300M/1B)",
            "DeMo's validation loss over DDP's below 1.02",
            ci(loss),
            below(loss, 1.02),
            why=(
                "the paper's 300M-1B parameters and 100B tokens against 0.13M and under a million tokens here, "
                "each optimizer tuned in both"
            ),
        ),
        Claim(
            source,
            "DeMo sends a small fraction of DDP's bytes per step (orders of magnitude at its chunk/top-k settings)",
            "DeMo bytes per step below 1/10 of DDP's",
            f"{ci(share, '.3f')} of DDP's",
            below(share, 0.1),
            exact=True,
        ),
    ]
    return lines, claims


def fedavg_section(runs: Runs, scale: Scale) -> tuple[list[str], list[Claim]]:
    sampled = f"{scale.client_sampling:.0%} sampled"
    lines = [
        "| data | clients per round | val loss | val accuracy | MB sent/client | sim time s |",
        "|---|---|---|---|---|---|",
    ]
    for scheme in ("iid", "dirichlet"):
        for who in ("all clients", sampled):
            run = f"{who} {scheme}"
            name = "IID" if scheme == "iid" else f"Dirichlet({ALPHA:g})"
            lines.append(
                f"| {name} | {who} | {ci(runs.of(run, 'val_loss'))} | {ci(runs.of(run, 'val_accuracy'), '.3f')} | "
                f"{fmt_mb(runs.of(run, 'bytes_sent_per_node').mean)} | {runs.of(run, 'sim_time').mean:.1f} |"
            )
    acc = {(w, s): runs.of(f"{w} {s}", "val_accuracy") for w in ("all clients", sampled) for s in ("iid", "dirichlet")}
    drop = {  # the IID - non-IID accuracy gap, seed by seed
        w: estimate(
            a - b
            for a, b in zip(
                runs.per_seed(f"{w} iid", "val_accuracy"), runs.per_seed(f"{w} dirichlet", "val_accuracy"), strict=True
            )
        )
        for w in ("all clients", sampled)
    }
    widening = estimate(  # the gap with sampling minus the gap with every client, seed by seed
        (a - b) - (c - d)
        for a, b, c, d in zip(
            runs.per_seed(f"{sampled} iid", "val_accuracy"),
            runs.per_seed(f"{sampled} dirichlet", "val_accuracy"),
            runs.per_seed("all clients iid", "val_accuracy"),
            runs.per_seed("all clients dirichlet", "val_accuracy"),
            strict=True,
        )
    )
    source = "FedAvg, non-IID (1909.06335)"
    skew = every([above(d, 0.0) for d in drop.values()])
    claims = [
        Claim(
            source,
            "label-skewed (non-IID) clients train a worse global model than IID clients in the "
            "same rounds; the gap grows as Dirichlet alpha falls to 0.1 and below (Hsu et al.)",
            f"IID accuracy minus Dirichlet({ALPHA:g})'s above 0, with every client and sampled",
            ", ".join(f"{w}: {ci(acc[(w, 'iid')], '.3f')} vs {ci(acc[(w, 'dirichlet')], '.3f')}" for w in drop),
            skew,
            why=("the digits are easy enough that a few dozen rounds reach high accuracy under either split"),
        ),
        Claim(
            source,
            "sampling fewer clients per round hurts more under label skew (Hsu et al.)",
            "the IID - non-IID accuracy gap with sampling minus the gap with every client above 0",
            f"gap {ci(drop[sampled], '+.3f')} sampled vs {ci(drop['all clients'], '+.3f')} with every client; "
            f"difference {ci(widening, '+.3f')}",
            above(widening, 0.0),
            why=(
                "over tens of rounds a sampled round's missing labels are soon made up; the paper "
                "measures over thousands"
            ),
        ),
    ]
    return lines, claims


def low_comm_section(runs: Runs, scale: Scale) -> tuple[list[str], list[Claim]]:
    k, h0 = scale.nodes[0], min(scale.H)
    ref = f"diloco H={h0} K={k}"
    dil = runs.of(ref, "val_loss")
    lines = [
        "| run | val loss | vs DiLoCo | MB sent/node | x DiLoCo's bytes | sim time s |",
        "|---|---|---|---|---|---|",
    ]
    for label in (f"diloco H={h0}", f"sparseloco H={h0}", f"eager_diloco H={h0}"):
        run = f"{label} K={k}"
        loss = runs.of(run, "val_loss")
        lines.append(
            f"| {label} | {ci(loss)} | {loss.mean / dil.mean - 1:+.1%} | "
            f"{fmt_mb(runs.of(run, 'bytes_sent_per_node').mean)} | "
            f"{ratio_per_seed(runs, run, ref, 'bytes_sent_per_node').mean:.4f} | {runs.of(run, 'sim_time').mean:.1f} |"
        )
    sparse, eager = f"sparseloco H={h0} K={k}", f"eager_diloco H={h0} K={k}"
    share = ratio_per_seed(runs, sparse, ref, "bytes_sent_per_node")
    sparse_loss, eager_loss = paired(runs, sparse, ref), paired(runs, eager, ref)
    seconds = runs.exact["eager_seconds"]
    eager_time = seconds["eager"] / seconds["diloco"]
    sparse_v = every([below(share, 1 / 30), below(sparse_loss, 1.02)])
    eager_v = below(eager_loss, 1.02)
    c = EAGER_SCALE
    claims = [
        Claim(
            "SparseLoCo (2508.15706)",
            "at 1-3% density with 2-bit values and error feedback, SparseLoCo matches or beats full-precision "
            "DiLoCo at the same H while sending over 30x fewer bytes (512M-parameter LLaMA)",
            "SparseLoCo (top-2 of each run of 64, 2 bits) over DiLoCo's validation loss below 1.02, "
            "at under 1/30 of its bytes",
            f"loss {ci(sparse_loss)} at {ci(share, '.4f')} of DiLoCo's bytes",
            sparse_v,
            why=(
                "the paper tunes H, beta and the outer learning rate over thousands of outer "
                f"steps; here its defaults run {scale.steps // h0} at H={h0}"
            ),
        ),
        Claim(
            "Eager updates (2502.12996)",
            "eager updates, whose all-reduce overlaps the next inner phase, stay close to DiLoCo's loss",
            "eager DiLoCo over DiLoCo: validation loss below 1.02",
            ci(eager_loss),
            eager_v,
            why=(
                f"the paper's H (100 and more) and model size differ from this run's H={h0} and 0.13M parameters, "
                f"and its momentum 0.9 lost to {tuned_of(runs)['eager_diloco'].momentum:g} in the tuning; which "
                "difference opens the gap is not known"
            ),
        ),
        Claim(
            "Eager updates (2502.12996)",
            "overlapping the outer all-reduce with the next inner phase hides its communication",
            f"at {c['params']} parameters ({c['layers']} layers, {c['step_seconds']} s of compute a step, "
            f"H={c['H']}, two workers at {c['bandwidth'] / 1e9:g} Gbit/s) eager DiLoCo's simulated time over "
            "DiLoCo's below 0.95",
            f"{eager_time:.3f} ({seconds['eager']:.0f} s against {seconds['diloco']:.0f} s over the schedule)",
            AGREES if eager_time < 0.95 else DISAGREES,
            exact=True,
            why="an outer step's all-reduce longer than H steps of compute is hidden only in part",
        ),
    ]
    return lines, claims


def algorithms_section(runs: Runs, scale: Scale) -> tuple[list[str], list[Claim]]:
    k0, kb, h0 = scale.nodes[0], max(scale.nodes), min(scale.H)
    lines = [
        "| K | run | val loss | vs reference | reference | bytes/step/node | x reference's | sim time s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    pairs = [
        (k0, f"powersgd rank={POWERSGD_RANK}", "ddp"),
        (k0, f"topk_ef k={TOPK:g}", "ddp"),
        (k0, f"desloc Kx={h0}", f"local adam Kx={h0}"),
        *((k, f"noloco H={h0}", f"diloco H={h0}") for k in scale.nodes),
        (kb, f"muloco H={h0}", f"diloco H={h0}"),
    ]
    loss, ref_loss, share = {}, {}, {}
    for k, label, ref in pairs:
        run, base = f"{label} K={k}", f"{ref} K={k}"
        loss[(k, label)], ref_loss[(k, label)] = runs.of(run, "val_loss"), runs.of(base, "val_loss")
        share[(k, label)] = per_step_ratio(runs, run, base)
        first, gap = runs.rows[run][0], loss[(k, label)].mean / ref_loss[(k, label)].mean - 1
        lines.append(
            f"| {k} | {label} | {ci(loss[(k, label)])} | {gap:+.1%} | "
            f"{ref} | {first['bytes_sent_per_node'] / first['steps']:,.0f} | {share[(k, label)].mean:.4f} | "
            f"{runs.of(run, 'sim_time').mean:.1f} |"
        )
    ratio = {(k, label): paired(runs, f"{label} K={k}", f"{ref} K={k}") for k, label, ref in pairs}
    near = {key: below(r, 1.02) for key, r in ratio.items()}  # "matches": within 2% of the reference
    psgd, topk = (k0, f"powersgd rank={POWERSGD_RANK}"), (k0, f"topk_ef k={TOPK:g}")
    desloc = (k0, f"desloc Kx={h0}")
    steps = runs.rows[f"desloc Kx={h0} K={k0}"][0]["steps"]
    # the moments are not averaged after the last step (nothing reads them), the parameters are
    desloc_rounds = (steps // h0 + (steps - 1) // (3 * h0) + (steps - 1) // (6 * h0)) / (
        steps // h0 + 2 * ((steps - 1) // h0)
    )
    noloco_bytes = {k: runs.rows[f"noloco H={h0} K={k}"][0]["bytes_sent_per_node"] / steps for k in scale.nodes}
    # the bytes follow from the algorithm: equal for every K and seed, or the finding does not hold
    flat = len({r["bytes_sent_per_node"] for k in scale.nodes for r in runs.rows[f"noloco H={h0} K={k}"]}) == 1
    noloco = every([AGREES if flat else DISAGREES, *(below(ratio[(k, f"noloco H={h0}")], 1.05) for k in scale.nodes)])
    muloco = (kb, f"muloco H={h0}")
    desloc_v = every([within(scaled(share[desloc], 1 / desloc_rounds), 0.99, 1.01), near[desloc]])
    muloco_v = below(ratio[muloco], 1.0)
    claims = [
        Claim(
            "PowerSGD (1905.13727)",
            "rank-2 to rank-4 PowerSGD reaches full-precision SGD's accuracy at a small fraction of its bytes "
            "(CIFAR-10 ResNet-18, WikiText-2 LSTM)",
            f"PowerSGD rank {POWERSGD_RANK} (dense for the first {h0} steps) over DDP's validation loss below 1.02",
            f"{ci(ratio[psgd])} at {share[psgd].mean:.3f} of DDP's bytes",
            near[psgd],
            why=(
                "the paper reaches parity over hundreds of epochs with its learning-rate warm-up and decay; here a "
                f"constant rate over {scale.steps} steps, each method at its own tuned rate"
            ),
        ),
        Claim(
            "Top-k with error feedback (1712.01887)",
            "top-k with error feedback keeps accuracy with 99% and more of the gradient entries dropped (DGC)",
            f"top-{TOPK:.0%} with error feedback over DDP's validation loss below 1.02",
            f"{ci(ratio[topk])} at {share[topk].mean:.3f} of DDP's bytes",
            near[topk],
            why=(
                "DGC warms up its sparsity and corrects momentum over many epochs; here "
                f"1% from the first step of {scale.steps}"
            ),
        ),
        Claim(
            "DES-LOC (2505.22549)",
            "DES-LOC (Ku = 3Kx, Kv = 6Kx) sends half of Local Adam's bytes (parameters and both moments every Kx) "
            "at matching loss",
            f"bytes / Local Adam's within 1% of the rounds' count (S/Kx + (S-1)/Ku + (S-1)/Kv) / (S/Kx + 2 (S-1)/Kx) "
            f"(no moments averaged after the last step) and validation loss over Local Adam's below 1.02 at "
            f"Kx={h0}",
            f"{ci(share[desloc], '.3f')} of Local Adam's bytes (count {desloc_rounds:.3f}), loss {ci(ratio[desloc])}",
            desloc_v,
            why=(
                "each at its own tuned learning rate, the two land about the bound's 2% apart, which five seeds do "
                "not separate"
            ),
        ),
        Claim(
            "NoLoCo (2506.10911)",
            "NoLoCo's synchronisation involves two replicas whatever their number, with loss at or below "
            "DiLoCo's (up to 4% faster convergence)",
            f"bytes per node and step equal at K={', '.join(map(str, scale.nodes))}, and validation loss over "
            f"DiLoCo's at H={h0} below 1.05 at each K",
            ", ".join(
                f"K={k}: {noloco_bytes[k]:,.0f} B/step, loss {ci(ratio[(k, f'noloco H={h0}')])}" for k in scale.nodes
            ),
            noloco,
            why=(
                "averaging with one random peer mixes the replicas more slowly than DiLoCo's "
                f"all-reduce, which {scale.steps // h0} outer steps do not make up"
            ),
        ),
        Claim(
            "MuLoCo (2505.23725)",
            "MuLoCo (Muon inner) reaches a lower loss than DiLoCo with AdamW inner at every K tested "
            "(150M-3.1B, tuned)",
            f"MuLoCo's validation loss over DiLoCo-AdamW's below 1 at K={kb}, H={h0} (Muon lr "
            f"{MUON_LR * tuned_of(runs)['muloco'].lr_factor:g}, tuned)",
            ci(ratio[muloco]),
            muloco_v,
            why=("Muon tuned on one seed at this model size, against the paper's 150M-3.1B parameters"),
        ),
    ]
    return lines, claims


#: What each study's runs are, and what to keep in mind when reading its verdicts at this scale
#: (no numbers: they hold for any run of the script).
NOTES = {
    "diloco": "The paper's runs take 88,000 inner steps (176 outer steps at H=500); here the largest H leaves "
    "a handful of outer steps, so the outer optimizer has barely started and the order of the "
    "larger H values (and of K at large H) rests on a few outer steps. H=500 is left out: a run "
    "of this length would not reach its first outer step. The bytes are exact at any scale.",
    "scaling": "Charles et al. fit scaling laws from 35M to 10B parameters with tuned hyperparameters per "
    "size; here DiLoCo at the smallest H on one node against DDP on one node (the same batch), and 1, 2 "
    "and K replicas sharing one global batch (each replica a share of it) over the same steps.",
    "streaming": "The GPT runs use the smallest H, so each fragment is synced once every H steps; the "
    "bandwidth table is the paper's setting (two workers, H=100, fragments of 3 layers, bf16 or FP4 on "
    "the wire), recorded on the target's meta tensors and priced by ExoGym's clock: no seeds.",
    "sparta": "The paper's 14.3% is at H in the thousands, where DiLoCo alone degrades badly; at "
    "this scale DiLoCo alone is hurt less by H, so a smaller gain from SPARTA is expected.",
    "demo": "DeMo runs with the paper's compression (top-32 of chunk 64, decay 0.999) and sign-SGD at its "
    "learning rate tuned as every method's (the tuning table); the paper tunes both optimizers at 300M-1B "
    "parameters and 100B tokens.",
    "fedavg": "Hsu et al. measure CIFAR-10 over thousands of rounds; here the digits over tens of "
    "rounds, where the effect of label skew is already large.",
    "low_comm": "SparseLoCo runs its defaults (beta 0.95, outer lr 1), one outer step every H steps. Eager "
    "DiLoCo's nodes apply their own share at once and the others' a round late. Its time is priced at 1B "
    "parameters (the Streaming DiLoCo table's 1B row), where a step's compute can hide an all-reduce: this "
    "GPT's FLOP-based step takes microseconds, behind which nothing hides.",
    "algorithms": "Every method runs at its own tuned learning rate (the tuning table; MuLoCo's Muon "
    "from the original Muon's lr 0.02); the papers tune each at 10^8-10^9 parameters over far longer "
    "runs. A 'does not agree' here says what this small run shows, not that the paper is wrong; the "
    "byte figures are exact at any scale.",
    "rosenbrock": "The paper gives the function, the workers, the noise and the periods; the start "
    f"{fidelity_rosenbrock.START}, Adam's learning rate {fidelity_rosenbrock.LR:g} and betas "
    f"{fidelity_rosenbrock.BETAS} and the length are ExoGym's, fixed before the runs. Each worker's batch is "
    "one noise vector; the validation loss is f at the average of the workers' points.",
    "async_diloco": "The GPT on 4 nodes whose steps take 0.1, 0.1, 0.05 and 0.025 s on a 100 Mbit/s, 30 ms "
    "network; DiLoCo waits for the slowest at each outer step, Async DiLoCo's slower nodes take fewer local "
    "steps (DyLU) and its server applies each update as it arrives (delayed Nesterov).",
    "fedbuff": "The digits MLP on clients whose step time is 0.01 s times a log-normal slowdown drawn per "
    "client (the seed draws them); FedAvg samples as many clients per round as FedBuff trains at once and "
    "waits for the slowest of them.",
    "halos": "The GPT on two regions of two nodes (speeds 1, 2 and 1, 4; 0.1 s steps at speed 1); the flat "
    "baseline is Async DiLoCo, whose one server sits in the first region, so the second region's nodes "
    "cross the slow link at every update; HALoS's workers talk to their region's server.",
    "decoupled": "The GPT on 4 learners of equal speed (0.1 s steps) on a 100 Mbit/s, 30 ms network; the "
    "same availability trace takes learners 1, 2 and 3 away in turn. Synchronous DiLoCo drops an absent "
    "learner for the round and the others go on; Decoupled DiLoCo's learners never wait.",
}

STUDIES: dict[str, tuple[str, Callable[[Runs, Scale], tuple[list[str], list[Claim]]]]] = {
    "diloco": ("DiLoCo against DDP (arXiv 2311.08105)", diloco_section),
    "scaling": ("DiLoCo's scaling laws and DDP's bytes (arXiv 2503.09799)", scaling_section),
    "streaming": ("Streaming DiLoCo against DiLoCo, and its bandwidth table (arXiv 2501.18512)", streaming_section),
    "sparta": ("SPARTA alone and with DiLoCo", sparta_section),
    "demo": ("DeMo against DDP-AdamW (arXiv 2411.19870)", demo_section),
    "fedavg": ("FedAvg: IID against Dirichlet label skew, with client sampling", fedavg_section),
    "low_comm": ("SparseLoCo and eager DiLoCo against DiLoCo", low_comm_section),
    "algorithms": ("PowerSGD, top-k, DES-LOC, NoLoCo and MuLoCo", algorithms_section),
    "rosenbrock": ("DES-LOC's Rosenbrock toy (arXiv 2505.22549)", fidelity_rosenbrock.section),
    **{name: (entry[0], fidelity_async.section(name)) for name, entry in fidelity_async.STUDIES.items()},
}


def study_runs(study: str, runs: Runs, scale: Scale) -> list[str]:
    """The labels of the runs a study's plots show."""
    k, h0 = scale.nodes[0], min(scale.H)
    if study == "diloco":
        return [f"{r} K={n}" for n in scale.nodes for r in ["ddp", *(f"diloco H={h}" for h in scale.H)]]
    if study == "scaling":
        return ["ddp M=1", f"diloco H={h0} M=1", f"diloco H={h0} M=2", f"diloco H={h0} K={k}"]
    if study == "streaming":
        return [f"diloco H={h0} K={k}", *(f"{r} K={k}" for r in streaming_runs(scale, tuned_of(runs)))]
    if study == "sparta":
        return [
            label
            for label in runs.rows
            if label.endswith(f" K={k}")
            and ("sparta" in label or label.startswith(("ddp", f"diloco H={max(scale.H)}")))
        ]
    if study == "demo":
        return [f"ddp K={k}", f"demo K={k}"]
    if study == "low_comm":
        return [f"{r} H={h0} K={k}" for r in ("diloco", "sparseloco", "eager_diloco")]
    if study == "algorithms":
        kb = max(scale.nodes)
        mine = [f"{label} K={n}" for n in scale.nodes for label in algorithm_runs(scale, n, tuned_of(runs))]
        return [f"ddp K={k}", f"diloco H={h0} K={k}", *mine, f"diloco H={h0} K={kb}"]
    if study == "fedavg":
        return [label for label in runs.rows if label.endswith((" iid", " dirichlet"))]
    return [label for label in runs.rows if label.endswith(f" [{study}]")]


def tuning_lines(runs: Runs, scale: Scale) -> list[str]:
    """How each GPT method's settings were chosen (``tune``), and the table of its choices."""
    tuned = runs.exact.get("tuned", {})
    factors = ", ".join(f"{f:g}" for f in scale.lr_factors)
    momenta = ", ".join(f"{m:g}" for m in scale.momenta)
    lines = [
        f"Tuning, before the report's runs: each GPT method trained once per setting on seed {scale.tune_seed} "
        f"(held out: not one of the report's seeds) at K={scale.nodes[0]} (MuLoCo K={max(scale.nodes)}), "
        f"H={min(scale.H)}, {scale.steps} steps, with its inner learning rate at {factors} times its base "
        f"(AdamW and sign-SGD {LR:g}, Muon {MUON_LR:g}) and, with an outer step, momentum {momenta}; the lowest "
        "final validation loss chose the setting every run of that method uses, at every K, H and p. The "
        "asynchronous studies, FedAvg and the toy keep the base settings.",
        "",
        "| method | inner lr | outer momentum | validation loss on the tuning seed, per setting |",
        "|---|---|---|---|",
    ]
    chosen = tuned_of(runs)
    for name in METHODS:
        hp = chosen[name]
        base = MUON_LR if name == "muloco" else LR
        losses = tuned.get(name, {}).get("losses", {})
        tried = ", ".join(f"{label.removeprefix(name + ' ')}: {v:.4f}" for label, v in losses.items()) or "one setting"
        lines.append(
            f"| {name} | {base * hp.lr_factor:g} (x{hp.lr_factor:g}) | {f'{hp.momentum:g}' if name in OUTER else '-'} "
            f"| {tried} |"
        )
    return lines


def write_report(runs: Runs, scale: Scale, scale_name: str, out: str, command: str) -> str:
    """Write ``<out>/report.md`` and the plots; return the report's path."""
    os.makedirs(out, exist_ok=True)
    gpt_params = sum(p.numel() for p in gpt_model(scale).parameters())  # (no corpus to read)
    settings = [
        f"GPT runs: byte-level GPT, {scale.n_layer} layers x {scale.n_embd} wide ({gpt_params / 1e6:.2f}M "
        f"parameters), context {scale.block}, on the Python standard library's source; {scale.steps} steps, "
        f"batch {scale.batch_size} per node, each method's inner optimizer (AdamW; DeMo's sign-SGD; MuLoCo's "
        "Muon) at its tuned learning rate and, where it has one, its outer Nesterov step (lr 0.7) at its tuned "
        "momentum (the tuning table below). FedAvg runs: the 64-256-256-10 MLP on scikit-learn's digits, "
        f"{scale.clients} "
        f"clients, H={scale.fed_H}, {scale.fed_steps} steps ({scale.fed_steps // scale.fed_H} rounds), batch "
        f"{scale.fed_batch}. Every run is repeated over seeds {list(scale.seeds)} (model initialisation, data "
        "order, the strategies' draws, the FedAvg split and drawn speeds); a number is the mean over seeds with "
        "its 95% confidence interval (Student t, see docs/user-guide/sweeps.md), a comparison of two runs is "
        "their ratio (or difference) seed by seed with its interval, and a verdict compares intervals: "
        "'agrees' or 'does not agree' when they are apart, 'cannot tell at this scale' when they overlap; "
        "'exact' marks a finding that follows from the algorithm's definition (the same for every seed). "
        "Validation loss is the average model's; simulated time on the `internet` network (see "
        "docs/user-guide/networks.md) with FLOP-based compute, unless a study names its world. An asynchronous "
        f"run counts ticks, which follow its fastest nodes, so it gets more of them than its baseline gets "
        f"steps ({', '.join(f'{n}: {t}x' for n, t in fidelity_async.TICKS.items())}).",
        "",
        *tuning_lines(runs, scale),
        "",
        "Scale matters: the papers train for tens of thousands of steps with hundreds of millions of "
        "parameters; these runs take minutes on a laptop CPU. Where a finding needs the long run, the "
        "verdict says so ('does not agree' or 'cannot tell at this scale', with the reason beside it) rather "
        "than tuning until it agrees: every criterion is fixed in the script before the runs.",
    ]
    if len(scale.seeds) < 5:
        settings += ["", f"**{scale_name} scale: {len(scale.seeds)} seeds only, so the intervals are wide; the "
                     f"full report runs {len(SCALES['full'].seeds)}.**"]  # fmt: skip
    claims: list[Claim] = []
    body: list[str] = []
    for study, (title, section) in STUDIES.items():
        table, found = section(runs, scale)
        claims += found
        labels = study_runs(study, runs, scale)
        metrics = ("val_loss", "val_accuracy") if study in ("fedavg", "fedbuff") else ("val_loss",)
        histories = {lb: runs.histories[lb] for lb in labels}
        plots = plot_seed_curves(histories, os.path.join(out, study), title=title, metrics=metrics)
        captions = dict.fromkeys(runs.captions[lb] for lb in labels)  # distinct, in order
        body += ["", f"## {title}", "", *(f"- {c}" for c in captions), "", *table, ""]
        body += [NOTES[study], "", f"Findings: {', '.join(dict.fromkeys(c.source for c in found))} in the table above."]
        body += ["", " ".join(f"![{os.path.basename(p)}]({study}/{os.path.basename(p)})" for p in plots)]
    verdicts = [c.verdict for c in claims]
    counts = {v: verdicts.count(v) for v in (AGREES, CANNOT_TELL, DISAGREES)}
    exact = sum(c.exact for c in claims)
    lines = [
        "# ExoGym fidelity report",
        "",
        f"**{counts[AGREES]} of {len(verdicts)} findings agree, {counts[DISAGREES]} do not, and at this scale "
        f"we cannot tell for {counts[CANNOT_TELL]} (their 95% intervals overlap).**",
        "",
        f"Command: `{command}` ({scale_name} scale); {datetime.date.today()}, {runs.wall / 60:.1f} min wall on "
        f"{os.cpu_count()} CPU cores ({platform.machine()}), torch {torch.__version__}. {len(verdicts)} findings "
        f"of {len(dict.fromkeys(c.source for c in claims))} papers, {exact} of them exact, the others over "
        f"{len(scale.seeds)} seeds.",
        "",
        *claims_table(claims),
        "",
        *settings,
        *body,
    ]
    path = os.path.join(out, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


@quiet_interrupt
def main(argv: Sequence[str] | None = None) -> None:
    p = script_parser(__doc__, "python benchmarks/fidelity.py")
    p.add_argument("--quick", action="store_true", help="the smoke-test scale: 2 seeds, smaller runs")
    p.add_argument("--out", default=None, help="report folder (default benchmarks/fidelity, or .../fidelity-quick)")
    p.add_argument(
        "--runs-dir", default=None, help="where each run's metrics.csv goes (default exogym_runs/fidelity[-quick])"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="write the report again from <runs-dir>/runs.json (saved by the last run) without training",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    scale_name = "quick" if args.quick else "full"
    out = args.out or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "fidelity" + ("-quick" if args.quick else "")
    )
    runs_dir = args.runs_dir or os.path.join("exogym_runs", "fidelity" + ("-quick" if args.quick else ""))
    saved = os.path.join(runs_dir, "runs.json")
    if args.report_only:
        if not os.path.exists(saved):
            p.error(f"--report-only: {saved} does not exist; run without --report-only first")
        runs = Runs.load(saved)
    else:
        scale = SCALES[scale_name]
        logger.info("%s scale: every run over seeds %s", scale_name, list(scale.seeds))
        runs = run_all(scale, runs_dir, progress=not args.no_progress)
        runs.save(saved)
        os.remove(os.path.join(runs_dir, "runs.partial.json"))
    command = "python benchmarks/fidelity.py" + (" --quick" if args.quick else "")
    path = write_report(runs, SCALES[scale_name], scale_name, out, command)
    logger.info("wrote %s (runs: %.1f min)", path, runs.wall / 60)


if __name__ == "__main__":
    sys.exit(main())
