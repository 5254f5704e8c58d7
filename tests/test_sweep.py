"""Sweeps end to end: the same runs as plain ``fit``, Ctrl-C keeps finished runs, a re-run
runs only the rest."""

import csv
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from exogym import Trainer
from exogym.cli.sweep import sweep
from exogym.core.comm.network import PRESETS
from exogym.core.optim import OptimSpec
from exogym.strategy import DiLoCoStrategy, SimpleReduceStrategy
from exogym.tasks import load_task

pytestmark = [pytest.mark.procs]

SMALL = {"nodes": 2, "workers": 2, "steps": 6, "val_size": 64, "progress": False}


def _plain_fit(strategy, seed: int) -> list[dict]:
    """The run as a user writes it with ``fit``: the same model seed, data, network and settings."""
    task = load_task("digits")
    torch.manual_seed(seed)
    trainer = Trainer(task.make_model(), task.train, task.val)
    network = dataclasses.replace(PRESETS["internet"], compute="flops")
    trainer.fit(
        strategy, num_nodes=2, workers=2, max_steps=6, batch_size=32, network=network, val_size=64, seed=seed,
        logger=False, progress=False,
    )  # fmt: skip
    return trainer.history


def _without_wall_time(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in ("wall_time", "comm_time", "peak_memory")} for row in history]


@pytest.mark.timeout(300)
def test_a_sweeps_rows_equal_the_same_runs_made_one_at_a_time_with_fit(tmp_path) -> None:
    result = sweep("digits", ["ddp", "diloco"], grid={"H": [2, 4]}, seeds=[0, 1], out_dir=str(tmp_path), **SMALL)
    assert not result.failures and result.executed == 6 and result.reused == 0
    rows = {(r["strategy"], r["H"], r["seed"]): r for r in result.runs}
    assert sorted(rows, key=str) == sorted(
        [("ddp", None, 0), ("ddp", None, 1), *(("diloco", h, s) for h in (2, 4) for s in (0, 1))], key=str
    )  # DDP takes no H: one run per seed
    adamw = lambda: OptimSpec(torch.optim.AdamW, lr=load_task("digits").lr)  # noqa: E731 - the presets' optimizer
    for (name, H, seed), strategy in {
        ("ddp", None, 1): SimpleReduceStrategy(adamw()),
        ("diloco", 4, 0): DiLoCoStrategy(H=4, outer_momentum=0.5, optim_spec=adamw()),
    }.items():
        history = _plain_fit(strategy, seed)
        row = rows[(name, H, seed)]
        assert _without_wall_time(result.histories[row["label"]]) == _without_wall_time(history)
        last_val = [r for r in history if "val_loss_global" in r][-1]
        last_train = [r for r in history if "train_loss" in r][-1]
        assert (row["val_loss"], row["val_accuracy"]) == (last_val["val_loss_global"], last_val["val_accuracy_global"])
        assert (row["bytes_sent_per_node"], row["sim_time"], row["steps"]) == (
            last_train["bytes_sent"], last_train["sim_time"], last_train["step"]
        )  # fmt: skip
    with open(tmp_path / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert [(r["strategy"], r["H"], r["seeds"]) for r in summary] == [
        ("ddp", "", "2"),
        ("diloco", "2", "2"),
        ("diloco", "4", "2"),
    ]
    losses = [rows[("diloco", 2, s)]["val_loss"] for s in (0, 1)]
    assert float(summary[1]["val_loss_mean"]) == pytest.approx(sum(losses) / 2)
    assert float(summary[1]["val_loss_std"]) == pytest.approx(abs(losses[0] - losses[1]) / 2**0.5)


def _descendants(root: int) -> set[int]:
    """The live processes under ``root`` (its children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(pid))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _finished(out) -> int:
    runs = out / "runs"
    return sum((runs / k / "run.json").exists() for k in os.listdir(runs)) if runs.exists() else 0


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "layout",
    [
        ["--workers", "2"],  # each run fills two cores: one after the other
        ["--workers", "1", "--parallel", "2"],  # packed: two runs side by side, one worker each
    ],
    ids=["one-at-a-time", "packed"],
)
def test_ctrl_c_keeps_the_finished_runs_leaves_no_process_and_a_rerun_runs_only_the_rest(tmp_path, layout) -> None:
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "exogym", "compare", "--strategies", "ddp,fedavg", "--grid", "H=2,4", "--seeds", "0,1"]
    cmd += ["--nodes", "2", *layout, "--steps", "40", "--no-progress", "--out", str(out)]

    def own_group_default_sigint() -> None:  # a terminal's Ctrl-C reaches the whole foreground group
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=own_group_default_sigint)
    tree: set[int] = set()
    deadline = time.monotonic() + 200
    while _finished(out) < 1 and proc.poll() is None and time.monotonic() < deadline:
        tree |= _descendants(proc.pid)
        time.sleep(0.05)
    tree |= _descendants(proc.pid)
    assert tree, "the sweep started no process"
    os.killpg(proc.pid, signal.SIGINT)
    output = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 130, output
    kept = _finished(out)
    assert 1 <= kept < 6, output  # ddp x 2 seeds + fedavg x 2 H x 2 seeds
    assert "Traceback" not in output and f"runs finished and are kept in {out / 'runs'}" in output
    deadline = time.monotonic() + 10
    while any(map(_alive, tree)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in tree if _alive(p)] == []
    with open(out / "summary.csv") as f:
        assert sum(int(r["seeds"]) for r in csv.DictReader(f)) == kept

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"6 runs ({6 - kept} trained, {kept} finished before)" in again.stdout
    assert len(re.findall(r"^\[\d/6\] .*: finished before", again.stderr, flags=re.M)) == kept
    assert _finished(out) == 6
    with open(out / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert [(r["strategy"], r["H"], r["seeds"]) for r in summary] == [
        ("ddp", "", "2"),
        ("fedavg", "2", "2"),
        ("fedavg", "4", "2"),
    ]
    for column in ("val_loss_mean", "val_loss_std", "val_loss_ci_low", "val_loss_ci_high", "sim_time_ci_high"):
        assert all(float(r[column]) == float(r[column]) for r in summary), column  # a number, not nan
    for plot in ("val_loss_vs_H", "val_loss_vs_bytes", "val_loss_vs_sim_time", "val_accuracy_vs_H"):
        assert (out / f"{plot}.png").stat().st_size > 10_000


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [2, 1], ids=["one-at-a-time", "packed"])
def test_a_failing_run_is_kept_in_failures_and_tried_again_and_a_factory_takes_the_grid_names_it_declares(
    tmp_path, workers
) -> None:
    from tests.helpers import RaisingStrategy

    def ddp_with(lr):  # a factory of your own: its signature says it takes lr
        return SimpleReduceStrategy(OptimSpec(torch.optim.AdamW, lr=lr))

    strategies = {"mine": ddp_with, "broken": RaisingStrategy(at=3)}
    settings = {**SMALL, "steps": 4, "workers": workers}  # one worker each: two runs side by side on two cores
    result = sweep("digits", strategies, grid={"lr": [1e-3, 2e-3]}, seeds=[0], out_dir=str(tmp_path), **settings)
    assert [(r["strategy"], r["lr"]) for r in result.runs] == [("mine", 1e-3), ("mine", 2e-3)]
    assert list(result.failures) == ["broken seed=0"] and "strategy broke at step 3" in str(
        result.failures["broken seed=0"]
    )
    assert _finished(tmp_path) == 2  # the failed run's folder keeps its metrics.csv, but no run.json
    (failed,) = (tmp_path / "runs").glob("*/FAILED")  # and says why
    assert not (failed.parent / "run.json").exists() and "strategy broke at step 3" in failed.read_text()
    again = sweep("digits", strategies, grid={"lr": [1e-3, 2e-3]}, seeds=[0], out_dir=str(tmp_path), **settings)
    assert (again.reused, again.executed, list(again.failures)) == (2, 0, ["broken seed=0"])  # the failure runs again
    assert [r["val_loss"] for r in again.runs] == [r["val_loss"] for r in result.runs]
