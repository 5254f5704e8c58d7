"""Dormant nodes: the nodes that never train nor take part in a round, run once per worker
(``exogym.runtime.dormant``). Which nodes the plan makes dormant, where it makes none, and
runs with dormant nodes against the same runs whose every node runs itself."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch.utils.data import Subset

from communicators import AveragingCommunicator
from communicators.islands import draw_round
from exogym import Network, Trainer
from exogym.run_config import CheckpointConfig, DataConfig, FitArgs, LoggingConfig, RunConfig, TransportConfig
from exogym.runtime import plan as P
from exogym.runtime.dormant import _states_uniform_idle_calls
from exogym.runtime.faults import Faults
from exogym.runtime.launch import NodeFailedError
from exogym.runtime.placement import Placement
from exogym.runtime.virtual import VirtualHub
from exogym.strategy import CommunicateOptimizeStrategy, FedAvgStrategy, SimpleReduceStrategy
from tests.helpers import FIT_DEFAULTS, TinyNet, regression_data

SGD = "sgd"
#: Modelled compute: every column of a row but the measured ones is a function of the run.
NET = Network(1e9, 0.01, compute=0.01)
SPEEDS = Network(1e9, 0.01, compute=0.01, compute_slowdown=(1.0, 1.0, 2.0, 4.0))
MEASURED = ("wall_time", "comm_time", "peak_memory")
SEED = 5


def _plan(strategy: Any, num_nodes: int, workers: int, steps: int, val: Any = None, run: Any = None, **sections: Any):
    settings = dict(num_nodes=num_nodes, max_steps=steps, batch_size=8, device="cpu", seed=SEED, **(run or {}))
    args = FitArgs(
        RunConfig(**settings),
        transport=TransportConfig(transport="gloo", workers=workers),
        logging=LoggingConfig(logger=False),
        **sections,
    )
    plan = P.plan_run(TinyNet(), regression_data(num_nodes * 16), val, strategy, args)
    plan.transport.close()
    return plan


class _OwnInit(FedAvgStrategy):
    """A user's FedAvg that sets a node up its own way."""

    def _init_node(self, model: torch.nn.Module, rank: int, num_nodes: int) -> None:
        super()._init_node(model, rank, num_nodes)


class _OwnAveraging(AveragingCommunicator):
    """A user's averaging that communicates its own way."""

    def communicate(self, step: int) -> None:
        super().communicate(step)


def _fedavg(sampling: float = 0.05, **kw: Any) -> FedAvgStrategy:
    return FedAvgStrategy(H=2, client_sampling=sampling, optim_spec=SGD, lr=0.05, **kw)


def test_the_plan_makes_dormant_every_node_no_round_samples_but_rank_0() -> None:
    plan = _plan(_fedavg(), 60, 2, 6)
    sampled = set().union(*(draw_round(60, None, 0.05, SEED, r).trains for r in range(3)))
    assert plan.placement.dormant == frozenset(range(1, 60)) - sampled
    assert len(plan.placement.dormant) >= 50


@pytest.mark.parametrize(
    "make, sections, workers",
    [
        (lambda: _fedavg(island_size=10), {}, 2),  # islands are drawn per rank
        (_fedavg, {"data": DataConfig(val_size=16)}, 2),  # validation reads every node's state
        (_fedavg, {"checkpoint": CheckpointConfig(checkpoint_dir="ckpt", checkpoint_interval=2)}, 2),
        (_fedavg, {"faults": Faults(drop={1: [0]})}, 2),
        (_fedavg, {}, 60),  # a process per node
        (lambda: SimpleReduceStrategy(optim_spec=SGD), {}, 2),  # every node trains
        (lambda: _OwnInit(H=2, client_sampling=0.05, optim_spec=SGD), {}, 2),  # may call collectives of its own
        (
            lambda: CommunicateOptimizeStrategy([_OwnAveraging(2, client_sampling=0.05)], optim_spec=SGD),
            {},
            2,
        ),
    ],
    ids=["islands", "validation", "checkpoints", "faults", "processes", "ddp", "own_init", "own_module"],
)
def test_no_node_is_dormant_where_the_run_reads_or_picks_nodes_by_rank(make, sections, workers, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    val = regression_data(64) if "data" in sections else None
    assert _plan(make(), 60, workers, 6, val, **sections).placement.dormant == frozenset()


def test_a_worker_s_first_dormant_node_leads_its_other_dormant_nodes() -> None:
    p = Placement([(0, 1, 2, 5), (3, 4, 6)], dormant={2, 5, 6, 1})
    assert p.twins(0) == {1: (2, 5)}
    assert p.twins(1) == {}  # one dormant node: it runs itself
    with pytest.raises(ValueError, match="other than 0"):
        Placement([(0, 1)], dormant={0})


def _run(strategy: Any, num_nodes: int, workers: int, steps: int, dormant: bool, data: Any, network: Network, mp):
    """Final parameters, rows less the measured columns, and the per-node table of a run with
    dormant nodes or with every node running itself."""
    with mp.context() as m:
        if not dormant:
            m.setattr(P, "dormant_nodes", lambda *a: frozenset())
        trainer = Trainer(TinyNet(), data)
        model = trainer.fit(
            strategy, num_nodes=num_nodes, workers=workers, max_steps=steps, batch_size=8, seed=SEED, network=network,
            log_interval=2, **FIT_DEFAULTS,
        )  # fmt: skip
    rows = [{k: v for k, v in r.items() if k not in MEASURED} for r in trainer.history]
    return [p.detach().clone() for p in model.parameters()], rows, trainer.result["nodes"], trainer.result["summary"]


def _assert_same_run(a: tuple, b: tuple) -> None:
    """Equal up to the order of float sums: the hub folds the twins' equal contributions when
    their lead makes them, not in node order (the final average, the rows' byte means)."""
    for x, y in zip(a[0], b[0], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)
    assert len(a[1]) == len(b[1])
    for r, s in zip(a[1], b[1], strict=True):
        assert r.keys() == s.keys() and r == pytest.approx(s, rel=1e-12, nan_ok=True)
    assert len(a[2]) == len(b[2]) and a[3] == b[3]
    for r, s in zip(a[2], b[2], strict=True):
        assert r == pytest.approx(s, rel=1e-12)


def _client_data(rank: int, num_nodes: int, train: bool, small: frozenset[int] = frozenset()) -> Subset:
    """80 examples per client, 4 (less than a batch) for the ``small`` ones."""
    data = regression_data(2000)
    g = torch.Generator().manual_seed(rank)
    return Subset(data, torch.randint(0, len(data), (4 if rank in small else 80,), generator=g).tolist())


@pytest.mark.procs
@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers", [1, 2])
def test_fedavg_with_dormant_clients_equals_the_run_where_every_client_runs(workers: int, monkeypatch) -> None:
    assert len(_plan(_fedavg(), 64, workers, 8, run={"network": NET}).placement.dormant) >= 40
    data = regression_data(64 * 16)
    with_ = _run(_fedavg(), 64, workers, 8, True, data, NET, monkeypatch)
    without = _run(_fedavg(), 64, workers, 8, False, data, NET, monkeypatch)
    _assert_same_run(with_, without)


@pytest.mark.procs
@pytest.mark.timeout(240)
@pytest.mark.parametrize("dormant", [True, False])
def test_a_twin_s_dataset_smaller_than_a_batch_fails_the_run_as_any_node_s(dormant: bool, monkeypatch) -> None:
    # the lead builds its twins' datasets and agrees on their steps per epoch too
    plan = _plan(_fedavg(), 60, 2, 8, run={"network": NET})
    last_twin = max(r for w in range(2) for ts in plan.placement.twins(w).values() for r in ts)
    data = functools.partial(_client_data, small=frozenset({last_twin}))
    with pytest.raises(NodeFailedError, match=f"node {last_twin}'s dataset has fewer than batch_size=8 examples"):
        _run(_fedavg(), 60, 2, 8, dormant, data, NET, monkeypatch)


def test_a_hub_makes_its_lead_s_calls_for_the_twins_which_run_no_thread() -> None:
    # Nodes 0-5 on one worker, 2-5 dormant: node 2 leads, nodes 3, 4 and 5 are its twins, whose
    # calls are node 2's. Each running node sums its rank + 1 (waits), receives a max it takes
    # no part in, contributes to a sum and to a max it does not wait for, sits one out, and
    # gathers. Expected values written out from the ranks.
    hub = VirtualHub(Placement([(0, 1, 2, 3, 4, 5)], dormant={2, 3, 4, 5}), 0, None, torch.device("cpu"), 0)
    ran: list[int] = []
    out: dict[Any, Any] = {}

    def body(rank: int, transport: Any) -> None:
        ran.append(rank)
        t = torch.tensor([float(rank + 1)])
        transport.all_reduce(t, "sum")
        got = transport.all_reduce_receive(torch.zeros(1), "max") if rank == 2 else None
        if rank != 2:
            transport.all_reduce(torch.tensor([float(rank + 1)]), "max")
        if rank == 0:
            total, top, alone = torch.tensor([10.0]), torch.tensor([-1.0]), torch.tensor([5.0])
            transport.all_reduce(total, "sum")
            transport.all_reduce(top, "max")
            transport.all_reduce(alone, "sum")
            out["sum"], out["max"], out["alone"] = total.item(), top.item(), alone.item()
        else:
            transport.all_reduce_contribute(torch.tensor([10.0 * (rank + 1)]), "sum")
            transport.all_reduce_contribute(torch.tensor([float(rank)]), "max")
            transport.all_reduce_absent(torch.zeros(1), "sum")
        out[rank] = (t.item(), None if got is None else got.item(), transport.all_gather(torch.tensor([float(rank)])))

    hub.run(body)
    assert sorted(ran) == [0, 1, 2]  # the twins run nothing of their own
    assert out[0][0] == out[2][0] == 1 + 2 + 4 * 3  # each twin's share of a sum is its lead's
    assert out[2][1] == 2.0  # a max of nodes 0 and 1: the twins receive it, as their lead
    assert out["sum"] == 10 + 20 + 4 * 30 and out["max"] == 2.0 and out["alone"] == 5.0
    assert out[0][2].tolist() == [[0.0], [1.0], [2.0], [2.0], [2.0], [2.0]]  # a twin's row of a gather is its lead's


class _SaysUniform(_OwnAveraging):
    """The user's averaging that communicates its own way and says its idle calls are uniform."""

    uniform_idle_calls = True


def test_a_module_s_claim_covers_the_methods_of_the_class_that_makes_it() -> None:
    assert _states_uniform_idle_calls(AveragingCommunicator(2, client_sampling=0.1))
    assert not _states_uniform_idle_calls(AveragingCommunicator(2, island_size=4, client_sampling=0.1))
    assert not _states_uniform_idle_calls(_OwnAveraging(2, client_sampling=0.1))  # overrides, inherits no claim
    assert _states_uniform_idle_calls(_SaysUniform(2, client_sampling=0.1))  # says it again for its own
    plan = _plan(CommunicateOptimizeStrategy([_SaysUniform(2, client_sampling=0.05)], optim_spec=SGD), 60, 2, 6)
    assert len(plan.placement.dormant) >= 50
