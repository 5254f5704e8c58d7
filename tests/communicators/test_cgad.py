"""CGAD's pieces against plain computations written from the formula (Shah & Sun 2026, arXiv
2605.09126, with ExoGym's cosine gate): the scale ``sigma(tau) = gamma(tau) exp(-alpha tau)``
with values worked out by hand, and the outer step against ``torch.optim.Adam`` (one per
fragment) on the staleness-scaled, token-weighted pseudo-gradient."""

from __future__ import annotations

import math

import pytest
import torch

from communicators.cgad import CGAD, cgad_scale, check_cgad


def test_sigma_is_one_when_fresh_decays_exponentially_and_the_cosine_gate_zeroes_it_from_the_cutoff() -> None:
    assert cgad_scale(0, 0.1, 16) == 1.0  # plain Adam on a fresh pseudo-gradient
    # tau = 4, cutoff 16: gate (1 + cos(pi / 4)) / 2 = (1 + sqrt(2) / 2) / 2, decay e^-0.4
    assert cgad_scale(4, 0.1, 16) == pytest.approx((1 + math.sqrt(2) / 2) / 2 * math.exp(-0.4), rel=1e-12)
    assert cgad_scale(4, 0.1, 8) == pytest.approx(0.5 * math.exp(-0.4), rel=1e-12)  # half-way: gate 1/2
    assert cgad_scale(2, 0.0, 3) == pytest.approx(0.25, rel=1e-12)  # (1 + cos(2 pi / 3)) / 2 = 1/4
    assert cgad_scale(8, 0.1, 8) == 0.0 and cgad_scale(9, 0.1, 8) == 0.0  # gated out from the cutoff on
    assert cgad_scale(30, 0.05, math.inf) == pytest.approx(math.exp(-1.5), rel=1e-12)  # no gate: Adam-Decay


def test_the_outer_step_is_adam_per_fragment_on_the_staleness_scaled_weighted_pseudo_gradient() -> None:
    torch.manual_seed(0)
    theta = torch.randn(10)
    bounds = [(0, 6), (6, 10)]
    alpha, cutoff, lr, betas, eps = 0.2, 4, 0.05, (0.8, 0.99), 1e-6
    # merges: (fragment, [(learner's fragment, weight, staleness)]); fragment 0 is merged 3
    # times, fragment 1 once (its bias correction is that of a first Adam step)
    merges = [
        (0, [(torch.randn(6), 0.5, 0), (torch.randn(6), 0.5, 2)]),
        (1, [(torch.randn(4), 0.25, 1), (torch.randn(4), 0.75, 0)]),
        (0, [(torch.randn(6), 1.0, 3)]),
        (0, [(torch.randn(6), 0.4, 0), (torch.randn(6), 0.6, 5)]),  # the stale one is gated out
    ]
    # sigma by hand: gate (1 + cos(pi tau / 4)) / 2 times e^(-0.2 tau)
    sigma = {0: 1.0, 1: (1 + math.sqrt(2) / 2) / 2 * math.exp(-0.2), 2: 0.5 * math.exp(-0.4)}
    sigma |= {3: (1 - math.sqrt(2) / 2) / 2 * math.exp(-0.6), 5: 0.0}

    ours = theta.clone()
    cgad = CGAD(ours, 2, lr, betas, eps)
    for p, parts in merges:
        a, b = bounds[p]
        delta = sum((ours[a:b] - local) * (w * cgad_scale(tau, alpha, cutoff)) for local, w, tau in parts)
        cgad.step(p, bounds[p], ours[a:b], delta)

    fragments = [torch.nn.Parameter(theta[a:b].clone()) for a, b in bounds]
    adams = [torch.optim.Adam([f], lr=lr, betas=betas, eps=eps) for f in fragments]
    for p, parts in merges:
        f = fragments[p]
        f.grad = sum(w * sigma[tau] * (f.detach() - local) for local, w, tau in parts)
        adams[p].step()
    torch.testing.assert_close(ours, torch.cat([f.detach() for f in fragments]), rtol=1e-6, atol=1e-7)
    assert cgad.steps == [3, 1]


def test_the_state_round_trips_and_a_restored_optimizer_steps_as_the_original() -> None:
    a, b = torch.zeros(5), torch.zeros(5)
    first, second = CGAD(a, 1, 0.1, (0.9, 0.999), 1e-8), CGAD(b, 1, 0.1, (0.9, 0.999), 1e-8)
    first.step(0, (0, 5), a, torch.arange(5.0))
    second.load_state_dict(first.state_dict())
    b.copy_(a)
    for opt, theta in ((first, a), (second, b)):
        opt.step(0, (0, 5), theta, torch.ones(5))
    assert torch.equal(a, b) and second.steps == [2]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-0.1, 16, (0.9, 0.999), 1e-8), "cgad_alpha must be a number >= 0"),
        ((0.1, 0, (0.9, 0.999), 1e-8), "cgad_cutoff must be a number > 0"),
        ((0.1, 16, (0.9, 1.0), 1e-8), r"cgad_betas must be a tuple of two numbers in \[0, 1\)"),
        ((0.1, 16, [0.9, 0.999], 1e-8), "cgad_betas must be a tuple"),
        ((0.1, 16, (0.9, 0.999), 0.0), "cgad_eps must be a number > 0"),
    ],
)
def test_bad_cgad_settings_are_refused_naming_the_argument(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_cgad(*args)
