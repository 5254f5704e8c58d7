"""``fit(scale=...)``: the learning is the proxy's, the bytes and simulated time the target's."""

import csv
import subprocess
import sys

import pytest
import torch

from exogym import Scale, Trainer
from exogym.core.comm.network import Network
from exogym.strategy import DiLoCoStrategy, OptimSpec
from tests.helpers import FIT_DEFAULTS, TinyNet, regression_data

pytestmark = [pytest.mark.procs, pytest.mark.timeout(240)]

K, H, STEPS, STEP_SECONDS = 2, 5, 10, 0.8
#: the 10B target's pseudo-gradient in bf16: 2e10 bytes
TARGET_BYTES = 2 * 10_000_000_000
#: the internet preset: 100 Mbit/s, 30 ms; a ring all-reduce 2(n-1) a + 2(n-1)/n * 8b / B
AR = 2 * (K - 1) * 0.03 + 2 * (K - 1) / K * 8 * TARGET_BYTES / 100e6  # 0.06 + 1600 = 1600.06 s
ROUNDS = STEPS // H


def _fit(network, scale=None):
    trainer = Trainer(TinyNet(), regression_data(n=STEPS * 8 * K))
    model = trainer.fit(
        DiLoCoStrategy(H=H, optim_spec=OptimSpec(torch.optim.SGD, lr=0.05)),
        num_nodes=K,
        max_steps=STEPS,
        batch_size=8,
        network=network,
        log_interval=1,
        scale=scale,
        **FIT_DEFAULTS,
    )
    return model, [r for r in trainer.history if "train_loss" in r]


@pytest.fixture(scope="module")
def unscaled():
    return _fit("internet")


@pytest.fixture(scope="module")
def scaled():
    return _fit("internet", Scale(10e9, step_seconds=STEP_SECONDS))


def test_a_scale_changes_neither_the_losses_nor_the_final_parameters(unscaled, scaled) -> None:
    (plain_model, plain_rows), (big_model, big_rows) = unscaled, scaled
    assert [r["train_loss"] for r in big_rows] == [r["train_loss"] for r in plain_rows]
    assert len(big_rows) == STEPS
    for (name, a), (_, b) in zip(plain_model.state_dict().items(), big_model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_scaled_sim_time_is_rounds_of_h_steps_plus_the_targets_all_reduce_beyond_the_backward_pass(scaled) -> None:
    # per round: 5 steps of 0.8 s, then the 10B all-reduce less the last step's backward pass (2/3 * 0.8 s)
    expected = ROUNDS * (H * STEP_SECONDS + AR - 2 / 3 * STEP_SECONDS)  # 2 * (4 + 1600.06 - 0.5333) = 3207.05
    assert scaled[1][-1]["sim_time"] == pytest.approx(expected, rel=1e-9)


def test_scaled_bytes_sent_per_node_are_the_targets_ring_share(scaled) -> None:
    # 2 rounds * 2 (n-1)/n * 2e10 = 4e10
    assert scaled[1][-1]["bytes_sent"] == pytest.approx(ROUNDS * 2 * (K - 1) / K * TARGET_BYTES)


def test_scaled_sim_time_without_backward_overlap_waits_for_the_whole_all_reduce() -> None:
    _, rows = _fit(Network(100e6, 0.03, backward_share=0.0), Scale(10e9, step_seconds=STEP_SECONDS))
    # 2 * (4 + 1600.06) = 3208.12
    assert rows[-1]["sim_time"] == pytest.approx(ROUNDS * (H * STEP_SECONDS + AR), rel=1e-9)


COMPARE_ARGS = (
    "--strategies ddp,diloco --nodes 2 --steps 10 --H 5 --batch-size 16 --no-progress "
    "--scale 1B --layers 24 --step-seconds 0.1"
)


def test_compare_with_scale_reports_the_targets_bytes_and_sim_time(tmp_path) -> None:
    out = tmp_path / "cmp"
    proc = subprocess.run(
        [sys.executable, "-m", "exogym", "compare", "--out", str(out), *COMPARE_ARGS.split()],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "latest" / "summary.csv") as f:
        rows = {r["strategy"]: r for r in csv.DictReader(f)}
    # the internet preset (the default): a ring all-reduce of the 1B target's 2e9 bytes on 2 nodes
    ar = 2 * 0.03 + 8 * 2e9 / 100e6  # 160.06 s
    c = 0.1
    # DDP: 10 steps of c + (AR - 2c/3); DiLoCo (H=5): 2 rounds of 5c + (AR - 2c/3)
    assert float(rows["ddp"]["sim_time"]) == pytest.approx(10 * (c + ar - 2 * c / 3), rel=1e-9)
    assert float(rows["diloco"]["sim_time"]) == pytest.approx(2 * (5 * c + ar - 2 * c / 3), rel=1e-9)
    # bytes per node: 2 (n-1)/n * 2e9 per all-reduce
    assert float(rows["ddp"]["bytes_sent_per_node"]) == pytest.approx(10 * 2e9)
    assert float(rows["diloco"]["bytes_sent_per_node"]) == pytest.approx(2 * 2e9)


@pytest.mark.procs
@pytest.mark.timeout(240)
def test_a_sweep_with_scale_prices_every_run_at_the_scale(tmp_path) -> None:
    out = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable, "-m", "exogym", "compare", "--out", str(out), "--strategies", "ddp", "--nodes", "2",
            "--steps", "4", "--scale", "1B", "--step-seconds", "0.1", "--seeds", "1,2", "--no-progress",
        ],
        capture_output=True, text=True, timeout=220,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "scale 1B parameters" in proc.stdout + proc.stderr
    with open(out / "runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    ar = 2 * 0.03 + 8 * 2e9 / 100e6  # the internet preset: a 2-node ring all-reduce of 2e9 bytes
    for row in rows:  # 4 DDP steps of c + (AR - 2c/3), c = 0.1 s; 2e9 bytes sent per step
        assert float(row["sim_time"]) == pytest.approx(4 * (0.1 + ar - 0.2 / 3), rel=1e-9)
        assert float(row["bytes_sent_per_node"]) == pytest.approx(4 * 2e9)
