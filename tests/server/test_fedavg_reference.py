"""Sampled FedAvg run as a server and tasks equals its reference written from the paper
(``tests/references/fedavg.py``) on 1 and 2 workers: final parameters, every client's steps, and
the clients drawn in each round."""

from __future__ import annotations

import pytest
import torch

from exogym.core.comm.network import Network
from exogym.core.server import ServerStrategy
from exogym.strategy import FedAvgStrategy, OptimSpec
from tests.fake_world import train_server
from tests.helpers import TinyNet, regression_data
from tests.references.fedavg import reference_fedavg

H, ROUNDS = 3, 6
STEPS = H * ROUNDS
# (K, client_sampling, island_size): sampling without islands, islands of 4 that divide K and
# that do not (islands of 4 and 2), and every client every round.
CASES = [(8, 0.25, None), (8, 0.5, 4), (6, 0.5, 4), (5, 1.0, None)]
# Inner optimizers with state, so that a client's optimizer kept between its rounds shows.
INNER = {
    "sgd_momentum": (
        OptimSpec(torch.optim.SGD, lr=0.05, momentum=0.9),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    ),
    "adamw": (OptimSpec(torch.optim.AdamW, lr=0.01), lambda ps: torch.optim.AdamW(ps, lr=0.01)),
}


def _run(k, sampling, island_size, spec, steps, workers):
    ds = regression_data(k * 8 * STEPS)
    strategy = lambda: FedAvgStrategy(H=H, client_sampling=sampling, island_size=island_size, optim_spec=spec)  # noqa: E731
    assert isinstance(strategy(), ServerStrategy)  # the preset with client_sampling runs as a server
    net = Network(1e9, 0.01, compute=0.1)  # equal speeds and links: a round is H ticks
    return ds, train_server(k, strategy, steps, dataset=ds, network=net, workers=workers)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    ("k", "sampling", "island_size", "inner"),
    [(*case, "sgd_momentum") for case in CASES] + [(6, 0.5, 4, "adamw")],
)
def test_fedavg_server_equals_the_sampled_fedavg_reference(k, sampling, island_size, inner, workers) -> None:
    spec, make_inner = INNER[inner]
    ds, out = _run(k, sampling, island_size, spec, STEPS, workers)
    ref = reference_fedavg(
        ds, k, STEPS, H=H, client_sampling=sampling, island_size=island_size, make_inner=make_inner
    )  # fmt: skip
    assert len(ref["drawn"]) == ROUNDS
    if sampling < 1:  # the draws matter: not every client trains every round
        assert all(len(d) < k for d in ref["drawn"]) and len(set(map(tuple, ref["drawn"]))) > 1
    summary = out[0]["summary"]
    assert summary["steps"] == ref["steps"]
    assert summary["rounds"] == ROUNDS
    assert summary["updates"] == sum(len(d) for d in ref["drawn"])
    assert any(not torch.equal(p, q.detach()) for p, q in zip(ref["params"], TinyNet().parameters(), strict=True))
    for rank in out:
        for a, b in zip(rank["params"], ref["params"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("k", "sampling", "island_size"), CASES)
def test_each_round_trains_the_clients_the_reference_drew(k, sampling, island_size) -> None:
    # Runs of r and r - 1 rounds: the clients whose steps differ by H are round r's.
    spec, make_inner = INNER["sgd_momentum"]
    ref = reference_fedavg(
        regression_data(k * 8 * STEPS), k, STEPS, H=H, client_sampling=sampling, island_size=island_size,
        make_inner=make_inner,
    )  # fmt: skip
    before = [0] * k
    for r in range(1, ROUNDS + 1):
        steps = _run(k, sampling, island_size, spec, H * r, 1)[1][0]["summary"]["steps"]
        trained = [c for c in range(k) if steps[c] - before[c] == H]
        assert all(steps[c] == before[c] for c in range(k) if c not in trained)
        assert trained == ref["drawn"][r - 1], f"round {r - 1}"
        before = steps


def test_the_reference_rejects_bad_arguments_naming_them() -> None:
    ds, sgd = regression_data(64), INNER["sgd_momentum"][1]
    for kw, name in [
        ({"k": 0}, "k"),
        ({"H": 0}, "H"),
        ({"max_steps": -1}, "max_steps"),
        ({"island_size": 0}, "island_size"),
    ]:
        args = {"k": 2, "max_steps": 3, "H": 1, **kw}
        with pytest.raises(ValueError, match=rf"^{name}="):
            reference_fedavg(ds, args.pop("k"), args.pop("max_steps"), make_inner=sgd, **args)
