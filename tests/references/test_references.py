"""The event-driven references keep ExoGym's timing model (timelines computed by hand below) and
reduce to plain synchronous loops where the papers say they must (loops written here in torch)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers import TinyNet, node_batches, regression_data
from tests.references import transfer_seconds
from tests.references.async_diloco import DelayedNesterov, dylu_steps, reference_async_diloco
from tests.references.fedbuff import draw_client, reference_fedbuff

INF = float("inf")
SPEEDS_1_1_2_4 = [1.0, 1.0, 0.5, 0.25]  # slowdown = 1 / speed
# TinyNet has P = 8*16 + 16 + 16 + 1 = 161 parameters: a transfer carries 4P = 644 bytes = 5152 bits.
TINYNET_BITS = 8 * 4 * 161


@pytest.fixture(scope="module")
def ds():
    return regression_data(n=1024)


def diloco(ds, k, max_steps, **kw):
    args = {"step_seconds": 1.0, "bandwidth": INF, "latency": 0.0, "H": 4, "outer_lr": 0.7, "outer_momentum": 0.9}
    return reference_async_diloco(ds, k, max_steps, **{**args, **kw})


def fedbuff(ds, k, max_steps, **kw):
    args = {"step_seconds": 1.0, "bandwidth": INF, "latency": 0.0, "client_lr": 0.05, "server_lr": 1.0}
    return reference_fedbuff(ds, k, max_steps, **{**args, **kw})


def test_a_transfer_of_tinynet_takes_latency_plus_its_float32_bits_over_the_bandwidth() -> None:
    params = list(TinyNet().parameters())
    assert TINYNET_BITS == 5152
    assert transfer_seconds(params, 0.25, TINYNET_BITS / 0.25) == 0.5
    assert transfer_seconds(params, 0.5, INF) == 0.5


# ---------------------------------------------------------------- Async DiLoCo: timing


def test_dylu_on_speeds_1_1_2_4_gives_the_fastest_node_four_times_the_slowest_nodes_steps() -> None:
    assert dylu_steps(4, SPEEDS_1_1_2_4, dylu=True) == [1, 1, 2, 4]
    assert dylu_steps(4, SPEEDS_1_1_2_4, dylu=False) == [4, 4, 4, 4]
    assert dylu_steps(4, [1.0, 8.0], dylu=True) == [4, 1]  # floor(4/8) = 0 is raised to one step


def test_async_diloco_dylu_on_fast_links_pushes_every_second_and_drains_only_complete_segments(ds) -> None:
    # H_r = 1, 1, 2, 4 steps of 1, 1, 0.5, 0.25 s: every segment lasts 1 s, all pushes land at
    # t = 1, 2, ... Ticks every 0.25 s; 6 ticks = starts at 0 .. 1.25. Second segments: nodes 0
    # and 1 (one step at t=1) complete; node 2 (1, 1.5) and node 3 (1 .. 1.75) do not.
    out = diloco(ds, 4, 6, slowdown=SPEEDS_1_1_2_4, dylu=True)
    assert out["steps"] == [2, 2, 3, 6]
    # At t=1 the four pushes apply in rank order onto versions 0..3; all pull version 4.
    assert out["updates"] == [(1.0, 0, 0), (1.0, 1, 1), (1.0, 2, 2), (1.0, 3, 3), (2.0, 0, 0), (2.0, 1, 1)]
    assert out["end_time"] == 2.0


def test_async_diloco_dylu_on_half_second_transfers_shift_every_round_by_one_second(ds) -> None:
    # latency 0.25 s + 5152 bits at 20608 bit/s = 0.5 s each way: segment 1 s, push lands 0.5 s
    # later, the reply 0.5 s after that. Ticks 0, .25, .5, .75, 2, 2.25 (6 ticks).
    out = diloco(ds, 4, 6, slowdown=SPEEDS_1_1_2_4, dylu=True, latency=0.25, bandwidth=TINYNET_BITS / 0.25)
    assert out["steps"] == [2, 2, 3, 6]
    assert out["updates"] == [(1.5, 0, 0), (1.5, 1, 1), (1.5, 2, 2), (1.5, 3, 3), (3.5, 0, 0), (3.5, 1, 1)]
    assert out["end_time"] == 3.5


def test_async_diloco_dylu_off_with_latency_gives_the_hand_computed_receipts_and_staleness(ds) -> None:
    # H = 4 for all: segments of 4, 4, 2, 1 s; 0.5 s each way, so a node's cycle is 5, 5, 3, 2 s.
    # Node 3 pushes land at 1.5, 3.5, 5.5; node 2's at 2.5, 5.5; nodes 0 and 1 at 4.5.
    # Versions: 1.5 r3 (from v0 onto v0: 0) -> v1, r3 pulls v1; 2.5 r2 (v0 onto v1: 1) -> v2, pulls
    # v2; 3.5 r3 (v1 onto v2: 1) -> v3; 4.5 r0 (v0 onto v3: 3), r1 (v0 onto v4: 4) -> v5;
    # 5.5 r2 (v2 onto v5: 3), r3 (v3 onto v6: 3).
    # Ticks: 0 .25 .5 .75 1 1.5 2 2.25 2.5 2.75 3 3.5 4 4.25 4.5 4.75 | 5: 16 ticks end at 4.75,
    # so nodes 0 and 1 never start their second segment (t=5), node 2 finishes its second
    # (last step 4.5) and node 3 its third (last step 4.75): both land at 5.5 in the drain.
    out = diloco(ds, 4, 16, slowdown=SPEEDS_1_1_2_4, dylu=False, latency=0.5)
    assert out["steps"] == [4, 4, 8, 12]
    assert out["updates"] == [(1.5, 3, 0), (2.5, 2, 1), (3.5, 3, 1), (4.5, 0, 3), (4.5, 1, 4), (5.5, 2, 3), (5.5, 3, 3)]
    assert out["end_time"] == 5.5


# ---------------------------------------------------------------- Async DiLoCo: values


def test_dn_box_by_hand_with_period_two_and_c_a_quarter() -> None:
    # lr 1, beta 1/2, N 2, c 1/4; pushes g = 1, 3, 2 onto theta = 0:
    # t=1: theta -= c*beta*m + g/N = 0 + 1/2                     -> -0.5
    # t=2: m = beta*0 + (1+3)/2 = 2; theta -= (1-cN+c)*beta*m + g/N = 0.75*0.5*2 + 1.5 = 2.25 -> -2.75
    # t=3: theta -= c*beta*m + g/N = 0.25*0.5*2 + 1 = 1.25       -> -4.0
    theta = [torch.zeros(2)]
    dn = DelayedNesterov(theta, lr=1.0, beta=0.5, period=2, c=0.25)
    seen = []
    for g in (1.0, 3.0, 2.0):
        dn.apply(theta, [torch.full((2,), g)])
        seen.append(theta[0][0].item())
    assert seen == [-0.5, -2.75, -4.0]
    assert dn.m[0][0].item() == 2.0 and dn.delta[0][0].item() == 2.0


def test_async_diloco_with_no_ticks_returns_the_initial_model_and_no_updates(ds) -> None:
    out = diloco(ds, 4, 0, slowdown=SPEEDS_1_1_2_4)
    assert out["steps"] == [0] * 4 and out["updates"] == [] and out["end_time"] == 0.0
    for got, want in zip(out["params"], TinyNet().parameters(), strict=True):
        assert torch.equal(got, want.detach())


def test_two_runs_of_each_reference_give_bitwise_equal_parameters(ds) -> None:
    kw = {"slowdown": SPEEDS_1_1_2_4, "latency": 0.5}
    a, b = diloco(ds, 4, 12, **kw), diloco(ds, 4, 12, **kw)
    assert a["updates"] == b["updates"] and all(map(torch.equal, a["params"], b["params"]))
    kw = {"slowdown": SIX, "concurrency": 2, "buffer_size": 2, "local_steps": 2, "latency": 0.5}
    a, b = fedbuff(ds, 6, 12, **kw), fedbuff(ds, 6, 12, **kw)
    assert a["updates"] == b["updates"] and all(map(torch.equal, a["params"], b["params"]))


def synchronous_diloco(ds, k, rounds, H, outer_lr, beta, make_inner):
    """DiLoCo as a plain loop: every round each node takes H inner steps from the global model,
    then Nesterov SGD on the global model with the mean pseudo-gradient."""
    global_model = TinyNet()
    outer = torch.optim.SGD(global_model.parameters(), lr=outer_lr, momentum=beta, nesterov=True)
    models = [TinyNet() for _ in range(k)]
    opts = [make_inner(m.parameters()) for m in models]
    data = [iter(node_batches(ds, k, r)) for r in range(k)]
    for _ in range(rounds):
        pseudo = []
        for model, opt, batches in zip(models, opts, data, strict=True):
            model.load_state_dict(global_model.state_dict())
            for _ in range(H):
                opt.zero_grad()
                model(next(batches)).backward()
                opt.step()
            pseudo.append(
                [g.detach() - p.detach() for g, p in zip(global_model.parameters(), model.parameters(), strict=True)]
            )
        for p, *gs in zip(global_model.parameters(), *pseudo, strict=True):
            p.grad = torch.stack(gs).mean(0)
        outer.step()
    return [p.detach() for p in global_model.parameters()]


@pytest.mark.parametrize(
    "inner, make_inner",
    [
        (("sgd", {"lr": 0.05}), lambda ps: torch.optim.SGD(ps, lr=0.05)),
        (("adamw", {"lr": 0.01}), lambda ps: torch.optim.AdamW(ps, lr=0.01)),
    ],
    ids=["sgd", "adamw"],
)
def test_async_diloco_with_equal_speeds_dn_c0_n_k_equals_synchronous_diloco_nesterov(ds, inner, make_inner) -> None:
    # Equal speeds, DyLU off: all K pushes of a round land at one instant, so DN with N = K and
    # c = 0 must make each round one Nesterov outer step on the mean pseudo-gradient. Equal up to
    # float summation order (DN subtracts lr * g / K push by push; torch subtracts lr * mean).
    k, H, rounds = 4, 3, 3
    out = diloco(ds, k, H * rounds, slowdown=[1.0] * k, dylu=False, H=H, latency=0.5, inner=inner)
    expected = synchronous_diloco(ds, k, rounds, H, 0.7, 0.9, make_inner)
    assert out["steps"] == [H * rounds] * k
    assert [s for _, _, s in out["updates"]] == [0, 1, 2, 3] * rounds
    for got, want in zip(out["params"], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(p, q) for p, q in zip(out["params"], TinyNet().parameters(), strict=True))


# ---------------------------------------------------------------- FedBuff: timing


def test_draw_client_picks_uniformly_among_the_ascending_free_clients_from_seed_and_index() -> None:
    free = [4, 1, 3]
    picks = [draw_client(7, i, free) for i in range(3000)]
    assert picks[:5] == [draw_client(7, i, sorted(free)) for i in range(5)]  # order of the list given is irrelevant
    for i in range(20):
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([7, i])))
        assert picks[i] == [1, 3, 4][rng.integers(3)]
    counts = np.bincount(picks, minlength=5)
    assert counts[[0, 2]].sum() == 0 and all(900 < c < 1100 for c in counts[[1, 3, 4]])
    with pytest.raises(ValueError, match="free_clients"):
        draw_client(0, 0, [])


# Slowdowns of the six clients for the hand timelines: client 3 is twice as fast, client 4 twice as slow.
SIX = [1.0, 1.0, 1.0, 0.5, 2.0, 1.0]
# Draws of seed 0 the timelines need (draw index: free clients -> pick), from draw_client:
DRAWS = {
    (0, (0, 1, 2, 3, 4, 5)): 5,
    (1, (0, 1, 2, 3, 4)): 2,
    (2, (0, 1, 2, 3, 4)): 4,
    (3, (0, 1, 2, 3, 5)): 2,
    (4, (0, 1, 2, 3, 5)): 2,
    (5, (0, 1, 2, 3, 5)): 3,
    (5, (0, 1, 3, 4, 5)): 4,
    (6, (0, 1, 2, 4, 5)): 2,
    (7, (0, 1, 3, 4, 5)): 4,
}


def test_the_draws_the_fedbuff_timelines_use() -> None:
    for (i, free), pick in DRAWS.items():
        assert draw_client(0, i, free) == pick


def test_fedbuff_on_fast_links_gives_the_hand_computed_receipts_staleness_and_steps(ds) -> None:
    # K=6, C=2, B=2, Q=2, transfers free. t=0: draws 5, 2 (v0). t=2: r2 (tau 0) frees 2, draw ->
    # 4; r5 (tau 0) fills the buffer -> v1, frees 5, draw -> 2; both served v1. Client 4 steps
    # at 2, 4; client 2 at 2, 3. t=4: r2 (tau 0), draw -> 2, steps 4, 5. t=6: r2 (tau 0) -> v2,
    # draw -> 3; r4 (served v1: tau 1), draw -> 2; both served v2. Client 3 steps 6, 6.5;
    # client 2 steps 6, 7. t=7: r3 (tau 0) -> v3, draw -> 4 (steps 7, 9). Ticks 0 1 2 3 4 5 6
    # 6.5 7: with 9 ticks client 2's push (t=8, served v2: tau 1) lands in the drain and client
    # 4's second participation (step at 9) never ends; its step at 7 ends at 9.
    out = fedbuff(ds, 6, 9, slowdown=SIX, concurrency=2, buffer_size=2, local_steps=2)
    assert out["updates"] == [(2.0, 2, 0), (2.0, 5, 0), (4.0, 2, 0), (6.0, 2, 0), (6.0, 4, 1), (7.0, 3, 0), (8.0, 2, 1)]
    assert out["steps"] == [0, 0, 8, 2, 3, 2]
    assert out["end_time"] == 9.0


def test_fedbuff_with_half_second_transfers_gives_the_hand_computed_receipts_staleness_and_steps(ds) -> None:
    # Each download and upload takes 0.5 s. t=0: draws 5, 2 served v0, start 0.5. t=3: r2 (tau
    # 0), draw -> 4; r5 (tau 0) -> v1, draw -> 2; served v1, start 3.5. Client 2: 3.5, 4.5 ->
    # lands 6: tau 0, draw -> 2, start 6.5 (6.5, 7.5 -> lands 9). Client 4: 3.5, 5.5 -> lands 8:
    # tau 0 -> v2, draw -> 4, start 8.5. t=9: r2 (served v1: tau 1). Ticks .5 1.5 3.5 4.5 5.5
    # 6.5 7.5 8.5: 8 ticks; client 4's step at 8.5 ends at 10.5.
    out = fedbuff(ds, 6, 8, slowdown=SIX, concurrency=2, buffer_size=2, local_steps=2, latency=0.5)
    assert out["updates"] == [(3.0, 2, 0), (3.0, 5, 0), (6.0, 2, 0), (8.0, 4, 0), (9.0, 2, 1)]
    assert out["steps"] == [0, 0, 6, 0, 3, 2]
    assert out["end_time"] == 10.5


# ---------------------------------------------------------------- FedBuff: values


def sgd_steps(model, batches, q, lr):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(q):
        opt.zero_grad()
        model(next(batches)).backward()
        opt.step()


def test_fedbuff_with_one_client_in_flight_and_buffer_one_is_sequential_sgd_over_the_drawn_clients(ds) -> None:
    # C=1, B=1, eta_g=1: every update has tau=0 and replaces the model by the client's: plain SGD
    # through the clients in draw order, each continuing its own batches.
    k, q, participations = 6, 2, 5
    out = fedbuff(ds, k, q * participations, slowdown=[1.0] * k, concurrency=1, buffer_size=1, local_steps=q)
    model, data = TinyNet(), [iter(node_batches(ds, k, r)) for r in range(k)]
    clients = [int(np.random.Generator(np.random.PCG64(np.random.SeedSequence([0, i]))).integers(k)) for i in range(5)]
    for c in clients:
        sgd_steps(model, data[c], q, 0.05)
    assert [r for _, r, _ in out["updates"]] == clients
    for got, want in zip(out["params"], model.parameters(), strict=True):
        torch.testing.assert_close(got, want.detach())


def test_fedbuff_with_two_equal_clients_and_buffer_two_is_fedavg_with_a_server_learning_rate(ds) -> None:
    # C=2, B=2, equal speeds: both clients land together with tau=0, and the server step is
    # x + eta_g * mean(local - x): FedAvg with server lr eta_g over the drawn pairs.
    k, q, rounds, eta = 6, 2, 3, 0.8
    out = fedbuff(ds, k, q * rounds, slowdown=[1.0] * k, concurrency=2, buffer_size=2, local_steps=q, server_lr=eta)
    x, data = [p.detach().clone() for p in TinyNet().parameters()], [iter(node_batches(ds, k, r)) for r in range(k)]
    free, draws, pair = set(range(k)), 0, []
    for _ in range(2):
        pair.append(draw_client(0, draws, free))
        free.discard(pair[-1])
        draws += 1
    for _ in range(rounds):
        deltas = []
        for c in pair:
            model = TinyNet()
            with torch.no_grad():
                for p, xi in zip(model.parameters(), x, strict=True):
                    p.copy_(xi)
            sgd_steps(model, data[c], q, 0.05)
            deltas.append([p.detach() - xi for p, xi in zip(model.parameters(), x, strict=True)])
        x = [xi + eta * (da + db) / 2 for xi, da, db in zip(x, *deltas, strict=True)]
        nxt = []
        for c in sorted(pair):  # receipts in ascending rank; each frees its client, then draws
            free.add(c)
            nxt.append(draw_client(0, draws, free))
            free.discard(nxt[-1])
            draws += 1
        pair = nxt
    assert [s for _, _, s in out["updates"]] == [0] * (2 * rounds)
    for got, want in zip(out["params"], x, strict=True):
        torch.testing.assert_close(got, want)


def test_fedbuff_scales_an_update_three_versions_stale_by_one_half(ds) -> None:
    # K=2, C=2, B=1, Q=1, slowdowns 1 and 3, eta_g=1. Client 0 lands at 1, 2, 3 (tau 0 each,
    # every receipt a server step); client 1's single step from x0 lands at 3 after client 0's
    # (ascending rank) onto version 3: tau 3, s = 1/sqrt(4) = 1/2.
    out = fedbuff(ds, 2, 3, slowdown=[1.0, 3.0], concurrency=2, buffer_size=1, local_steps=1)
    assert out["updates"] == [(1.0, 0, 0), (2.0, 0, 0), (3.0, 0, 0), (3.0, 1, 3)]
    data = [iter(node_batches(ds, 2, r)) for r in range(2)]
    x0 = [p.detach().clone() for p in TinyNet().parameters()]
    slow = TinyNet()
    sgd_steps(slow, data[1], 1, 0.05)
    fast = TinyNet()
    sgd_steps(fast, data[0], 3, 0.05)  # a fresh SGD per step is plain SGD: no optimizer state
    want = [
        f.detach() + 0.5 * (s.detach() - x) for f, s, x in zip(fast.parameters(), slow.parameters(), x0, strict=True)
    ]
    for got, w in zip(out["params"], want, strict=True):
        torch.testing.assert_close(got, w)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"slowdown": [1.0, 1.0]}, "slowdown"),
        ({"slowdown": [1.0, 1.0, 0.0]}, "slowdown"),
        ({"bandwidth": 0.0}, "bandwidth"),
        ({"latency": -1.0}, "latency"),
        ({"H": 0}, "H"),
        ({"dn_period": 0}, "dn_period"),
        ({"dn_c": 0.5}, "dn_c"),
        ({"inner": ("lion", {})}, "inner"),
    ],
)
def test_async_diloco_rejects_bad_arguments_naming_them(ds, kw, name) -> None:
    with pytest.raises(ValueError, match=rf"^{name}="):
        diloco(ds, 3, 4, **{"slowdown": [1.0] * 3, **kw})


@pytest.mark.parametrize(
    "kw, name",
    [({"concurrency": 7}, "concurrency"), ({"buffer_size": 0}, "buffer_size"), ({"local_steps": 0}, "local_steps")],
)
def test_fedbuff_rejects_bad_arguments_naming_them(ds, kw, name) -> None:
    args = {"slowdown": [1.0] * 6, "concurrency": 2, "buffer_size": 2, "local_steps": 2, **kw}
    with pytest.raises(ValueError, match=rf"^{name}="):
        fedbuff(ds, 6, 4, **args)


def test_a_node_out_of_batches_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="ran out of batches"):
        diloco(regression_data(n=64), 2, 10, slowdown=[1.0, 1.0], dylu=False)


def test_staleness_scale_is_one_over_root_one_plus_tau() -> None:
    from tests.references.fedbuff import staleness_scale

    assert [staleness_scale(t) for t in (0, 3, 8)] == [1.0, 0.5, 1 / 3] and staleness_scale(1) == 1 / math.sqrt(2)
