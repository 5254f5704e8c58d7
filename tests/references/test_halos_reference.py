"""The HALoS reference keeps the two-level timing model (timelines computed by hand below), applies
the LPS, GPS and merge rules as written (values recomputed here in plain torch), and reduces to
Async DiLoCo and to synchronous DiLoCo where the hierarchy collapses."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import TinyNet, node_batches, regression_data
from tests.references.async_diloco import reference_async_diloco
from tests.references.halos import LocalServer, halos_steps, reference_halos

INF = float("inf")


@pytest.fixture(scope="module")
def ds():
    return regression_data(n=1024)


def halos(ds, k, max_steps, **kw):
    args = {
        "step_seconds": 1.0,
        "H": 2,
        "accumulation": 2,
        "lps_lr": 0.8,
        "lps_momentum": 0.9,
        "gps_lr": 0.7,
        "gps_momentum": 0.5,
        "merge_weight": 0.25,
    }
    return reference_halos(ds, k, max_steps, **{**args, **kw})


def sgd_steps(params, batches, n, lr=0.05):
    """``n`` plain SGD steps of a TinyNet started from ``params``; returns its parameters."""
    model = TinyNet()
    with torch.no_grad():
        for p, s in zip(model.parameters(), params, strict=True):
            p.copy_(s)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(n):
        opt.zero_grad()
        model(next(batches)).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


# ---------------------------------------------------------------- timing


def test_dylu_rounds_the_speed_scaled_steps_up_and_keeps_at_least_one() -> None:
    assert halos_steps(8, [1.0, 1.0, 0.5, 0.25], dylu=True) == [2, 2, 4, 8]
    assert halos_steps(8, [1.0, 3.0], dylu=True) == [8, 3]  # ceil(8 / 3) = 3
    assert halos_steps(2, [1.0, 8.0], dylu=True) == [2, 1]  # ceil(0.25) = 1
    assert halos_steps(8, [1.0, 3.0], dylu=False) == [8, 8]


def test_two_regions_of_two_nodes_give_the_hand_computed_receipts_staleness_merges_and_steps(ds) -> None:
    # Regions [0, 0, 1, 1], H = 2, K = 2. Segments of 2, 2, 1, 0.5 s; node<->LPS 0.5, 0.5, 0.25,
    # 0.25 s each way; LPS<->GPS 1 s (region 0) and 3 s (region 1) each way.
    # Region 1: r3 lands .75 (from v0 onto v0: 0) -> v1, restarts 1.0 (steps 1, 1.25); r2 lands
    # 1.25 (v0 onto v1: 1) -> v2 = 2nd update: push, lands at the GPS 4.25; r2 restarts 1.5
    # (1.5, 2). r3 1.75 (v1 onto v2: 1) -> v3, restarts 2 (2, 2.25). 2.75: r2 (v2 onto v3: 1),
    # r3 (v3 onto v4: 1) -> v5, both restart 3 (r2: 3, 3.5; r3: 3, 3.25). 3.75: r3 (v5 onto v5:
    # 0), restarts 4 (4, 4.25). 4.25: r2 (v5 onto v6: 1). Region 1's count since its merge is
    # past 2 from 1.75 on: one push only, merged at 4.25 + 3 = 7.25.
    # Region 0: r0, r1 step 0, 1, land 2.5: staleness 0, 1 -> push (2nd update), lands 3.5;
    # restart 3 (3, 4), land 5.5: r0 (v2 onto v2: 0), r1 (v2 onto v3: 1); the merge at 4.5 reset
    # the count, so 5.5's 2nd update pushes again: lands 6.5, merged 7.5.
    # GPS: 3.5 region 0 (merged v0, GPS at v0: 0) -> V1, merged by region 0 at 4.5; 4.25 region 1
    # (v0 onto V1: 1) -> V2, merged 7.25; 6.5 region 0 (merged V1, onto V2: 1) -> V3, merged 7.5.
    # Ticks 0 .25 .5 1 1.25 1.5 2 2.25 3 3.25 3.5 4 | 4.25: 12 ticks end at 4, so r3's step at
    # 4.25 and r2's segment at 4.5 never run.
    out = halos(
        ds,
        4,
        12,
        slowdown=[1.0, 1.0, 0.5, 0.25],
        region=[0, 0, 1, 1],
        worker_transfer=[0.5, 0.5, 0.25, 0.25],
        region_transfer=[1.0, 3.0],
    )
    assert out["steps"] == [4, 4, 6, 9]
    assert out["updates"] == [
        (0.75, 3, 0),
        (1.25, 2, 1),
        (1.75, 3, 1),
        (2.5, 0, 0),
        (2.5, 1, 1),
        (2.75, 2, 1),
        (2.75, 3, 1),
        (3.75, 3, 0),
        (4.25, 2, 1),
        (5.5, 0, 0),
        (5.5, 1, 1),
    ]
    assert out["region_updates"] == [(3.5, 0, 0), (4.25, 1, 1), (6.5, 0, 1)]
    assert out["merges"] == [(4.5, 0, 1), (7.25, 1, 2), (7.5, 0, 3)]
    assert out["end_time"] == 7.5


def test_dylu_on_speeds_1_1_2_4_makes_every_segment_one_second_and_the_pushes_land_together(ds) -> None:
    # H = 4 with DyLU: 1, 1, 2, 4 steps of 1, 1, 0.5, 0.25 s; free links. 4 ticks (0 .. 0.75)
    # are the first segments; all four land at t=1 in rank order onto LPS versions 0..3.
    out = halos(
        ds,
        4,
        4,
        slowdown=[1.0, 1.0, 0.5, 0.25],
        region=[0] * 4,
        worker_transfer=[0.0] * 4,
        region_transfer=[0.0],
        H=4,
        accumulation=100,
        dylu=True,
    )
    assert out["steps"] == [1, 1, 2, 4]
    assert out["updates"] == [(1.0, 0, 0), (1.0, 1, 1), (1.0, 2, 2), (1.0, 3, 3)]
    assert out["end_time"] == 1.0


def test_with_no_ticks_every_server_keeps_the_initial_model_and_nothing_happens(ds) -> None:
    out = halos(ds, 2, 0, slowdown=[1.0, 1.0], region=[0, 1], worker_transfer=[0.0, 0.0], region_transfer=[1.0, 1.0])
    assert out["steps"] == [0, 0] and out["updates"] == out["region_updates"] == out["merges"] == []
    assert out["end_time"] == 0.0
    for params in [out["params"], *out["lps_params"]]:
        assert all(map(torch.equal, params, [p.detach() for p in TinyNet().parameters()]))


# ---------------------------------------------------------------- rules


def test_lps_merge_weights_the_global_model_by_alpha_and_resets_the_baseline() -> None:
    server = LocalServer([torch.zeros(2)], lr=1.0, beta=0.0, period=1)
    server.apply([torch.full((2,), -4.0)])  # theta = 0 - 1 * (-4) = 4
    assert server.params[0].tolist() == [4.0, 4.0] and server.accumulated()[0].tolist() == [-4.0, -4.0]
    assert (server.version, server.since_merge) == (1, 1)
    server.merge([torch.zeros(2)], 0.25, global_version=7)  # 0.75 * 4 + 0.25 * 0
    assert server.params[0].tolist() == [3.0, 3.0] and server.accumulated()[0].tolist() == [0.0, 0.0]
    assert (server.version, server.since_merge, server.merged_version) == (1, 0, 7)


def test_one_node_applies_nesterov_at_the_lps_and_the_gps_and_merges_the_global_model_late(ds) -> None:
    # One node, H = 1, K = 1, node<->LPS free, LPS<->GPS 1 s. t=1: g1 lands, LPS Nesterov step,
    # push d1 = theta0 - theta_l (lands at the GPS at 2); the node restarts from theta_l at 1.
    # t=2: g2 lands first (phase order), applied but not pushed (d1 in flight); then the GPS
    # applies d1. t=3: the LPS merges the GPS model with weight alpha.
    lr_l, b_l, lr_g, b_g, alpha = 0.8, 0.9, 0.7, 0.5, 0.25
    out = halos(
        ds,
        1,
        2,
        slowdown=[1.0],
        region=[0],
        worker_transfer=[0.0],
        region_transfer=[1.0],
        H=1,
        accumulation=1,
        lps_lr=lr_l,
        lps_momentum=b_l,
        gps_lr=lr_g,
        gps_momentum=b_g,
        merge_weight=alpha,
    )
    assert out["updates"] == [(1.0, 0, 0), (2.0, 0, 0)]
    assert out["region_updates"] == [(2.0, 0, 0)] and out["merges"] == [(3.0, 0, 1)]
    assert out["steps"] == [2] and out["end_time"] == 3.0

    batches = iter(node_batches(ds, 1, 0))
    theta0 = [p.detach().clone() for p in TinyNet().parameters()]
    g1 = [a - b for a, b in zip(theta0, sgd_steps(theta0, batches, 1), strict=True)]
    m1 = g1  # m = beta * 0 + g
    lps1 = [t - lr_l * (b_l * m + g) for t, m, g in zip(theta0, m1, g1, strict=True)]
    d1 = [a - b for a, b in zip(theta0, lps1, strict=True)]
    g2 = [a - b for a, b in zip(lps1, sgd_steps(lps1, batches, 1), strict=True)]
    m2 = [b_l * m + g for m, g in zip(m1, g2, strict=True)]
    lps2 = [t - lr_l * (b_l * m + g) for t, m, g in zip(lps1, m2, g2, strict=True)]
    gps = [t - lr_g * (b_g * d + d) for t, d in zip(theta0, d1, strict=True)]
    lps3 = [(1 - alpha) * p + alpha * q for p, q in zip(lps2, gps, strict=True)]
    for got, want in zip(out["params"], gps, strict=True):
        torch.testing.assert_close(got, want)
    for got, want in zip(out["lps_params"][0], lps3, strict=True):
        torch.testing.assert_close(got, want)


# ---------------------------------------------------------------- reductions


def test_one_region_relaying_every_update_at_once_is_async_diloco(ds) -> None:
    # K = 1, alpha = 1, LPS plain SGD with lr 1, free LPS<->GPS: each worker push is relayed to
    # the GPS (d = b - (b - g)) and the GPS model replaces the LPS's within the instant, so the
    # run is Async DiLoCo with the GPS as its server. Parameters equal up to the rounding of d.
    k, slowdown, kw = 3, [1.0, 0.75, 1.6], {"H": 2, "gps_lr": 0.7, "gps_momentum": 0.9}
    out = halos(
        ds,
        k,
        14,
        slowdown=slowdown,
        region=[0] * k,
        worker_transfer=[0.5] * k,
        region_transfer=[0.0],
        accumulation=1,
        merge_weight=1.0,
        lps_lr=1.0,
        lps_momentum=0.0,
        gps_period=2,
        **kw,
    )
    want = reference_async_diloco(
        ds,
        k,
        14,
        slowdown=slowdown,
        step_seconds=1.0,
        bandwidth=INF,
        latency=0.5,
        H=2,
        outer_lr=0.7,
        outer_momentum=0.9,
        dn_period=2,
        dylu=False,
    )
    times = [t for t, _, _ in out["updates"]]
    assert len(set(times)) == len(times) > 6  # no two pushes land at one instant
    assert out["steps"] == want["steps"] and out["updates"] == want["updates"]
    assert out["end_time"] == want["end_time"]
    assert [s for _, _, s in out["region_updates"]] == [0] * len(times) and len(out["merges"]) == len(times)
    for got, w in zip(out["params"], want["params"], strict=True):
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)


def test_one_region_that_never_reaches_k_is_an_async_diloco_server_and_the_gps_never_moves(ds) -> None:
    kw = {"slowdown": [1.0, 0.5], "step_seconds": 1.0, "H": 2}
    out = halos(
        ds,
        2,
        10,
        region=[0, 0],
        worker_transfer=[0.25, 0.25],
        region_transfer=[1.0],
        accumulation=1000,
        lps_lr=0.8,
        lps_momentum=0.9,
        lps_period=2,
        **kw,
    )
    want = reference_async_diloco(
        ds, 2, 10, bandwidth=INF, latency=0.25, outer_lr=0.8, outer_momentum=0.9, dn_period=2, dylu=False, **kw
    )
    assert out["updates"] == want["updates"] and out["region_updates"] == out["merges"] == []
    assert all(map(torch.equal, out["lps_params"][0], want["params"]))
    assert all(map(torch.equal, out["params"], [p.detach() for p in TinyNet().parameters()]))


def test_equal_speeds_k_per_region_and_free_global_links_is_synchronous_diloco_nesterov(ds) -> None:
    # Two regions of two equal nodes, K = 2, LPS plain SGD with lr 1/2 (d = the region's mean
    # pseudo-gradient), alpha = 1, LPS<->GPS free: both regions push at one instant, the GPS
    # applies DN with period 2 (= one Nesterov step on the mean of the two, c = 0) and replies
    # after both receipts, and every node restarts from the GPS model: synchronous DiLoCo.
    k, H, rounds, lr_g, b_g = 4, 2, 3, 0.7, 0.9
    out = halos(
        ds,
        k,
        H * rounds,
        slowdown=[1.0] * k,
        region=[0, 0, 1, 1],
        worker_transfer=[0.5] * k,
        region_transfer=[0.0, 0.0],
        H=H,
        accumulation=2,
        lps_lr=0.5,
        lps_momentum=0.0,
        gps_lr=lr_g,
        gps_momentum=b_g,
        gps_period=2,
        merge_weight=1.0,
    )
    global_model = TinyNet()
    outer = torch.optim.SGD(global_model.parameters(), lr=lr_g, momentum=b_g, nesterov=True)
    data = [iter(node_batches(ds, k, r)) for r in range(k)]
    for _ in range(rounds):
        start = [p.detach().clone() for p in global_model.parameters()]
        pseudo = [[s - p for s, p in zip(start, sgd_steps(start, data[r], H), strict=True)] for r in range(k)]
        for p, *gs in zip(global_model.parameters(), *pseudo, strict=True):
            p.grad = torch.stack(gs).mean(0)
        outer.step()
    assert out["steps"] == [H * rounds] * k
    assert [s for _, _, s in out["updates"]] == [0, 1, 0, 1] * rounds  # per LPS version
    assert [s for _, _, s in out["region_updates"]] == [0, 1] * rounds
    for got, want in zip(out["params"], global_model.parameters(), strict=True):
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)


def test_two_runs_give_bitwise_equal_parameters_and_schedules(ds) -> None:
    kw = {
        "slowdown": [1.0, 1.0, 0.5, 0.25],
        "region": [0, 0, 1, 1],
        "worker_transfer": [0.5, 0.5, 0.25, 0.25],
        "region_transfer": [1.0, 3.0],
    }
    a, b = halos(ds, 4, 12, **kw), halos(ds, 4, 12, **kw)
    assert a["updates"] == b["updates"] and a["merges"] == b["merges"]
    assert all(map(torch.equal, a["params"], b["params"]))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"region": [0, 0, 1]}, "region"),
        ({"region": [0, 0, 2, 1]}, "region"),
        ({"region": [0, 0, 0, 0]}, "region"),  # region 1 has no node
        ({"region_transfer": []}, "region_transfer"),
        ({"region_transfer": [1.0, -1.0]}, "region_transfer"),
        ({"region_transfer": [1.0, INF]}, "region_transfer"),
        ({"worker_transfer": [0.5, 0.5, 0.5]}, "worker_transfer"),
        ({"worker_transfer": [0.5, 0.5, 0.5, -0.5]}, "worker_transfer"),
        ({"H": 0}, "H"),
        ({"accumulation": 0}, "accumulation"),
        ({"lps_period": 0}, "lps_period"),
        ({"gps_period": 0}, "gps_period"),
        ({"lps_lr": -1.0}, "lps_lr"),
        ({"gps_lr": INF}, "gps_lr"),
        ({"lps_momentum": 1.0}, "lps_momentum"),
        ({"gps_momentum": -0.1}, "gps_momentum"),
        ({"merge_weight": 1.5}, "merge_weight"),
        ({"slowdown": [1.0, 1.0, 1.0]}, "slowdown"),
        ({"inner": ("lion", {})}, "inner"),
    ],
)
def test_halos_rejects_bad_arguments_naming_them(ds, kw, name) -> None:
    args = {"slowdown": [1.0] * 4, "region": [0, 0, 1, 1], "worker_transfer": [0.5] * 4, "region_transfer": [1.0, 1.0]}
    with pytest.raises(ValueError, match=rf"^{name}="):
        halos(ds, 4, 4, **{**args, **kw})
