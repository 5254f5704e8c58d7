"""Scripts written for the original exo gym run unchanged: its import paths, keywords, the
positional ``fit(num_epochs, strategy, num_nodes)``, and ``CommunicationModule`` subclasses."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from exogym import Trainer, compat
from exogym.strategy import DiLoCoStrategy, FedAvgStrategy, OptimSpec, SimpleReduceStrategy, SPARTADiLoCoStrategy
from tests.core.test_launch import _env
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, regression_data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_a_script_in_the_original_exo_gyms_style_runs_unchanged(tmp_path) -> None:
    script = os.path.join(REPO, "tests", "legacy_script.py")
    env = {**_env(), "PYTHONPATH": REPO}
    proc = subprocess.run(
        [sys.executable, script, str(tmp_path / "ckpt")], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = [line.split()[0] for line in proc.stdout.splitlines() if " ok: 3 correlation rows" in line]
    assert done == [
        "SimpleReduceStrategy",
        "DiLoCoStrategy",
        "SPARTAStrategy",
        "SPARTADiLoCoStrategy",
        "CommunicateOptimizeStrategy",
        "QuantizationStrategy",
        "AllReduceStrategy",
    ]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["latest", "step-00000008"]  # save_dir + checkpoint_interval


def test_the_original_readmes_custom_strategy_trains_with_int32_all_reduces_and_the_ranks_agree() -> None:
    from tests.legacy_script import QuantizationStrategy

    base = TinyNet()
    out = train_ranks(2, lambda: QuantizationStrategy(OptimSpec(torch.optim.SGD, lr=0.05), "int8"), 4)
    for a, b in zip(out[0]["params"], out[1]["params"], strict=True):
        torch.testing.assert_close(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(out[0]["params"], base.parameters(), strict=True))
    n_elems = sum(p.numel() for p in base.parameters())
    assert [sum(r.sent for r in recs) for recs in out[0]["records"]] == [4 * n_elems] * 4  # int32, ring of 2


def test_a_strategy_that_builds_its_optimizer_over_the_model_equals_ddp() -> None:
    from tests.legacy_script import AllReduceStrategy

    sgd = OptimSpec(torch.optim.SGD, lr=0.05)
    legacy = train_ranks(2, lambda: AllReduceStrategy(sgd), 5)  # _init_node: self.optim_spec.build(model)
    ddp = train_ranks(2, lambda: SimpleReduceStrategy(optim_spec=sgd), 5)
    for a, b in zip(legacy[1]["params"], ddp[1]["params"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_a_strategy_that_builds_its_own_optimizer_gets_its_lr_schedule_from_setup_scheduler() -> None:
    from tests.legacy_script import AllReduceStrategy

    sgd = OptimSpec(torch.optim.SGD, lr=0.05)
    legacy = train_ranks(2, lambda: AllReduceStrategy(sgd, lr_scheduler="lambda_cosine", warmup_steps=4), 5)
    ddp = train_ranks(2, lambda: SimpleReduceStrategy(optim_spec=sgd, lr_scheduler="lambda_cosine", warmup_steps=4), 5)
    strategy = legacy[0]["strategy"]
    assert strategy.scheduler.optimizer is strategy.optim  # the schedule drives the optimizer it built
    for a, b in zip(legacy[1]["params"], ddp[1]["params"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_legacy_strategy_keywords_mean_the_canonical_ones() -> None:
    sgd = OptimSpec(torch.optim.SGD, lr=0.1)
    outer = OptimSpec(torch.optim.SGD, lr=0.5)
    legacy = SPARTADiLoCoStrategy(inner_optim_spec=sgd, outer_optim_spec=outer, H=5)
    canonical = SPARTADiLoCoStrategy(optim_spec=sgd, outer_optim=outer, H=5)
    assert legacy.config() == canonical.config()
    assert DiLoCoStrategy(outer_optim_spec=outer).config() == DiLoCoStrategy(outer_optim=outer).config()
    with pytest.raises(TypeError, match="give optim_spec or its legacy spelling inner_optim_spec, not both"):
        FedAvgStrategy(optim_spec=sgd, inner_optim_spec=sgd)


def test_fit_takes_the_original_positional_order() -> None:
    s = FedAvgStrategy()
    assert compat.legacy_fit_order(1, s, 4) == (s, 4, 1)  # fit(num_epochs, strategy, num_nodes)
    assert compat.legacy_fit_order(s, 4, 1) == (s, 4, 1)  # fit(strategy, num_nodes, num_epochs)


def test_legacy_fit_keywords_resolve_to_canonical_settings(tmp_path) -> None:
    args = dict(logger_arg=None, run_name=None, correlation_interval=None, wandb_project=None)
    got = compat.resolve_fit_legacy(None, 5, None, save_dir=str(tmp_path), **args)
    assert got[:2] == (str(tmp_path), None)  # save_dir is where checkpoints go
    assert compat.resolve_fit_legacy(None, 5, None, save_dir=None, **args)[0] == compat.LEGACY_SAVE_DIR
    assert compat.resolve_fit_legacy(None, None, None, save_dir=None, **{**args, "correlation_interval": 7})[1] == 7
    assert compat.resolve_fit_legacy(None, None, 3, save_dir=None, **{**args, "correlation_interval": 7})[1] == 3
    with pytest.raises(TypeError, match="give checkpoint_dir or its legacy spelling save_dir, not both"):
        compat.resolve_fit_legacy("a", 5, None, save_dir="b", **args)
    from exogym.logger import WandbLogger

    wandb = compat.resolve_fit_legacy(None, None, None, None, "run1", None, None, "proj")[2]
    assert isinstance(wandb, WandbLogger) and (wandb.project, wandb.experiment_name) == ("proj", "run1")
    with pytest.raises(TypeError, match="give logger='csv' or wandb_project='p', not both"):
        compat.resolve_fit_legacy(
            None, None, None, save_dir=None, **{**args, "logger_arg": "csv", "wandb_project": "p"}
        )


class _Average(compat.CommunicationModule):
    """The original API: communicate(model, rank, num_nodes, local_step), _init_node(model, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def _init_node(self, model, rank, num_nodes) -> None:
        self.bound = (rank, num_nodes)

    def communicate(self, model, rank, num_nodes, local_step) -> None:
        from exogym.strategy.communicate import all_reduce

        self.seen.append(local_step)
        for p in model.parameters():
            all_reduce(p.data)
            p.data /= num_nodes


def test_a_legacy_communication_module_runs_after_every_step_and_is_charged() -> None:
    from exogym.core.pipeline import CommunicateOptimizeStrategy

    sgd = OptimSpec(torch.optim.SGD, lr=0.05)
    legacy = train_ranks(2, lambda: CommunicateOptimizeStrategy([_Average()], optim_spec=sgd), 5)
    fedavg = train_ranks(2, lambda: FedAvgStrategy(H=1, optim_spec=sgd), 5)
    module = legacy[1]["strategy"].communication_modules[0]
    assert module.seen == [0, 1, 2, 3, 4] and module.bound == (1, 2)
    for a, b in zip(legacy[0]["params"], fedavg[0]["params"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert all(sum(r.sent for r in recs) > 0 for recs in legacy[0]["records"])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 4}, ValueError, r"dataloader_kwargs may not set \['batch_size'\]"),
        ({"workers": 2}, TypeError, r"dataloader_kwargs has \['workers'\], which torch.utils.data.DataLoader"),
    ],
)
def test_bad_dataloader_kwargs_are_refused_before_the_run(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        Trainer(TinyNet(), regression_data(64)).fit(
            FedAvgStrategy(), 2, max_steps=2, batch_size=8, dataloader_kwargs=kwargs
        )
