"""Malicious nodes: which nodes attack, from which step, and what they send.

``Adversaries(attack, fraction)`` is part of a run's world (``fit(..., adversaries=...)``,
``exogym compare --attack NAME --malicious FRACTION``): ``fraction * num_nodes`` nodes (rounded
half up),
drawn from the run's seed (the same on every rank and in every run of that seed), collude from
step ``start`` on. An attack acts where the nodes' updates are aggregated
([`communicators.aggregation`][communicators.aggregation]): every rank gathers the updates, the
malicious nodes' rows are replaced by what the attack makes of them, and the aggregation rule
runs on the result. Attacks that use the honest updates' statistics (``alie``, ``ipm``) see
every honest row, as colluding attackers who know them would (the strongest case). ``label_flip``
poisons the data instead: a malicious node trains on ``y -> num_classes - 1 - y``.

The attacks (``ATTACKS``), ``s`` the attack's ``strength``:

- ``sign_flip``: ``-s * u``, the node's own update flipped and scaled (default ``s = 1``).
- ``noise``: a Gaussian vector of standard deviation ``s`` (default 1), drawn from the run's seed.
- ``label_flip``: data poisoning (no change to the update).
- ``alie`` (Baruch et al. 2019, "A little is enough"): every malicious node sends
  ``mu - z sigma``, ``mu`` and ``sigma`` the coordinate-wise mean and (population) standard
  deviation of the honest updates; ``z`` defaults to the paper's ``z_max = Phi^-1((n - s) / n)``
  with ``s = floor(n / 2 + 1) - f`` (``n`` nodes, ``f`` malicious).
- ``ipm`` (Xie, Koyejo and Gupta 2020, inner-product manipulation): ``-s * mean(honest)``
  (default ``s = 0.5``).
- ``free_rider``: a zero update (the node contributes nothing and takes the aggregate).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from exogym.core.seeding import named_seed

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # (torch is imported where it is used: the command line's --help imports this module)
    import torch

ATTACKS = ("sign_flip", "noise", "label_flip", "alie", "ipm", "free_rider")

#: What ``strength`` is for each attack that takes one.
STRENGTH = {
    "sign_flip": "sign_flip's factor",
    "noise": "noise's standard deviation",
    "alie": "alie's z",
    "ipm": "ipm's epsilon",
}

#: Each attack's ``strength`` when none is given (``None``: ``alie``'s ``z_max``).
DEFAULT_STRENGTH: dict[str, float | None] = {
    "sign_flip": 1.0,
    "noise": 1.0,
    "label_flip": None,
    "alie": None,
    "ipm": 0.5,
    "free_rider": None,
}


@dataclass(frozen=True)
class Adversaries:
    """Colluding malicious nodes (see the module docstring for the attacks).

    Args:
        attack: one of ``ATTACKS``.
        fraction: the share of the nodes that are malicious, in ``[0, 1)``; ``fraction *
            num_nodes`` of them (rounded half up), drawn from the run's seed.
        start: the first step at which they attack (before it they behave).
        strength: the attack's parameter (``DEFAULT_STRENGTH``): ``sign_flip``'s factor,
            ``noise``'s standard deviation, ``alie``'s ``z``, ``ipm``'s epsilon.
        num_classes: ``label_flip``'s number of classes (labels ``0..num_classes-1``).
    """

    attack: str
    fraction: float
    start: int = 0
    strength: float | None = None
    num_classes: int = 10

    def __post_init__(self) -> None:
        if self.attack not in ATTACKS:
            raise ValueError(f"Adversaries(attack={self.attack!r}): choose from {', '.join(ATTACKS)}")
        f = self.fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f < 1:
            raise ValueError(f"Adversaries(fraction={f!r}): the share of malicious nodes must be in [0, 1)")
        if isinstance(self.start, bool) or not isinstance(self.start, int) or self.start < 0:
            raise ValueError(f"Adversaries(start={self.start!r}): the first attacking step must be an int >= 0")
        s = self.strength
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s)):
            raise ValueError(f"Adversaries(strength={s!r}) must be a finite number or None")
        if s is not None and self.attack not in STRENGTH:
            raise ValueError(f"Adversaries(strength={s!r}): {self.attack} takes no strength; leave it None")
        if s is not None and s <= 0:
            raise ValueError(f"Adversaries(strength={s!r}): {STRENGTH[self.attack]} must be > 0")
        if isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int) or self.num_classes < 2:
            raise ValueError(f"Adversaries(num_classes={self.num_classes!r}) must be an int >= 2")

    @property
    def on_updates(self) -> bool:
        """Whether the attack acts where updates are aggregated (every attack but ``label_flip``,
        which poisons the data)."""
        return self.attack != "label_flip"

    def count(self, num_nodes: int) -> int:
        """How many of ``num_nodes`` nodes are malicious: ``fraction * num_nodes``, rounded half up."""
        return math.floor(self.fraction * num_nodes + 0.5)

    def check_run(self, num_nodes: int, max_steps: int | None = None) -> None:
        """Refuse a share that gives a run of ``num_nodes`` nodes no malicious node (other than
        ``fraction=0``, a clean run on purpose), naming the least share that gives one; warn where
        the attack starts after the run's ``max_steps``.

        Raises:
            ValueError: ``0 < fraction`` and no malicious node.
        """
        if self.fraction > 0 and self.count(num_nodes) == 0:
            raise ValueError(
                f"Adversaries(fraction={self.fraction!r}): on {num_nodes} nodes no node is malicious; give at least "
                f"{1 / num_nodes:.3g} (one node), or 0 for a clean run"
            )
        if max_steps is not None and self.start >= max_steps:
            logger.warning(
                "Adversaries(start=%d): the run has %d steps, so the attack never acts; give a smaller start",
                self.start, max_steps,
            )  # fmt: skip

    def malicious(self, num_nodes: int, seed: int) -> tuple[int, ...]:
        """The malicious ranks of a run of ``num_nodes`` nodes from ``seed``, ascending."""
        import torch

        g = torch.Generator().manual_seed(named_seed(seed, "adversaries"))
        return tuple(sorted(torch.randperm(num_nodes, generator=g)[: self.count(num_nodes)].tolist()))

    def plan(self, num_nodes: int, seed: int) -> AdversaryPlan:
        """This configuration for a run: the malicious ranks drawn."""
        return AdversaryPlan(self, num_nodes, seed, self.malicious(num_nodes, seed))

    def to_dict(self) -> dict:
        return {
            "attack": self.attack,
            "fraction": self.fraction,
            "start": self.start,
            "strength": self.strength,
            "num_classes": self.num_classes,
        }


def check_labels(labels: Any, num_classes: int) -> None:
    """``ValueError`` naming ``num_classes`` where ``labels`` fall outside ``0..num_classes-1``
    (``label_flip`` would make them negative)."""
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        reach = low if low < 0 else high
        raise ValueError(
            f"Adversaries('label_flip', num_classes={num_classes}): this data's labels reach {reach}; "
            f"give num_classes={max(high + 1, 2)} (labels 0..num_classes-1)"
        )


def labels_of(item: Any) -> Any:
    """The labels of one batch or example: a mapping's ``"labels"``, else the last item of a tuple
    or list (``None`` when there are none)."""
    if isinstance(item, Mapping):
        return item.get("labels")
    if isinstance(item, (tuple, list)) and item:
        return item[-1]
    return None


@dataclass(frozen=True)
class AdversaryPlan:
    """``Adversaries`` for one run: its malicious ranks (``malicious``) drawn from its seed."""

    config: Adversaries
    num_nodes: int
    seed: int
    malicious: tuple[int, ...]
    _set: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_set", frozenset(self.malicious))

    def is_malicious(self, rank: int) -> bool:
        return rank in self._set

    def active(self, step: int) -> bool:
        """Whether the attack acts at ``step`` (some node is malicious and ``step >= start``)."""
        return bool(self.malicious) and step >= self.config.start

    def flips_labels(self, rank: int, step: int) -> bool:
        """Whether ``rank`` trains on flipped labels at ``step``."""
        return self.config.attack == "label_flip" and self.active(step) and self.is_malicious(rank)

    def poison(self, batch: Any) -> Any:
        """``label_flip``'s batch: its labels ``y`` (the last item of a tuple or list batch, or a
        mapping's ``"labels"``) replaced by ``num_classes - 1 - y``.

        Raises:
            TypeError: a batch without integer labels there.
        """
        labels = labels_of(batch)
        if labels is None:
            raise TypeError(
                "Adversaries('label_flip') flips the labels of a (inputs, labels) batch or a mapping's 'labels'; "
                f"this task's batches are {type(batch).__name__}"
            )
        flipped = self._flip(labels)
        return {**batch, "labels": flipped} if isinstance(batch, Mapping) else type(batch)([*batch[:-1], flipped])

    def _flip(self, labels: Any) -> torch.Tensor:
        import torch

        if not isinstance(labels, torch.Tensor) or labels.is_floating_point():
            raise TypeError(f"Adversaries('label_flip') needs integer labels, got {labels!r:.60}")
        check_labels(labels, self.config.num_classes)
        return self.config.num_classes - 1 - labels

    def attack_rows(self, rows: torch.Tensor, members: Sequence[int], step: int, tag: str = "") -> torch.Tensor:
        """The gathered updates ``rows`` (``[n, d]``, row ``i`` from rank ``members[i]``) with the
        malicious members' rows replaced by the attack at ``step``. Collective in effect: every
        rank computes the same rows from the same inputs (``noise`` draws from the run's seed,
        the step and ``tag``)."""
        if not self.active(step) or self.config.attack == "label_flip":
            return rows
        bad = [i for i, r in enumerate(members) if r in self._set]
        if not bad:
            return rows
        good = [i for i in range(len(members)) if i not in bad]
        strength = self.config.strength
        if strength is None:
            strength = DEFAULT_STRENGTH[self.config.attack]
        import torch

        g = torch.Generator().manual_seed(named_seed(self.seed, "attack", step, tag))
        out = rows.clone()
        out[bad] = attack(self.config.attack, rows, bad, good, strength, g)
        return out


def alie_z(n: int, f: int) -> float:
    """ALIE's ``z_max`` (Baruch et al. 2019): ``Phi^-1((n - s) / n)``, ``s = floor(n / 2 + 1) - f``."""
    s = math.floor(n / 2 + 1) - f
    p = min(max((n - s) / n, 1e-12), 1 - 1e-12)
    import torch

    return float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(p, dtype=torch.float64)))


def attack(
    name: str,
    rows: torch.Tensor,
    bad: Sequence[int],
    good: Sequence[int],
    strength: float | None,
    generator: torch.Generator,
) -> torch.Tensor:
    """The rows the malicious nodes ``bad`` send instead of ``rows[bad]`` under attack ``name``
    (``good``: the honest rows; see the module docstring), shape ``[len(bad), d]``."""
    own = rows[bad]
    honest = rows[good] if good else rows[bad]
    if name == "sign_flip":
        return -strength * own
    if name == "noise":
        import torch

        draw = torch.randn(own.shape, generator=generator, dtype=torch.float64)
        return (strength * draw).to(rows.dtype)
    if name == "alie":
        z = alie_z(rows.shape[0], len(bad)) if strength is None else strength
        mu, sigma = honest.mean(0), honest.std(0, correction=0)
        return (mu - z * sigma).expand_as(own).clone()
    if name == "ipm":
        return (-strength * honest.mean(0)).expand_as(own).clone()
    if name == "free_rider":
        return own.new_zeros(own.shape)
    raise ValueError(f"unknown attack {name!r}; choose from {', '.join(ATTACKS)}")


__all__ = ["ATTACKS", "Adversaries", "AdversaryPlan", "alie_z", "attack"]
