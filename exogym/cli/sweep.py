"""Sweeps: strategies over a grid of arguments and several seeds, with means and confidence
intervals, resumable run by run."""

from __future__ import annotations

import contextlib
import copy
import csv
import dataclasses
import functools
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exogym import runs
from exogym.adversaries import Adversaries
from exogym.cli import measured_compute
from exogym.cli.aggregate import aggregate, format_sweep_table, summary_columns
from exogym.cli.grid import Point, points
from exogym.cli.sweep_packing import Job, Lanes, check_parallel, width
from exogym.cli.sweep_plots import plot_sweep
from exogym.cli.sweep_runs import Outcome, Runner, keep, network_of
from exogym.cli.sweep_store import RunStore, run_key
from exogym.cli.target import time_to_target
from exogym.core.comm.network import Network
from exogym.core.strategy import Strategy
from exogym.run_config import check_keywords
from exogym.runs import check_name
from exogym.runtime import cluster, pool
from exogym.runtime.launch import start_processes_server
from exogym.runtime.plan import check_adversaries, check_rules, resolve_workers, usable_cpus
from exogym.scale import Scale, as_scale
from exogym.strategy.registry import PRESETS, call_factory
from exogym.tasks import Task, load

logger = logging.getLogger(__name__)

__all__ = ["RUN_COLUMNS", "Sweep", "SweepInterrupted", "report_sweep", "sweep"]

#: Columns of ``runs.csv`` besides the grid's names: one row per run.
RUN_COLUMNS = ("val_loss", "val_accuracy", "bytes_sent_per_node", "sim_time", "wall_time", "steps")


@dataclass
class Sweep:
    """What [`sweep`][exogym.sweep] produced.

    Attributes:
        out_dir: the sweep's folder: ``summary.csv``, ``runs.csv``, the plots, and ``runs/<key>/``
            per run.
        axes: the grid's names, in order.
        runs: one row per run that finished (``strategy``, the grid's names, ``seed``,
            ``RUN_COLUMNS``, ``time_to_target`` with a target loss, ``key``, ``label``), in run
            order; a grid name that does not apply to the strategy is ``None``.
        summary: one row per strategy and grid point (``exogym.cli.aggregate.aggregate``).
        failures: a run's label -> the exception that stopped it (the others still ran).
        executed: how many runs trained in this call; ``reused``: how many were read back from
            ``runs/``, finished by an earlier call.
        startup_time: seconds before the first run (task data, process server).
        caption: the settings, as written under the plots.
        plots: paths of the PNG files written.
        histories: a run's label -> its ``Trainer.history`` rows.
        parallel: how many runs trained at once (``exogym.cli.sweep_packing``).
    """

    out_dir: str
    axes: list[str]
    runs: list[dict[str, Any]] = field(default_factory=list)
    summary: list[dict[str, Any]] = field(default_factory=list)
    failures: dict[str, Exception] = field(default_factory=dict)
    executed: int = 0
    reused: int = 0
    startup_time: float = 0.0
    caption: str = ""
    plots: list[str] = field(default_factory=list)
    histories: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    target_loss: float | None = None
    parallel: int = 1


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a sweep; the message says what finished and how to go on."""


def _factories(strategies: Sequence[str] | Mapping[str, Any]) -> dict[str, tuple[Callable[..., Strategy], str]]:
    """label -> (factory, its name in the runs' keys)."""
    if not isinstance(strategies, Mapping):
        unknown = [n for n in strategies if n not in PRESETS]
        if unknown or not strategies:
            raise ValueError(f"strategies: unknown {unknown}; choose from {sorted(PRESETS)}")
        return {n: (PRESETS[n][0], f"preset:{n}") for n in strategies}
    out: dict[str, tuple[Callable[..., Strategy], str]] = {}
    for label, made in strategies.items():
        check_name(label, "a strategy's label")
        if isinstance(made, Strategy):  # one instance: a fresh copy for every run
            out[label] = ((lambda s=made: copy.deepcopy(s)), f"instance:{type(made).__qualname__}")
        elif callable(made):
            out[label] = (made, f"factory:{getattr(made, '__module__', '')}.{getattr(made, '__qualname__', made)}")
        else:
            raise TypeError(f"strategies[{label!r}] must be a Strategy or a factory returning one, got {made!r}")
    return out


def _check_settings(seeds: Sequence[int], lr: float | None, target_loss: float | None, confidence: float) -> None:
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: a seed is listed twice in {list(seeds)}")
    if lr is not None and not lr > 0:
        raise ValueError(f"lr must be > 0 (or None for the task's default), got {lr}")
    if target_loss is not None and not math.isfinite(target_loss):
        raise ValueError(f"target_loss must be a finite number, got {target_loss}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def sweep(
    task: str | Task,
    strategies: Sequence[str] | Mapping[str, Callable[..., Strategy] | Strategy],
    grid: Mapping[str, Sequence[Any]] | None = None,
    seeds: Sequence[int] = (42,),
    nodes: int = 4,
    steps: int = 200,
    batch_size: int = 32,
    lr: float | None = None,
    H: int = 20,
    network: str | Network = "internet",
    compute: str | float | None = None,
    out_dir: str = "exogym_runs/sweep",
    device: str = "cpu",
    data_dir: str = "data",
    val_size: int = 512,
    progress: bool = True,
    workers: int | None = None,
    target_loss: float | None = None,
    confidence: float = 0.95,
    flops_per_second: float | None = None,
    raise_on_failure: bool = False,
    parallel: int | str = "auto",
    scale: Scale | str | float | None = None,
    adversaries: Adversaries | None = None,
) -> Sweep:
    """Train every strategy at every point of ``grid`` and every seed, each run as
    [`exogym.cli.compare.compare`][exogym.cli.compare.compare] trains one (same model, data and
    settings for the same arguments); write ``runs.csv`` (one row per run), ``summary.csv`` (one row
    per strategy and point: mean, standard deviation and ``confidence`` interval over the seeds, see
    [`exogym.stats`][exogym.stats]) and the plots of ``exogym.cli.sweep_plots.plot_sweep`` into
    ``out_dir``.

    Resumable: each run is written to ``<out_dir>/runs/<key>/run.json`` when it finishes, keyed
    by a hash of its full configuration (task, strategy and its parameters, run settings,
    seed); a later sweep with the same ``out_dir`` reads finished runs back instead of training
    them again, so the same call after Ctrl-C, SIGTERM or a crash runs only the rest. The key holds a
    factory's name, not its code: after changing a factory, use another ``out_dir``. A
    ``run.json`` carries the digest of its content: one that is damaged or edited is named in a
    warning, moved aside to ``runs/<key>.damaged-N`` and trained again
    (``exogym.cli.sweep_store``); a failed run's folder holds a ``FAILED`` file with its error.

    Args:
        task, nodes, steps, batch_size, lr, H, network, compute, device, data_dir, val_size, progress, workers: as
            for [`compare`][exogym.cli.compare.compare]: the values where the grid has none.
        strategies: preset names, or ``{label: factory}``: a factory is called with those of
            ``lr``, ``H`` and the grid's names that its signature names, and returns a fresh
            [`Strategy`][exogym.strategy.Strategy] (a ``Strategy`` instance is copied per run).
        grid: name -> values (``exogym.cli.grid``); several names make their product. A
            strategy parameter applies to the strategies whose factory takes it; the others run
            once for all its values.
        seeds: each point runs once per seed (model initialisation, data order, the strategy's
            and the network's randomness).
        target_loss: also report each run's simulated time to this validation loss
            (``exogym.cli.target.time_to_target``) and its statistics.
        flops_per_second: a node's throughput for ``compute="flops"`` (``None``: the network's).
        raise_on_failure: re-raise the first failing run's exception (after writing the results
            of those that finished) instead of going on.
        parallel: the most runs trained at once (``exogym.cli.sweep_packing``): ``'auto'``
            packs runs side by side as long as their worker processes fit in the cores (runs of
            fewer workers than cores, e.g. ``workers=1``), ``1`` trains one after the other,
            ``N`` at most N at once. On ``device='cpu'`` every worker has one intra-op thread,
            whatever ``parallel``, so that the results do not depend on it; elsewhere runs train
            one at a time.
        scale: the model and hardware whose time every run simulates ([`Scale`][exogym.Scale], or
            a parameter count such as ``"1B"``), as for [`compare`][exogym.cli.compare.compare],
            where the grid has no ``scale``; the caption names it.
        adversaries: malicious nodes in every run ([`Adversaries`][exogym.Adversaries]); a grid
            name ``malicious`` varies their share (``grid={"malicious": [0.1, 0.2]}``), and
            ``aggregate`` the strategies' aggregation rule, so one sweep gives loss against the
            share of malicious nodes per defence, over the seeds.

    Raises:
        ValueError, TypeError: for a bad grid, seed or setting (every point's values, strategy,
            network and ``fit`` keywords are checked) or an ``out_dir`` that cannot be written,
            before any process starts.
        SweepInterrupted: on Ctrl-C, after writing the results of the runs that finished.
    """
    _check_settings(seeds, lr, target_loss, confidence)
    runs.check_writable_folder(out_dir, "out_dir")
    check_parallel(parallel, device)
    if cluster.detect() is not None:
        raise ValueError("sweep runs on this machine's processes; run it without torchrun")
    t0 = time.perf_counter()
    spec = task if isinstance(task, Task) else load(task, data_dir)
    lr = spec.lr if lr is None else lr
    made = _factories(strategies)
    base_run = {
        "nodes": nodes, "steps": steps, "batch_size": batch_size, "val_size": val_size, "workers": workers,
        "network": network, "compute": compute,
    }  # fmt: skip
    if adversaries is not None:  # (a sweep without adversaries keeps its runs' keys)
        base_run["malicious"] = adversaries.fraction
    elif grid and "malicious" in grid:
        raise ValueError("grid: malicious varies the share of malicious nodes of adversaries=...; give adversaries")
    try:  # every point's values, strategy and network are checked before any run starts
        plan = points(dict(grid or {}), {k: f for k, (f, _) in made.items()}, {"lr": lr, "H": H}, base_run, seeds)
        if scale is not None:  # every run at the scale, where the grid does not vary it
            scale = as_scale(scale)
            plan = [dataclasses.replace(p, fit_args={"scale": scale, **p.fit_args}) for p in plan]
        if adversaries is not None:  # each point's share of malicious nodes
            share = lambda p: dataclasses.replace(adversaries, fraction=p.run["malicious"])  # noqa: E731
            plan = [dataclasses.replace(p, fit_args={"adversaries": share(p), **p.fit_args}) for p in plan]
        configs = [_config(spec, p, made[p.strategy], device, flops_per_second) for p in plan]
    except (ValueError, TypeError, OSError) as e:
        raise type(e)(f"grid: {e}") from e
    store = RunStore(out_dir)
    keys = [run_key(c) for c in configs]
    stored = [store.load(k) for k in keys]  # None: to train (a damaged record is set aside, with a warning)
    cores = usable_cpus()
    needs = {  # the cores each run to train takes: its worker processes
        i: min(cores, resolve_workers(p.run["workers"], p.run["nodes"], device, 1))
        for i, p in enumerate(plan)
        if stored[i] is None
    }
    lanes = width(parallel, device, list(needs.values()), cores)
    startup = time.perf_counter() - t0 + (start_processes_server() if needs else 0.0)
    result = Sweep(out_dir, list(grid or {}), startup_time=startup, target_loss=target_loss, parallel=lanes)
    result.caption = _caption(spec.name, base_run, lr, H, grid or {}, seeds, target_loss)
    if scale is not None:
        result.caption += f"; {scale.describe()}"
    at_once = f", {lanes} at a time on {cores} cores" if lanes > 1 else ""
    logger.info("%s\n%d runs, %d to train%s; start-up %.1f s", result.caption, len(plan), len(needs), at_once, startup)
    runner = Runner(spec, store, device, flops_per_second, progress and lanes == 1, lanes > 1)
    outcomes: dict[int, Outcome] = {}
    running: list[str] = []
    counter = [f"[{i + 1}/{len(plan)}]" for i in range(len(plan))]
    try:
        try:
            for i, point in enumerate(plan):
                if (record := stored[i]) is not None:
                    outcomes[i] = runner.reuse(point, keys[i], counter[i], record)
            jobs = [
                Job(i, plan[i].label(), need, functools.partial(
                    runner.train, plan[i], made[plan[i].strategy][0], configs[i], keys[i], counter[i]
                ))
                for i, need in needs.items()
            ]  # fmt: skip
            if lanes > 1:
                packed = Lanes(lanes, cores)
                running = packed.running
                packed.run(jobs, lambda job, done: keep(outcomes, job.index, done, raise_on_failure))
            else:
                with pool.lane() if device == "cpu" else contextlib.nullcontext():
                    for job in jobs:
                        running[:] = [job.label]
                        if not keep(outcomes, job.index, job.run(), raise_on_failure):
                            break
                running[:] = []
        finally:
            _collect(result, outcomes)
            _finish(result, confidence)
    except KeyboardInterrupt:
        during = f" during {', '.join(running)}" if running else ""  # (packed lanes may be between runs)
        raise SweepInterrupted(
            f"sweep interrupted{during}: {len(result.runs)} of {len(plan)} runs finished and are "
            f"kept in {store.root} (summary.csv covers them); run the same sweep again to run the other "
            f"{len(plan) - len(result.runs)}"
        ) from None
    if raise_on_failure and result.failures:
        raise next(iter(result.failures.values()))
    return result


def _config(
    spec: Task, point: Point, factory: tuple[Callable[..., Strategy], str], device: str, fps: float | None
) -> dict[str, Any]:
    """The run's full configuration (its key's input); builds its strategy and network and checks
    its ``fit`` keywords first, so a bad value fails here, before any run starts."""
    factory_fn, factory_name = factory
    run = point.run
    try:
        strategy = call_factory(factory_fn, point.params)
        net = network_of(point, fps, point.seed)
        check_keywords(
            {"num_nodes": run["nodes"], "max_steps": run["steps"], "batch_size": run["batch_size"], "network": net,
             "val_size": run["val_size"], "workers": run["workers"], "seed": point.seed, **point.fit_args}
        )  # fmt: skip
        if strategy.needs_step_seconds and net.compute == "measured":
            raise ValueError(measured_compute([point.strategy], "compute='flops' or seconds per step"))
        check_adversaries(point.fit_args.get("adversaries"), strategy, network=net)
        check_rules(strategy, run["nodes"], point.fit_args.get("adversaries"))
    except (ValueError, TypeError, OSError) as e:
        raise type(e)(f"{point.label()}: {e}") from e
    workers = point.run["workers"]
    if workers is not None and workers > point.run["nodes"]:
        raise ValueError(f"{point.label()}: workers={workers} is more than nodes={point.run['nodes']}")
    return {
        "task": spec.name, "strategy": point.strategy, "factory": factory_name, "params": point.params,
        "run": {**point.run, "network": net.describe(), "compute": net.describe_compute(), "given": point.run},
        "fit": point.fit_args, "seed": point.seed, "device": device,
    }  # fmt: skip


def _collect(result: Sweep, outcomes: dict[int, Outcome]) -> None:
    """Fill ``result``'s runs, failures and histories from ``outcomes``, in the sweep's order."""
    for _, done in sorted(outcomes.items()):
        point, label = done.point, done.point.label()
        if done.error is not None:
            result.failures[label] = done.error
            continue
        result.reused += done.reused
        result.executed += not done.reused
        full = {"strategy": point.strategy, **{a: point.axes.get(a) for a in result.axes}, "seed": point.seed}
        full.update(done.row)
        if result.target_loss is not None:
            reached = time_to_target(done.history, result.target_loss)
            full["time_to_target"] = None if reached is None else reached.sim_time
        result.runs.append({**full, "key": done.key, "label": label})
        result.histories[label] = done.history


def _finish(result: Sweep, confidence: float) -> None:
    """Aggregate the finished runs; write ``runs.csv``, ``summary.csv`` and the plots."""
    target = result.target_loss is not None
    result.summary = aggregate(result.runs, result.axes, target, confidence)
    logger.info(
        "sweep: %d runs finished (%d trained, %d finished before), %d failed",
        len(result.runs), result.executed, result.reused, len(result.failures),
    )  # fmt: skip
    if not result.runs:
        for name in ("summary.csv", "runs.csv"):
            if (rows := _rows_in(os.path.join(result.out_dir, name))) > 0:
                logger.warning(
                    "%s is left as it was (%d rows): no run of this sweep finished", os.path.join(result.out_dir, name),
                    rows,
                )  # fmt: skip
        return
    os.makedirs(result.out_dir, exist_ok=True)
    run_cols = ["strategy", *result.axes, "seed", *RUN_COLUMNS, *(["time_to_target"] if target else []), "key"]
    _write_csv(os.path.join(result.out_dir, "runs.csv"), run_cols, result.runs)
    _write_csv(os.path.join(result.out_dir, "summary.csv"), summary_columns(result.axes, target), result.summary)
    result.plots = plot_sweep(result, confidence)


def _write_csv(path: str, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """Write ``rows`` to ``path`` (atomically); a warning says so when the file had more rows."""
    had = _rows_in(path)
    if had > len(rows):
        logger.warning(
            "%s had %d rows; it is rewritten with %d: the runs missing (failed, interrupted, or set aside as damaged) "
            "are not in it; run the same sweep again to train them",
            path, had, len(rows),
        )  # fmt: skip
    with runs.atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)


def _rows_in(path: str) -> int:
    """The rows of the CSV file at ``path`` (0 when there is none, or it cannot be read)."""
    try:
        with open(path, newline="") as f:
            return sum(1 for _ in csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error):
        return 0


def _caption(
    task: str,
    run: Mapping[str, Any],
    lr: float,
    H: int,
    grid: Mapping[str, Sequence[Any]],
    seeds: Sequence[int],
    target: float | None,
) -> str:
    """The sweep's settings in one line."""
    settings = {"nodes": run["nodes"], "steps": run["steps"], "batch": run["batch_size"], "lr": lr, "H": H}
    fixed = ", ".join(f"{k} {v}" for k, v in settings.items() if k not in grid)
    varied = "; ".join(f"{k} in {list(v)}" for k, v in grid.items())
    text = f"{task}: {fixed}; {run['network']} network; seeds {list(seeds)}"
    return text + (f"; grid {varied}" if varied else "") + (f"; target loss {target:g}" if target is not None else "")


def report_sweep(result: Sweep) -> None:
    """Print the aggregated table and the files written to stdout, log each failure in one
    line, and exit with status 1 when a run failed (the ending of ``exogym compare --grid``)."""
    import sys

    target = result.target_loss is not None
    if result.summary:
        print(f"\n{result.caption}\n{format_sweep_table(result.summary, result.axes, target)}\n", flush=True)
        print(
            f"wrote {result.out_dir}/summary.csv, runs.csv and {len(result.plots)} plots; {len(result.runs)} runs "
            f"({result.executed} trained, {result.reused} finished before)",
            flush=True,
        )
    for name, error in result.failures.items():
        logger.error("%s failed: %s: %s", name, type(error).__name__, (str(error).strip().splitlines() or [""])[0])
    if result.failures:
        sys.exit(1)
