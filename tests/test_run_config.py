"""``fit``'s keywords as sections (exogym.run_config) that check themselves, and the plan the
runtime derives from them (exogym.runtime.plan)."""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable
from typing import Any

import pytest

from exogym import Faults, Trainer
from exogym.core.comm.network import PRESETS
from exogym.logger import CSVLogger
from exogym.run_config import (
    CheckpointConfig,
    DataConfig,
    FitArgs,
    LoggingConfig,
    RunConfig,
    TransportConfig,
)
from exogym.runtime.plan import plan_run
from exogym.strategy import SimpleReduceStrategy
from tests.helpers import TinyNet, regression_data

P, K = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
#: ``Trainer.fit``'s parameters: name, default (``REQUIRED``: none), kind.
REQUIRED = inspect.Parameter.empty
FIT_PARAMETERS = [
    ("self", REQUIRED, P),
    ("strategy", REQUIRED, P),
    ("num_nodes", REQUIRED, P),
    ("num_epochs", 1, P),
    ("max_steps", None, P),
    ("batch_size", 32, P),
    ("minibatch_size", None, P),
    ("gradient_accumulation", None, P),
    ("device", None, P),
    ("devices", None, P),
    ("val_size", 256, P),
    ("val_interval", None, P),
    ("autocast", False, P),
    ("seed", 42, P),
    ("logger", None, P),
    ("log_interval", 10, P),
    ("max_memory_usage", 0.8, P),
    ("shuffle", True, P),
    ("progress", True, P),
    ("run_name", None, P),
    ("network", None, P),
    ("transport", "auto", P),
    ("collective_timeout", 300.0, P),
    ("shm_slot_mb", 16, P),
    ("workers", None, P),
    ("stop_on_nonfinite_loss", True, P),
    ("torchrun_mode", None, P),
    ("checkpoint_dir", None, P),
    ("checkpoint_interval", None, P),
    ("resume_from", None, P),
    ("resume", False, P),
    ("faults", None, P),
    ("dataloader_kwargs", None, P),
    ("offload_idle_nodes", False, P),
    ("save_dir", None, K),
    ("correlation_interval", None, K),
    ("wandb_project", None, K),
    ("scale", None, K),
    ("adversaries", None, K),
]
SECTIONS = (RunConfig, DataConfig, TransportConfig, CheckpointConfig, LoggingConfig)


def test_fit_keeps_its_signature() -> None:
    params = inspect.signature(Trainer.fit).parameters.values()
    assert [(p.name, p.default, p.kind) for p in params] == FIT_PARAMETERS


def test_every_fit_keyword_is_in_one_section_with_fits_default() -> None:
    fit_defaults = {name: default for name, default, _ in FIT_PARAMETERS}
    fields = [f for section in SECTIONS for f in dataclasses.fields(section) if f.init]
    names = [f.name for f in fields] + ["faults", "adversaries"]
    assert sorted(names) == sorted(
        set(fit_defaults)
        - {"self", "strategy", "save_dir", "correlation_interval", "wandb_project", "offload_idle_nodes"}  # (compat)
    )
    for f in fields:
        default = REQUIRED if f.default is dataclasses.MISSING else f.default
        assert default == fit_defaults[f.name], f.name


def _section(make: Callable[..., Any], **kwargs: Any) -> Callable[[], Any]:
    return lambda: make(**kwargs)


BAD = [
    (_section(RunConfig, num_nodes=0), ValueError, "num_nodes must be >= 1"),
    (_section(RunConfig, num_nodes=2.0), TypeError, "num_nodes must be an int"),
    (_section(RunConfig, num_nodes=2, num_epochs=0), ValueError, "num_epochs must be >= 1"),
    (_section(RunConfig, num_nodes=2, max_steps=0), ValueError, "max_steps must be >= 1"),
    (_section(RunConfig, num_nodes=2, batch_size=True), TypeError, "batch_size must be an int"),
    (_section(RunConfig, num_nodes=2, batch_size=8, minibatch_size=3), ValueError, "minibatch_size=3 must divide"),
    (_section(RunConfig, num_nodes=2, minibatch_size=64), ValueError, "minibatch_size=64 must divide batch_size=32"),
    (_section(RunConfig, num_nodes=2, gradient_accumulation=3), ValueError, "gradient_accumulation=3 must divide"),
    (
        _section(RunConfig, num_nodes=2, batch_size=8, minibatch_size=4, gradient_accumulation=4),
        ValueError,
        "minibatch_size=4 and gradient_accumulation=4 disagree for batch_size=8; give one of them",
    ),
    (_section(RunConfig, num_nodes=2, max_memory_usage=1.5), ValueError, r"max_memory_usage must be in \(0, 1\]"),
    (_section(RunConfig, num_nodes=2, network="moon"), ValueError, "network must be a Network or one of"),
    (_section(DataConfig, val_size=-1), ValueError, "val_size must be an int >= 0"),
    (_section(DataConfig, val_interval=0), ValueError, "val_interval must be >= 1"),
    (_section(DataConfig, dataloader_kwargs={"shuffle": False}), ValueError, r"dataloader_kwargs may not set \["),
    (_section(DataConfig, dataloader_kwargs={"num_wrkers": 2}), TypeError, "DataLoader does not take"),
    (_section(DataConfig, dataloader_kwargs=[2]), TypeError, "dataloader_kwargs must be a dict"),
    (_section(TransportConfig, transport="tcp"), ValueError, "transport must be one of"),
    (_section(TransportConfig, collective_timeout=0), ValueError, "collective_timeout must be > 0 seconds"),
    (_section(TransportConfig, shm_slot_mb=-1), ValueError, "shm_slot_mb must be > 0"),
    (_section(TransportConfig, workers=0), ValueError, "workers must be >= 1"),
    (_section(CheckpointConfig, checkpoint_interval=0), ValueError, "checkpoint_interval must be >= 1"),
    (
        _section(CheckpointConfig, resume=True),
        ValueError,
        "resume=True continues from checkpoint_dir's newest checkpoint: give checkpoint_dir",
    ),
    (
        _section(CheckpointConfig, checkpoint_dir="ckpt", resume=True, resume_from="ckpt"),
        ValueError,
        r"give resume=True \(the newest checkpoint in checkpoint_dir\) or resume_from, not both",
    ),
    (_section(LoggingConfig, log_interval=0), ValueError, "log_interval must be >= 1"),
    (_section(LoggingConfig, logger="csv2"), ValueError, r"logger must be one of \('csv', 'wandb', 'tensorboard'\)"),
    (_section(LoggingConfig, logger=object()), TypeError, "logger must have start"),
    (
        _section(FitArgs, run=RunConfig(num_nodes=2), faults="drop"),
        TypeError,
        r"faults must be an exogym.Faults \(e.g. Faults\(drop=\{1: \[2\]\}\)\), got str",
    ),
]


@pytest.mark.parametrize(("make", "error", "match"), BAD)
def test_a_section_refuses_a_bad_value_naming_the_fit_argument(make, error, match) -> None:
    with pytest.raises(error, match=match):
        make()


def test_a_section_resolves_what_its_values_name() -> None:
    run = RunConfig(num_nodes=2, network="internet", batch_size=12, gradient_accumulation=3)
    assert run.network_model is PRESETS["internet"] and run.given_minibatch_size == 4
    assert RunConfig(num_nodes=2, batch_size=12, minibatch_size=6).given_minibatch_size == 6
    assert RunConfig(num_nodes=2).given_minibatch_size is None  # probed by the plan
    assert RunConfig(num_nodes=2).network_model is PRESETS["ethernet"]
    assert DataConfig().loader_kwargs == {} and DataConfig(dataloader_kwargs={"num_workers": 0}).loader_kwargs == {
        "num_workers": 0
    }
    assert isinstance(LoggingConfig().sink, CSVLogger) and LoggingConfig(logger=False).sink is None
    assert FitArgs(RunConfig(num_nodes=2), faults=Faults(drop={1: [0]})).faults == Faults(drop={1: [0]})


def test_the_plan_derives_what_every_node_reads(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = FitArgs(
        RunConfig(num_nodes=4, max_steps=30, batch_size=8, gradient_accumulation=2, device="cpu", seed=3),
        transport=TransportConfig(transport="gloo", workers=2, collective_timeout=10.0),
        checkpoint=CheckpointConfig(checkpoint_dir="ckpt", checkpoint_interval=10),
        logging=LoggingConfig(logger=False, run_name="run"),
    )
    plan = plan_run(TinyNet(), regression_data(256), None, SimpleReduceStrategy(), args)
    try:
        cfg = plan.config
        assert (cfg.num_nodes, cfg.workers, cfg.transport, cfg.device, cfg.seed) == (4, 2, "gloo", "cpu", 3)
        assert (cfg.max_steps, cfg.minibatch_size, cfg.accumulation) == (30, 4, 2)
        assert cfg.collective_timeout == 20.0  # a worker waits for a peer that runs its 2 nodes in turn
        assert (cfg.val_interval, cfg.val_size) == (3, 0)  # about 10 validations; no validation data
        assert (cfg.checkpoint_dir, cfg.checkpoint_interval) == (os.path.join(tmp_path, "ckpt"), 10)
        assert cfg.threads_per_worker >= 1 and cfg.launcher == "exogym" and cfg.faults is None
        assert (plan.transport.kind, plan.transport.world_size, plan.transport.timeout_s) == ("gloo", 2, 20.0)
        assert (plan.run_name, plan.logger, plan.layout.launch, plan.layout.mode) == ("run", None, None, None)
        assert plan.checkpoint_meta is not None
        assert (plan.checkpoint_meta["num_nodes"], plan.checkpoint_meta["max_steps"]) == (4, 30)
        assert plan.placement.hosts == ((0, 1), (2, 3))
    finally:
        plan.transport.close()


def test_the_plan_without_max_steps_counts_the_epochs() -> None:
    args = FitArgs(
        RunConfig(num_nodes=2, num_epochs=3, batch_size=8, minibatch_size=8, device="cpu"),
        data=DataConfig(val_interval=5),
        transport=TransportConfig(transport="gloo", workers=1),
        logging=LoggingConfig(logger=False),
    )
    plan = plan_run(TinyNet(), regression_data(64), regression_data(16), SimpleReduceStrategy(), args)
    plan.transport.close()
    # 64 examples over 2 nodes: 32 per node, 4 steps of 8 per epoch
    assert (plan.config.max_steps, plan.config.val_interval, plan.config.val_size) == (12, 5, 256)
    assert plan.checkpoint_meta is None and plan.run_name == "SimpleReduceStrategy"


def test_offload_idle_nodes_is_accepted_and_warns_that_it_has_no_effect(caplog: pytest.LogCaptureFixture) -> None:
    from exogym import compat

    with pytest.raises(TypeError, match="offload_idle_nodes must be True or False, got 'yes'"):
        compat.offload_idle_nodes("yes")
    with caplog.at_level("WARNING", logger="exogym.compat"):
        compat.offload_idle_nodes(False)
        assert not caplog.records
        compat.offload_idle_nodes(True)
    assert "offload_idle_nodes=True has no effect" in caplog.text and "only the drawn clients" in caplog.text
