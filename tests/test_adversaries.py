"""``fit(adversaries=...)``: the same malicious nodes and the same results on one and two workers
and after a resume, the result naming them, and strategies the attack cannot act on refused
before anything starts."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from exogym import Adversaries, Trainer
from exogym.core.comm.network import Network
from exogym.privacy import DifferentialPrivacy
from exogym.strategy import DiLoCoStrategy, FedBuffStrategy, HALoSStrategy, NoLoCoStrategy, SimpleReduceStrategy
from tests.helpers import TinyNet, regression_data

pytestmark = [pytest.mark.procs, pytest.mark.timeout(240)]

K, STEPS = 4, 16
ALIE = Adversaries("alie", fraction=0.25)
PRIVACY = DifferentialPrivacy(clip=1.0, noise_multiplier=0.1, side="client")  # each node's own noise


def _fit(steps: int, workers: int, **kw: Any) -> tuple[list[torch.Tensor], list[dict], Trainer]:
    trainer = Trainer(TinyNet(), regression_data(1024), regression_data(64, seed=1))
    model = trainer.fit(
        DiLoCoStrategy(H=4, aggregate="trimmed_mean", privacy=PRIVACY),
        num_nodes=K,
        max_steps=steps,
        batch_size=8,
        workers=workers,
        logger=False,
        progress=False,
        val_size=32,
        val_interval=4,
        network=Network(1e9, 1e-3, compute=0.01),
        adversaries=ALIE,
        **kw,
    )
    rows = [{k: v for k, v in r.items() if k not in ("wall_time", "comm_time", "peak_memory")} for r in trainer.history]
    return [p.detach().clone() for p in model.parameters()], rows, trainer


def test_an_attacked_robust_private_run_is_identical_on_one_and_two_workers_and_after_a_resume(tmp_path) -> None:
    one, one_rows, trainer = _fit(STEPS, workers=1)
    two, two_rows, _ = _fit(STEPS, workers=2)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True)) and one_rows == two_rows
    _fit(STEPS // 2, workers=2, checkpoint_dir=str(tmp_path), checkpoint_interval=STEPS // 2)
    resumed, resumed_rows, _ = _fit(STEPS, workers=2, resume_from=str(tmp_path))
    assert all(torch.equal(a, b) for a, b in zip(one, resumed, strict=True)) and resumed_rows == one_rows
    named = trainer.result["adversaries"]
    seed = trainer.result["config"].seed
    assert named["attack"] == "alie" and named["malicious"] == list(ALIE.malicious(K, seed))
    assert len(named["malicious"]) == 1
    spent = trainer.result["privacy"][0]
    assert spent["aggregations"] == STEPS // 4 and 0 < spent["epsilon"] < math.inf


def test_the_attack_changes_the_run_and_the_malicious_nodes_follow_the_seed() -> None:
    attacked, _, _ = _fit(8, workers=1)
    trainer = Trainer(TinyNet(), regression_data(1024))
    honest = trainer.fit(
        DiLoCoStrategy(H=4, aggregate="trimmed_mean", privacy=PRIVACY), num_nodes=K, max_steps=8, batch_size=8,
        logger=False, progress=False, val_size=0, network=Network(1e9, 1e-3, compute=0.01),
    )  # fmt: skip
    assert not all(torch.equal(a, b) for a, b in zip(attacked, honest.parameters(), strict=True))
    draws = {ALIE.malicious(8, seed) for seed in range(10)}
    assert len(draws) > 1 and all(len(d) == 2 for d in draws)


def test_an_attacked_robust_fedbuff_run_is_identical_on_one_and_two_workers_and_after_a_resume(tmp_path) -> None:
    def fit(steps: int, workers: int, **kw: Any) -> list[torch.Tensor]:
        trainer = Trainer(TinyNet(), regression_data(1024))
        model = trainer.fit(
            FedBuffStrategy(local_steps=2, buffer_size=3, concurrency=3, aggregate="median"), num_nodes=6,
            max_steps=steps, batch_size=8, workers=workers, logger=False, progress=False, val_size=0,
            network=Network(1e9, 1e-3, compute=0.01, compute_slowdown=(1.0, 0.5, 1.0, 0.25, 1.0, 0.5)),
            adversaries=Adversaries("ipm", fraction=0.5), **kw,
        )  # fmt: skip
        return [p.detach().clone() for p in model.parameters()]

    one, two = fit(STEPS, 1), fit(STEPS, 2)
    assert all(torch.equal(a, b) for a, b in zip(one, two, strict=True))
    fit(STEPS, 2, checkpoint_dir=str(tmp_path), checkpoint_interval=STEPS // 2)  # (as the server-run tests do)
    resumed = fit(STEPS, 1, resume_from=str(tmp_path / f"step-{STEPS // 2:08d}"))
    assert all(torch.equal(a, b) for a, b in zip(one, resumed, strict=True))


@pytest.mark.parametrize(
    ("strategy", "needle"),
    [
        (lambda: HALoSStrategy(H=2), "has no module where attacks act"),
        (lambda: NoLoCoStrategy(H=2), "has no module where attacks act"),
    ],
)
def test_a_strategy_the_attack_cannot_act_on_is_refused_before_anything_starts(strategy, needle: str) -> None:
    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(ValueError, match=needle):
        trainer.fit(strategy(), num_nodes=K, max_steps=4, batch_size=8, adversaries=ALIE, logger=False)


def test_adversaries_with_dropped_nodes_are_refused_naming_both() -> None:
    from exogym import Faults

    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(ValueError, match="with nodes dropped"):
        trainer.fit(
            SimpleReduceStrategy(), num_nodes=K, max_steps=4, batch_size=8, adversaries=ALIE,
            faults=Faults(drop={1: [2]}), logger=False,
        )  # fmt: skip


def test_fit_refuses_adversaries_that_are_not_an_adversaries_object() -> None:
    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(TypeError, match=r"adversaries must be an exogym.Adversaries \(e.g. Adversaries\('sign_flip'"):
        trainer.fit(SimpleReduceStrategy(), num_nodes=K, max_steps=4, batch_size=8, adversaries="alie")


def test_a_sweep_varies_the_rule_and_the_share_of_malicious_nodes_and_keeps_each_run_s_attack(tmp_path) -> None:
    from exogym import sweep
    from exogym.tasks import Task

    task = Task("regression", TinyNet, regression_data(512), regression_data(64, seed=1), 0.01)
    attack = Adversaries("sign_flip", fraction=0.25, strength=4.0)
    result = sweep(
        task, ["diloco"], grid={"aggregate": ["mean", "median"], "malicious": [0.0, 0.25]}, seeds=[0], nodes=K,
        steps=8, batch_size=8, H=4, network=Network(1e9, 1e-3, compute=0.01), out_dir=str(tmp_path),
        progress=False, val_size=32, adversaries=attack, parallel=1,
    )  # fmt: skip
    assert not result.failures
    assert {(r["aggregate"], r["malicious"]) for r in result.runs} == {
        ("mean", 0.0),
        ("mean", 0.25),
        ("median", 0.0),
        ("median", 0.25),
    }
    loss = {(r["aggregate"], r["malicious"]): r["val_loss"] for r in result.runs}
    clean = loss[("mean", 0.0)]  # one of four flips and scales by 4: the mean moves away, the median stays near
    assert abs(loss[("median", 0.25)] - clean) < abs(loss[("mean", 0.25)] - clean)
    with pytest.raises(ValueError, match="malicious varies the share of malicious nodes of adversaries"):
        sweep(task, ["diloco"], grid={"malicious": [0.25]}, nodes=K, steps=4, batch_size=8, out_dir=str(tmp_path))


def test_a_rule_the_run_s_nodes_cannot_take_is_refused_before_anything_starts() -> None:
    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(ValueError, match=r"aggregate of DiLoCoStrategy: .* 2 updates .*krum needs n > f \+ 2"):
        trainer.fit(DiLoCoStrategy(H=2, aggregate="krum"), num_nodes=2, max_steps=4, batch_size=8, logger=False)


def test_label_flip_with_too_few_classes_for_the_data_is_refused_before_anything_starts() -> None:
    from torch.utils.data import TensorDataset

    from exogym.tasks import MLPClassifier

    data = TensorDataset(torch.randn(256, 64), torch.arange(256) % 10)
    trainer = Trainer(MLPClassifier(), data)
    with pytest.raises(ValueError, match=r"num_classes=3\): this data's labels reach 9; give num_classes=10"):
        trainer.fit(
            SimpleReduceStrategy(), num_nodes=K, max_steps=4, batch_size=8, logger=False,
            adversaries=Adversaries("label_flip", fraction=0.25, num_classes=3),
        )  # fmt: skip
