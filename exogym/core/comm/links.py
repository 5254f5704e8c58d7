"""Links of a simulated world: a bandwidth and a latency, given as numbers or with units.

``Link(bandwidth, latency)`` takes bits per second and seconds as numbers, or strings with a
unit: ``Link("1Gbit/s", "80ms")``, ``Link("100Mbit/s", "10us")``; a string without a unit is
bits/s or seconds (``Link("1e9", "0.08")``). Bandwidth units are decimal
(``k`` = 1e3, ``M`` = 1e6, ``G`` = 1e9, ``T`` = 1e12) over ``bit/s`` or ``bps``, or bytes with a
capital ``B`` (``"1GB/s"`` = 8e9 bits/s); latency units are ``s``, ``ms``, ``us`` (or ``µs``)
and ``ns``. A bandwidth is in ``BANDWIDTH_RANGE`` (1 bit/s to 1 Pbit/s), a latency in
``LATENCY_RANGE`` (0 to 1e4 s): values outside are refused, as no network has them.

A node's access link may send at another rate than it receives: ``Link("500Mbit/s", "20ms",
upload="110Mbit/s")``. A link between two regions may be ``shared``: the transfers of one
collective that cross it in the same direction at once divide its bandwidth.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_BANDWIDTH_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BANDWIDTH_BASE = {"bit/s": 1.0, "bps": 1.0, "b/s": 1.0, "B/s": 8.0, "Bps": 8.0}
#: Bits/s per unit: every prefix over every base (``"Mbit/s"``, ``"GB/s"``, ``"bps"``).
_BANDWIDTH_UNIT = {p + b: ps * bs for p, ps in _BANDWIDTH_PREFIX.items() for b, bs in _BANDWIDTH_BASE.items()}
_BANDWIDTH_UNIT[""] = 1.0  # a plain number: bits/s
_LATENCY_UNIT = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
BANDWIDTH_UNITS = "bit/s, kbit/s, Mbit/s, Gbit/s, Tbit/s (or bps, Mbps, ...; bytes: MB/s, GB/s; none: bit/s)"
LATENCY_UNITS = "s, ms, us (or µs), ns (none: s)"
#: The bandwidths (bits/s) and latencies (seconds) a link may have.
BANDWIDTH_RANGE, LATENCY_RANGE = (1.0, 1e15), (0.0, 1e4)
_NUMBER = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(\S*)\s*$")


def _quantity(value: float | str, what: str, unit: dict[str, float], units: str, base: str) -> float:
    """``value`` in ``base`` units: a number as it is, a string's number times its ``unit`` factor;
    ``ValueError`` or ``TypeError`` naming ``what`` and the accepted ``units`` otherwise."""
    if isinstance(value, str):
        m = _NUMBER.match(value)
        if m is None:
            raise ValueError(f"{what} must be a number or a number with a unit ({units}), got {value!r}")
        if m.group(2) not in unit:
            raise ValueError(f"{what}: unknown unit {m.group(2)!r} in {value!r}; use one of {units}")
        return float(m.group(1)) * unit[m.group(2)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value  # (as given: an int beyond floats is refused by its range)
    raise TypeError(f"{what} must be {base} (a number) or a string with a unit ({units}), got {value!r}")


def in_range(value: object, what: str, bounds: tuple[float, float], unit: str, given: object = None) -> float:
    """``value`` as a float when it is a number in ``bounds``; else ``ValueError``: ``"{what} in
    [low, high] {unit}, got {given}"`` (``given``: the value as the user wrote it)."""
    try:
        x = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond floats
        x = math.inf
    except (TypeError, ValueError):
        x = math.nan
    if isinstance(value, bool) or not bounds[0] <= x <= bounds[1]:
        shown = repr(value if given is None else given)
        shown = shown if len(shown) <= 40 else f"{shown[:12]}... ({len(shown)} characters)"
        raise ValueError(f"{what} in [{bounds[0]:g}, {bounds[1]:g}] {unit}, got {shown}")
    return x


def parse_bandwidth(value: float | str, what: str = "bandwidth") -> float:
    """Bits per second from a number or a string without a unit (bits/s) or with one, such as
    ``"1Gbit/s"``. ``ValueError`` naming ``what`` and the accepted units or ``BANDWIDTH_RANGE``."""
    bits = _quantity(value, what, _BANDWIDTH_UNIT, BANDWIDTH_UNITS, "bits/s")
    return in_range(bits, f"{what} must be", BANDWIDTH_RANGE, "bits/s (1 bit/s to 1 Pbit/s)", value)


def parse_latency(value: float | str, what: str = "latency") -> float:
    """Seconds from a number or a string without a unit (seconds) or with one, such as
    ``"80ms"``. ``ValueError`` naming ``what`` and the accepted units or ``LATENCY_RANGE``."""
    seconds = _quantity(value, what, _LATENCY_UNIT, LATENCY_UNITS, "seconds")
    return in_range(seconds, f"{what} must be", LATENCY_RANGE, "s", value)


@dataclass(frozen=True, init=False)
class Link:
    """A network link: ``bandwidth`` bits/s (1 to 1e15) and ``latency`` seconds per message (0 to 1e4).

    Either may be given as a number or as a string with a unit (see the module docstring);
    the attributes hold bits/s and seconds.

    Args:
        bandwidth: bits/s. A link between regions carries it each way (full-duplex); a node's
            access link receives at it (its download).
        latency: seconds per message.
        upload: a node's access link only: the bits/s it sends at (default ``bandwidth``, a
            symmetric link), e.g. ``Link("500Mbit/s", "20ms", upload="110Mbit/s")`` for a home
            connection.
        shared: a link between two regions only: the transfers of one collective that cross it
            in the same direction at once divide its bandwidth equally (each direction has the
            whole bandwidth: two transfers each way take as long as one).

    ``ValueError`` (or ``TypeError``) naming the argument and the range when a value is not a
    bandwidth in ``BANDWIDTH_RANGE``, a latency in ``LATENCY_RANGE`` or a bool.
    """

    bandwidth: float
    latency: float
    upload: float
    shared: bool

    def __init__(
        self,
        bandwidth: float | str,
        latency: float | str = 0.0,
        *,
        upload: float | str | None = None,
        shared: bool = False,
    ) -> None:
        down = parse_bandwidth(bandwidth, "Link bandwidth")
        if not isinstance(shared, bool):
            raise TypeError(f"Link shared must be True or False, got {shared!r}")
        object.__setattr__(self, "bandwidth", down)
        object.__setattr__(self, "latency", parse_latency(latency, "Link latency"))
        object.__setattr__(self, "upload", down if upload is None else parse_bandwidth(upload, "Link upload"))
        object.__setattr__(self, "shared", shared)

    @property
    def symmetric(self) -> bool:
        """Whether it sends at the bandwidth it receives at."""
        return self.upload == self.bandwidth

    def scaled(self, bandwidth: float) -> Link:
        """This link with download ``bandwidth`` bits/s, its upload in the same ratio to it (a
        bandwidth trace's row), its latency and ``shared`` kept."""
        upload = bandwidth if self.symmetric else self.upload * (bandwidth / self.bandwidth)
        return Link(bandwidth, self.latency, upload=upload, shared=self.shared)

    def __repr__(self) -> str:
        up = "" if self.symmetric else f", upload {self.upload:g} bit/s"
        return f"Link({self.bandwidth:g} bit/s, {self.latency:g} s{up}{', shared' if self.shared else ''})"


__all__ = ["BANDWIDTH_UNITS", "LATENCY_UNITS", "Link", "parse_bandwidth", "parse_latency"]
