"""Sampled FedAvg as a server and tasks: ``FedAvgStrategy(client_sampling=...)`` is a
``ServerStrategy`` running ``FedAvgServer``; a round trains exactly the clients it draws (the
same values on 1 and 2 workers); ``local_epochs`` is that many passes over a client's data; its
draws are ``draw_participants``' without the list of every client."""

from __future__ import annotations

import pytest
import torch

from communicators import draw_islands, draw_participants
from communicators.fedavg import FedAvgServer, drawn_clients
from exogym.core.comm.network import Network
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.core.server import ServerStrategy
from exogym.strategy import FedAvgStrategy, OptimSpec
from tests.fake_world import train_server
from tests.helpers import regression_data

SGD = OptimSpec(torch.optim.SGD, lr=0.05)
NET = Network(1e9, 0.01, compute=0.1)  # equal speeds and links: a round is H ticks


def test_the_preset_with_client_sampling_is_a_server_strategy_running_fedavg_server() -> None:
    strategy = FedAvgStrategy(H=4, island_size=3, client_sampling=0.5, optim_spec=SGD, max_norm=1.0)
    assert type(strategy) is ServerStrategy and type(strategy.server) is FedAvgServer
    server = strategy.server
    assert (server.H, server.client_sampling, server.island_size, server.local_epochs) == (4, 0.5, 3, None)
    assert strategy.optim_spec is SGD and strategy.max_norm == 1.0  # the clients' optimizer and clipping
    contract = FedAvgStrategy(optim_spec=SGD, local_epochs=5, island_size=4, client_sampling=0.1)
    assert contract.server.describe() == "FedAvg(local_epochs=5, client_sampling=0.1, island_size=4)"
    plain = FedAvgStrategy(H=4, island_size=3, optim_spec=SGD)  # without sampling: the lock-step pipeline
    assert type(plain) is FedAvgStrategy and isinstance(plain, CommunicateOptimizeStrategy)


@pytest.mark.parametrize("islands", [None, 4])
def test_a_round_trains_the_clients_it_draws_with_the_same_values_on_one_and_two_workers(islands) -> None:
    k, sampling, h, steps = 8, 0.25, 3, 12
    ds = regression_data(k * 8 * steps)
    runs = [
        train_server(
            k,
            lambda: FedAvgStrategy(H=h, client_sampling=sampling, island_size=islands, optim_spec=SGD),
            steps,
            dataset=ds,
            network=NET,
            workers=workers,
        )  # fmt: skip
        for workers in (1, 2)
    ]
    rounds = steps // h
    assert runs[0][0]["summary"]["rounds"] == rounds
    if islands is None:
        drawn = [drawn_clients(k, sampling, 0, r) for r in range(rounds)]
    else:
        drawn = [
            [c for g in draw_islands(k, islands, 0, r) for c in draw_participants(g, sampling, 0, r)]
            for r in range(rounds)
        ]
    expected = [h * sum(c in d for d in drawn) for c in range(k)]
    for run in runs:
        assert run[0]["summary"]["steps"] == expected
    for x, y in zip(runs[0][0]["params"], runs[1][0]["params"], strict=True):
        assert torch.equal(x, y)


def test_local_epochs_are_that_many_passes_over_a_clients_data() -> None:
    k, batch, per_client = 4, 8, 24  # a client's shard: 24 examples, 3 steps per epoch
    ds = regression_data(k * per_client)
    out = train_server(
        k, lambda: FedAvgStrategy(local_epochs=2, client_sampling=0.5, optim_spec=SGD), 12, dataset=ds,
        batch_size=batch, network=NET,
    )  # fmt: skip
    server = out[0]["server"]
    assert server.local_steps == 2 * (per_client // batch)
    assert out[0]["summary"]["rounds"] == 12 // 6
    assert all(s % 6 == 0 for s in out[0]["summary"]["steps"]) and sum(out[0]["summary"]["steps"]) == 2 * 2 * 6


def test_local_epochs_with_h_is_refused_naming_both() -> None:
    with pytest.raises(TypeError, match=r"H \(steps\) or local_epochs, not both"):
        FedAvgStrategy(H=2, local_epochs=1, client_sampling=0.5)
    with pytest.raises(TypeError, match=r"H=2 \(steps per round\) or local_epochs=1"):
        FedAvgServer(2, 0.5, local_epochs=1)
    with pytest.raises(ValueError, match="local_epochs must be an int >= 1"):
        FedAvgStrategy(local_epochs=0, client_sampling=0.5)
    with pytest.raises(TypeError, match="did you mean 'island_size'"):
        FedAvgStrategy(island=3, client_sampling=0.5)


def test_a_subclass_of_the_preset_refuses_client_sampling_naming_the_server() -> None:
    class Mine(FedAvgStrategy):
        pass

    with pytest.raises(TypeError, match=r"ServerStrategy\(FedAvgServer"):
        Mine(H=2, client_sampling=0.5)
    assert type(Mine(H=2)) is Mine


def test_a_round_of_a_million_clients_draws_what_draw_participants_draws() -> None:
    for k, f in [(10, 0.3), (1000, 0.01), (7, 1.0)]:
        for r in range(3):
            assert drawn_clients(k, f, 5, r) == draw_participants(list(range(k)), f, 5, r)
    assert len(drawn_clients(10**6, 1e-5, 5, 0)) == 10


def test_islands_too_small_for_the_sampling_warn_of_the_fraction_they_draw(caplog) -> None:
    from exogym.core.server import setup_server
    from exogym.runtime.server_run import server_context

    def set_up(fraction: float, island: int) -> None:
        ctx = server_context(Network(1e9, 0.01, compute=0.01), 100, 0, torch.zeros(3), 1)
        setup_server(FedAvgServer(5, fraction, island), ctx)

    with caplog.at_level("WARNING", logger="communicators.fedavg"):
        set_up(0.1, 4)  # 25 islands of 4, one client each: 25%
        assert "draws 25 a round (25.0%, not 10.0%)" in caplog.text
        caplog.clear()
        set_up(0.1, 10)  # one of each 10: 10%
        set_up(0.25, 4)
        assert not caplog.records


def test_the_runs_of_a_plain_server_strategy_are_named_after_its_server() -> None:
    from exogym.runtime.plan import _label

    assert _label(FedAvgStrategy(H=2, client_sampling=0.5)) == "FedAvgServer"
    assert _label(FedAvgStrategy(H=2)) == "FedAvgStrategy"
    from exogym.strategy import FedBuffStrategy

    assert _label(FedBuffStrategy()) == "FedBuffStrategy"
