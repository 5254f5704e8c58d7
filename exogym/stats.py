"""Mean, sample standard deviation and Student-t confidence interval of a few runs' values.

A sweep repeats each point over ``n`` seeds and reports, for each quantity ``x_1 .. x_n``:

* the mean ``m = (x_1 + ... + x_n) / n``;
* the sample standard deviation ``s = sqrt(sum (x_i - m)^2 / (n - 1))`` (ddof = 1);
* the two-sided confidence interval ``m -/+ t_{(1+c)/2, n-1} * s / sqrt(n)`` at confidence
  ``c`` (0.95 by default), where ``t_{q, d}`` is the ``q`` quantile of Student's t distribution
  with ``d`` degrees of freedom (4.303 for 3 seeds at 95%, 2.776 for 5, 1.96 in the limit).

The interval assumes the values over seeds are independent draws from a normal distribution; with
few seeds it is wide, which is the honest answer. With one value the standard deviation and the
interval are undefined (``nan``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Estimate", "estimate", "t_quantile"]


@dataclass(frozen=True)
class Estimate:
    """A quantity's [`estimate`][exogym.stats.estimate] over seeds.

    Attributes:
        mean: the sample mean.
        std: the sample standard deviation (ddof = 1; ``nan`` for one value).
        low, high: the confidence interval's ends (``nan`` for one value).
        n: how many values.
    """

    mean: float
    std: float
    low: float
    high: float
    n: int

    def overlaps(self, other: Estimate) -> bool:
        """Whether the two intervals share a point (an undefined interval overlaps everything)."""
        if any(math.isnan(v) for v in (self.low, self.high, other.low, other.high)):
            return True
        return self.low <= other.high and other.low <= self.high

    def describe(self, fmt: str = ".4g") -> str:
        """``mean [low, high]``, or the mean alone when the interval is undefined."""
        if math.isnan(self.low):
            return f"{self.mean:{fmt}}"
        return f"{self.mean:{fmt}} [{self.low:{fmt}}, {self.high:{fmt}}]"


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz's
    method, Numerical Recipes 3rd ed. section 6.4)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """``I_x(a, b)``, the regularized incomplete beta function, for ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t distribution with ``df`` degrees of freedom
    (``t_quantile(0.975, 2)`` = 4.3027), by bisection on its CDF to 1e-12.

    Raises:
        ValueError: unless ``0 < q < 1`` and ``df > 0``.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < q:
        hi *= 2.0
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _t_cdf(mid, df) < q else (lo, mid)
    return 0.5 * (lo + hi)


def estimate(values: Iterable[float], confidence: float = 0.95) -> Estimate:
    """Mean, sample standard deviation and Student-t ``confidence`` interval of ``values`` (see
    the module docstring for the formulas).

    Raises:
        ValueError: for no values, or ``confidence`` outside (0, 1).
    """
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("estimate needs at least one value")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n = len(xs)
    mean = math.fsum(xs) / n
    if n == 1:
        return Estimate(mean, math.nan, math.nan, math.nan, 1)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile((1.0 + confidence) / 2.0, n - 1) * std / math.sqrt(n)
    return Estimate(mean, std, mean - half, mean + half, n)
