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

import bisect
import csv
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

from exogym.core.comm.links import parse_bandwidth

#: ``((kind, key), ((time, bandwidth), ...))``: kind ``"node"`` with key ``(rank,)`` or
#: ``"pair"`` with key ``(region index, region index)``; times ascending.
Traces = tuple[tuple[tuple[str, tuple[int, ...]], tuple[tuple[float, float], ...]], ...]


def read_rows(source: str | os.PathLike[str] | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a trace: a CSV file's, or the given dicts."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, newline="") as f:
            return [dict(row) for row in csv.DictReader(f)]
    return [dict(row) for row in source]


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
    return tuple((key, tuple(sorted(points.items()))) for key, points in sorted(series.items()))


def change_times(traces: Traces) -> tuple[float, ...]:
    """Every time at which some traced link changes, ascending."""
    return tuple(sorted({t for _, points in traces for t, _ in points}))


def value_at(points: tuple[tuple[float, float], ...], t: float) -> float | None:
    """The bandwidth a trace gives at time ``t`` (``None`` before its first row)."""
    i = bisect.bisect_right(points, t, key=lambda point: point[0])  # the points at or before t
    return points[i - 1][1] if i else None


__all__ = ["Traces", "change_times", "parse_traces", "read_rows", "trace_name", "value_at"]
