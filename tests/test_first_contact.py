"""Every mistake a new user makes gets a clear error naming the argument, before any process
starts (``run_nodes``, which starts the workers, is replaced by a stub that fails the test)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import exogym.trainer
from communicators.averaging import AveragingCommunicator
from exogym import Trainer
from exogym.core.comm.links import Link
from exogym.core.comm.network import Network
from exogym.core.pipeline import Communicator
from exogym.strategy import (
    CommunicateOptimizeStrategy,
    DeMoStrategy,
    DiLoCoStrategy,
    FedAvgStrategy,
    OptimSpec,
    SimpleReduceStrategy,
    SPARTAStrategy,
)
from tests.helpers import TinyNet, regression_data


class _FailsToBind(Communicator):
    def _init_node(self, ctx) -> None:
        raise ValueError("ring_size must divide num_nodes")

    def communicate(self, step: int) -> None:
        pass


def _fit(strategy: Callable[[], Any] = SimpleReduceStrategy, model: Any = None, **kw: Any) -> Callable[[], Any]:
    def go() -> Any:
        args = {"num_nodes": 2, "max_steps": 4, "batch_size": 8, "logger": False, "progress": False, **kw}
        return Trainer(model or TinyNet(), regression_data(64)).fit(strategy(), **args)

    return go


class _VectorLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(8, 1)

    def forward(self, batch):
        x, y = batch
        return (self.w(x) - y) ** 2  # per example: not a scalar


class _WrongWidth(torch.nn.Module):
    """Expects 20 input features; the data has 8."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(20, 4)

    def forward(self, batch):
        x, y = batch
        return self.w(x).mean()


CASES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    # strategy constructors
    ("negative lr", lambda: SimpleReduceStrategy(lr=-1.0), ValueError, "lr must be a non-negative number"),
    ("DeMo topk 0", lambda: DeMoStrategy(compression_topk=0), ValueError, "compression_topk must be a positive int"),
    ("DeMo decay", lambda: DeMoStrategy(compression_decay=2.0), ValueError, "compression_decay must be in"),
    (
        "lower-case h",
        lambda: DiLoCoStrategy(h=10),
        TypeError,
        r"DiLoCoStrategy\(\) got an unexpected keyword argument 'h' \(did you mean 'H'\?\)",
    ),
    ("SPARTA H", lambda: SPARTAStrategy(H=5), TypeError, r"SPARTAStrategy\(\) got an unexpected keyword argument 'H'"),
    ("unknown keyword", lambda: FedAvgStrategy(island=3), TypeError, "did you mean 'island_size'"),
    ("SPARTA method", lambda: SPARTAStrategy(compression_method="magic"), ValueError, "compression_method must be"),
    ("SPARTA p", lambda: SPARTAStrategy(p_sparta=2.0), ValueError, "p_sparta"),
    ("SPARTA bits", lambda: SPARTAStrategy(quantization_bits=7), ValueError, "quantization_bits"),
    ("FedAvg H=0", lambda: FedAvgStrategy(H=0), ValueError, "H must be a positive int"),
    ("DiLoCo H=0", lambda: DiLoCoStrategy(H=0), ValueError, "H must be a positive int"),
    ("FedAvg H and epochs", lambda: FedAvgStrategy(H=5, local_epochs=2), TypeError, "H .steps. or local_epochs"),
    ("sampling > 1", lambda: FedAvgStrategy(client_sampling=2.0), ValueError, "client_sampling must be a number in"),
    (
        "sampled FedAvg H and epochs",
        lambda: FedAvgStrategy(H=5, local_epochs=2, client_sampling=0.5),
        TypeError,
        "H .steps. or local_epochs",
    ),
    (
        "sampled FedAvg epochs 0",
        lambda: FedAvgStrategy(local_epochs=0, client_sampling=0.5),
        ValueError,
        "local_epochs must be an int >= 1",
    ),
    ("island 0", lambda: FedAvgStrategy(island_size=0), ValueError, "island_size must be"),
    ("outer optimizer", lambda: DiLoCoStrategy(outer_optim="magic"), ValueError, "outer_optim must be one of"),
    ("optimizer name", lambda: SimpleReduceStrategy(optim_spec="magic"), ValueError, "unknown optimizer 'magic'"),
    (
        "optimizer twice",
        lambda: SimpleReduceStrategy(optim_spec="sgd", inner_optim="adam"),
        TypeError,
        "optim_spec or its alias inner_optim",
    ),
    ("max_norm", lambda: SimpleReduceStrategy(max_norm=-1.0), ValueError, "max_norm must be positive"),
    ("warmup", lambda: SimpleReduceStrategy(warmup_steps=-1), ValueError, "warmup_steps must be"),
    ("scheduler", lambda: SimpleReduceStrategy(lr_scheduler="magic"), ValueError, "unknown lr_scheduler 'magic'"),
    ("averaging target", lambda: AveragingCommunicator(target="weights"), ValueError, "target must be one of"),
    # fit arguments
    (
        "fit keyword misspelled",
        _fit(max_step=20),
        TypeError,
        r"fit\(\) got an unexpected keyword argument 'max_step' \(did you mean 'max_steps'\?\)",
    ),
    (
        "negative bandwidth",
        lambda: Link("-1Gbit/s", "1ms"),
        ValueError,
        r"Link bandwidth must be in \[1, 1e\+15\] bits/s \(1 bit/s to 1 Pbit/s\), got '-1Gbit/s'",
    ),
    ("strategy string", lambda: Trainer(TinyNet(), regression_data(64)).fit("ddp", 2), TypeError, "strategy must be"),
    ("0 nodes", _fit(num_nodes=0), ValueError, "num_nodes"),
    ("0 batch", _fit(batch_size=0), ValueError, "batch_size"),
    ("0 steps", _fit(max_steps=0), ValueError, "max_steps"),
    ("0 log interval", _fit(log_interval=0), ValueError, "log_interval"),
    ("device gpu", _fit(device="gpu"), ValueError, "device must be 'cpu', 'cuda' or 'mps'"),
    (
        "nccl on cpu",
        _fit(transport="nccl"),
        ValueError,
        r"transport='nccl' needs device='cuda', got device='cpu' \(\d+ GPUs",
    ),
    ("transport name", _fit(transport="tcp"), ValueError, "transport must be one of"),
    ("logger string", _fit(logger="csv2"), ValueError, r"logger must be one of \('csv', 'wandb', 'tensorboard'\)"),
    ("logger object", _fit(logger=object()), TypeError, "logger must have start"),
    ("workers > nodes", _fit(workers=3), ValueError, "workers"),
    ("network name", _fit(network="moon"), ValueError, "network"),
    ("torchrun_mode outside torchrun", _fit(torchrun_mode="deploy"), ValueError, "applies only under torchrun"),
    ("compute model", lambda: Network(1e9, 1e-3, compute="fast"), ValueError, "compute must be 'measured', 'flops'"),
    ("batch > shard", _fit(batch_size=64), ValueError, "batch_size=64 is larger than each node's shard"),
    ("vector loss", _fit(model=_VectorLoss()), TypeError, "scalar loss"),
    (
        "model input size",
        _fit(model=_WrongWidth()),
        RuntimeError,
        r"model\(batch\) failed on ExoGym's probe batch, examples 0 to 1 of train_dataset collated into a batch of 2 "
        r"\(shapes \[\(2, 8\), \(2, 1\)\]\).*"
        r"RuntimeError: mat1 and mat2 shapes cannot be multiplied \(2x8 and 20x4\)\. "
        r"A 2 in that error is this probe's batch size, not your batch_size",
    ),
    # errors only binding the strategy to a model reveals (built once in the parent)
    (
        "optimizer argument",
        _fit(lambda: SimpleReduceStrategy(optim_spec=OptimSpec(torch.optim.SGD, lr=0.1, momentum=-1.0))),
        ValueError,
        "momentum",
    ),
    (
        "communicator init",
        _fit(lambda: CommunicateOptimizeStrategy([_FailsToBind()])),
        ValueError,
        "ring_size must divide num_nodes",
    ),
]


@pytest.mark.parametrize(("what", "call", "error", "match"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_raises_naming_it_before_any_process_starts(what, call, error, match, monkeypatch) -> None:
    def no_start(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{what}: worker processes were started")

    monkeypatch.setattr(exogym.trainer, "run_nodes", no_start)
    with pytest.raises(error, match=match):
        call()


def test_the_table_covers_at_least_25_inputs() -> None:
    assert len(CASES) + len(CLI_CASES) >= 25 and len(CASES) >= 25


#: ``exogym compare`` arguments -> what the argparse-style error (exit 2) must say.
CLI_CASES: list[tuple[list[str], str]] = [
    (["--nodes", "0"], "argument --nodes: must be >= 1, got 0"),
    (["--nodes", "four"], "argument --nodes: must be an integer, got 'four'"),
    (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (["--H", "0"], "argument --H: must be >= 1, got 0"),
    (["--batch-size", "-2"], "argument --batch-size: must be >= 1, got -2"),
    (["--lr", "0"], "argument --lr: must be > 0, got 0"),
    (["--lr", "nan"], "argument --lr: must be > 0, got nan"),
    (["--workers", "3", "--nodes", "2"], "--workers must be between 1 and --nodes=2, got 3"),
    (["--strategies", "ddp,adam"], "unknown strategies ['adam']"),
    (["--strategies", ","], "argument --strategies: no strategy given"),
    (["--compute", "fast"], "argument --compute: must be 'flops', 'measured' or seconds per step"),
    (["--compute", "-1"], "argument --compute: seconds per step must be >= 0"),
    (["--compute", "1e300"], "argument --compute: seconds per step must be >= 0 and at most 1e+06, got 1e300"),
    (["--flops-per-second", "0"], "argument --flops-per-second: must be > 0"),
    (["--flops-per-second", "1e-300"], "argument --flops-per-second: must be in [1, 1e+21] FLOP/s, got 1e-300"),
    (["--network", "moon"], "argument --network: invalid choice: 'moon'"),
    (["--network", "missing-world.json"], "argument --network: world file 'missing-world.json' does not exist"),
    (["--task", "cifar"], "argument --task: invalid choice: 'cifar'"),
    (["--device", "gpu"], "argument --device: device must be 'cpu', 'cuda' or 'mps'"),
    pytest.param(
        ["--device", "cuda"],
        "torch.cuda.is_available() is False",
        marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: cuda is valid"),
    ),
    (["--task", "mnist"], "--task mnist: its data is not in --data-dir"),
    (["--partition", "labels"], "argument --partition: invalid choice: 'labels'"),
    (["--partition", "dirichlet", "--alpha", "0"], "argument --alpha: must be > 0, got 0"),
    (
        ["--partition", "dirichlet", "--task", "chars"],
        "--partition dirichlet (task chars): cannot read one integer label",
    ),
]


@pytest.mark.parametrize(("argv", "match"), CLI_CASES, ids=[" ".join(getattr(c, "values", c)[0]) for c in CLI_CASES])
def test_a_bad_compare_argument_exits_2_naming_it_before_anything_starts(
    argv, match, monkeypatch, capsys, tmp_path
) -> None:
    import urllib.error
    import urllib.request

    import exogym.cli.compare
    from exogym.__main__ import main

    def no_start(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{argv}: the comparison started")

    def offline(*args: Any, **kwargs: Any) -> None:
        raise urllib.error.URLError("no network")  # as on a machine without one

    monkeypatch.setattr(exogym.cli.compare, "compare", no_start)
    monkeypatch.setattr(urllib.request, "urlretrieve", offline)
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--data-dir", str(tmp_path), *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: exogym compare" in err and match in err and "Traceback" not in err


class _StopHere(Exception):
    pass


def _stop(*args: Any, **kwargs: Any) -> None:
    raise _StopHere()


def test_a_period_longer_than_the_run_and_a_long_warm_up_are_logged_before_training(monkeypatch, caplog) -> None:
    monkeypatch.setattr(exogym.trainer, "run_nodes", _stop)
    caplog.set_level("INFO", logger="exogym")
    with pytest.raises(_StopHere):
        _fit(lambda: DiLoCoStrategy(H=100, warmup_steps=1000), max_steps=30)()
    text = caplog.text
    assert "communicates every H=100 steps but the run has 30 steps: it will never communicate (0 rounds)" in text
    # lambda warm-up (flat after it): lr at the last step (index 29) is 30/1000 of the peak
    assert "the warm-up of 1000 steps is longer than the run (30 steps)" in text and "3.0% of its peak" in text
    caplog.clear()
    with pytest.raises(_StopHere):
        _fit(lambda: DiLoCoStrategy(H=10), max_steps=30)()
    assert "3 communication rounds in 30 steps" in caplog.text and "never" not in caplog.text


class _BlowsUp(TinyNet):
    """A loss that becomes infinite on rank 1 at its third step."""

    def forward(self, batch):
        from exogym.core.comm.comm import current

        self.calls = getattr(self, "calls", 0) + 1
        loss = super().forward(batch)
        return loss * float("inf") if current().rank == 1 and self.calls == 3 else loss


def test_diloco_with_fewer_rounds_than_its_outer_momentum_needs_is_warned_with_the_numbers(monkeypatch, caplog) -> None:
    monkeypatch.setattr(exogym.trainer, "run_nodes", _stop)
    with pytest.raises(_StopHere):
        _fit(DiLoCoStrategy, max_steps=200)()  # the defaults: H=100, outer momentum 0.9
    assert "momentum 0.9 needs about 20 steps (2 / (1 - momentum)) to build up, but the run gives it 2" in caplog.text
    assert "(200 steps / H=100)" in caplog.text
    caplog.clear()
    with pytest.raises(_StopHere):
        _fit(lambda: DiLoCoStrategy(H=20, outer_momentum=0.5), max_steps=200)()  # compare's preset: 10 rounds
    assert "momentum" not in caplog.text


def _factory(rank: int, num_nodes: int, train_dataset: bool):
    data = regression_data(64, seed=0 if train_dataset else 1)
    return torch.utils.data.Subset(data, range(rank, len(data), num_nodes))


def test_a_training_factory_without_val_dataset_says_no_validation_will_run(monkeypatch, caplog) -> None:
    monkeypatch.setattr(exogym.trainer, "run_nodes", _stop)
    with pytest.raises(_StopHere):
        Trainer(TinyNet(), _factory).fit(SimpleReduceStrategy(), 2, max_steps=4, batch_size=8, logger=False)
    assert "no validation will run" in caplog.text and "Trainer(model, factory, factory)" in caplog.text


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_a_factory_passed_as_val_dataset_too_validates_on_its_validation_data(caplog) -> None:
    trainer = Trainer(TinyNet(), _factory, _factory)
    trainer.fit(SimpleReduceStrategy(), 2, max_steps=4, batch_size=8, logger=False, progress=False)
    steps = [r["step"] for r in trainer.history if "val_loss_global" in r]
    assert steps[0] == 0 and steps[-1] == 4
    assert "no validation will run" not in caplog.text


def test_a_non_finite_loss_stops_the_run_naming_the_node_and_step() -> None:
    from tests.fake_world import train_ranks

    with pytest.raises(FloatingPointError, match="node 1: the training loss is inf at step 2"):
        train_ranks(2, SimpleReduceStrategy, 4, make_model=_BlowsUp)


def test_stop_on_nonfinite_loss_false_trains_on(monkeypatch) -> None:
    import dataclasses

    import tests.fake_world as fw

    config = fw._config
    monkeypatch.setattr(fw, "_config", lambda *a: dataclasses.replace(config(*a), stop_on_nonfinite_loss=False))
    out = fw.train_ranks(2, SimpleReduceStrategy, 4, make_model=_BlowsUp)
    assert len(out[1]["records"]) == 4  # every step ran


def test_an_error_in_a_world_file_names_the_file_once(tmp_path, capsys) -> None:
    from exogym.__main__ import main

    world = tmp_path / "neg.json"
    world.write_text('{"regions": {"a": [0, 1], "b": [2, 3]}, "intra": {"bandwidth": "-1Gbit/s", "latency": "1ms"}}')
    with pytest.raises(SystemExit):
        main(["compare", "--network", str(world)])
    err = capsys.readouterr().err
    assert f"argument --network: {world}: intra: Link bandwidth must be in [1, 1e+15] bits/s" in err
    assert err.count("neg.json") == 1
