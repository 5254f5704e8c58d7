"""The Decoupled DiLoCo reference keeps its rules (timelines computed by hand below) and reduces to
synchronous DiLoCo and Streaming DiLoCo (loops written here in plain torch) where it must."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import TinyNet, node_batches, regression_data
from tests.references.decoupled_diloco import (
    fragment_bounds,
    fragment_offsets,
    grace_window,
    nesterov_merge,
    reference_decoupled_diloco,
)

INF = float("inf")
SPEEDS_1_1_2_4 = [1.0, 1.0, 0.5, 0.25]  # slowdown = 1 / speed


@pytest.fixture(scope="module")
def ds():
    return regression_data(n=1024)


def ddiloco(ds, k, max_steps, **kw):
    args = {
        "step_seconds": 1.0,
        "bandwidth": INF,
        "latency": 0.0,
        "H": 4,
        "fragments": 1,
        "quorum": k,
        "grace": 0.0,
        "outer_lr": 0.7,
        "outer_momentum": 0.9,
    }
    return reference_decoupled_diloco(ds, k, max_steps, **{**args, **kw})


# ---------------------------------------------------------------- pieces


def test_fragments_are_contiguous_near_equal_slices_sent_at_distinct_offsets() -> None:
    assert fragment_bounds(161, 1) == [(0, 161)]
    assert fragment_bounds(161, 3) == [(0, 54), (54, 108), (108, 161)]
    assert fragment_offsets(4, 1) == [0]
    assert fragment_offsets(4, 2) == [2, 0]
    assert fragment_offsets(6, 3) == [2, 4, 0]
    assert fragment_offsets(5, 5) == [1, 2, 3, 4, 0]


def test_grace_window_is_gamma_times_what_is_left_of_tau_steps_after_quorum_wait_and_sync() -> None:
    assert grace_window(0.5, 2, 1.0, 0.5, 0.25) == 0.5 * (2.0 - 0.5 - 0.25)
    assert grace_window(0.5, 2, 1.0, 1.5, 0.75) == 0.0  # no slack left: merge at quorum
    assert grace_window(0.0, 8, 1.0, 0.0, 0.0) == 0.0


def test_nesterov_merge_by_hand_on_token_weighted_pseudo_gradients_from_the_global_fragment() -> None:
    # lr 1, mu 1/2, Theta = 0. Merge 1: theta_1 = -1 (w 1/4), theta_2 = -3 (w 3/4):
    # delta = 1/4 * 1 + 3/4 * 3 = 2.5, buf = 2.5, Theta -= 2.5 + 0.5 * 2.5 -> -3.75.
    # Merge 2: theta_1 = -4.75 (w 1): delta = 1, buf = 0.5 * 2.5 + 1 = 2.25, Theta -= 1 + 1.125 -> -5.875.
    theta, buf = torch.zeros(3), torch.zeros(3)
    nesterov_merge(theta, buf, [(torch.full((3,), -1.0), 0.25), (torch.full((3,), -3.0), 0.75)], 1.0, 0.5)
    assert theta.tolist() == [-3.75] * 3 and buf.tolist() == [2.5] * 3
    nesterov_merge(theta, buf, [(torch.full((3,), -4.75), 1.0)], 1.0, 0.5)
    assert theta.tolist() == [-5.875] * 3 and buf.tolist() == [2.25] * 3


# ---------------------------------------------------------------- timelines by hand


def test_quorum_two_with_a_grace_window_merges_the_fast_learners_first_and_all_four_next(ds) -> None:
    # H = 4, one fragment, free links. Sends (every 4 local steps): learner 3 at 1, 2, 3, 4 s;
    # learner 2 at 2, 4; learners 0, 1 at 4. step_ref = 0.5 (2nd fastest), tau * step_ref = 2.
    # Round 1 opens at 1 (learner 3), quorum at 2 (learner 2): window = .5 * (2 - 1 - 0) = .5,
    # merge at 2.5 with learner 2 (c=4) and learner 3 (c=8, its send at 2 replaced the one at 1).
    # Adoption at the next step start: learners 2, 3 at 2.5, learners 0, 1 at 3.
    # Round 2 opens at 3 (learner 3), quorum at 4 (learner 0): window .5, merge at 4.5 with
    # c = 1, 1, 3, 6 (learner 3's send at 4 replaced the one at 3). 16 ticks end at 3.75.
    out = ddiloco(ds, 4, 16, slowdown=SPEEDS_1_1_2_4, quorum=2, grace=0.5, tau=4)
    assert out["steps"] == [4, 4, 8, 16]
    assert out["merges"] == [
        (2.5, 0, (2, 3), (4 / 12, 8 / 12)),
        (4.5, 0, (0, 1, 2, 3), (1 / 11, 1 / 11, 3 / 11, 6 / 11)),
    ]
    assert out["updates"] == [(2.0, 2, 0), (2.0, 3, 0), (4.0, 0, 0), (4.0, 1, 0), (4.0, 2, 0), (4.0, 3, 0)]
    assert out["end_time"] == 4.5


def test_quorum_one_merges_when_the_grace_window_of_the_fastest_learner_closes(ds) -> None:
    # step_ref = 0.25 (fastest), tau = 8: every window is .5 * (2 - 0 - 0) = 1 s after the first send.
    # Round 1: learner 3 at 1 -> merge at 2 with learners 2 (c=4) and 3 (c=8); all adopt at 2.
    # Round 2: learner 3 at 3 -> merge at 4 with c = 2, 2, 4, 8.
    out = ddiloco(ds, 4, 16, slowdown=SPEEDS_1_1_2_4, quorum=1, grace=0.5, tau=8)
    assert out["steps"] == [4, 4, 8, 16]
    assert out["merges"] == [(2.0, 0, (2, 3), (4 / 12, 8 / 12)), (4.0, 0, (0, 1, 2, 3), (0.125, 0.125, 0.25, 0.5))]
    assert out["end_time"] == 4.0


def test_transfers_delay_receipts_merges_and_adoption_and_a_send_from_an_old_version_counts_stale(ds) -> None:
    # 0.5 s per transfer, quorum 2, grace 0. Receipts: learner 3 at 1.5, 2.5, 3.5, 4.5; learner 2
    # at 2.5, 4.5; learners 0, 1 at 4.5. Round 1: quorum at 2.5 -> merge at 2.5 with learners 2
    # (c=4) and 3 (c=8); delivered at 3, adopted by all at 3. Learner 3's send at 3 (c=12, from
    # version 0) arrives at 3.5 and opens round 2; its send at 4 (c=4, version 1) replaces it.
    # Round 2: quorum at 4.5 -> merge at 4.5 with c = 1, 1, 2, 4, all from version 1.
    out = ddiloco(ds, 4, 16, slowdown=SPEEDS_1_1_2_4, quorum=2, latency=0.5)
    assert out["merges"] == [(2.5, 0, (2, 3), (4 / 12, 8 / 12)), (4.5, 0, (0, 1, 2, 3), (0.125, 0.125, 0.25, 0.5))]
    assert [s for _, _, s in out["updates"]] == [0] * 6
    # With learner 3 gone at 3.5 (its steps at 3 and 3.25 still run), its send from version 0 is
    # the one merged, one merge stale.
    out = ddiloco(ds, 4, 16, slowdown=SPEEDS_1_1_2_4, quorum=2, latency=0.5, down={3: [(3.5, INF)]})
    assert out["steps"] == [5, 5, 9, 14]  # 16 ticks: 0 .. 3.25, 3.5, 4
    assert out["merges"][1] == (4.5, 0, (0, 1, 2, 3), (1 / 16, 1 / 16, 2 / 16, 12 / 16))
    assert out["updates"][2:] == [(4.5, 0, 0), (4.5, 1, 0), (4.5, 2, 0), (3.5, 3, 1)]


def test_a_learner_down_for_an_interval_is_skipped_training_goes_on_and_it_rejoins_by_a_pull(ds) -> None:
    # 3 equal learners, H = 2, quorum 2. Learner 2 is absent on [1.5, 4.5): its step [1, 2) is not
    # taken, so it never sends; merges at 2 and 4 take learners 0 and 1. At 4.5 it pulls version 2,
    # steps 4.5 - 5.5 and sends with c=1; learners 0, 1 send at 6 with c=2. 7 ticks: 0 1 2 3 4 4.5 5.
    out = ddiloco(ds, 3, 7, slowdown=[1.0] * 3, H=2, quorum=2, down={2: [(1.5, 4.5)]})
    assert out["steps"] == [6, 6, 2]
    assert out["merges"] == [
        (2.0, 0, (0, 1), (0.5, 0.5)),
        (4.0, 0, (0, 1), (0.5, 0.5)),
        (6.0, 0, (0, 1, 2), (0.4, 0.4, 0.2)),
    ]
    assert out["updates"][-1] == (5.5, 2, 0)
    gone = ddiloco(ds, 3, 7, slowdown=[1.0] * 3, H=2, quorum=2, down={2: [(1.5, INF)]})
    assert gone["steps"] == [7, 7, 1]
    assert [m[2] for m in gone["merges"]] == [(0, 1)] * 3


def test_fragments_travel_alone_and_a_rejoining_learner_adopts_a_fragment_delivered_during_its_pull(ds) -> None:
    # TinyNet's 161 parameters in 7 fragments of 23: a fragment is 736 bits, the model 5152; at
    # 5152 bit/s a fragment takes 1/7 s and a pull 1 s. H = 7: fragment p is sent at steps
    # s = p + 1 (mod 7). Quorum 1, grace 0: every receipt merges at once. Learner 1 is absent on
    # [2.5, 3): its step [2, 3) is not taken; at 3 it pulls (fragment 2 still at version 0). The
    # merge of learner 0's fragment 2 at 3 + 1/7 reaches it at 3 + 2/7, during the pull, and is
    # adopted when its step starts at 4: its third step sends fragment 2 at 5 from version 1.
    out = ddiloco(ds, 2, 5, slowdown=[1.0, 1.0], H=7, fragments=7, quorum=1, bandwidth=5152.0, down={1: [(2.5, 3.0)]})
    assert out["steps"] == [5, 3]
    assert out["merges"] == [
        (1 + 1 / 7, 0, (0, 1), (0.5, 0.5)),
        (2 + 1 / 7, 1, (0, 1), (0.5, 0.5)),
        (3 + 1 / 7, 2, (0,), (1.0,)),
        (4 + 1 / 7, 3, (0,), (1.0,)),
        (5 + 1 / 7, 2, (1,), (1.0,)),
        (5 + 1 / 7, 4, (0,), (1.0,)),
    ]
    assert out["updates"][-2:] == [(5 + 1 / 7, 1, 0), (5 + 1 / 7, 0, 0)]
    assert out["end_time"] == 5 + 1 / 7


def test_a_round_below_quorum_waits_without_stopping_any_learner(ds) -> None:
    out = ddiloco(ds, 3, 6, slowdown=[1.0] * 3, H=2, quorum=3, down={2: [(0.5, INF)]})
    assert out["steps"] == [6, 6, 0] and out["merges"] == [] and out["end_time"] == 6.0
    for got, want in zip(out["params"], TinyNet().parameters(), strict=True):
        assert torch.equal(got, want.detach())


def test_two_runs_give_bitwise_equal_parameters_and_the_same_schedule(ds) -> None:
    kw = {"slowdown": SPEEDS_1_1_2_4, "quorum": 2, "grace": 0.5, "latency": 0.25, "fragments": 2}
    a, b = ddiloco(ds, 4, 12, **kw), ddiloco(ds, 4, 12, **kw)
    assert a["merges"] == b["merges"] and a["updates"] == b["updates"]
    assert all(map(torch.equal, a["params"], b["params"]))


# ---------------------------------------------------------------- reductions to known algorithms


def flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def streaming_diloco(ds, k, steps, H, slices, offsets, outer_lr, mu, make_inner):
    """Streaming DiLoCo with no overlap and no mixing as a plain loop: every node takes a step; at
    step s, the fragment whose offset is s mod H gets Nesterov SGD (its own torch optimizer) on
    the mean of (global - local) and every node's copy of it is replaced by the global one."""
    start = flat(TinyNet().parameters())
    fragments = [torch.nn.Parameter(start[a:b].clone()) for a, b in slices]
    outers = [torch.optim.SGD([f], lr=outer_lr, momentum=mu, nesterov=True) for f in fragments]
    models = [TinyNet() for _ in range(k)]
    opts = [make_inner(m.parameters()) for m in models]
    data = [iter(node_batches(ds, k, r)) for r in range(k)]
    for s in range(1, steps + 1):
        for model, opt, batches in zip(models, opts, data, strict=True):
            opt.zero_grad()
            model(next(batches)).backward()
            opt.step()
        if s % H not in offsets:
            continue
        p = offsets.index(s % H)
        (a, b), fragment = slices[p], fragments[p]
        locals_ = [flat(m.parameters())[a:b] for m in models]
        fragment.grad = torch.stack([fragment.detach() - x for x in locals_]).mean(0)
        outers[p].step()
        for model in models:
            whole = flat(model.parameters())
            whole[a:b] = fragment.detach()
            torch.nn.utils.vector_to_parameters(whole, model.parameters())
    whole = torch.cat([f.detach() for f in fragments])
    return list(whole.split([p.numel() for p in TinyNet().parameters()]))


@pytest.mark.parametrize(
    "inner, make_inner",
    [
        (("sgd", {"lr": 0.05}), lambda ps: torch.optim.SGD(ps, lr=0.05)),
        (("adamw", {"lr": 0.01}), lambda ps: torch.optim.AdamW(ps, lr=0.01)),
    ],
    ids=["sgd", "adamw"],
)
def test_equal_speeds_full_quorum_no_grace_one_fragment_equals_synchronous_diloco(ds, inner, make_inner) -> None:
    # All four sends of a round land at one instant, the merge takes all of them with weight 1/4
    # and every learner adopts before its next step: one synchronous DiLoCo round (one fragment:
    # the whole model). Equal up to float summation order (weighted sum vs torch's mean).
    k, H, rounds = 4, 3, 3
    out = ddiloco(ds, k, H * rounds, slowdown=[1.0] * k, H=H, inner=inner)
    assert out["merges"] == [(float(H * n), 0, (0, 1, 2, 3), (0.25,) * 4) for n in range(1, rounds + 1)]
    expected = streaming_diloco(ds, k, H * rounds, H, [(0, 161)], [0], 0.7, 0.9, make_inner)
    for got, want in zip(out["params"], expected, strict=True):
        torch.testing.assert_close(got.reshape(-1), want, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(p, q) for p, q in zip(out["params"], TinyNet().parameters(), strict=True))


def test_equal_speeds_full_quorum_two_fragments_equal_streaming_diloco_without_overlap(ds) -> None:
    # TinyNet's 161 parameters in two slices [0, 81) and [81, 161); H = 4: fragment 0 at steps
    # 2, 6, 10, fragment 1 at 4, 8 (offsets 2 and 0).
    k, H, steps = 3, 4, 10
    out = ddiloco(ds, k, steps, slowdown=[1.0] * k, H=H, fragments=2)
    assert [(t, p) for t, p, _, _ in out["merges"]] == [(2.0, 0), (4.0, 1), (6.0, 0), (8.0, 1), (10.0, 0)]
    expected = streaming_diloco(
        ds, k, steps, H, [(0, 81), (81, 161)], [2, 0], 0.7, 0.9, lambda ps: torch.optim.SGD(ps, lr=0.05)
    )
    for got, want in zip(out["params"], expected, strict=True):
        torch.testing.assert_close(got.reshape(-1), want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"H": 0}, "H="),
        ({"fragments": 0}, "fragments="),
        ({"fragments": 5}, "fragments="),
        ({"quorum": 0}, "quorum="),
        ({"quorum": 5}, "quorum="),
        ({"grace": 1.0}, "grace="),
        ({"grace": -0.1}, "grace="),
        ({"tau": -1}, "tau="),
        ({"outer_lr": -1.0}, "outer_lr="),
        ({"outer_momentum": 1.0}, "outer_momentum="),
        ({"outer": "adam"}, "outer="),
        ({"outer": "cgad", "cgad_cutoff": 0}, "cgad_cutoff="),
        ({"down": {4: [(0.0, 1.0)]}}, "down: rank 4"),
        ({"down": {0: [(2.0, 3.0), (1.0, 4.0)]}}, r"down\[0\]"),
        ({"down": {0: [(1.0, 1.0)]}}, r"down\[0\]"),
        ({"down": {0: [(-1.0, 1.0)]}}, r"down\[0\]"),
        ({"slowdown": [1.0, 1.0]}, "slowdown="),
        ({"inner": ("lion", {})}, "inner="),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_argument(ds, kw, name) -> None:
    with pytest.raises(ValueError, match=name):
        ddiloco(ds, 4, 4, **{"slowdown": SPEEDS_1_1_2_4, **kw})
