"""DiLoCo with eager updates against a plain-PyTorch reference written from the paper's rule
(Kale, Douillard & Donchev 2025, arXiv 2502.12996, the eager variant of its Algorithm 3: the
current local outer gradient mixed with the other replicas' delayed ones, each weighted 1/M):
each node's outer step takes its own fresh pseudo-gradient share at once and the others' shares
one round late; its bytes (DiLoCo's, overlapping the next inner phase), dropped nodes, virtual
nodes."""

from __future__ import annotations

import pytest
import torch

from exogym.faults_config import Faults
from exogym.strategy import DiLoCoStrategy, EagerDiLoCoStrategy, OptimSpec
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, node_batches, regression_data

H, STEPS = 3, 12
SGD = OptimSpec(torch.optim.SGD, lr=0.05)
OUTER_LR, MOMENTUM = 0.7, 0.5


def eager_reference(
    ds, k: int, steps: int, dropped: dict[int, list[int]] | None = None, median: bool = False
) -> list[list[torch.Tensor]]:
    """K model copies with inner SGD, each node m with its own outer parameters phi_m and Nesterov
    buffer b_m. After every H steps, over the n present nodes: delta_m = phi_m - theta_m;
    g_m = delta_m / n + late_m; late_m = mean(delta) - delta_m / n; b_m = mu b_m + g_m (b_m = g_m
    the first time); phi_m -= lr (g_m + mu b_m); theta_m = phi_m (``median``: the coordinate-wise
    median of the deltas in the mean's place). ``dropped[r]``: nodes that sit
    round r out (no batches, not in the mean) and take the lowest survivor's state at its end."""
    dropped = dropped or {}
    models = [TinyNet() for _ in range(k)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    data = [node_batches(ds, k, r) for r in range(k)]
    theta = [list(m.parameters()) for m in models]
    phi = [[p.detach().clone() for p in ps] for ps in theta]
    late = [[torch.zeros_like(p) for p in ps] for ps in theta]
    buf: list[list[torch.Tensor] | None] = [None] * k
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
            n = len(alive)
            delta = {m: [f - t for f, t in zip(phi[m], theta[m], strict=True)] for m in alive}
            mean = [sum(delta[m][i] for m in alive) / n for i in range(len(phi[0]))]
            if median:  # the coordinate-wise median takes the mean's place (an even count: the middle two's mean)
                ordered = [torch.stack([delta[m][i] for m in alive]).sort(0).values for i in range(len(phi[0]))]
                mean = [(o[(n - 1) // 2] + o[n // 2]) / 2 for o in ordered]
            for m in alive:
                g = [d / n + lt for d, lt in zip(delta[m], late[m], strict=True)]
                late[m] = [mu - d / n for mu, d in zip(mean, delta[m], strict=True)]
                buf[m] = g if buf[m] is None else [MOMENTUM * b + gi for b, gi in zip(buf[m], g, strict=True)]
                phi[m] = [f - OUTER_LR * (gi + MOMENTUM * b) for f, gi, b in zip(phi[m], g, buf[m], strict=True)]
                for t, f in zip(theta[m], phi[m], strict=True):
                    t.copy_(f)
            for r in gone:
                src = alive[0]
                for t, u in zip(theta[r], theta[src], strict=True):
                    t.copy_(u)
                phi[r] = [f.clone() for f in phi[src]]
                late[r] = [x.clone() for x in late[src]]
                buf[r] = [b.clone() for b in buf[src]]
    return [[p.detach().clone() for p in ps] for ps in theta]


def _make():
    return EagerDiLoCoStrategy(H=H, outer_lr=OUTER_LR, outer_momentum=MOMENTUM, optim_spec=SGD)


@pytest.mark.parametrize("k", [2, 4])
def test_eager_diloco_matches_the_reference_on_every_node(k: int) -> None:
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(k, _make, STEPS, dataset=ds)
    ref = eager_reference(ds, k, STEPS)
    for rank in range(k):
        for a, b in zip(out[rank]["params"], ref[rank], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(out[0]["params"][0], out[1]["params"][0])  # each node's own share differs


def test_with_nodes_dropped_the_survivors_share_by_their_number_and_the_dropped_rejoin() -> None:
    k, dropped = 4, {1: [2], 2: [0, 3]}
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(k, _make, STEPS, dataset=ds, faults=Faults(drop=dropped))
    ref = eager_reference(ds, k, STEPS, dropped=dropped)
    for rank in range(k):
        for a, b in zip(out[rank]["params"], ref[rank], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ref[1][0], eager_reference(ds, k, STEPS)[1][0])


def test_one_node_is_diloco() -> None:
    eager = train_ranks(1, _make, STEPS)
    diloco = train_ranks(
        1, lambda: DiLoCoStrategy(H=H, outer_lr=OUTER_LR, outer_momentum=MOMENTUM, optim_spec=SGD), STEPS
    )
    for a, b in zip(eager[0]["params"], diloco[0]["params"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("k", [2, 4])
def test_bytes_per_round_are_one_all_reduce_of_the_parameters_overlapping_the_next_h_steps(k: int) -> None:
    param_bytes = sum(4 * p.numel() for p in TinyNet().parameters())
    out = train_ranks(k, _make, STEPS)
    for o in out:
        records = [r for step in o["records"] for r in step]
        assert [(r.kind, r.group_size, r.payload, r.overlap_steps) for r in records] == [
            ("all_reduce", k, param_bytes, H)
        ] * (STEPS // H)
        assert sum(r.sent for r in records) == pytest.approx((STEPS // H) * 2 * (k - 1) / k * param_bytes)


def test_the_all_reduce_is_hidden_behind_the_next_inner_phase_where_diloco_waits_for_it() -> None:
    from exogym.core.comm.network import Network

    def sim_comm(make, compute: float) -> float:
        net = Network(100e6, 0.03, compute=compute)
        rows = [r for r in train_ranks(2, make, STEPS, network=net)[0]["node"].history if "train_loss" in r]
        return rows[-1]["sim_comm_time"]

    diloco = lambda: DiLoCoStrategy(H=H, outer_lr=OUTER_LR, outer_momentum=MOMENTUM, optim_spec=SGD)  # noqa: E731
    # 4 all-reduces of TinyNet's 644 bytes between 2 nodes: 2 * 0.03 + 8 * 644 / 1e8 = 0.06005152 s
    # each, starting with their step's backward pass (2/3 of its compute)
    t = 0.06 + 8 * 644 / 1e8
    # compute 0.05 s, backward 0.0333 s: DiLoCo waits t - 0.0333 s for each
    assert sim_comm(diloco, 0.05) == pytest.approx(4 * (t - 0.1 / 3), abs=1e-12)
    assert sim_comm(_make, 0.05) == 0.0  # each hidden behind 0.0333 s + the next H steps' 0.15 s
    # compute 0.001 s: DiLoCo waits t - 0.000667 s, eager DiLoCo t - 0.000667 - 3 * 0.001 s
    assert sim_comm(diloco, 0.001) == pytest.approx(4 * (t - 0.002 / 3), abs=1e-12)
    assert sim_comm(_make, 0.001) == pytest.approx(4 * (t - 0.002 / 3 - 0.003), abs=1e-12)  # partly hidden


def test_virtual_nodes_end_as_nodes_on_their_own_threads() -> None:
    alone = train_ranks(4, _make, STEPS)
    virtual = train_ranks(4, _make, STEPS, workers=2)
    for a, b in zip(alone, virtual, strict=True):
        for p, q in zip(a["params"], b["params"], strict=True):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_the_normalized_outer_optimizer_is_refused_naming_the_choice() -> None:
    with pytest.raises(ValueError, match="outer_optim='sgd_normalized' is not available for eager DiLoCo; use 'sgd'"):
        EagerDiLoCoStrategy(outer_optim="sgd_normalized")


@pytest.mark.parametrize("h", [0, 2.5, True])
def test_a_period_that_is_not_a_positive_int_is_refused_naming_h(h) -> None:
    with pytest.raises(ValueError, match=r"H must be a positive int \(communicate every H steps\)"):
        EagerDiLoCoStrategy(H=h)


@pytest.mark.parametrize("k", [3, 4])
def test_with_the_median_rule_the_median_takes_the_mean_s_place_and_is_charged_as_an_overlapped_all_gather(
    k: int,
) -> None:
    ds = regression_data(k * 8 * STEPS)
    make = lambda: EagerDiLoCoStrategy(  # noqa: E731
        H=H, outer_lr=OUTER_LR, outer_momentum=MOMENTUM, optim_spec=SGD, aggregate="median"
    )
    out = train_ranks(k, make, STEPS, dataset=ds)
    ref = eager_reference(ds, k, STEPS, median=True)
    for rank in range(k):
        for a, b in zip(out[rank]["params"], ref[rank], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ref[0][0], eager_reference(ds, k, STEPS)[0][0])  # the median is not the mean here
    records = [r for step in out[0]["records"] for r in step]
    assert {(r.kind, r.overlap_steps) for r in records} == {("all_gather", H)}
