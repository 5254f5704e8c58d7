"""NoLoCo against a plain-PyTorch reference written from its outer step (Kolehmainen et al. 2025,
arXiv 2506.10911, Eq. 2 with the signs of the authors' code): every H steps each node averages
with one random peer and takes a momentum step pulled towards the peer's outer weights; its
bytes (flat in K), pairs, dropped nodes and defaults (the authors' NoLoCo runs)."""

from __future__ import annotations

import pytest
import torch

from communicators.islands import draw_islands
from exogym.faults_config import Faults
from exogym.strategy import DiLoCoStrategy, NoLoCoStrategy, OptimSpec
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, node_batches, regression_data

H, STEPS = 3, 12
SGD = OptimSpec(torch.optim.SGD, lr=0.05)
BETA, ALPHA = 0.7, 0.5


def noloco_reference(
    ds, k: int, steps: int, gamma: float, dropped: dict[int, list[int]] | None = None
) -> list[list[torch.Tensor]]:
    """K model copies (theta) with inner SGD, each node with its own outer weights phi and
    momentum delta. After every H steps the round's pairs (the shared-seed draw, taken as given)
    are formed from the present nodes; each node i of a group G takes
    delta_i = ALPHA delta_i - BETA/|G| sum_j (phi_j - theta_j) - gamma (phi_i - 1/|G| sum_j phi_j),
    phi_i += delta_i, theta_i = phi_i. ``dropped[r]``: nodes that sit round r out (no batches,
    in no group) and take the lowest survivor's theta, phi and delta at its end."""
    dropped = dropped or {}
    models = [TinyNet() for _ in range(k)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    data = [node_batches(ds, k, r) for r in range(k)]
    theta = [list(m.parameters()) for m in models]
    phi = [[p.detach().clone() for p in ps] for ps in theta]
    delta = [[torch.zeros_like(p) for p in ps] for ps in theta]
    for s in range(steps):
        gone = dropped.get(s // H, [])
        alive = [r for r in range(k) if r not in gone]
        for r in alive:
            opts[r].zero_grad()
            models[r](next(data[r])).backward()
            opts[r].step()
        if (s + 1) % H:
            continue
        with torch.no_grad():
            for pair in draw_islands(k, 2, 0, s // H):
                group = [r for r in pair if r in alive]
                new = {}
                for i in group:
                    new[i] = []
                    for t in range(len(theta[i])):
                        pseudo = sum(phi[j][t] - theta[j][t] for j in group) / len(group)
                        mean_phi = sum(phi[j][t] for j in group) / len(group)
                        new[i].append(ALPHA * delta[i][t] - BETA * pseudo - gamma * (phi[i][t] - mean_phi))
                for i in group:
                    for t in range(len(theta[i])):
                        delta[i][t] = new[i][t]
                        phi[i][t] = phi[i][t] + new[i][t]
                        theta[i][t].copy_(phi[i][t])
            for r in gone:
                for t in range(len(theta[r])):
                    theta[r][t].copy_(theta[alive[0]][t])
                    phi[r][t], delta[r][t] = phi[alive[0]][t].clone(), delta[alive[0]][t].clone()
    return [[p.detach().clone() for p in ps] for ps in theta]


def _make(gamma: float | None = None):
    return lambda: NoLoCoStrategy(H=H, outer_lr=BETA, outer_momentum=ALPHA, gamma=gamma, optim_spec=SGD)


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("gamma", [None, 0.3], ids=["gamma_is_beta", "gamma_0.3"])
def test_noloco_matches_the_reference_on_every_node(k: int, gamma: float | None) -> None:
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(k, _make(gamma), STEPS, dataset=ds)
    ref = noloco_reference(ds, k, STEPS, BETA if gamma is None else gamma)
    for r in range(k):
        for a, b in zip(out[r]["params"], ref[r], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    if k > 2:
        assert not torch.allclose(out[0]["params"][0], out[1]["params"][0])  # no step makes them equal


def test_with_two_nodes_it_is_diloco_with_heavy_ball_outer_momentum() -> None:
    noloco = train_ranks(2, _make(0.3), STEPS)
    outer = OptimSpec(torch.optim.SGD, lr=BETA, momentum=ALPHA)
    diloco = train_ranks(2, lambda: DiLoCoStrategy(H=H, outer_optim=outer, optim_spec=SGD), STEPS)
    for a, b in zip(noloco[0]["params"], diloco[0]["params"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_with_nodes_dropped_a_node_whose_peer_is_missing_steps_alone_and_the_dropped_rejoin() -> None:
    k, dropped = 4, {1: [2], 2: [0, 3]}
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(k, _make(0.3), STEPS, dataset=ds, faults=Faults(drop=dropped))
    ref = noloco_reference(ds, k, STEPS, 0.3, dropped=dropped)
    for r in range(k):
        for a, b in zip(out[r]["params"], ref[r], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ref[1][0], noloco_reference(ds, k, STEPS, 0.3)[1][0])


@pytest.mark.parametrize(("gamma", "copies"), [(None, 1), (0.3, 2)], ids=["local_weights", "local_and_outer"])
def test_bytes_per_node_are_the_same_at_4_and_8_nodes(gamma: float | None, copies: int) -> None:
    param_bytes = sum(4 * p.numel() for p in TinyNet().parameters())
    for k in (4, 8):
        out = train_ranks(k, _make(gamma), STEPS)
        for o in out:
            records = [r for step in o["records"] for r in step]
            assert [(r.kind, r.group_size, r.payload) for r in records] == [("all_reduce", 2, copies * param_bytes)] * (
                STEPS // H
            )
            assert sum(r.sent for r in records) == (STEPS // H) * copies * param_bytes  # 2(2-1)/2 = 1 payload


def test_with_an_odd_number_of_nodes_one_node_per_round_is_alone_and_sends_nothing() -> None:
    k, steps = 5, 8 * H
    out = train_ranks(k, _make(), steps)
    sizes = [[r.group_size for r in o["records"][s]] for s in range(H - 1, steps, H) for o in out]
    rounds = [sizes[i : i + k] for i in range(0, len(sizes), k)]
    alone = [[rank for rank, g in enumerate(rnd) if g == [1]] for rnd in rounds]
    assert all(len(a) == 1 for a in alone) and all(sorted(g for [g] in rnd) == [1, 2, 2, 2, 2] for rnd in rounds)
    assert len({a[0] for a in alone}) > 1  # the matching is drawn afresh each round
    lone = [r for o in out for recs in o["records"] for r in recs if r.group_size == 1]
    assert lone and all(r.sent == 0 for r in lone)


def test_virtual_nodes_end_as_nodes_on_their_own_threads() -> None:
    alone = train_ranks(4, _make(0.3), STEPS)
    virtual = train_ranks(4, _make(0.3), STEPS, workers=2)
    for a, b in zip(alone, virtual, strict=True):
        for p, q in zip(a["params"], b["params"], strict=True):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kwargs", [{"outer_lr": -1.0}, {"gamma": "x"}, {"outer_momentum": True}])
def test_negative_or_non_numeric_outer_settings_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="must be a number >= 0"):
        NoLoCoStrategy(**kwargs)


def test_the_defaults_are_the_settings_of_the_authors_noloco_runs() -> None:
    (module,) = NoLoCoStrategy().communication_modules
    assert (module.H, module.outer_lr, module.outer_momentum, module.gamma) == (50, 0.7, 0.5, 0.7)
    assert not module.sends_outer_weights  # gamma == beta: only the local weights travel
