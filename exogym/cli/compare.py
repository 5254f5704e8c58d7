"""Run several strategies on one task and compare loss against steps, bytes and simulated time."""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exogym import runs
from exogym.adversaries import Adversaries
from exogym.cli.plots import plot_comparison, plot_label_histogram
from exogym.cli.point import run_point
from exogym.cli.target import TARGET_COLUMNS, target_columns
from exogym.cli.utilisation import mean_utilisation, write_utilisation
from exogym.clocks import percent
from exogym.core.comm.network import Network, resolve_network
from exogym.core.comm.world_file import is_world_file, read_world_file
from exogym.core.strategy import Strategy
from exogym.partition import Partition
from exogym.runs import check_name
from exogym.runtime import cluster
from exogym.runtime.launch import start_processes_server
from exogym.runtime.plan import check_adversaries, check_rules
from exogym.scale import Scale, as_scale
from exogym.strategy.registry import build
from exogym.tasks import Task, load

logger = logging.getLogger(__name__)

SUMMARY_COLUMNS = (
    "strategy",
    "val_loss",
    "val_accuracy",
    "bytes_sent_per_node",
    "sim_time",
    "utilisation",
    "wall_time",
    "steps",
    "staleness",
    "staleness_max",
)
"""Columns of ``summary.csv`` (and of the printed table). Every column but ``wall_time`` is the
same in two runs with the same arguments (with a deterministic compute model); ``utilisation``
is the nodes' mean (``utilisation.csv`` has each node's); ``staleness`` and ``staleness_max``
are an asynchronous strategy's updates' mean and largest staleness (server versions applied
between a node's pull and its push; empty for the others). With a target loss, each row also
has ``exogym.cli.target.TARGET_COLUMNS``: the simulated seconds, steps and MB per node at
which the average model first reached it (empty: never); with adversaries, ``malicious``: the
malicious nodes' ranks."""


@dataclass
class Comparison:
    """What [`compare`][exogym.cli.compare.compare] produced.

    Attributes:
        out_dir: the folder this comparison wrote, ``<out_dir>/version_N`` of
            [`compare`][exogym.cli.compare.compare]'s ``out_dir`` (``<out_dir>/latest`` names the
            newest).
        summary: one row per strategy that finished
            ([`SUMMARY_COLUMNS`][exogym.cli.compare.SUMMARY_COLUMNS]), in run order.
        failures: strategy name -> the exception that stopped it (the others still ran).
        startup_time: seconds spent once before the first run (task data, the process server
            with torch imported); not part of any strategy's ``wall_time``.
        caption: the settings, as written under the plots.
        plots: paths of the PNG files written.
        histories: strategy name -> its ``Trainer.history`` rows (the metrics plotted), for the
            runs that finished.
        target_loss: the validation loss the summary's time-to-target columns refer to, or ``None``.
        nodes: strategy name -> its ``Trainer.result["nodes"]``: every node's simulated compute,
            communication and waiting seconds, clock and utilisation (``utilisation.csv``).
    """

    out_dir: str
    summary: list[dict[str, Any]]
    failures: dict[str, Exception] = field(default_factory=dict)
    startup_time: float = 0.0
    caption: str = ""
    plots: list[str] = field(default_factory=list)
    histories: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    target_loss: float | None = None
    nodes: dict[str, list[dict[str, float]]] = field(default_factory=dict)


def settings_caption(
    task: str,
    nodes: int,
    steps: int,
    batch_size: int,
    lr: float | None,
    H: int | None,
    net: Network,
    seed: int,
    compute_source: str = "",
) -> str:
    """The run's settings in one line (plot captions, logs). ``lr`` and ``H`` are those the presets
    were built with; ``None`` (strategies of the caller's own, which carry their own) leaves them out.
    ``compute_source`` (``compute_source``) says where the compute model came from."""
    presets = "" if lr is None or H is None else f"inner lr {lr:g}, H={H}, "
    return (
        f"{task}: {nodes} nodes x {steps} steps, batch {batch_size}/node, {presets}seed {seed}; "
        f"{net.describe()}, {net.describe_compute()}{compute_source}"
    )


def compute_source(network: str | Network, compute: str | float | None) -> str:
    """Where a comparison's compute model comes from, for its caption, when a world file is
    involved: ``" (world.json)"`` where the file's ``compute`` holds, ``" (given, over
    world.json's ...)"`` where ``compute`` replaces it; ``""`` otherwise."""
    if not (isinstance(network, str) and is_world_file(network)):
        return ""
    own = read_world_file(network).get("compute")
    name = os.path.basename(network)
    if own is None:
        return ""
    if compute is None or compute == own:
        return f" ({name})"
    return f" (given, over {name}'s {own!r})"


def compare(
    task: str | Task,
    strategies: Sequence[str] | Mapping[str, Strategy],
    nodes: int = 4,
    steps: int = 200,
    batch_size: int = 32,
    lr: float | None = None,
    H: int = 20,
    network: str | Network = "internet",
    compute: str | float | None = None,
    out_dir: str = "exogym_runs/compare",
    device: str = "cpu",
    data_dir: str = "data",
    seed: int = 42,
    val_size: int = 512,
    progress: bool = True,
    workers: int | None = None,
    partition: Partition | None = None,
    raise_on_failure: bool = False,
    target_loss: float | None = None,
    flops_per_second: float | None = None,
    scale: Scale | str | float | None = None,
    adversaries: Adversaries | None = None,
) -> Comparison:
    """Train each preset in ``strategies`` on ``task`` from the same initial model; write each
    run's ``<strategy>/metrics.csv``, ``summary.csv`` and the plots of
    ``exogym.cli.plots.plot_comparison`` into a new folder, ``<out_dir>/version_N`` (N one
    more than the highest there), and point ``<out_dir>/latest`` at it: a comparison never
    overwrites another's files. ``summary.csv`` and the plots are each written atomically.
    ``out_dir`` is checked first: a folder that cannot be created or written raises
    ``ValueError`` naming ``out_dir`` before anything starts.

    Under ``torchrun`` each run joins the launcher's processes (see ``exogym.runtime.cluster``)
    and rank 0 writes the files and returns the summary (other ranks: an empty summary).

    A strategy that fails is logged with its traceback and kept in ``Comparison.failures``, its
    folder gets a ``FAILED`` file holding the error (beside the ``metrics.csv`` rows written
    before it failed), and the others still run (with ``raise_on_failure=True`` its exception propagates at once);
    the summary and plots cover those that finished. Ctrl-C also writes them, then raises
    [`ComparisonInterrupted`][exogym.cli.compare.ComparisonInterrupted] (a ``KeyboardInterrupt``)
    whose message says where they are.

    Args:
        task: a built-in task's name (loaded from ``data_dir``) or a loaded
            [`Task`][exogym.tasks.Task].
        strategies: preset names (``exogym.strategy.registry.PRESETS``, built with ``lr`` and
            ``H``), or ``{label: Strategy}`` to compare strategies of your own.
        lr: the inner learning rate (``None``: the task's); must be > 0.
        compute: the compute model of the simulated time
            ([`exogym.core.comm.network.Network`][exogym.Network]): ``"flops"`` and a number of
            seconds per step make the table identical run to run; ``"measured"`` times this machine;
            ``None`` (default): the network's own (a world file's ``compute`` where it sets one,
            otherwise ``"flops"``). The caption says when a world file's setting holds or is
            replaced.
        workers: processes hosting the ``nodes`` (default: ``fit``'s, one per core).
        partition: how the task's training set is split over the nodes (a
            [`Partition`][exogym.partition.Partition] for ``nodes`` nodes, see
            [`exogym.partition.partition`][exogym.partition.partition]); ``None``: IID shards of the
            shared dataset. Its label histogram is plotted to ``label_histogram.png``.
        raise_on_failure: re-raise the first failing strategy's exception (after writing the
            results of those that finished) instead of going on with the others.
        target_loss: a validation loss; each summary row then says at which simulated seconds,
            steps and MB per node the average model first reached it
            (``exogym.cli.target.time_to_target``; empty when never), and the loss plots
            mark it with a horizontal line.
        flops_per_second: a node's throughput for ``compute="flops"`` (``None``: the network's).
        scale: the model and hardware whose time is simulated ([`Scale`][exogym.Scale], or a
            parameter count such as ``"1B"``): each run's bytes and simulated time are the
            target's (its step seconds replace ``compute`` where it gives them), the learning the
            task's; the caption names it.
        adversaries: malicious nodes ([`Adversaries`][exogym.Adversaries]) in every run, the
            same ones (drawn from ``seed``); the caption and each summary row name them
            (``malicious``).
    """
    if lr is not None and not lr > 0:
        raise ValueError(f"lr must be > 0 (or None for the task's default), got {lr}")
    runs.check_writable_folder(out_dir, "out_dir")
    if target_loss is not None and (
        isinstance(target_loss, bool) or not isinstance(target_loss, (int, float)) or not math.isfinite(target_loss)
    ):
        raise ValueError(f"target_loss must be a finite number (a validation loss) or None, got {target_loss!r}")
    t0 = time.perf_counter()
    spec = task if isinstance(task, Task) else load(task, data_dir)
    net = resolve_network(network, compute, num_nodes=nodes, seed=seed)
    if flops_per_second is not None:
        net = dataclasses.replace(net, flops_per_second=flops_per_second)
    if scale is not None:
        scale = as_scale(scale)
    seconds = scale.seconds_per_step() if scale is not None else None
    if seconds is not None:  # (as fit applies it: the caption says the compute the runs have)
        net = dataclasses.replace(net, compute=seconds)
    lr = spec.lr if lr is None else lr
    own = isinstance(strategies, Mapping)  # built by the caller, with their own lr and H
    if own:  # your own strategies, by label
        built = {check_name(label, "a strategy's label"): strategy for label, strategy in strategies.items()}
    else:
        built = {name: build(name, lr, H) for name in strategies}  # bad names and values fail first
    for strategy in built.values():  # an attack or a rule the strategy cannot take: before anything runs
        check_adversaries(adversaries, strategy, network=net)
        check_rules(strategy, nodes, adversaries)
    launch = cluster.detect()  # under torchrun the launcher started the processes
    startup = time.perf_counter() - t0 + (start_processes_server() if launch is None else 0.0)
    caption = settings_caption(
        spec.name, nodes, steps, batch_size, None if own else lr, None if own else H, net, seed,
        compute_source(network, compute) if seconds is None else " (the scale's)",
    )  # fmt: skip
    if scale is not None:
        caption += f"; {scale.describe()}"
    if adversaries is not None:
        bad = adversaries.malicious(nodes, seed)
        named = ", ".join(map(str, bad))
        caption += f"; {adversaries.attack} by malicious node(s) {named} from step {adversaries.start}"
    if partition is not None:
        if partition.num_nodes != nodes:
            raise ValueError(f"partition was made for {partition.num_nodes} nodes, the comparison has nodes={nodes}")
        caption += f"; data {partition.describe()}"
    logger.info("%s\nstart-up %.1f s (task data, process server with torch imported; not in wall s)", caption, startup)
    # Under torchrun only the reporting rank writes files; the others' loggers are never started.
    out = runs.new_version(out_dir) if cluster.reporting() else out_dir
    result = Comparison(out, [], startup_time=startup, caption=caption, target_loss=target_loss)
    stopped: str | None = None  # the strategy Ctrl-C stopped
    try:
        try:
            for i, (name, strategy) in enumerate(built.items()):
                stopped = name
                logger.info("[%d/%d] %s", i + 1, len(built), name)
                try:
                    history, wall, clocks, summary = run_point(
                        spec, strategy, name=name, log_dir=out, nodes=nodes, steps=steps, batch_size=batch_size,
                        network=net, seed=seed, val_size=val_size, progress=progress, device=device,
                        workers=workers, partition=partition, fit_args={"scale": scale, "adversaries": adversaries},
                    )  # fmt: skip
                except Exception as e:
                    result.failures[name] = e
                    if cluster.reporting():
                        runs.mark_failed(os.path.join(out, name), e)
                    if raise_on_failure:
                        raise
                    logger.error("%s failed (the other strategies go on):", name, exc_info=e)
                    continue
                if history:  # under torchrun, rank 0 has the metrics and writes the results
                    result.histories[name] = history
                    result.nodes[name] = clocks
                    row = _summary_row(name, history, wall)
                    row["utilisation"] = mean_utilisation(clocks)
                    if adversaries is not None:
                        row["malicious"] = " ".join(map(str, adversaries.malicious(nodes, seed)))
                    if summary.get("updates"):  # an asynchronous strategy: its updates' staleness
                        row["staleness"] = summary["staleness_mean"]
                        row["staleness_max"] = summary["staleness_max"]
                        logger.info(
                            "%s: %d updates, staleness %s (updates per value), steps per node %s",
                            name, summary["updates"], summary["staleness"], summary["steps"],
                        )  # fmt: skip
                    if target_loss is not None:
                        row.update(target_columns(history, target_loss))
                    result.summary.append(row)
            stopped = None
        finally:
            _write_results(result, spec.name, nodes, partition)
    except KeyboardInterrupt:
        if stopped is None or not cluster.reporting():
            raise
        raise ComparisonInterrupted(_partial_message(result, stopped, len(built))) from None
    return result


class ComparisonInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a comparison; the message says where its partial results are."""


def _write_results(result: Comparison, task: str, nodes: int, partition: Partition | None) -> None:
    """``summary.csv`` and the plots of the strategies that finished, if any."""
    if not result.summary:
        return
    _write_summary(result.summary, result.out_dir)
    title = f"{task}, {nodes} nodes"
    result.plots = plot_comparison(
        result.histories, result.out_dir, title=title, caption=result.caption, target_loss=result.target_loss
    )
    result.plots += [p for p in write_utilisation(result.nodes, result.out_dir) if p.endswith(".png")]
    if partition is not None and cluster.reporting():
        title = f"{task}: {partition.describe()}"
        result.plots.append(plot_label_histogram(partition.label_counts(), result.out_dir, title))


def _partial_message(result: Comparison, stopped: str, planned: int) -> str:
    """Where an interrupted comparison's results are."""
    done = [r["strategy"] for r in result.summary]
    finished = (
        f"summary.csv and the plots cover the {len(done)} of {planned} strategies that finished ({', '.join(done)}); "
        if done
        else "no strategy finished; "
    )
    return (
        f"comparison interrupted during {stopped}: its partial results are in {result.out_dir} ({finished}"
        f"{stopped}/metrics.csv holds the rows {stopped} wrote before it stopped)"
    )


def _summary_row(name: str, history: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    last_val = [r for r in history if "val_loss_global" in r][-1]
    last_train = [r for r in history if "train_loss" in r][-1]
    return {
        "strategy": name,
        "val_loss": last_val["val_loss_global"],
        "val_accuracy": last_val.get("val_accuracy_global"),
        "bytes_sent_per_node": last_train["bytes_sent"],
        "sim_time": last_train["sim_time"],
        "wall_time": wall,
        "steps": last_train["step"],
    }


def _write_summary(summary: Sequence[dict[str, Any]], out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with runs.atomic_path(os.path.join(out_dir, "summary.csv")) as tmp, open(tmp, "w", newline="") as f:
        targets = TARGET_COLUMNS if any(c in summary[0] for c in TARGET_COLUMNS) else ()
        malicious = ("malicious",) if "malicious" in summary[0] else ()
        writer = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS + targets + malicious)
        writer.writeheader()
        writer.writerows(summary)


def format_table(summary: Sequence[dict[str, Any]], target_loss: float | None = None) -> str:
    """The summary as an aligned text table; with ``target_loss``, three more columns: the
    simulated seconds, steps and MB per node to reach it (``not reached`` when never)."""
    w = max(16, *(len(r["strategy"]) + 2 for r in summary))  # the strategy column: its longest name
    head = f"{'strategy':<{w}}{'val loss':>10}{'accuracy':>10}{'MB sent/node':>14}{'sim time s':>12}"
    head += f"{'util':>7}{'wall s':>9}"
    if target_loss is not None:
        head += f"{f'to {target_loss:g}: sim s':>18}{'steps':>8}{'MB/node':>10}"
    lines = [head, "-" * len(head)]
    for r in summary:
        acc = "-" if r["val_accuracy"] is None else f"{r['val_accuracy']:.3f}"
        line = (
            f"{r['strategy']:<{w}}{r['val_loss']:>10.4f}{acc:>10}{r['bytes_sent_per_node'] / 1e6:>14.2f}"
            f"{r['sim_time']:>12.2f}{percent(r.get('utilisation')):>7}{r['wall_time']:>9.1f}"
        )
        if target_loss is not None:
            t, steps, mb = (r.get(c) for c in TARGET_COLUMNS)
            line += f"{'not reached':>18}" if t is None else f"{t:>18.2f}{steps:>8.1f}{mb:>10.2f}"
        lines.append(line)
    return "\n".join(lines)


def report(result: Comparison) -> None:
    """Print the table and the files written to stdout, log each failure in one line (its
    traceback was logged when it failed) and exit with status 1 when a strategy failed (the
    command-line ending of ``exogym compare`` and the examples)."""
    import sys

    if result.summary:
        print(f"\n{result.caption}\n{format_table(result.summary, result.target_loss)}\n", flush=True)
        missed = [r["strategy"] for r in result.summary if r.get(TARGET_COLUMNS[0], 0) is None]
        if missed:
            print(f"never reached validation loss {result.target_loss:g}: {', '.join(missed)}", flush=True)
        print(f"wrote {result.out_dir}/summary.csv, per-run metrics.csv and {len(result.plots)} plots", flush=True)
    for name, error in result.failures.items():
        logger.error("%s failed: %s: %s", name, type(error).__name__, (str(error).strip().splitlines() or [""])[0])
    if result.failures:
        sys.exit(1)


__all__ = [
    "SUMMARY_COLUMNS",
    "Comparison",
    "ComparisonInterrupted",
    "compare",
    "format_table",
    "report",
    "settings_caption",
]
