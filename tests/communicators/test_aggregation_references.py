"""Independent references for the robust aggregation rules and the Byzantine attacks.

Each reference is written from its paper's definition as a plain loop, and the library's
vectorised implementation is compared against it on small random float64 cases.
"""

import math
from statistics import NormalDist

import pytest
import torch
from torch.testing import assert_close

from communicators.aggregation import (
    centered_clip,
    default_f,
    krum,
    krum_scores,
    mean,
    median,
    multi_krum,
    trimmed_mean,
)
from exogym.adversaries import Adversaries, alie_z, attack


def ref_median(x):
    """Coordinate-wise median (Yin et al. 2018); for even n the mean of the two middle values."""
    n, d = x.shape
    out = torch.empty(d, dtype=x.dtype)
    for j in range(d):
        v = sorted(x[:, j].tolist())
        out[j] = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    return out


def ref_trimmed_mean(x, beta):
    """Coordinate-wise trimmed mean (Yin et al. 2018): drop floor(beta n) largest and smallest, average the rest."""
    n, d = x.shape
    k = math.floor(beta * n)
    out = torch.empty(d, dtype=x.dtype)
    for j in range(d):
        kept = sorted(x[:, j].tolist())[k : n - k]
        out[j] = sum(kept) / len(kept)
    return out


def ref_krum_scores(x, f):
    """Krum score (Blanchard et al. 2017): sum of squared distances to the n - f - 2 closest other updates."""
    n = x.shape[0]
    scores = []
    for i in range(n):
        dists = sorted(float(((x[i] - x[j]) ** 2).sum()) for j in range(n) if j != i)
        scores.append(sum(dists[: n - f - 2]))
    return scores


def ref_multi_krum(x, f, m):
    """Multi-Krum (Blanchard et al. 2017): mean of the m updates with the lowest Krum scores (ties: lowest index)."""
    scores = ref_krum_scores(x, f)
    order = sorted(range(x.shape[0]), key=lambda i: (scores[i], i))
    return sum(x[i] for i in order[:m]) / m


def ref_krum(x, f):
    """Krum (Blanchard et al. 2017): the update with the lowest score, the lowest index on ties."""
    scores = ref_krum_scores(x, f)
    best = min(range(x.shape[0]), key=lambda i: (scores[i], i))
    return x[best].clone()


def ref_centered_clip(x, tau, iterations, center=None):
    """Centered clipping (Karimireddy, He, Jaggi 2021): v <- v + (1/n) sum_i (x_i - v) min(1, tau / ||x_i - v||)."""
    n = x.shape[0]
    v = ref_median(x) if center is None else center.clone()
    for _ in range(iterations):
        step = torch.zeros_like(v)
        for i in range(n):
            diff = x[i] - v
            norm = float(diff.norm())
            step += diff * (1.0 if norm <= tau else tau / norm)
        v = v + step / n
    return v


def ref_alie_z(n, f):
    """ALIE's z_max (Baruch et al. 2019): Phi^{-1}((n - s) / n) with s = floor(n / 2 + 1) - f."""
    s = math.floor(n / 2 + 1) - f
    return NormalDist().inv_cdf((n - s) / n)


def ref_alie(rows, bad, good, z):
    """A little is enough (Baruch et al. 2019): every malicious row is mu - z sigma over the honest rows."""
    mu = sum(rows[g] for g in good) / len(good)
    sigma = (sum((rows[g] - mu) ** 2 for g in good) / len(good)).sqrt()  # population std: divide by the count
    return torch.stack([mu - z * sigma for _ in bad])


def ref_ipm(rows, bad, good, eps):
    """Inner product manipulation (Xie, Koyejo, Gupta 2020): every malicious row is -eps times the honest mean."""
    honest = sum(rows[g] for g in good) / len(good)
    return torch.stack([-eps * honest for _ in bad])


def rand(n, d, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


SHAPES = [(n, d) for n in (5, 6, 8) for d in (3, 7)]


@pytest.mark.parametrize("n,d", SHAPES)
def test_median_matches_reference(n, d):
    x = rand(n, d, seed=n * 10 + d)
    assert_close(median(x), ref_median(x))


@pytest.mark.parametrize("beta", [0.1, 0.25, 0.4])
@pytest.mark.parametrize("n,d", SHAPES)
def test_trimmed_mean_matches_reference(n, d, beta):
    x = rand(n, d, seed=n * 10 + d)
    assert_close(trimmed_mean(x, beta=beta), ref_trimmed_mean(x, beta))


@pytest.mark.parametrize("f", [1, 2])
@pytest.mark.parametrize("n,d", SHAPES)
def test_krum_and_scores_match_reference(n, d, f):
    x = rand(n, d, seed=n * 10 + d + f)
    assert_close(krum_scores(x, f), torch.tensor(ref_krum_scores(x, f), dtype=torch.float64))
    assert_close(krum(x, f=f), ref_krum(x, f))


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("f", [1, 2])
@pytest.mark.parametrize("n,d", SHAPES)
def test_multi_krum_matches_reference(n, d, f, m):
    x = rand(n, d, seed=n * 10 + d + f)
    assert_close(multi_krum(x, f=f, m=m), ref_multi_krum(x, f, m))


@pytest.mark.parametrize("n,d", SHAPES)
def test_krum_and_multi_krum_defaults_use_default_f_and_m_n_minus_f(n, d):
    x = rand(n, d, seed=n + d)
    f = max(0, (n - 3) // 2)
    assert default_f(n) == f
    assert_close(krum(x), ref_krum(x, f))
    assert_close(multi_krum(x), ref_multi_krum(x, f, n - f))
    assert_close(multi_krum(x, f=f, m=1), krum(x, f=f))


def test_krum_breaks_score_ties_by_lowest_index():
    # rows 0 and 1 are mirror images with equal (lowest) scores, 105 each
    x = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 10.0], [0.0, -10.0], [0.0, 20.0]], dtype=torch.float64)
    assert ref_krum_scores(x, 1)[:2] == [105.0, 105.0]
    assert_close(krum(x, f=1), x[0])
    assert_close(multi_krum(x, f=1, m=1), x[0])


@pytest.mark.parametrize("tau,iterations", [(0.5, 1), (1.0, 3), (10.0, 2)])
@pytest.mark.parametrize("n,d", SHAPES)
def test_centered_clip_matches_reference_with_default_and_given_center(n, d, tau, iterations):
    x = rand(n, d, seed=n * 10 + d)
    assert_close(centered_clip(x, tau=tau, iterations=iterations), ref_centered_clip(x, tau, iterations))
    center = rand(1, d, seed=99)[0] * 3
    got = centered_clip(x, tau=tau, iterations=iterations, center=center)
    assert_close(got, ref_centered_clip(x, tau, iterations, center))


def test_huge_tau_centered_clip_and_beta_zero_trimmed_mean_both_equal_the_mean():
    x = rand(7, 3)
    assert_close(centered_clip(x, tau=1e9, iterations=1), x.mean(0))
    assert_close(trimmed_mean(x, beta=0.0), mean(x))


def outlier_case():
    honest = rand(6, 5, seed=3)
    return torch.cat([honest, torch.full((2, 5), 1e6, dtype=torch.float64)]), honest


@pytest.mark.parametrize(
    "rule", [median, lambda x: trimmed_mean(x, beta=0.25), krum, multi_krum], ids=["median", "trimmed", "krum", "mk"]
)
def test_robust_rules_stay_within_honest_range_with_two_huge_outliers(rule):
    x, honest = outlier_case()
    out = rule(x)
    assert bool((out >= honest.min(0).values).all()) and bool((out <= honest.max(0).values).all())


def test_centered_clip_stays_near_honest_mean_while_mean_does_not():
    x, honest = outlier_case()
    assert float((centered_clip(x) - honest.mean(0)).norm()) < 5.0
    assert float((mean(x) - honest.mean(0)).norm()) > 1e5


def test_krum_returns_one_of_the_input_rows():
    x = rand(8, 7, seed=5)
    out = krum(x)
    assert any(torch.equal(out, row) for row in x)


@pytest.mark.parametrize("beta", [0.5, 0.7, -0.1])
def test_trimmed_mean_rejects_beta_outside_half_open_interval(beta):
    with pytest.raises(ValueError, match="beta"):
        trimmed_mean(rand(8, 3), beta=beta)


@pytest.mark.parametrize("n,f", [(4, 2), (5, 3), (2, None)])
def test_krum_and_multi_krum_reject_n_minus_f_minus_2_below_one(n, f):
    for rule in (krum, multi_krum):
        with pytest.raises(ValueError, match=r"\bf\b|\bn\b"):
            rule(rand(n, 3), f=f)


@pytest.mark.parametrize("n,f", [(8, 2), (10, 2), (20, 4), (50, 12), (9, 3)])
def test_alie_z_matches_inverse_normal_cdf(n, f):
    assert alie_z(n, f) == pytest.approx(ref_alie_z(n, f), rel=1e-9, abs=1e-12)


BAD, GOOD = [1, 4], [0, 2, 3, 5, 6, 7]


@pytest.mark.parametrize("strength", [None, 0.7])
def test_alie_attack_matches_reference_with_z_max_or_given_z(strength):
    rows = rand(8, 5, seed=11)
    z = ref_alie_z(8, len(BAD)) if strength is None else strength
    got = attack("alie", rows, BAD, GOOD, strength, torch.Generator().manual_seed(0))
    assert_close(got, ref_alie(rows, BAD, GOOD, z))


def test_ipm_sign_flip_and_free_rider_attacks_match_reference():
    rows, gen = rand(8, 5, seed=12), torch.Generator().manual_seed(0)
    assert_close(attack("ipm", rows, BAD, GOOD, 0.5, gen), ref_ipm(rows, BAD, GOOD, 0.5))
    assert_close(attack("sign_flip", rows, BAD, GOOD, 3.0, gen), torch.stack([-3.0 * rows[b] for b in BAD]))
    assert_close(attack("free_rider", rows, BAD, GOOD, None, gen), torch.zeros(len(BAD), 5, dtype=torch.float64))


@pytest.mark.parametrize("fraction,num_nodes", [(0.25, 8), (0.3, 10), (0.25, 10), (0.1, 4), (0.0, 6)])
def test_malicious_is_deterministic_sorted_distinct_with_the_count_rounded_half_up(fraction, num_nodes):
    adv = Adversaries(attack="sign_flip", fraction=fraction)
    for seed in range(5):
        ranks = adv.malicious(num_nodes, seed)
        assert ranks == adv.malicious(num_nodes, seed)
        assert isinstance(ranks, tuple) and list(ranks) == sorted(set(ranks))
        assert len(ranks) == math.floor(fraction * num_nodes + 0.5) and all(0 <= r < num_nodes for r in ranks)


def test_malicious_differs_across_some_pair_of_seeds():
    adv = Adversaries(attack="sign_flip", fraction=0.25)
    assert len({adv.malicious(16, seed) for seed in range(10)}) > 1


@pytest.mark.parametrize(
    "kwargs,word", [({"attack": "nope"}, "attack"), ({"fraction": 1.0}, "fraction"), ({"fraction": -0.1}, "fraction")]
)
def test_adversaries_rejects_unknown_attack_and_fraction_outside_zero_one(kwargs, word):
    with pytest.raises(ValueError, match=word):
        Adversaries(**{"attack": "ipm", "fraction": 0.25, **kwargs})
