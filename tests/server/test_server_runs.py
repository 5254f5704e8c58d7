"""The asynchronous presets (FedBuff, Async DiLoCo, HALoS, Decoupled DiLoCo) as ``fit`` runs them:
as a server and tasks on worker processes, the same schedule and values on 1, 2 and 4 workers,
bit-identical resumes from checkpoints taken with updates in flight, their synchronous limits,
and their errors before any process starts."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import exogym
import exogym.trainer
from communicators.fedavg import FedAvgServer
from exogym import Trainer
from exogym.core.comm.links import Link
from exogym.core.comm.network import Network
from exogym.core.events import DeadlockError
from exogym.strategy import (
    AsyncDiLoCoStrategy,
    DecoupledDiLoCoStrategy,
    DiLoCoStrategy,
    FedAvgStrategy,
    FedBuffStrategy,
    HALoSStrategy,
    OptimSpec,
)
from tests.fake_world import train_ranks, train_server
from tests.helpers import TinyNet, regression_data

SGD = OptimSpec(torch.optim.SGD, lr=0.05)
#: Speeds 1, 1, 2, 4 (a step of 1 s on the slowest nodes), 10 ms each way to the server.
SPEEDS = Network(1e9, 0.01, compute=1.0, compute_slowdown=(1.0, 1.0, 0.5, 0.25))
#: The same speeds on two regions of two nodes (HALoS's servers: one per region and a global one).
REGIONS = Network.regions(
    {"a": [0, 1], "b": [2, 3]}, Link(1e9, 0.01), Link(1e8, 0.3), compute=1.0, compute_slowdown=(1.0, 1.0, 0.5, 0.25)
)
#: The same speeds, node 1 away from 3 s to 6 s (Decoupled DiLoCo follows the trace).
AWAY = Network(
    1e9, 0.01, compute=1.0, compute_slowdown=(1.0, 1.0, 0.5, 0.25),
    availability=[{"time": 3.0, "node": 1, "available": 0}, {"time": 6.0, "node": 1, "available": 1}],
)  # fmt: skip
#: Columns measured on this machine; every other column is simulated and must match exactly.
MEASURED = ("wall_time", "comm_time", "peak_memory")

STRATEGIES = {
    "async_diloco": lambda: AsyncDiLoCoStrategy(H=4, outer_momentum=0.5, optim_spec=SGD),
    "fedbuff": lambda: FedBuffStrategy(local_steps=2, buffer_size=2, concurrency=3, optim_spec=SGD),
    "halos": lambda: HALoSStrategy(H=4, accumulation=2, lps_momentum=0.5, optim_spec=SGD),
    "decoupled_diloco": lambda: DecoupledDiLoCoStrategy(H=4, fragments=2, quorum=2, optim_spec=SGD),
    "fedavg_islands": lambda: exogym.ServerStrategy(FedAvgServer(4, 0.5, island_size=2), optim_spec=SGD),
}
NETWORKS = {"halos": REGIONS, "decoupled_diloco": AWAY}


def _fit(strategy: Any, num_nodes: int, examples: int, network: Network, steps: int, **kw: Any) -> tuple:
    """A run (TinyNet, regression data, batch 8, no validation): its final parameters, its metric
    rows less the measured columns, its summary and its per-node table."""
    trainer = Trainer(TinyNet(), regression_data(examples))
    model = trainer.fit(
        strategy, num_nodes=num_nodes, max_steps=steps, batch_size=8, network=network, logger=False,
        progress=False, val_size=0, **kw,
    )  # fmt: skip
    rows = [{c: v for c, v in r.items() if c not in MEASURED} for r in trainer.history]
    params = [p.detach().clone() for p in model.parameters()]
    return params, rows, trainer.result["summary"], trainer.result["nodes"]


@pytest.mark.procs
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_one_two_and_four_workers_run_the_same_schedule_and_values(name: str) -> None:
    net = NETWORKS.get(name, SPEEDS)
    try:
        runs = {w: _fit(STRATEGIES[name](), 4, 4 * 8 * 40, net, 24, workers=w, log_interval=4) for w in (4, 1, 2)}
    finally:
        exogym.shutdown()
    params, rows, summary, nodes = runs[4]
    assert summary["updates"] > 0 and rows
    for w in (1, 2):
        assert runs[w][2] == summary and runs[w][3] == nodes  # every node's steps and clock, every update
        assert runs[w][1] == rows  # bytes, simulated times and losses: the same results in the same order
        for x, y in zip(runs[w][0], params, strict=True):
            assert torch.equal(x, y)


def test_the_clock_is_one_the_table_the_summary_and_the_last_row_agree() -> None:
    out = train_server(4, STRATEGIES["halos"], 24, network=REGIONS, workers=2)
    end = out[0]["summary"]["end_time"]
    assert out[0]["history"][-1]["sim_time"] == end
    for row, util in zip(out[0]["nodes"], out[0]["summary"]["utilisation"], strict=True):
        assert row["clock"] == end
        assert row["compute"] + row["comm"] + row["wait"] == pytest.approx(end, abs=1e-9)
        assert row["utilisation"] == pytest.approx(util, abs=1e-12)


#: Nodes at different paces (no DyLU): updates are in flight across the checkpoint at step 8.
RESUMED = {
    "async_diloco": lambda: AsyncDiLoCoStrategy(H=4, outer_momentum=0.5, dylu=False, optim_spec=SGD),
    "fedbuff": STRATEGIES["fedbuff"],
    "halos": lambda: HALoSStrategy(H=4, accumulation=1, lps_momentum=0.5, dylu=False, optim_spec=SGD),
    "decoupled_diloco": STRATEGIES["decoupled_diloco"],
    "fedavg_islands": STRATEGIES["fedavg_islands"],
    "decoupled_diloco_cgad": lambda: DecoupledDiLoCoStrategy(
        H=4, fragments=2, quorum=2, outer="cgad", outer_lr=0.05, optim_spec=SGD
    ),
}


@pytest.mark.procs
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(RESUMED))
def test_a_run_checkpointed_with_updates_in_flight_resumes_bit_identically(name: str, tmp_path) -> None:
    # 0.4 s each way to the server, steps of 0.25-1 s: updates are in flight across step 8
    net = Network(1e9, 0.4, compute=1.0, compute_slowdown=(1.0, 1.0, 0.5, 0.25))
    if name == "halos":  # 0.4 s to the regional servers, 1.2 s more between them and the global one
        links = {("a", "a"): Link(1e9, 0.4), ("b", "b"): Link(1e9, 0.4), ("a", "b"): Link(1e9, 1.6)}
        net = Network.regions(
            {"a": [0, 1], "b": [2, 3]}, links=links, compute=1.0, compute_slowdown=(1.0, 1.0, 0.5, 0.25)
        )

    def fit(steps: int, **kw: Any) -> tuple:
        return _fit(RESUMED[name](), 4, 1024, net, steps, log_interval=2, **{"workers": 2, **kw})

    try:
        whole = fit(16)
        fit(16, checkpoint_dir=str(tmp_path), checkpoint_interval=8)
        state = torch.load(tmp_path / "step-00000008" / "node-00000.pt", weights_only=True)["loop"]
        in_flight = [
            e for e in state["events"] if e[4] in ("receive", "start", "contribution", "region_receive", "merge")
        ]
        assert in_flight  # results or contributions on their way at the checkpoint
        resumed = fit(16, resume_from=str(tmp_path), workers=1)  # on another number of workers
    finally:
        exogym.shutdown()
    assert all(torch.equal(x, y) for x, y in zip(whole[0], resumed[0], strict=True))
    assert resumed[1] == whole[1] and resumed[2] == whole[2] and resumed[3] == whole[3]


@pytest.mark.parametrize("k", [2, 4])
def test_with_equal_speeds_and_dylu_off_async_diloco_equals_synchronous_diloco(k: int) -> None:
    # every node's update arrives at one instant; DN with N = K and c = 0 takes one Nesterov
    # step on their mean, which every node then pulls
    steps, ds = 12, regression_data(k * 8 * 12)
    net = Network(1e9, 0.01, compute=1.0)
    a = train_server(
        k, lambda: AsyncDiLoCoStrategy(H=3, outer_lr=0.7, outer_momentum=0.5, dylu=False, optim_spec=SGD), steps,
        dataset=ds, network=net,
    )  # fmt: skip
    b = train_ranks(
        k, lambda: DiLoCoStrategy(H=3, outer_lr=0.7, outer_momentum=0.5, optim_spec=SGD), steps, dataset=ds, network=net
    )
    for x, y in zip(a[0]["params"], b[0]["params"], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)  # the mean summed in another order
    assert a[0]["summary"]["steps"] == [steps] * k


def test_with_dylu_the_fastest_node_takes_four_times_the_steps_of_the_slowest() -> None:
    out = train_server(4, lambda: AsyncDiLoCoStrategy(H=4, optim_spec=SGD), 12, network=SPEEDS)
    assert out[0]["summary"]["steps"] == [3, 3, 6, 12]


def test_a_fedbuff_client_never_drawn_is_never_built() -> None:
    out = train_server(
        50, lambda: FedBuffStrategy(local_steps=2, buffer_size=2, concurrency=2, optim_spec=SGD), 8,
        dataset=regression_data(50 * 8 * 8), network=SPEEDS,
    )  # fmt: skip
    trained = {r for r, s in enumerate(out[0]["summary"]["steps"]) if s}
    sent = {row["rank"] for row in out[0]["nodes"]}  # the table lists the clients a send named
    assert 2 <= len(trained) and trained <= sent and len(sent) <= len(trained) + 2  # (drawn as the run drains)
    # no clock exists for a client no send named, and no stored state for one that ran no task
    assert set(out[0]["loop"].clients) == sent
    assert set(out[0]["clients"]) == trained


def _no_start(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("worker processes were started")


@pytest.mark.parametrize(
    ("strategy", "network", "match"),
    [
        (lambda: AsyncDiLoCoStrategy(H=2), Network(1e9, 0.01, compute="measured"), "modelled compute.*'measured'"),
        (lambda: FedBuffStrategy(concurrency=5), SPEEDS, "concurrency=5 is more than num_nodes=3"),
        (lambda: DecoupledDiLoCoStrategy(H=4, quorum=4), SPEEDS, "quorum=4 is more than num_nodes=3"),
        (
            lambda: FedAvgStrategy(H=2, client_sampling=0.5),
            AWAY,
            r"availability trace that takes clients away, but FedAvg\(H=2.*does not read it",
        ),
        (lambda: FedBuffStrategy(concurrency=2), AWAY, "does not read it .Server.follows_availability is False"),
    ],
)
def test_a_server_run_refuses_settings_the_run_cannot_have_before_any_process_starts(
    strategy, network, match, monkeypatch
) -> None:
    monkeypatch.setattr(exogym.trainer, "run_nodes", _no_start)
    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(ValueError, match=match):
        trainer.fit(strategy(), num_nodes=3, max_steps=4, network=network, progress=False, logger=False)


def test_faults_with_a_server_are_refused_naming_node_speeds_for_stragglers(monkeypatch) -> None:
    monkeypatch.setattr(exogym.trainer, "run_nodes", _no_start)
    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(ValueError, match=r"runs FedAvg\(H=2.* as a server.*compute_slowdown"):
        trainer.fit(
            FedAvgStrategy(H=2, client_sampling=0.5), num_nodes=3, max_steps=4, network=SPEEDS,
            faults=exogym.Faults(drop_probability=0.1), progress=False, logger=False,
        )  # fmt: skip


@pytest.mark.parametrize("bad", [{"H": 0}, {"outer_momentum": 1.0}, {"dn_period": 0}, {"dn_c": -1.0}])
def test_async_diloco_names_a_bad_argument(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        AsyncDiLoCoStrategy(**{"H": 4, **bad})


def _clients(rank: int, num_nodes: int, train: bool) -> Any:
    """Client ``rank``'s 16 examples (drawn with its own seed): 1,000 clients share 2,048."""
    data = regression_data(2048)
    idx = torch.randint(0, len(data), (16,), generator=torch.Generator().manual_seed(rank))
    return torch.utils.data.Subset(data, idx.tolist())


@pytest.mark.procs
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fedbuff_on_1000_clients_runs_the_same_schedule_and_values_on_one_and_two_workers() -> None:
    net = Network(1e9, 0.01, compute=0.01, compute_slowdown=tuple(1.0 + (r % 7) * 0.37 for r in range(1000)))

    def run(workers: int) -> tuple[list[torch.Tensor], dict[str, Any]]:
        trainer = Trainer(TinyNet(), _clients)
        model = trainer.fit(
            FedBuffStrategy(local_steps=2, buffer_size=4, concurrency=20, optim_spec=SGD), num_nodes=1000,
            workers=workers, max_steps=30, batch_size=8, network=net, logger=False, progress=False, val_size=0,
            log_interval=10,
        )  # fmt: skip
        return [p.detach().clone() for p in model.parameters()], trainer.result["summary"]

    try:
        one, two = run(1), run(2)
    finally:
        exogym.shutdown()
    assert one[1] == two[1] and one[1]["updates"] >= 20  # the schedule: exactly the same
    assert sum(s > 0 for s in one[1]["steps"]) > 20  # more clients than the concurrency took part
    for x, y in zip(one[0], two[0], strict=True):
        assert torch.equal(x, y)  # each task runs on one worker: the same values


@pytest.mark.procs
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compare_of_the_four_asynchronous_presets_runs_one_schedule_on_one_two_and_four_workers(tmp_path) -> None:
    from exogym.cli.compare import compare

    def run(workers: int):
        return compare(
            "digits", ["async_diloco", "fedbuff", "halos", "decoupled_diloco"], nodes=4, steps=24, batch_size=8,
            H=4, network=REGIONS, compute=0.05, out_dir=str(tmp_path / f"w{workers}"), progress=False, val_size=64,
            workers=workers, raise_on_failure=True,
        )  # fmt: skip

    try:
        runs = {w: run(w) for w in (4, 1, 2)}
    finally:
        exogym.shutdown()
    kept = ("strategy", "sim_time", "bytes_sent_per_node", "utilisation", "staleness", "staleness_max")
    want = [{c: row.get(c) for c in kept} for row in runs[4].summary]
    assert [row["strategy"] for row in want] == ["async_diloco", "fedbuff", "halos", "decoupled_diloco"]
    for w in (1, 2):
        assert [{c: row.get(c) for c in kept} for row in runs[w].summary] == want
        for got, ref in zip(runs[w].summary, runs[4].summary, strict=True):
            # the validation's sums over the workers' shares of the validation set: in the layout's order
            assert got["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-6)


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_on_a_two_region_world_file_every_figure_of_an_asynchronous_run_comes_from_one_clock(tmp_path) -> None:
    import csv
    import json

    from exogym.cli.compare import compare

    world = tmp_path / "world.json"
    world.write_text(
        json.dumps(
            {
                "regions": {"us": [0, 1], "eu": [2, 3]},
                "intra": {"bandwidth": "100Gbit/s", "latency": "1ms"},
                "inter": {"bandwidth": "100Mbit/s", "latency": "100ms"},
                "compute_slowdown": [1, 0.5, 1, 0.333],
                "compute": 0.02,
            }
        )
    )
    try:
        result = compare(
            "digits", ["async_diloco", "fedbuff"], nodes=4, steps=40, batch_size=8, H=4, network=str(world),
            out_dir=str(tmp_path / "out"), progress=False, val_size=64, raise_on_failure=True,
        )  # fmt: skip
    finally:
        exogym.shutdown()
    assert "compute 0.02 s/step (world.json)" in result.caption  # the file's compute holds
    with open(tmp_path / "out" / "latest" / "summary.csv") as f:
        csv_rows = {row["strategy"]: row for row in csv.DictReader(f)}
    for name in ("async_diloco", "fedbuff"):
        nodes, history = result.nodes[name], result.histories[name]
        end = history[-1]["sim_time"]
        assert float(csv_rows[name]["sim_time"]) == pytest.approx(end, abs=1e-6)
        for row in nodes:
            assert row["clock"] == pytest.approx(end, abs=1e-6)
            assert row["compute"] + row["comm"] + row["wait"] == pytest.approx(end, abs=1e-6)
        for row in (r for r in nodes if r["rank"] in (2, 3)):  # in eu: each transfer crosses 100 ms
            assert row["comm"] >= 0.1 * 2  # at least one task: its download or start, and its upload


def test_the_server_model_is_validated_at_the_start_every_interval_and_at_the_end() -> None:
    out = train_server(4, STRATEGIES["fedbuff"], 24, network=SPEEDS, val_dataset=regression_data(64, seed=1), workers=2)
    rows = [r for r in out[0]["history"] if "val_loss_global" in r]
    assert [r["step"] for r in rows] == [0, 24]  # no interval: the start and the end
    assert all(r["val_loss_global"] > 0 and "bytes_sent" in r for r in rows)
    assert rows[0]["bytes_sent"] == 0 and rows[-1]["bytes_sent"] == out[0]["history"][-2]["bytes_sent"]


class _Lazy(exogym.Server):
    def start(self):
        self.send(0, exogym.Train(2))

    def on_result(self, result):
        pass  # never sends again


class _NoSuper(exogym.Server):
    def setup(self, ctx):
        self.count = 0

    def start(self):
        self.send(0, exogym.Train(2))

    def on_result(self, result):
        pass


class _Twice(exogym.Server):
    def start(self):
        self.send(0, exogym.Train(2))
        self.send(0, exogym.Train(2))

    def on_result(self, result):
        pass


class _NotATask(exogym.Server):
    def start(self):
        self.send(0, 5)

    def on_result(self, result):
        pass


@pytest.mark.parametrize(
    ("server", "error", "match"),
    [
        (_Lazy, DeadlockError, "after 2 of 12 steps: no client is in flight, and the server sends nothing more"),
        (_Twice, RuntimeError, "sent client 0 a task at 0 s while its last one is in flight"),
        (_NotATask, TypeError, r"send: task must be a Train\(steps\), got 5"),
        (_NoSuper, TypeError, r"_NoSuper.setup\(ctx\) must call super\(\).setup\(ctx\) first"),
    ],
)
def test_a_servers_mistakes_are_named(server, error, match) -> None:
    with pytest.raises(error, match=match):
        train_server(3, lambda: exogym.ServerStrategy(server(), optim_spec=SGD), 12, network=SPEEDS)


def test_a_setup_without_super_is_refused_before_any_process_starts(monkeypatch) -> None:
    monkeypatch.setattr(exogym.trainer, "run_nodes", _no_start)
    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(TypeError, match="must call super"):
        trainer.fit(exogym.ServerStrategy(_NoSuper(), optim_spec=SGD), 3, max_steps=4, network=SPEEDS, progress=False)


def test_a_validation_row_is_timed_as_the_train_row_of_its_step() -> None:
    slow = Network(1e8, 0.01, compute=1.0, compute_slowdown=(1.0, 1.0, 0.5, 0.25))
    out = train_server(
        4, STRATEGIES["async_diloco"], 16, network=slow, val_dataset=regression_data(64, seed=1), workers=1
    )
    # (a validation needs val_interval: the helper's run validates at the start and the end only)
    train = {r["step"]: r for r in out[0]["history"] if "train_loss" in r}
    for row in (r for r in out[0]["history"] if "val_loss_global" in r and r["step"] in train):
        assert row["sim_time"] == train[row["step"]]["sim_time"]
        assert row["bytes_sent"] == train[row["step"]]["bytes_sent"]


class _SendsAtTheEnd(exogym.Server):
    """Sends client 0 one step at a time; records whether the run is open at each result."""

    def setup(self, ctx):
        super().setup(ctx)
        self.seen = []

    def start(self):
        self.send(0, exogym.Train(1), transfer=False)

    def on_result(self, result):
        self.seen.append(self.open)
        self.send(0, exogym.Train(1))


def test_the_run_is_closed_to_sends_once_its_last_tick_has_passed() -> None:
    out = train_server(2, lambda: exogym.ServerStrategy(_SendsAtTheEnd(), optim_spec=SGD), 3, network=SPEEDS)
    server, loop = out[0]["server"], out[0]["loop"]
    assert server.seen == [True, True, False]  # the third result arrives after the third (last) tick
    assert loop.clients[0].steps == 3
    row = out[0]["nodes"][0]
    assert row["compute"] + row["comm"] + row["wait"] == pytest.approx(row["clock"], abs=1e-9)


@pytest.mark.parametrize("compute", [0.0, 4e-10])
def test_steps_that_take_no_time_on_the_clock_are_refused_naming_the_fix(compute: float) -> None:
    # 4e-10 s is below the clock's nanosecond: every step of a task would start at one instant
    with pytest.raises(ValueError, match=r"a step must take time.*compute=<seconds per step >= 1e-9>"):
        train_server(2, STRATEGIES["fedbuff"], 4, network=Network(1e9, 0.0, compute=compute))


def test_a_model_with_running_statistics_is_refused_before_any_process_starts(monkeypatch) -> None:
    monkeypatch.setattr(exogym.trainer, "run_nodes", _no_start)

    class WithBatchNorm(TinyNet):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(8)

    trainer = Trainer(WithBatchNorm(), regression_data(256))
    with pytest.raises(ValueError, match="norm .BatchNorm1d. updates running statistics.*track_running_stats=False"):
        trainer.fit(STRATEGIES["fedbuff"](), 3, max_steps=4, network=SPEEDS, progress=False)


def test_a_run_shorter_than_a_task_warns_that_no_result_reached_the_server(caplog) -> None:
    from communicators.fedavg import FedAvgServer

    make = lambda: exogym.ServerStrategy(FedAvgServer(5, 0.5), optim_spec=SGD)  # noqa: E731
    with caplog.at_level("WARNING", logger="exogym.runtime.server_run"):
        out = train_server(4, make, 3, network=SPEEDS)
    assert out[0]["summary"]["updates"] == 0
    assert "no client's result reached the server in the run's 3 steps" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="exogym.runtime.server_run"):
        train_server(4, make, 10, network=SPEEDS)
    assert "no client's result" not in caplog.text
    # a server that records no update (record_update is optional) but receives results: no warning
    with caplog.at_level("WARNING", logger="exogym.runtime.server_run"):
        out = train_server(2, lambda: exogym.ServerStrategy(_SendsAtTheEnd(), optim_spec=SGD), 3, network=SPEEDS)
    assert out[0]["summary"]["updates"] == 0 and out[0]["server"].seen
    assert "no client's result" not in caplog.text


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_the_rows_of_a_server_run_carry_their_own_wall_time_rising_to_the_end() -> None:
    trainer = Trainer(TinyNet(), regression_data(512))
    trainer.fit(
        FedBuffStrategy(local_steps=2, buffer_size=2, concurrency=2, optim_spec=SGD), num_nodes=3, max_steps=12,
        network=SPEEDS, log_interval=3, val_size=0, progress=False, logger=False,
    )  # fmt: skip
    walls = [r["wall_time"] for r in trainer.history if "train_loss" in r]
    assert len(walls) == 4 and walls == sorted(walls) and len(set(walls)) == 4
