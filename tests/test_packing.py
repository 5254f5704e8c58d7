"""Packing a sweep's runs onto the cores: how many run at once, bad values of ``parallel``, and
runs side by side that equal the same runs one after the other (parameters and every row)."""

import os
import subprocess
import sys

import pytest
import torch

from exogym import Trainer
from exogym.cli.sweep import sweep
from exogym.cli.sweep_args import parallel_runs
from exogym.cli.sweep_packing import Job, Lanes, width
from exogym.core.comm.network import Network
from exogym.runtime import pool
from exogym.runtime.plan import usable_cpus
from exogym.strategy import DiLoCoStrategy, OptimSpec, SimpleReduceStrategy
from tests.helpers import FIT_DEFAULTS, TinyNet, regression_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Columns that measure this machine (time, memory) rather than the training.
MEASURED = {"wall_time", "compute_time", "comm_time", "peak_memory"}


@pytest.mark.parametrize(
    ("parallel", "device", "needs", "cores", "expected"),
    [
        ("auto", "cpu", [1, 1, 1], 2, 2),  # one worker each: two at a time on two cores
        ("auto", "cpu", [1] * 40, 16, 16),
        ("auto", "cpu", [4] * 9, 16, 4),
        ("auto", "cpu", [1, 1], 16, 2),  # no more lanes than runs
        ("auto", "cpu", [2, 2, 2], 2, 1),  # each fills the cores: one after the other
        ("auto", "cpu", [3, 1, 1, 1, 1], 4, 4),  # the smallest runs set the width; the cores limit it
        (1, "cpu", [1, 1, 1], 2, 1),
        (3, "cpu", [1] * 9, 16, 3),
        (8, "cpu", [1] * 9, 2, 2),  # at most one run per core
        ("auto", "cuda", [1, 1], 16, 1),  # GPU runs one at a time
        ("auto", "cpu", [], 2, 1),  # nothing to train
    ],
)
def test_width_packs_as_many_of_the_smallest_runs_as_the_cores_hold(parallel, device, needs, cores, expected) -> None:
    assert width(parallel, device, needs, cores) == expected


@pytest.mark.parametrize(
    ("parallel", "device", "error", "message"),
    [
        (0, "cpu", ValueError, r"parallel must be >= 1 \(1: one run after the other\) or 'auto', got 0"),
        (-2, "cpu", ValueError, "parallel must be >= 1"),
        ("two", "cpu", TypeError, r"parallel must be a positive int .* or 'auto' .*, got 'two'"),
        (True, "cpu", TypeError, "parallel must be a positive int"),
        (2.0, "cpu", TypeError, "parallel must be a positive int"),
        (2, "cuda", ValueError, r"parallel=2 packs runs onto CPU cores, but device='cuda'.*use parallel=1 or 'auto'"),
    ],
)
def test_a_bad_parallel_is_an_error_naming_it_before_any_process_starts(
    parallel, device, error, message, tmp_path
) -> None:
    with pytest.raises(error, match=message):
        sweep("digits", ["ddp"], seeds=[0], out_dir=str(tmp_path), device=device, parallel=parallel)
    assert os.listdir(tmp_path) == []


def test_the_parallel_option_reads_auto_or_a_positive_integer() -> None:
    assert (parallel_runs("auto"), parallel_runs("AUTO"), parallel_runs("3")) == ("auto", "auto", 3)
    for bad in ("0", "-1", "1.5", "many"):
        with pytest.raises(Exception, match=r"must be 'auto' .* or a positive integer \(1: one after the other\)"):
            parallel_runs(bad)


def test_compare_refuses_a_bad_parallel_with_exit_status_2() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "exogym", "compare", "--seeds", "0,1", "--parallel", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert out.returncode == 2 and "argument --parallel: must be 'auto'" in out.stderr, out.stderr


def _fit(strategy_name: str, seed: int) -> tuple[dict[str, torch.Tensor], list[dict], int]:
    """A small run: its final parameters, its rows (less the measured columns) and its intra-op
    threads per worker."""
    torch.manual_seed(seed)
    trainer = Trainer(TinyNet(), regression_data(256), regression_data(64, seed=1))
    sgd = OptimSpec(torch.optim.SGD, lr=0.05)
    strategy = SimpleReduceStrategy(sgd) if strategy_name == "ddp" else DiLoCoStrategy(H=2, optim_spec=sgd)
    args = {**FIT_DEFAULTS, "num_nodes": 2, "workers": 1, "max_steps": 8, "batch_size": 8, "val_size": 16}
    model = trainer.fit(
        strategy, seed=seed, log_interval=1, val_interval=2, network=Network(1e9, 0.01, compute=0.01), **args
    )
    rows = [{k: v for k, v in row.items() if k not in MEASURED} for row in trainer.history]
    return {k: v.clone() for k, v in model.state_dict().items()}, rows, trainer.result["config"].threads_per_worker


RUNS = [("ddp", 0), ("diloco", 0), ("ddp", 1), ("diloco", 1)]


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_fits_on_two_lanes_side_by_side_equal_the_same_fits_one_after_the_other() -> None:
    with pool.lane():
        alone = [_fit(*run) for run in RUNS]
    assert len(pool.worker_pids()) == 1  # the lane's warm worker went to the program's pool
    side_by_side: dict[int, tuple] = {}

    def keep(job: Job, outcome: tuple) -> bool:
        side_by_side[job.index] = outcome
        return True

    lanes = Lanes(2, 2)
    lanes.run([Job(i, f"{run}", 1, lambda run=run: _fit(*run)) for i, run in enumerate(RUNS)], keep)
    assert sorted(side_by_side) == [0, 1, 2, 3]
    for i, (state, rows, threads) in enumerate(alone):
        other_state, other_rows, other_threads = side_by_side[i]
        assert threads == other_threads == 1  # one intra-op thread per worker, in a lane
        assert state.keys() == other_state.keys()
        for k in state:
            assert torch.equal(state[k], other_state[k]), (RUNS[i], k)
        assert rows == other_rows, RUNS[i]
    assert alone[0][1] != alone[2][1]  # the seeds differ: the comparison can fail


def _run_spans(out: str) -> list[tuple[float, float]]:
    """Each run's span: from its ``config.json`` (written as it starts training) to its ``run.json``."""
    root = os.path.join(out, "runs")
    spans = []
    for key in os.listdir(root):
        folder = os.path.join(root, key)
        spans.append(
            (os.stat(os.path.join(folder, "config.json")).st_mtime, os.stat(os.path.join(folder, "run.json")).st_mtime)
        )
    return sorted(spans)


@pytest.mark.procs
@pytest.mark.timeout(400)
@pytest.mark.skipif(usable_cpus() < 2, reason="packing needs two cores or more")
def test_a_packed_sweep_trains_runs_side_by_side_and_equals_the_same_sweep_one_run_at_a_time(tmp_path) -> None:
    settings = {"nodes": 2, "workers": 1, "steps": 12, "val_size": 64, "progress": False, "seeds": [0, 1]}
    packed = sweep("digits", ["ddp", "diloco"], grid={"H": [2, 4]}, out_dir=str(tmp_path / "packed"), **settings)
    alone = sweep(
        "digits", ["ddp", "diloco"], grid={"H": [2, 4]}, out_dir=str(tmp_path / "alone"), parallel=1, **settings
    )
    assert (packed.parallel, alone.parallel) == (2, 1)
    assert packed.executed == alone.executed == 6 and not packed.failures and not alone.failures
    spans = _run_spans(str(tmp_path / "packed"))
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False)), spans  # one started before another ended
    drop = lambda row: {k: v for k, v in row.items() if k not in MEASURED}  # noqa: E731
    assert [drop(r) for r in packed.runs] == [drop(r) for r in alone.runs]
    assert packed.summary == alone.summary  # means, deviations and intervals over the seeds
    for label, history in alone.histories.items():
        assert [drop(r) for r in packed.histories[label]] == [drop(r) for r in history], label
