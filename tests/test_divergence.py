"""Divergence metrics in validation rows: each node's distance to the all-node average and the
mean pairwise correlation of the nodes' models, against numpy computed from the final models."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.strategy import FedAvgStrategy, OptimSpec, SimpleReduceStrategy
from tests.fake_world import train_ranks
from tests.helpers import regression_data

SGD = OptimSpec(torch.optim.SGD, lr=0.05)


def _last_validation(out: list[dict]) -> dict:
    return [r for r in out[0]["node"].history if "val_loss_local" in r][-1]


@pytest.mark.parametrize("k", [2, 3])
def test_distance_and_correlation_of_independent_models_match_numpy(k: int) -> None:
    out = train_ranks(
        k, lambda: CommunicateOptimizeStrategy([], optim_spec=SGD), 6, val_dataset=regression_data(32, seed=1)
    )
    vectors = [np.concatenate([p.numpy().ravel() for p in o["params"]]).astype(np.float64) for o in out]
    mean = np.mean(vectors, axis=0)
    corr = np.mean([np.corrcoef(a, b)[0, 1] for a, b in itertools.combinations(vectors, 2)])
    row = _last_validation(out)
    assert row["param_distance"] == pytest.approx(np.mean([np.linalg.norm(v - mean) for v in vectors]), rel=1e-5)
    assert row["model_correlation"] == pytest.approx(corr, abs=1e-6)
    assert 0.5 < row["model_correlation"] < 1.0 and row["param_distance"] > 0  # they did drift apart


def test_nodes_that_stay_identical_have_correlation_one_and_distance_zero() -> None:
    out = train_ranks(3, lambda: SimpleReduceStrategy(optim_spec=SGD), 4, val_dataset=regression_data(32, seed=1))
    rows = [r for r in out[0]["node"].history if "val_loss_local" in r]
    assert len(rows) == 2  # before the first step and after the last
    for row in rows:
        assert row["param_distance"] == pytest.approx(0.0, abs=1e-6)
        assert row["model_correlation"] == pytest.approx(1.0, abs=1e-6)


def test_fedavg_drifts_between_rounds_and_agrees_after_each() -> None:
    out = train_ranks(
        2, lambda: FedAvgStrategy(H=4, optim_spec=SGD), 8, val_dataset=regression_data(32, seed=1), val_interval=2
    )
    distance = {r["step"]: r["param_distance"] for r in out[0]["node"].history if "val_loss_local" in r}
    assert distance[4] == pytest.approx(0.0, abs=1e-6) and distance[8] == pytest.approx(0.0, abs=1e-6)
    assert distance[2] > 1e-4 and distance[6] > 1e-4


def test_one_node_has_a_distance_but_no_correlation() -> None:
    out = train_ranks(1, lambda: SimpleReduceStrategy(optim_spec=SGD), 2, val_dataset=regression_data(32, seed=1))
    row = _last_validation(out)
    assert row["param_distance"] == 0.0 and "model_correlation" not in row
