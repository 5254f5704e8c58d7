"""The fidelity report's bookkeeping: every run's results over seeds, the verdicts that compare
their 95% intervals, and the findings (``Claim``) the report lists.

A verdict is decided from intervals only (``below``, ``above``, ``within``): "agrees" or "does
not agree" when they are apart, "cannot tell at this scale" when they overlap. A finding that
follows from an algorithm's definition (bytes, a schedule) has the same value for every seed and
is marked exact.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from exogym.cli.compare import Comparison
from exogym.cli.target import time_to_target
from exogym.stats import Estimate, estimate

logger = logging.getLogger("fidelity")


@dataclass
class Runs:
    """Every run of the report over the seeds: by label, one summary row and one history per
    seed (in seed order), the wall seconds of them all, and by name the measurements that need
    no seeds (``exact``)."""

    rows: dict[str, list[dict[str, Any]]]
    histories: dict[str, list[list[dict[str, Any]]]]
    captions: dict[str, str]
    wall: float = 0.0
    exact: dict[str, Any] = dataclasses.field(default_factory=dict)

    def save(self, path: str) -> None:
        """Write everything the report reads to ``path`` (JSON), for ``--report-only``."""
        with open(path, "w") as f:
            json.dump(dataclasses.asdict(self), f)

    @classmethod
    def load(cls, path: str) -> Runs:
        with open(path) as f:
            return cls(**json.load(f))

    def add(self, result: Comparison, suffix: str = "") -> None:
        """Add one seed's comparison: each of its strategies' row and history under
        ``<strategy><suffix>``."""
        if result.failures:
            raise RuntimeError(f"runs failed: {result.failures}")
        for row in result.summary:
            label = row["strategy"] + suffix
            self.rows.setdefault(label, []).append(row)
            self.histories.setdefault(label, []).append(result.histories[row["strategy"]])
            self.captions[label] = re.sub(r"\bseed[ =]\d+", "each seed", result.caption)

    def of(self, label: str, column: str, scale: float = 1.0) -> Estimate:
        """The estimate over seeds (mean, std, 95% interval; [`exogym.stats`][exogym.stats]) of a
        summary column of the run ``label``, times ``scale``."""
        return estimate(r[column] * scale for r in self.rows[label])

    def per_seed(self, label: str, column: str) -> list[float]:
        """A summary column of the run ``label``, one value per seed."""
        return [r[column] for r in self.rows[label]]

    def last(self, label: str, column: str) -> Estimate | None:
        """The estimate over seeds of the last value of ``column`` in the run's histories
        (``None`` if it never appears)."""
        values = [[r[column] for r in h if column in r] for h in self.histories[label]]
        return estimate(v[-1] for v in values) if all(values) else None


def over_seeds(seeds: Sequence[int], run: Callable[[int], Comparison], runs: Runs, suffix: str = "") -> None:
    """Run one comparison per seed (``run(seed)``) and add each to ``runs`` under its
    strategies' labels plus ``suffix``: a finding then reads each run's estimate over the
    seeds with ``Runs.of`` and decides with ``below``, ``above``, ``within``."""
    for seed in seeds:
        logger.info("seed %d", seed)
        runs.add(run(seed), suffix)


AGREES, DISAGREES, CANNOT_TELL = "agrees", "does not agree", "cannot tell at this scale"


def _interval(x: Estimate | float) -> tuple[float, float]:
    """An estimate's 95% interval, or a number as an interval of width 0 (one seed: the mean)."""
    if isinstance(x, Estimate):
        return (x.mean, x.mean) if math.isnan(x.low) else (x.low, x.high)
    return (x, x)


def below(a: Estimate | float, b: Estimate | float) -> str:
    """The finding "a < b": agrees when a's interval lies below b's, does not agree when it lies
    above, and cannot tell when the intervals overlap."""
    (a_lo, a_hi), (b_lo, b_hi) = _interval(a), _interval(b)
    return AGREES if a_hi < b_lo else DISAGREES if a_lo > b_hi else CANNOT_TELL


def above(a: Estimate | float, b: Estimate | float) -> str:
    """The finding "a > b" (see ``below``)."""
    return below(b, a)


def within(a: Estimate, low: float, high: float) -> str:
    """The finding "low <= a <= high": agrees when a's interval lies inside, does not agree when
    it lies outside, cannot tell when it straddles an end."""
    a_lo, a_hi = _interval(a)
    return AGREES if low <= a_lo and a_hi <= high else DISAGREES if a_hi < low or a_lo > high else CANNOT_TELL


def every(verdicts: Sequence[str]) -> str:
    """A finding made of several: does not agree if one does not, agrees if all do, else cannot tell."""
    return DISAGREES if DISAGREES in verdicts else AGREES if all(v == AGREES for v in verdicts) else CANNOT_TELL


def scaled(x: Estimate, factor: float) -> Estimate:
    """``x`` times a positive ``factor`` (mean, std and interval)."""
    return Estimate(x.mean * factor, x.std * factor, x.low * factor, x.high * factor, x.n)


def ratio_per_seed(runs: Runs, a: str, b: str, column: str) -> Estimate:
    """The estimate over seeds of ``a``'s column divided by ``b``'s, seed by seed."""
    return estimate(x / y for x, y in zip(runs.per_seed(a, column), runs.per_seed(b, column), strict=True))


def fmt_mb(b: float) -> str:
    return f"{b / 1e6:.3g}"


def ci(x: Estimate, fmt: str = ".4f") -> str:
    """``mean [low, high]`` (the mean alone for one seed)."""
    return x.describe(fmt)


@dataclass
class Claim:
    """One finding of a paper, the criterion ExoGym decides it by (fixed before the runs), what
    ExoGym found (means with their 95% intervals over seeds) and the verdict (``AGREES``,
    ``DISAGREES`` or ``CANNOT_TELL``).

    Attributes:
        source: the paper, e.g. ``"DiLoCo (2311.08105)"``.
        paper: what the paper found.
        criterion: how ExoGym decides it.
        found: ExoGym's figures.
        verdict: the verdict.
        exact: the finding follows from the algorithm's definition (its figures are the same for
            every seed): no interval.
        why: one sentence on what at this scale can keep the finding from showing; the report
            gives it where the verdict is not "agrees".
    """

    source: str
    paper: str
    criterion: str
    found: str
    verdict: str
    exact: bool = False
    why: str = ""

    def verdict_cell(self) -> str:
        if self.verdict == AGREES:
            return f"{AGREES} (exact)" if self.exact else AGREES
        return f"{self.verdict}: {self.why}" if self.why else self.verdict

    def cells(self) -> str:
        return f"| {self.source} | {self.paper} | {self.criterion} | {self.found} | {self.verdict_cell()} |"


def claims_table(claims: Sequence[Claim]) -> list[str]:
    """The report's summary table: a row per finding."""
    return [
        "| paper | the paper found | ExoGym's criterion (95% intervals over seeds) | ExoGym found | verdict |",
        "|---|---|---|---|---|",
        *(c.cells() for c in claims),
    ]


def last_val(history: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """The last validation of a run's history: (average model's loss, simulated seconds)."""
    row = [r for r in history if r.get("val_loss_global") not in (None, "")][-1]
    return float(row["val_loss_global"]), float(row["sim_time"])


def time_ratio(runs: Runs, a: str, b: str) -> tuple[Estimate | None, int]:
    """Seed by seed, the simulated seconds at which run ``a``'s average model first reached run
    ``b``'s last validation loss, over the seconds at which ``b`` first reached it
    (``exogym.cli.target.time_to_target`` on both): below 1 when ``a`` gets there sooner.
    Returns the estimate over the seeds (``None`` unless ``a`` reached it in every seed) and the
    number of seeds in which it did."""
    ratios = []
    for ha, hb in zip(runs.histories[a], runs.histories[b], strict=True):
        target, _ = last_val(hb)
        ra, rb = time_to_target(ha, target), time_to_target(hb, target)
        if ra is not None and rb is not None and rb.sim_time > 0:
            ratios.append(ra.sim_time / rb.sim_time)
    return (estimate(ratios) if len(ratios) == len(runs.histories[a]) else None), len(ratios)


def bytes_per_step(runs: Runs, label: str) -> list[float]:
    """A run's bytes per node and step, one value per seed."""
    return [r["bytes_sent_per_node"] / r["steps"] for r in runs.rows[label]]


def per_step_ratio(runs: Runs, a: str, b: str) -> Estimate:
    """The estimate over seeds of ``a``'s bytes per node and step divided by ``b``'s, seed by seed."""
    return estimate(x / y for x, y in zip(bytes_per_step(runs, a), bytes_per_step(runs, b), strict=True))
