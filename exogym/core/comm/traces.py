"""Bandwidth traces: a link's bandwidth as a piecewise-constant function of simulated seconds.

A trace is a CSV file (or the same rows as a list of dicts) in one of two forms:

* ``time,node,bandwidth``: node ``node``'s access link (the world needs access links): its
  download, its upload keeping its ratio to the download;
* ``time,region_a,region_b,bandwidth``: the link between two regions (either order; the same
  name twice for the link inside a region).

``time`` is in simulated seconds, ``bandwidth`` in bits/s (a plain number) or with a unit
(``"500Mbit/s"``), from 1 bit/s to 1 Pbit/s; two rows of one link at one time are refused. From
a row's time on, its bandwidth holds until the next row of the same link; before a link's first
row, the world's own bandwidth holds. Latencies do not change.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from exogym.core.comm.links import BANDWIDTH_RANGE, parse_bandwidth

_FORMS = ({"time", "node", "bandwidth"}, {"time", "region_a", "region_b", "bandwidth"})
#: The characters of a column of plain numbers (bits/s without a unit), one a line: ``float``
#: reads them as ``parse_bandwidth`` does, unless a dot ends a number's digits.
_DIGITS = frozenset("0123456789.eE+-\n")


class Series:
    """One link's trace: its change times ascending and the bandwidth from each on (two
    read-only float64 arrays); iterates as ``(time, bandwidth)`` pairs. Compact and quick to
    pickle, whatever its rows."""

    __slots__ = ("times", "values")

    def __init__(self, times: Iterable[float], values: Iterable[float]) -> None:
        for name, x in (("times", times), ("values", values)):
            a = np.array(x, dtype=np.float64)
            a.flags.writeable = False
            object.__setattr__(self, name, a)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Series is read-only")

    def __reduce__(self) -> tuple:
        return Series, (self.times, self.values)

    def __len__(self) -> int:
        return len(self.times)

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return zip(self.times.tolist(), self.values.tolist(), strict=True)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Series):
            return NotImplemented
        return bool(np.array_equal(self.times, other.times) and np.array_equal(self.values, other.values))

    def __hash__(self) -> int:
        return hash((len(self), self.times[:4].tobytes(), self.values[-4:].tobytes()))

    def __repr__(self) -> str:
        return f"Series({len(self)} points)"

    def at(self, t: float) -> float | None:
        """The bandwidth at time ``t`` (``None`` before the first point)."""
        i = int(np.searchsorted(self.times, t, side="right"))  # the points at or before t
        return float(self.values[i - 1]) if i else None


#: ``((kind, key), Series)``: kind ``"node"`` with key ``(rank,)`` or ``"pair"`` with key
#: ``(region index, region index)``.
Traces = tuple[tuple[tuple[str, tuple[int, ...]], Series], ...]


def read_rows(source: str | os.PathLike[str] | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a trace: a CSV file's, or the given dicts."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, newline="") as f:
            return [dict(row) for row in csv.DictReader(f)]
    return [dict(row) for row in source]


def load_traces(
    source: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    region_names: tuple[str, ...],
    num_nodes: int,
    has_access: bool,
) -> Traces:
    """Checked traces of a world from a CSV file or rows (``parse_traces``). A plain file (no
    quotes, no blank lines, the same number of fields on every line) is read by columns: a
    million rows in about a second; another, or one with a wrong row, is read row by row, whose
    errors name the row."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, newline="") as f:
            text = f.read()
        fast = _parse_text(text, region_names, num_nodes, has_access)
        if fast is not None:
            return fast
    return parse_traces(read_rows(source), region_names, num_nodes, has_access, trace_name(source))


def _parse_text(text: str, region_names: tuple[str, ...], num_nodes: int, has_access: bool) -> Traces | None:
    """``parse_traces`` of a plain CSV file's text by columns, or ``None`` where it is not plain
    or a row is wrong (``parse_traces`` then names it)."""
    text = text.rstrip("\n") + "\n"
    if '"' in text or "\r" in text or "\n\n" in text:
        return None
    head, _, body = text.partition("\n")
    header = head.split(",")
    if len(set(header)) != len(header) or set(header) not in _FORMS:
        return None
    if not body:
        return ()
    # Every line must have the header's fields: its commas, counted between its newlines.
    raw = np.frombuffer(body.encode(), np.uint8)
    commas = np.searchsorted(np.flatnonzero(raw == ord(",")), np.flatnonzero(raw == ord("\n")))
    if (np.diff(commas, prepend=0) != len(header) - 1).any():
        return None
    fields = body[:-1].replace("\n", ",").split(",")
    n = len(commas)
    columns = {name: fields[i :: len(header)] for i, name in enumerate(header)}
    try:
        times = np.fromiter(map(float, columns["time"]), np.float64, n)
        bw_text = columns["bandwidth"]
        joined = "\n".join(bw_text) + "\n"
        if set(joined) <= _DIGITS and not any(x in joined for x in (".e", ".E", ".\n")):
            bws = np.fromiter(map(float, bw_text), np.float64, n)  # plain numbers, as parse_bandwidth reads them
        else:
            parsed = {text: parse_bandwidth(text) for text in set(bw_text)}
            bws = np.fromiter(map(parsed.__getitem__, bw_text), np.float64, n)
        if "node" in columns:
            ranks = {text: int(text) for text in set(columns["node"])}
            which = np.fromiter(map(ranks.__getitem__, columns["node"]), np.int64, n)
            if not has_access or not all(0 <= r < num_nodes for r in ranks.values()):
                return None
        else:
            index = {name: i for i, name in enumerate(region_names)}
            a = np.fromiter(map(index.__getitem__, columns["region_a"]), np.int64, n)
            b = np.fromiter(map(index.__getitem__, columns["region_b"]), np.int64, n)
            which = np.minimum(a, b) * len(region_names) + np.maximum(a, b)
    except (ValueError, KeyError):
        return None
    low, high = BANDWIDTH_RANGE
    if not (np.isfinite(times).all() and (times >= 0).all() and (bws >= low).all() and (bws <= high).all()):
        return None
    order = np.lexsort((times, which))  # by link, then time
    which, times, bws = which[order], times[order], bws[order]
    if ((np.diff(which) == 0) & (np.diff(times) == 0)).any():
        return None  # a link set twice at one time
    starts = np.flatnonzero(np.diff(which, prepend=-1))
    series = []
    for lo, hi in zip(starts.tolist(), [*starts[1:].tolist(), n], strict=True):
        w = int(which[lo])
        key = ("node", (w,)) if "node" in columns else ("pair", divmod(w, len(region_names)))
        series.append((key, Series(times[lo:hi], bws[lo:hi])))
    return tuple(series)


def trace_name(source: object) -> str:
    """How errors name a trace: its file, or its rows."""
    return f"trace {os.fspath(source)}" if isinstance(source, (str, os.PathLike)) else "trace"  # type: ignore[arg-type]


def parse_traces(
    rows: list[dict[str, Any]], region_names: tuple[str, ...], num_nodes: int, has_access: bool, name: str = "trace"
) -> Traces:
    """Checked traces of a world from trace rows; ``ValueError`` naming the trace (``name``), the
    row and what is wrong."""
    series: dict[tuple[str, tuple[int, ...]], dict[float, float]] = {}
    first: dict[tuple[str, tuple[int, ...], float], int] = {}  # the row that set a link at a time
    for i, row in enumerate(rows, start=1):
        where = f"{name} row {i} ({row})"
        keys = set(row)
        try:
            t = float(row["time"])
            bw = parse_bandwidth(row["bandwidth"], f"{where}: bandwidth")
        except KeyError as e:
            raise ValueError(f"{where}: missing column {e.args[0]!r}") from None
        if not (t >= 0 and math.isfinite(t)):
            raise ValueError(f"{where}: time must be simulated seconds >= 0")
        if keys == {"time", "node", "bandwidth"}:
            if not has_access:
                raise ValueError(f"{where}: a node's trace changes its access link; give the world access links")
            node = int(row["node"])
            if not 0 <= node < num_nodes:
                raise ValueError(f"{where}: node must be a rank in [0, {num_nodes})")
            key: tuple[str, tuple[int, ...]] = ("node", (node,))
        elif keys == {"time", "region_a", "region_b", "bandwidth"}:
            names = (str(row["region_a"]), str(row["region_b"]))
            for r in names:
                if r not in region_names:
                    raise ValueError(f"{where}: unknown region {r!r}; the world has {list(region_names)}")
            key = ("pair", tuple(sorted(region_names.index(r) for r in names)))
        else:
            raise ValueError(f"{where}: columns must be time,node,bandwidth or time,region_a,region_b,bandwidth")
        if (*key, t) in first:
            raise ValueError(f"{where}: row {first[(*key, t)]} sets the same link at time {t:g}; keep one of the two")
        first[(*key, t)] = i
        series.setdefault(key, {})[t] = bw
    return tuple((key, Series(*zip(*sorted(points.items()), strict=True))) for key, points in sorted(series.items()))


def change_times(traces: Traces) -> np.ndarray:
    """Every time at which some traced link changes, ascending (read-only)."""
    if len(traces) == 1:
        return traces[0][1].times  # (ascending and distinct already)
    times = np.unique(np.concatenate([points.times for _, points in traces])) if traces else np.zeros(0)
    times.flags.writeable = False
    return times


def value_at(points: Series, t: float) -> float | None:
    """The bandwidth a trace gives at time ``t`` (``None`` before its first row)."""
    return points.at(t)


__all__ = ["Series", "Traces", "change_times", "load_traces", "parse_traces", "read_rows", "trace_name", "value_at"]
