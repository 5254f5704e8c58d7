"""Soak: 1,000 FedAvg clients with client sampling and stragglers, the run SIGKILLed at a random
round and resumed from its checkpoint; the final parameters equal an uninterrupted run's.

The work: 1,000 clients on 2 workers, each owning 80 digits drawn with its own seed, the MLP
64-32-10, FedAvg with plain SGD (lr 0.05), H local steps of batch 8 per sampled client (1% sampled
per round). Sampled FedAvg runs as a server on the simulated clock (``FedAvgStrategy(client_sampling
=...)`` is a ``ServerStrategy`` running ``FedAvgServer``): a client no round draws is never built.
Stragglers are the clients' own speeds, drawn once per client from ``LogNormal(0, 0.5)``
(``Network(compute_slowdown=...)``: 10 ms of compute per step times the client's factor); server
strategies take no ``faults=``, so no client drops out. With speeds drawn from a continuous
distribution the drawn clients' step starts coincide only at a round's start: a round is
``1 + 10 (H - 1)`` ticks of the clock, and ``fit``'s steps and ``checkpoint_interval`` count
ticks (a checkpoint is taken between two ticks, with the round's slowest client still in flight).

Three fresh Python processes: the whole run; the same run with a checkpoint every
``--checkpoint-rounds`` rounds, SIGKILLed (the process that called ``fit``, as a pre-empted job
is) at a round drawn from ``--seed`` after its first checkpoint; its resumption with
``resume_from``. The report gives the three times, the rounds the whole run completed, the
checkpoint resumed from, whether any process of the killed run outlived it by 5 s, whether the
parameters are bit-identical, and the whole run's peak RSS per worker process (the largest)
sampled every 0.2 s, at each tenth of its time in ``fit``.

    python benchmarks/soak.py                      # 500 rounds, checkpoints every 100
    python benchmarks/soak.py --quick --out DIR    # 100 rounds of H=2, checkpoints every 30 (the test's form)
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time

from timed_children import PeakBelow, descendants  # this folder is the script's first import path

from exogym.cli import int_at_least, quiet_interrupt, script_parser

logger = logging.getLogger("benchmarks.soak")
CLIENTS, WORKERS, SAMPLING, BATCH, PER_CLIENT, SIZES = 1000, 2, 0.01, 8, 80, (64, 32, 10)


def round_ticks(H: int) -> int:
    """Ticks of one round: the drawn clients' first steps start together, and each of their other
    ``H - 1`` steps at an instant of its own (their speeds differ)."""
    return 1 + round(SAMPLING * CLIENTS) * (H - 1)


@functools.cache
def _digits():
    from exogym.tasks import digits_datasets

    return digits_datasets()[0]


def client_data(rank: int, num_nodes: int, train: bool):
    """Client ``rank``'s 80 digits (drawn with its own seed), a ``dataset_factory``."""
    import torch
    from torch.utils.data import Subset

    data = _digits()
    g = torch.Generator().manual_seed(rank)
    return Subset(data, torch.randint(0, len(data), (PER_CLIENT,), generator=g).tolist())


def _train(args: argparse.Namespace) -> None:
    """The child: one ``fit``; its final parameters to ``--params``, its report as JSON on stdout."""
    import torch
    from torch.distributions import LogNormal

    from exogym import Network, Trainer
    from exogym.strategy import FedAvgStrategy
    from exogym.tasks import MLPClassifier

    torch.manual_seed(0)  # the same initial model in every child
    trainer = Trainer(MLPClassifier(SIZES), client_data)
    ticks = round_ticks(args.H)
    t0 = time.perf_counter()
    with PeakBelow(0.2) as peak:
        model = trainer.fit(
            FedAvgStrategy(H=args.H, client_sampling=SAMPLING, optim_spec="sgd", lr=0.05),
            num_nodes=CLIENTS,
            workers=WORKERS,
            max_steps=ticks * args.rounds,
            batch_size=BATCH,
            log_interval=ticks,
            val_size=0,
            progress=False,
            logger=False,
            device="cpu",
            # stragglers: each client's speed drawn once from the run's seed; simulated time deterministic
            network=Network(1e9, 1e-3, compute=0.01, compute_slowdown=LogNormal(0.0, 0.5)),
            checkpoint_dir=args.checkpoint_dir,
            checkpoint_interval=ticks * args.checkpoint_rounds if args.checkpoint_dir else None,
            resume_from=args.resume_from,
        )
    fit_s = time.perf_counter() - t0
    torch.save([p.detach() for p in model.parameters()], args.params)
    tenths = [max((mb for t, mb in peak.samples if t <= fit_s * i / 10), default=0.0) for i in range(1, 11)]
    rounds = trainer.result["summary"]["rounds"]
    train_s = trainer.history[-1]["wall_time"]  # the clock's run, without fit's start-up
    sys.stdout.write(json.dumps({"fit_s": fit_s, "train_s": train_s, "rounds": rounds, "rss_mb": tenths}) + "\n")


def _child_cmd(args: argparse.Namespace, params: str, *extra: str) -> list[str]:
    return [
        sys.executable, os.path.abspath(__file__), "--child", "--H", str(args.H), "--rounds", str(args.rounds),
        "--checkpoint-rounds", str(args.checkpoint_rounds), "--params", params, *extra,
    ]  # fmt: skip


def _run(cmd: list[str]) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"soak child failed:\n{out.stderr[-3000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "total_s": time.perf_counter() - t0}


def _killed(args: argparse.Namespace, root: str, round_s: float) -> dict:
    """Start the checkpointing run, SIGKILL it at a random round after its first checkpoint."""
    from exogym.runtime import checkpoint as ckpt

    target = random.Random(args.seed).randint(args.checkpoint_rounds + 1, args.rounds - 1)
    log = os.path.join(args.out, "killed.log")  # a file, not a pipe: a full pipe would stall the run
    with open(log, "w") as err:
        proc = subprocess.Popen(
            _child_cmd(args, os.path.join(args.out, "killed.pt"), "--checkpoint-dir", root),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        at = _wait_for_round(proc, root, target, round_s, round_ticks(args.H), log)
        below = descendants(proc.pid)
        if proc.poll() is not None:
            raise RuntimeError("the run ended before it was killed: pass more --rounds")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 5.0
        while (left := [p for p in below if _is_alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    resumed_at = ckpt.load_meta(ckpt.newest(root))["step"] // round_ticks(args.H)
    return {
        "target_round": target, "killed_at_round": at, "processes_below": len(below), "left_after_5s": left,
        "resume_round": resumed_at,
    }  # fmt: skip


def _wait_for_round(proc: subprocess.Popen, root: str, target: int, round_s: float, ticks: int, log: str) -> float:
    """Wait until the run is at round ``target`` by its own pace: the time since its newest
    checkpoint over its seconds per round between checkpoints (before its second checkpoint, the
    whole run's ``round_s``; a round is ``ticks`` steps). Returns that estimate of the round."""
    from exogym.runtime import checkpoint as ckpt

    seen: list[tuple[int, float]] = []  # (round, time) of each checkpoint when it appeared
    while True:
        if proc.poll() is not None:
            with open(log) as f:
                raise RuntimeError(f"the run to kill ended before round {target}:\n{f.read()[-3000:]}")
        folder = ckpt.newest(root)
        if folder is not None:
            done = int(os.path.basename(folder).removeprefix("step-")) // ticks
            if not seen or seen[-1][0] != done:
                seen.append((done, time.monotonic()))
        if seen:
            (r0, t0), (r1, t1) = seen[0], seen[-1]
            pace = (t1 - t0) / (r1 - r0) if r1 > r0 else round_s
            at = r1 + (time.monotonic() - t1) / pace
            if at >= target:
                return at
        time.sleep(0.02)


def _is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _soak(args: argparse.Namespace) -> dict:
    import torch

    os.makedirs(args.out, exist_ok=True)
    root = os.path.join(args.out, "ckpt")
    shutil.rmtree(root, ignore_errors=True)  # an earlier soak's checkpoints are not this one's
    whole = _run(_child_cmd(args, os.path.join(args.out, "whole.pt")))
    logger.info("whole run: %.1f s (fit %.1f s, training %.1f s)", whole["total_s"], whole["fit_s"], whole["train_s"])
    kill = _killed(args, root, whole["train_s"] / args.rounds)
    logger.info(
        "killed at round %.1f by its pace (drawn: %d; %d processes below it, %d left 5 s later); resumed from %d",
        kill["killed_at_round"], kill["target_round"], kill["processes_below"], len(kill["left_after_5s"]),
        kill["resume_round"],
    )  # fmt: skip
    resumed = _run(_child_cmd(args, os.path.join(args.out, "resumed.pt"), "--resume-from", root))
    logger.info("resumed run: %.1f s (fit %.1f s)", resumed["total_s"], resumed["fit_s"])
    a = torch.load(os.path.join(args.out, "whole.pt"))
    b = torch.load(os.path.join(args.out, "resumed.pt"))
    equal = len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    rss = whole["rss_mb"]  # at each tenth of the whole run's time in fit
    first = max(0, -(-10 * args.checkpoint_rounds // args.rounds) - 1)  # the first tenth past the first checkpoint
    growth = rss[-1] / rss[first] - 1 if rss[first] else float("nan")
    logger.info("whole run: %d rounds", whole["rounds"])
    logger.info("final parameters bit-identical to the whole run's: %s", equal)
    logger.info("peak RSS per worker, MB, by tenth of the run: %s", ", ".join(f"{mb:.0f}" for mb in rss))
    logger.info(
        "growth from the %d%% mark (past round %d) to the end: %.2f%%",
        10 * (first + 1),
        args.checkpoint_rounds,
        100 * growth,
    )
    report = {
        "whole": whole, "resumed": resumed, **kill, "bit_identical": equal, "rss_growth_after_first_checkpoint": growth,
    }  # fmt: skip
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f)
    return report


@quiet_interrupt
def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="100 rounds of H=2, a checkpoint every 30 rounds")
    parser.add_argument("--rounds", type=int_at_least(3), default=500, help="FedAvg rounds")
    parser.add_argument("--H", type=int_at_least(1), default=10, help="local steps per round")
    parser.add_argument("--checkpoint-rounds", type=int_at_least(1), default=100, help="rounds between checkpoints")
    parser.add_argument("--seed", type=int, default=0, help="draws the round at which the run is killed")
    parser.add_argument("--out", default="exogym_runs/soak", help="folder of the parameters, checkpoints and report")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--resume-from", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import exogym

        exogym.prestart()
        _train(args)
        return
    if args.quick:
        args.rounds, args.H, args.checkpoint_rounds = 100, 2, 30
    if args.checkpoint_rounds >= args.rounds - 1:
        parser.error(f"--checkpoint-rounds must be below --rounds - 1 ({args.rounds - 1}) to kill after a checkpoint")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    report = _soak(args)
    sys.exit(0 if report["bit_identical"] and not report["left_after_5s"] else 1)


if __name__ == "__main__":
    main()
