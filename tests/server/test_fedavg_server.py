"""Sampled FedAvg written as a server and tasks equals the lock-step ``FedAvgStrategy`` with client
sampling (the same draws and means), with and without islands, on 1 and 2 workers; its draws are
``draw_participants``' without the list of every client."""

from __future__ import annotations

import pytest
import torch

from communicators import draw_participants
from communicators.fedavg import FedAvgServer, drawn_clients
from exogym.core.comm.network import Network
from exogym.core.server import ServerStrategy
from exogym.strategy import FedAvgStrategy, OptimSpec
from tests.fake_world import train_ranks, train_server
from tests.helpers import regression_data

SGD = OptimSpec(torch.optim.SGD, lr=0.05)
NET = Network(1e9, 0.01, compute=0.1)  # equal speeds and links: a round is H ticks


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(("k", "sampling", "islands"), [(8, 0.25, None), (8, 0.5, 4), (6, 0.5, 4), (5, 1.0, None)])
def test_sampled_fedavg_as_a_server_equals_the_lock_step_run(k, sampling, islands, workers) -> None:
    steps, ds = 12, regression_data(k * 8 * 12)
    server = train_server(
        k, lambda: ServerStrategy(FedAvgServer(3, sampling, islands), optim_spec=SGD), steps, dataset=ds,
        network=NET, workers=workers,
    )  # fmt: skip
    lock = train_ranks(
        k, lambda: FedAvgStrategy(H=3, client_sampling=sampling, island_size=islands, optim_spec=SGD), steps,
        dataset=ds, network=NET,
    )  # fmt: skip
    assert server[0]["summary"]["rounds"] == steps // 3
    mean = [torch.stack([lock[r]["params"][i] for r in range(k)]).mean(0) for i in range(len(lock[0]["params"]))]
    for x, y in zip(server[0]["params"], mean, strict=True):  # the run's model: every client's mean
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    trained = [r for r, s in enumerate(server[0]["summary"]["steps"]) if s]
    lock_trained = [r for r in range(k) if lock[r]["node"].batches_drawn]
    assert trained == lock_trained


def test_a_round_of_a_million_clients_draws_what_draw_participants_draws() -> None:
    for k, f in [(10, 0.3), (1000, 0.01), (7, 1.0)]:
        for r in range(3):
            assert drawn_clients(k, f, 5, r) == draw_participants(list(range(k)), f, 5, r)
    assert len(drawn_clients(10**6, 1e-5, 5, 0)) == 10
