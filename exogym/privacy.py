"""Differential privacy of the nodes' updates: clipping, Gaussian noise and the privacy spent.

``DifferentialPrivacy(clip, noise_multiplier, side)`` is a strategy's ``privacy`` (DDP, FedAvg,
DiLoCo): at every aggregation each node's update (gradients, model delta or pseudo-gradient) is
clipped to L2 norm ``clip`` (``C``), and Gaussian noise of standard deviation ``sigma * C`` is
added, as Flower's differential-privacy wrappers do:

- ``side="client"``: each node adds ``N(0, (sigma C)^2)`` to its clipped update before sending it
  (the noise is the node's own, drawn from the run's seed, the node and the step);
- ``side="server"``: the clipped updates are averaged and the aggregate gets
  ``N(0, (sigma C / n)^2)`` (``n`` nodes): the sum's noise ``sigma C``, as DP-FedAvg's trusted
  server adds it (McMahan et al. 2018), drawn from the run's seed, the same on every rank.

The privacy spent is the Rényi-DP accounting of Opacus (``opacus.accountants.RDPAccountant``,
Mironov 2017), one Gaussian-mechanism step of noise multiplier ``sigma`` per aggregation with
every node taking part: [`epsilon`][exogym.privacy.epsilon] gives the ``(epsilon,
delta)`` after a number of aggregations, and a run's result reports it (``result["privacy"]``).
Opacus is the ``privacy`` extra (``pip install exogym[privacy]``).

Clipping and noise apply to each dtype's flat payload (one for most models), and before an
aggregation rule other than the mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from exogym.core.seeding import named_seed

SIDES = ("client", "server")


@dataclass(frozen=True)
class DifferentialPrivacy:
    """Clip each node's update to L2 norm ``clip`` and add Gaussian noise of ``noise_multiplier *
    clip`` (see the module docstring).

    Args:
        clip: the L2 norm each update is clipped to (> 0).
        noise_multiplier: the noise's standard deviation over ``clip`` (>= 0).
        side: ``"client"`` (each node adds noise to its update) or ``"server"`` (noise on the
            aggregate).
        delta: the ``delta`` of the reported ``(epsilon, delta)`` (in (0, 1)).
    """

    clip: float
    noise_multiplier: float
    side: str = "client"
    delta: float = 1e-5

    def __post_init__(self) -> None:
        for name, value, ok in (
            ("clip", self.clip, lambda v: v > 0),
            ("noise_multiplier", self.noise_multiplier, lambda v: v >= 0),
            ("delta", self.delta, lambda v: 0 < v < 1),
        ):
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not number or not ok(value):
                bound = {"clip": "> 0", "noise_multiplier": ">= 0", "delta": "in (0, 1)"}[name]
                raise ValueError(f"DifferentialPrivacy({name}={value!r}) must be a number {bound}")
        if self.side not in SIDES:
            raise ValueError(f"DifferentialPrivacy(side={self.side!r}): choose 'client' or 'server'")

    def describe(self) -> str:
        return f"DP(clip={self.clip:g}, sigma={self.noise_multiplier:g}, {self.side})"


def check_privacy(privacy: object) -> None:
    """``TypeError`` unless ``privacy`` is a ``DifferentialPrivacy`` or ``None``."""
    if privacy is not None and not isinstance(privacy, DifferentialPrivacy):
        raise TypeError(
            "privacy must be a exogym.privacy.DifferentialPrivacy (e.g. DifferentialPrivacy(clip=1.0, "
            f"noise_multiplier=1.0)) or None, got {type(privacy).__name__}"
        )


def clip_(update: torch.Tensor, clip: float) -> torch.Tensor:
    """Scale ``update`` in place to L2 norm at most ``clip``: ``u * min(1, clip / ||u||)``."""
    norm = float(torch.linalg.vector_norm(update.double()))
    if norm > clip:
        update.mul_(clip / norm)
    return update


def gaussian(shape: torch.Size, std: float, seed: int, *parts: object, dtype: torch.dtype) -> torch.Tensor:
    """``N(0, std^2)`` of ``shape`` from a generator seeded by ``seed`` and ``parts`` (the same
    on every rank and platform)."""
    g = torch.Generator().manual_seed(named_seed(seed, *parts))
    return (std * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)


def epsilon(privacy: DifferentialPrivacy, aggregations: int, sample_rate: float = 1.0) -> float:
    """The ``epsilon`` of ``(epsilon, privacy.delta)``-DP after ``aggregations`` Gaussian-mechanism
    steps of noise multiplier ``privacy.noise_multiplier``, each with every node taking part
    (``sample_rate`` 1), by Opacus's RDP accountant; ``inf`` without noise.

    Raises:
        ImportError: Opacus is not installed (``pip install exogym[privacy]``).
    """
    if privacy.noise_multiplier == 0:
        return math.inf
    try:
        from opacus.accountants import RDPAccountant
    except ImportError as e:  # pragma: no cover - the extra is installed with dev
        raise ImportError("the privacy accounting needs Opacus: pip install 'exogym[privacy]'") from e
    accountant = RDPAccountant()
    for _ in range(aggregations):
        accountant.step(noise_multiplier=privacy.noise_multiplier, sample_rate=sample_rate)
    return float(accountant.get_epsilon(delta=privacy.delta)) if aggregations else 0.0


def privacy_report(strategy: object, steps: int) -> list[dict[str, object]]:
    """Per module of ``strategy``'s pipeline that has a ``privacy``: its settings, its
    aggregations in a run of ``steps`` steps (one every ``H`` steps) and the ``(epsilon,
    delta)`` spent (``epsilon``)."""
    pipeline = getattr(strategy, "pipeline", None)
    report = []
    for module in pipeline.leaves() if pipeline is not None else []:
        privacy = getattr(module, "privacy", None)
        if privacy is None:
            continue
        rounds = steps // module.H
        report.append(
            {"module": module.describe(), "clip": privacy.clip, "noise_multiplier": privacy.noise_multiplier,
             "side": privacy.side, "aggregations": rounds, "epsilon": epsilon(privacy, rounds), "delta": privacy.delta}
        )  # fmt: skip
    return report


__all__ = ["SIDES", "DifferentialPrivacy", "check_privacy", "clip_", "epsilon", "gaussian", "privacy_report"]
