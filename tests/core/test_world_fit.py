"""Worlds in whole runs (``Trainer.fit`` on node processes): islands inside regions pay the
links inside them, and a world's simulated times depend only on its description and the seeds."""

import dataclasses

import pytest
import torch

from exogym import Availability, Link, Network, Trainer
from exogym.strategy import DiLoCoStrategy, FedAvgStrategy, OptimSpec
from tests.helpers import FIT_DEFAULTS, TinyNet, regression_data

pytestmark = pytest.mark.procs

K, B = 4, 8
INTRA, INTER = Link("10Gbit/s", "1ms"), Link("100Mbit/s", "50ms")


def _fit(strategy, network, steps, workers, seed=0) -> list[dict]:
    torch.manual_seed(0)
    trainer = Trainer(TinyNet(), regression_data(K * B * steps))
    trainer.fit(
        strategy, num_nodes=K, max_steps=steps, batch_size=B, network=network, workers=workers, seed=seed,
        log_interval=1, **FIT_DEFAULTS,
    )  # fmt: skip
    return [r for r in trainer.history if "sim_time" in r]


@pytest.mark.timeout(180)
def test_fedavg_islands_that_each_lie_inside_a_region_pay_only_the_link_inside_it() -> None:
    from communicators.islands import draw_islands

    # A seed whose two averaging rounds draw the same islands of 2; the regions are those islands.
    seed = next(s for s in range(100) if draw_islands(K, 2, s, 0) == draw_islands(K, 2, s, 1))
    first, second = draw_islands(K, 2, seed, 0)
    world = Network.regions({"a": first, "b": second}, INTRA, INTER, compute=0.0)
    rows = _fit(FedAvgStrategy(H=3, island_size=2, optim_spec="sgd"), world, 6, workers=2, seed=seed)
    # TinyNet: 161 float32 parameters, 644 bytes. An island of 2 all-reduces them on a ring of 2:
    # 2(n-1) = 2 steps, each a 322-byte chunk over the 10 Gbit/s, 1 ms link inside the region:
    # 2 * (1e-3 + 2576 / 1e10) = 0.0020005152 s per round; over the 50 ms crossing it would be 0.10005152 s.
    per_round = 2 * (1e-3 + 322 * 8 / 1e10)
    assert per_round == pytest.approx(0.0020005152, rel=1e-12)
    assert rows[-1]["sim_comm_time"] == pytest.approx(2 * per_round, rel=1e-9)
    assert rows[-1]["sim_time"] == pytest.approx(2 * per_round, rel=1e-9)  # no compute charged


def _traced_world() -> Network:
    # Two regions whose crossing drops to 20 Mbit/s from simulated second 0.5 on (a DiLoCo round's
    # all-reduce over the 50 ms crossing takes about 0.3 s: the last two rounds' start later);
    # node 3 is away during the second round of 3 steps (steps of 1e-5 s for the trace). No
    # backward pass to overlap (backward_share=0): a round waits for its whole all-reduce.
    net = Network.regions(
        {"us": [0, 1], "eu": [2, 3]},
        INTRA,
        INTER,
        traces=[{"time": 0.5, "region_a": "us", "region_b": "eu", "bandwidth": "20Mbit/s"}],
        availability=Availability(
            [{"time": 3e-5, "node": 3, "available": 0}, {"time": 6e-5, "node": 3, "available": 1}], step_seconds=1e-5
        ),
        compute="flops",
        flops_per_second=1e9,
    )
    return dataclasses.replace(net, backward_share=0.0)


SIMULATED = ("step", "sim_time", "sim_comm_time", "compute_time", "bytes_sent", "nodes_alive")


@pytest.mark.timeout(300)
def test_simulated_times_repeat_exactly_across_runs_and_between_processes_and_virtual_nodes() -> None:
    def run(workers: int) -> list[tuple]:
        strategy = DiLoCoStrategy(H=3, optim_spec=OptimSpec(torch.optim.AdamW, lr=0.01))
        rows = _fit(strategy, _traced_world(), 12, workers)
        return [tuple(r.get(c) for c in SIMULATED) for r in rows if "train_loss" in r]

    processes, again, virtual = run(K), run(K), run(1)
    assert processes == again == virtual
    assert [r[-1] for r in processes] == [4, 4, 4, 3, 3, 3, 4, 4, 4, 4, 4, 4]  # node 3 away in the second round
    # The world took effect. A round of 4 nodes all-reduces TinyNet's 644 bytes on a ring crossing
    # the regions twice: 6 steps of a 161-byte chunk over the crossing, 6 * (0.05 + 1288 / B).
    step_comm = [b[2] - a[2] for a, b in zip([(0,) * 6, *processes[:-1]], processes, strict=True)]
    rounds = [step_comm[i] for i in (2, 5, 8, 11)]  # the steps that end a round (the all-reduce)
    assert rounds[0] == pytest.approx(6 * (0.05 + 1288 / 1e8), rel=1e-9)  # before 0.5 s: 100 Mbit/s
    assert rounds[2:] == pytest.approx([6 * (0.05 + 1288 / 2e7)] * 2, rel=1e-9)  # after: 20 Mbit/s
