"""Simulated time and bytes reported by real runs."""

import pytest
import torch

from exogym import Trainer
from exogym.core.comm.network import PRESETS
from exogym.strategy import DiLoCoStrategy, OptimSpec, SimpleReduceStrategy
from tests.helpers import FIT_DEFAULTS, TinyNet, regression_data

pytestmark = [pytest.mark.procs, pytest.mark.timeout(120)]


def _run(strategy, steps=200, network="internet"):
    trainer = Trainer(TinyNet(), regression_data(n=steps * 8 * 2))
    trainer.fit(strategy, num_nodes=2, max_steps=steps, batch_size=8, network=network, log_interval=50, **FIT_DEFAULTS)
    return [r for r in trainer.history if "train_loss" in r]


def test_diloco_h100_sends_a_hundredth_of_ddp_and_is_faster_on_the_internet() -> None:
    sgd = OptimSpec(torch.optim.SGD, lr=0.01)
    ddp = _run(SimpleReduceStrategy(optim_spec=sgd))[-1]
    dil = _run(DiLoCoStrategy(H=100, optim_spec=sgd))[-1]
    assert dil["bytes_sent"] == pytest.approx(ddp["bytes_sent"] / 100)
    assert dil["sim_time"] < ddp["sim_time"]
    # DDP's modelled communication on the internet preset, from the formula
    param_bytes = sum(p.numel() * 4 for p in TinyNet().parameters())
    per_step = PRESETS["internet"].collective_time("all_reduce", 2, param_bytes)
    assert ddp["sim_comm_time"] == pytest.approx(200 * per_step)
    assert ddp["sim_time"] == pytest.approx(ddp["compute_time"] + ddp["sim_comm_time"])


def test_rows_have_monotone_cumulative_columns() -> None:
    rows = _run(SimpleReduceStrategy(optim_spec="sgd"), steps=120)
    assert [r["step"] for r in rows] == [50, 100, 120]
    for col in ("bytes_sent", "sim_time", "compute_time", "wall_time", "examples"):
        vals = [r[col] for r in rows]
        assert vals == sorted(vals), col
    assert rows[-1]["examples"] == 120 * 8 * 2
