"""Differential privacy of the updates: clipping, the noise's size and where it is drawn, and the
privacy spent as Opacus's RDP accountant counts it."""

from __future__ import annotations

import math

import pytest
import torch

from exogym.core.optim import OptimSpec
from exogym.privacy import DifferentialPrivacy, clip_, epsilon, privacy_report
from exogym.strategy.diloco import DiLoCoStrategy
from exogym.strategy.federated_averaging import FedAvgStrategy
from exogym.strategy.simple_reduce import SimpleReduceStrategy
from tests.fake_world import train_ranks

K, H = 4, 3
SGD = OptimSpec(torch.optim.SGD, lr=0.05)
OUTER = OptimSpec(torch.optim.SGD, lr=1.0)  # the parameters move by exactly the aggregate


def _rows(privacy: DifferentialPrivacy | None) -> torch.Tensor:
    calls: list[torch.Tensor] = []

    def record(u: torch.Tensor) -> torch.Tensor:
        calls.append(u.clone())
        return u.mean(0)

    train_ranks(K, lambda: DiLoCoStrategy(H=H, outer_optim=OUTER, optim_spec=SGD, aggregate=record, privacy=privacy), H)
    return calls[0]


def _final(privacy: DifferentialPrivacy | None, k: int = K) -> list[torch.Tensor]:
    out = train_ranks(k, lambda: DiLoCoStrategy(H=H, outer_optim=OUTER, optim_spec=SGD, privacy=privacy), H)
    for r in out[1:]:  # every node ends with the same parameters
        for a, b in zip(r["params"], out[0]["params"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    return [p.flatten() for p in out[0]["params"]]


def test_clip_scales_an_update_to_the_bound_and_leaves_a_short_one_alone() -> None:
    long, short = torch.tensor([3.0, 4.0]), torch.tensor([0.3, 0.4])
    assert clip_(long, 1.0).tolist() == pytest.approx([0.6, 0.8])
    assert clip_(short, 1.0).tolist() == pytest.approx([0.3, 0.4])


def test_each_node_s_update_is_clipped_before_the_rule_sees_it() -> None:
    honest = _rows(None)
    bound = 0.5 * float(honest.norm(dim=1).min())  # every row is longer: every row is clipped
    clipped = _rows(DifferentialPrivacy(clip=bound, noise_multiplier=0.0))
    expected = honest * (bound / honest.norm(dim=1, keepdim=True))
    torch.testing.assert_close(clipped, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("side", "scale"), [("server", 1 / K), ("client", 1 / math.sqrt(K))])
def test_the_noise_on_the_aggregate_has_the_documented_standard_deviation(side: str, scale: float) -> None:
    clip, sigma = 1e6, 1e-2  # no update is clipped; server: sigma C / n, client: n draws of sigma C, averaged
    plain = torch.cat(_final(None))
    noisy = torch.cat(_final(DifferentialPrivacy(clip=clip, noise_multiplier=sigma, side=side)))
    noise = noisy - plain  # the outer step subtracts the aggregate: its noise, negated
    assert float(noise.std()) == pytest.approx(sigma * clip * scale, rel=0.25)
    assert abs(float(noise.mean())) < 0.3 * sigma * clip * scale


def test_epsilon_is_opacus_s_rdp_accounting_of_one_step_per_aggregation() -> None:
    from opacus.accountants import RDPAccountant

    privacy = DifferentialPrivacy(clip=1.0, noise_multiplier=1.1, delta=1e-5)
    accountant = RDPAccountant()
    for _ in range(30):
        accountant.step(noise_multiplier=1.1, sample_rate=1.0)
    assert epsilon(privacy, 30) == pytest.approx(accountant.get_epsilon(delta=1e-5))
    assert epsilon(privacy, 60) > epsilon(privacy, 30) > 0
    assert epsilon(DifferentialPrivacy(clip=1.0, noise_multiplier=0.0), 5) == math.inf
    report = privacy_report(DiLoCoStrategy(H=4, privacy=privacy), steps=120)
    assert report[0]["aggregations"] == 30 and report[0]["epsilon"] == pytest.approx(epsilon(privacy, 30))
    assert privacy_report(SimpleReduceStrategy(privacy=privacy), steps=30)[0]["aggregations"] == 30
    assert privacy_report(DiLoCoStrategy(H=4), steps=120) == []


@pytest.mark.parametrize(
    ("make", "error", "needle"),
    [
        (lambda: DifferentialPrivacy(clip=0.0, noise_multiplier=1.0), ValueError, r"clip=0.0\) must be a number > 0"),
        (lambda: DifferentialPrivacy(clip=1.0, noise_multiplier=-1.0), ValueError, "noise_multiplier"),
        (lambda: DifferentialPrivacy(clip=1.0, noise_multiplier=1.0, side="both"), ValueError, "choose 'client'"),
        (lambda: DifferentialPrivacy(clip=1.0, noise_multiplier=1.0, delta=1.0), ValueError, "delta"),
        (lambda: DiLoCoStrategy(H=2, privacy=0.5), TypeError, "privacy must be a exogym.privacy"),
        (
            lambda: FedAvgStrategy(H=2).averaging.__class__(2, privacy=DifferentialPrivacy(1.0, 1.0)),
            ValueError,
            "averaging parameters shares whole models",
        ),
    ],
)
def test_bad_privacy_settings_are_refused_naming_the_argument(make, error, needle: str) -> None:
    with pytest.raises(error, match=needle):
        make()
