"""Many short runs in one program: successive ``fit`` calls on warm worker processes against the
sum of in-process loops doing the same training.

Two workloads, each run three ways, every side in a fresh Python process timed from its start
(torch's import included) to its end:

* ``grid``: DDP, DiLoCo and SPARTA (the presets: AdamW lr 1e-3; DiLoCo's outer Nesterov lr 0.7,
  momentum 0.5; SPARTA p=0.005) x H in ``--H`` x seeds in ``--seeds``, K=4 nodes of the digits
  MLP (64-256-256-10), batch 32, 200 steps each. H does not apply to DDP nor SPARTA: they run
  at every H all the same, on both sides. The loop trains the K model copies in one process:
  DDP averages their gradients every step, DiLoCo steps an outer Nesterov SGD on the mean
  pseudo-gradient every H steps, SPARTA averages 0.5% of every parameter (random indices) every
  step.
* ``fedavg``: ``--runs`` runs (seeds 0, 1, ...) of FedAvg over 1,000 clients with 1% client
  sampling, 5 rounds of 10 local SGD steps of batch 8 (the work of ``virtual_nodes.py``); the
  loop trains each round's sampled clients (the same draw) from the global model and averages
  them.

The three sides: ``loop`` (the in-process loops, one after the other), ``warm`` (``fit`` after
``fit``: the worker processes of a run serve the next), ``fresh`` (the same, with
``exogym.shutdown()`` after every run: every run starts its workers from the fork server, which
stays up). "start-up/run" is the mean over the runs after the first of a run's ``fit`` time less
its training (from the first training step to the last): planning, sending the job, building
the nodes, and the end (final average, result back). "CPU s" is the CPU time of the side's
process and all its descendants (fork server, workers): on a loaded machine it moves far less
than wall time.

    python benchmarks/warm_workers.py grid
    python benchmarks/warm_workers.py fedavg --runs 50
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import time

from e2e import _train_data, average_gradients  # this folder is the script's first import path
from timed_children import run_child
from virtual_nodes import BATCH, _strategy, client_data, fedavg_loop
from virtual_nodes import H as ROUND_STEPS

from exogym.cli import int_at_least, quiet_interrupt, script_parser

logger = logging.getLogger("benchmarks.warm_workers")
STRATEGIES = ("ddp", "diloco", "sparta")
K, STEPS, GRID_BATCH, LR = 4, 200, 32, 1e-3
CLIENTS, SAMPLING, ROUNDS = 1000, 0.01, 5
SIDES = ("loop", "warm", "fresh")


def _grid_points(hs: list[int], seeds: list[int]) -> list[tuple[str, int, int]]:
    return [(s, h, seed) for s in STRATEGIES for h in hs for seed in seeds]


def _grid_loop(strategy: str, h: int, seed: int) -> None:
    """K model copies trained in one process as ``strategy`` trains them (module docstring)."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from exogym.tasks import MLPClassifier

    train = _train_data(K, GRID_BATCH)
    torch.manual_seed(seed)
    base = MLPClassifier()
    models = [MLPClassifier() for _ in range(K)]
    for m in models:
        m.load_state_dict(base.state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=LR) for m in models]
    outer = torch.optim.SGD(base.parameters(), lr=0.7, momentum=0.5, nesterov=True)
    samplers = [DistributedSampler(train, K, r, shuffle=True, seed=seed) for r in range(K)]
    loaders = [DataLoader(train, batch_size=GRID_BATCH, sampler=s, drop_last=True) for s in samplers]

    def batches(loader, sampler):
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    its = [batches(lo, s) for lo, s in zip(loaders, samplers, strict=True)]
    for step in range(STEPS):
        for m, it, o in zip(models, its, opts, strict=True):
            o.zero_grad()
            m(next(it)).backward()
        if strategy == "ddp":
            average_gradients(models)
        for o in opts:
            o.step()
        with torch.no_grad():
            if strategy == "sparta":
                for ps in zip(*(m.parameters() for m in models), strict=True):
                    flat = [p.view(-1) for p in ps]
                    idx = torch.randint(0, flat[0].numel(), (max(1, int(0.005 * flat[0].numel())),))
                    mean = torch.stack([f[idx] for f in flat]).mean(0)
                    for f in flat:
                        f[idx] = mean
            elif strategy == "diloco" and (step + 1) % h == 0:
                for g, *ps in zip(base.parameters(), *(m.parameters() for m in models), strict=True):
                    g.grad = g - torch.stack(ps).mean(0)
                outer.step()
                for m in models:
                    m.load_state_dict(base.state_dict())


def _grid_fit(strategy: str, h: int, seed: int) -> tuple[float, float]:
    """One ExoGym run of the grid; its ``fit`` time and its training time."""
    import torch

    from exogym import Trainer
    from exogym.strategy.registry import build
    from exogym.tasks import MLPClassifier

    torch.manual_seed(seed)
    trainer = Trainer(MLPClassifier(), _train_data(K, GRID_BATCH))
    t0 = time.perf_counter()
    trainer.fit(
        build(strategy, LR, h),
        num_nodes=K,
        max_steps=STEPS,
        batch_size=GRID_BATCH,
        device="cpu",
        seed=seed,
        progress=False,
        logger=False,
        log_interval=20,
    )
    walls = [r["wall_time"] for r in trainer.history if "train_loss" in r]
    return time.perf_counter() - t0, walls[-1]


def _fedavg_loop(seed: int) -> int:
    """The sampled clients of every round trained from the global model in one process, then
    averaged (``virtual_nodes.fedavg_loop``); the examples trained on."""
    import torch

    torch.manual_seed(seed)
    return fedavg_loop(CLIENTS, SAMPLING, ROUNDS, seed)


def _fedavg_fit(seed: int) -> tuple[float, float, int]:
    """One ExoGym FedAvg run; its ``fit`` time, training time and examples trained on."""
    import torch

    from exogym import Trainer
    from exogym.tasks import MLPClassifier

    torch.manual_seed(seed)
    trainer = Trainer(MLPClassifier(), client_data)
    t0 = time.perf_counter()
    trainer.fit(
        _strategy(SAMPLING),
        num_nodes=CLIENTS,
        max_steps=ROUND_STEPS * ROUNDS,
        batch_size=BATCH,
        seed=seed,
        log_interval=ROUND_STEPS,
        progress=False,
        logger=False,
        device="cpu",
    )
    walls = [r["wall_time"] for r in trainer.history if "train_loss" in r]
    return time.perf_counter() - t0, walls[-1], trainer.history[-1]["examples"]


def _child(args: argparse.Namespace) -> dict:
    """Runs inside the timed subprocess: every run of the workload on one side."""
    if args.side != "loop":
        import exogym

        exogym.prestart()  # a script's first statement, as the docs recommend
    else:
        import torch

        torch.set_num_threads(args.loop_threads)
    logging.getLogger("exogym").setLevel(logging.ERROR)  # the factory's "no validation" notice
    runs = (
        [("grid", p) for p in _grid_points(args.H, args.seeds)]
        if args.workload == "grid"
        else [("fedavg", (s,)) for s in range(args.runs)]
    )
    fit_s, train_s, examples = [], [], 0
    for workload, point in runs:
        if args.side == "loop":
            if workload == "grid":
                _grid_loop(*point)
            else:
                examples += _fedavg_loop(*point)
            continue
        if workload == "grid":
            f, t = _grid_fit(*point)
        else:
            f, t, n = _fedavg_fit(*point)
            examples += n
        fit_s.append(f)
        train_s.append(t)
        if args.side == "fresh":
            import exogym

            exogym.shutdown()
    return {"runs": len(runs), "fit_s": fit_s, "train_s": train_s, "examples": examples}


@quiet_interrupt
def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("workload", choices=["grid", "fedavg"], help="what to run")
    parser.add_argument("--H", type=lambda s: [int(x) for x in s.split(",")], default=[10, 20, 50])
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    parser.add_argument("--runs", type=int_at_least(1), default=50, help="FedAvg runs (seeds 0, 1, ...)")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated from {', '.join(SIDES)}")
    parser.add_argument(
        "--loop-threads",
        type=int_at_least(1),
        default=1,
        help="intra-op threads of the loop (ExoGym's workers use one each); the MLP's matmuls gain little from more",
    )
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", default="warm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.stdout.write(json.dumps(_child(args)) + "\n")
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    flags = [args.workload, "--H", ",".join(map(str, args.H)), "--seeds", ",".join(map(str, args.seeds))]
    flags += ["--runs", str(args.runs), "--loop-threads", str(args.loop_threads)]
    sides = [s for s in args.sides.split(",") if s]
    out = {side: _timed(side, flags) for side in sides}
    examples = {out[s]["examples"] for s in sides}
    assert len(examples) == 1, out  # the same sampled work on every side
    n = out[sides[0]]["runs"]
    logger.info("%s: %d runs, %s, %d cores", args.workload, n, _describe(args), os.cpu_count())
    columns = ("side", "total s", "x loop", "CPU s", "x loop", "s per run", "start-up/run s", "first run s")
    logger.info("%-6s %9s %7s %9s %7s %10s %15s %12s", *columns)
    base = out.get("loop")
    for side in sides:
        r = out[side]
        ratio = f"{r['total_s'] / base['total_s']:.2f}" if base else "-"
        cpu_ratio = f"{r['cpu_s'] / base['cpu_s']:.2f}" if base else "-"
        startup = [f - t for f, t in zip(r["fit_s"], r["train_s"], strict=True)]
        mean_startup = f"{sum(startup[1:]) / max(1, len(startup) - 1):.3f}" if startup else "-"
        first = f"{r['fit_s'][0]:.2f}" if r["fit_s"] else "-"
        logger.info(
            "%-6s %9.2f %7s %9.2f %7s %10.3f %15s %12s",
            side, r["total_s"], ratio, r["cpu_s"], cpu_ratio, r["total_s"] / n, mean_startup, first,
        )  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


def _timed(side: str, flags: list[str]) -> dict:
    """One side in a fresh Python (``run_child``), with ``cpu_s``: the CPU seconds of that
    process and every process under it (fork server, workers), which the machine's load does not
    inflate as it does wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = run_child(__file__, [*flags, "--side", side])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {**out, "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)}


def _describe(args: argparse.Namespace) -> str:
    if args.workload == "grid":
        return f"{'/'.join(STRATEGIES)} x H={args.H} x seeds {args.seeds}, K={K}, {STEPS} steps"
    return f"{CLIENTS} clients, {SAMPLING:.0%} sampled, {ROUNDS} rounds of {ROUND_STEPS} steps"


if __name__ == "__main__":
    main()
