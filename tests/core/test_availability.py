"""Availability traces: nodes present or absent over simulated seconds, turned into the rounds
they drop out of at the start of a run, with the same effect as ``Faults(drop=...)``."""

import pytest
import torch

from exogym import Availability, Faults, Trainer
from exogym.core.comm.links import Link
from exogym.core.comm.network import Network
from exogym.strategy import DeMoStrategy, DiLoCoStrategy, FedAvgStrategy, OptimSpec
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, regression_data

K = 4
# Node 2 leaves at 1.0 s and returns at 3.0 s; node 1 is away for 4.4-4.45 s only.
ROWS = [
    {"time": 1.0, "node": 2, "available": 0},
    {"time": 3.0, "node": 2, "available": 1},
    {"time": 4.4, "node": 1, "available": "false"},
    {"time": 4.45, "node": 1, "available": "true"},
]


def test_a_node_absent_at_any_moment_of_a_round_drops_out_of_that_round() -> None:
    # Rounds of 3 steps of 0.5 s: round 0 is [0, 1.5) s, round 1 [1.5, 3), round 2 [3, 4.5),
    # round 3 [4.5, 5) (the run's 10th step only). Node 2 is away during rounds 0 and 1 (it
    # leaves inside round 0 and is back exactly when round 2 starts); node 1 during round 2.
    plan = Availability(ROWS, step_seconds=0.5).drop_plan(K, 3, 10, 0.5)
    assert plan == {0: [2], 1: [2], 2: [1]}
    # At 1 s per step the rounds are [0, 3), [3, 6), [6, 9): node 2 misses round 0, node 1 round 1.
    assert Availability(ROWS).drop_plan(K, 3, 9, 1.0) == {0: [2], 1: [1]}


def test_a_change_on_a_round_boundary_belongs_to_the_round_it_starts_despite_float_error() -> None:
    # 3 * 1e-5 is 3.0000000000000004e-05 in floats: a node leaving at 3e-5 s still finishes round 0.
    away = Availability([{"time": 3e-5, "node": 3, "available": 0}, {"time": 6e-5, "node": 3, "available": 1}])
    assert away.drop_plan(K, 3, 12, 1e-5) == {1: [3]}


def test_the_step_seconds_default_to_the_networks_compute_seconds(tmp_path) -> None:
    csv = tmp_path / "online.csv"
    csv.write_text("time,node,available\n1.0,2,0\n3.0,2,1\n4.4,1,no\n4.45,1,yes\n")
    net = Network(1e9, 1e-3, compute=0.5, availability=str(csv))
    assert net.drop_plan(K, 3, 10) == {0: [2], 1: [2], 2: [1]}
    given = Network(1e9, 1e-3, compute=0.5, availability=Availability(str(csv), step_seconds=1.0))
    assert given.drop_plan(K, 3, 9) == {0: [2], 1: [1]}


#: Columns this machine measures (they vary between any two runs).
MEASURED = {"wall_time", "comm_time", "peak_memory"}


def _modelled(rows):
    """Every row without the measured columns: losses, bytes, nodes alive, simulated times."""
    return [{k: v for k, v in row.items() if k not in MEASURED} for row in rows]


def _diloco():
    return DiLoCoStrategy(H=3, optim_spec=OptimSpec(torch.optim.AdamW, lr=0.01))


@pytest.mark.parametrize("workers", [None, 2], ids=["node_per_thread", "virtual_nodes"])
def test_an_availability_trace_drops_and_rejoins_nodes_exactly_as_faults_drop_would(workers) -> None:
    steps = 9
    ds = regression_data(K * 8 * steps)
    world = {"us": [0, 1], "eu": [2, 3]}
    links = Link("100Gbit/s", "10us"), Link("1Gbit/s", "80ms")
    traced = Network.regions(world, *links, availability=Availability(ROWS, step_seconds=0.5), compute=0.5)
    plain = Network.regions(world, *links, compute=0.5)
    by_trace = train_ranks(K, _diloco, steps, dataset=ds, workers=workers, network=traced)
    by_faults = train_ranks(
        K, _diloco, steps, dataset=ds, workers=workers, network=plain, faults=Faults(drop={0: [2], 1: [2], 2: [1]})
    )
    nobody = train_ranks(K, _diloco, steps, dataset=ds, workers=workers, network=plain)
    for a, b in zip(by_trace, by_faults, strict=True):
        for p, q in zip(a["params"], b["params"], strict=True):
            assert torch.equal(p, q)
    assert _modelled(by_trace[0]["node"].history) == _modelled(by_faults[0]["node"].history)
    assert [o["node"].batches_drawn for o in by_trace] == [9, 6, 3, 9]
    assert not torch.equal(by_trace[0]["params"][0], nobody[0]["params"][0])  # the trace changed the run


def test_bad_availability_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValueError, match="columns must be time,node,available"):
        Availability([{"time": 0, "node": 1, "online": 1}])
    with pytest.raises(ValueError, match="available must be 1/0"):
        Availability([{"time": 0, "node": 1, "available": "maybe"}])
    with pytest.raises(ValueError, match="time must be simulated seconds"):
        Availability([{"time": -1, "node": 1, "available": 0}])
    with pytest.raises(ValueError, match="step_seconds"):
        Availability(ROWS, step_seconds=0)
    with pytest.raises(ValueError, match=r"give Availability\(trace, step_seconds=...\)"):
        Network(1e9, 1e-3, availability=ROWS)  # compute="measured": no seconds per step before the run
    with pytest.raises(ValueError, match=r"names node\(s\) \[5\]"):
        away = [{"time": 0, "node": 5, "available": 0}]
        Network.regions({"a": [0, 1]}, Link(1e9, 0), availability=away, compute=1)
    # node 0 is away during [3, 4) s, node 1 during [4, 5) s: never both at once, but both in round 1
    turns = [(3, 0, 0), (4, 0, 1), (4, 1, 0), (5, 1, 1)]
    turns = Availability([{"time": t, "node": n, "available": a} for t, n, a in turns])
    with pytest.raises(ValueError, match="every node is absent at some moment of round 1.*or drop the trace"):
        turns.drop_plan(2, 3, 9, 1.0)
    with pytest.raises(ValueError, match=r"takes every node \(0..1\) away at simulated second 3: a run needs"):
        Availability([{"time": 3, "node": n, "available": 0} for n in range(2)]).drop_plan(2, 3, 9, 1.0)


@pytest.mark.parametrize(
    ("strategy", "max_steps", "match"),
    [
        (DeMoStrategy(), 8, r"Availability traces that take nodes away \(network 'custom'\): DeMoStrategy"),
        (FedAvgStrategy(H=2), 4, r"every node is absent at some moment of round 1 \(simulated seconds \[1, 2\)"),
    ],
)
def test_fit_refuses_an_availability_the_run_cannot_take_before_it_starts(strategy, max_steps, match) -> None:
    # 0.5 s per step, rounds of 2 steps: nodes 0 and 1 are away during [1, 1.5) s, nodes 2 and 3
    # during [1.5, 2) s: never all at once, but all during round 1
    away = [{"time": 1.0 + 0.5 * (n // 2) + d, "node": n, "available": d > 0} for n in range(4) for d in (0, 0.5)]
    net = Network(1e9, 1e-3, compute=0.5, availability=away if max_steps == 4 else ROWS)
    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(ValueError, match=match):
        trainer.fit(strategy, num_nodes=4, max_steps=max_steps, batch_size=8, network=net, logger=False, progress=False)


def test_a_world_file_reads_its_availability_beside_it(tmp_path) -> None:
    from exogym.core.comm.world_file import load_world

    (tmp_path / "online.csv").write_text("time,node,available\n1.0,2,0\n3.0,2,1\n")
    (tmp_path / "w.json").write_text(
        '{"regions": {"us": [0, 1], "eu": [2, 3]}, "intra": {"bandwidth": "100Gbit/s"},'
        ' "inter": {"bandwidth": "1Gbit/s"}, "availability": {"trace": "online.csv", "step_seconds": 0.5}}'
    )
    assert load_world(tmp_path / "w.json").drop_plan(K, 3, 9) == {0: [2], 1: [2]}


def test_faults_and_a_trace_together_drop_the_nodes_of_both_per_round() -> None:
    from exogym.runtime.faults import with_availability

    net = Network(1e9, 1e-3, compute=0.5, availability=ROWS)  # drops {0: [2], 1: [2], 2: [1]} in rounds of 3
    merged = with_availability(Faults(drop={0: [1], 3: 0}, drop_probability=0.1), net, K, 3, 12)
    assert merged.drop == {0: [1, 2], 1: [2], 2: [1], 3: [0]} and merged.drop_probability == 0.1
    later = Network(1e9, 1e-3, compute=0.5, availability=[{"time": 100, "node": 0, "available": 0}])
    assert with_availability(None, later, K, 3, 12) is None  # nobody leaves during the run's 6 s


def _world_with_availability(tmp_path) -> str:
    """A world file whose availability trace takes node 3 away from 0.05 s to 0.15 s (steps of
    0.01 s: steps 5-14)."""
    (tmp_path / "av.csv").write_text("time,node,available\n0.05,3,0\n0.15,3,1\n")
    world = tmp_path / "w.json"
    world.write_text(
        '{"regions": {"us": [0, 1], "eu": [2, 3]}, "intra": {"bandwidth": "100Gbit/s", "latency": "10us"},'
        ' "inter": {"bandwidth": "1Gbit/s", "latency": "80ms"}, "availability": "av.csv", "compute": 0.01}'
    )
    return str(world)


@pytest.mark.procs
@pytest.mark.timeout(180)
def test_a_run_on_an_availability_trace_logs_nodes_alive_and_lists_the_rounds_it_drops(tmp_path) -> None:
    import csv

    from exogym.logger import CSVLogger

    trainer = Trainer(TinyNet(), regression_data(K * 8 * 20))
    trainer.fit(
        _diloco(), num_nodes=K, max_steps=20, batch_size=8, network=_world_with_availability(tmp_path), workers=2,
        log_interval=2, logger=CSVLogger(str(tmp_path / "runs")), run_name="traced", progress=False, val_size=0,
    )  # fmt: skip
    # Rounds of 3 steps: node 3 is away during steps 5-14, in rounds 1 to 4 (steps 3-14).
    assert [(e["round"], e["dropped"]) for e in trainer.result["faults"]] == [(r, [3]) for r in range(1, 5)]
    with open(tmp_path / "runs" / "traced" / "latest" / "metrics.csv") as f:
        alive = {int(r["step"]): int(r["nodes_alive"]) for r in csv.DictReader(f) if r["nodes_alive"]}
    assert alive == {s: 3 if 3 < s <= 16 else 4 for s in range(2, 21, 2)}
