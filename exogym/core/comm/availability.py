"""Availability traces: which nodes are present over simulated time, as rounds they drop out of.

A trace is a CSV file (or the same rows as a list of dicts) with the columns ``time,node,available``:
from ``time`` (simulated seconds) on, node ``node`` is present (``available`` true: ``1``,
``true``, ``yes``) or absent (``0``, ``false``, ``no``) until the node's next row. Before a
node's first row, and for a node without rows, the node is present.

The trace drives the dropout machinery of ``exogym.runtime.faults``: at the start of a run
it becomes the ``{round: nodes}`` plan that ``Faults(drop=...)`` takes, by this rule:

* step ``k`` (0-based) occupies simulated seconds ``[k s, (k + 1) s)``, where ``s`` is
  ``Availability.step_seconds``, or the network's ``compute`` seconds per step when that
  is not given;
* round ``r`` (``L`` steps: the strategy's slowest communication period) occupies the seconds
  of its steps, ``[r L s, min((r + 1) L, steps) s)``;
* a node drops out of round ``r`` when it is absent at any moment of that interval (a node that
  leaves in the middle of a round loses the round's work, as a federated client that goes
  offline before it reports), and rejoins at the end of the last round it missed.

The rule is fixed before the run: simulated seconds that communication adds to a step do not
move the rounds (give ``step_seconds`` including the communication you expect when it matters).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exogym.core.comm.traces import read_rows, trace_name

#: ``((node, ((time, available), ...)), ...)``: per node with rows, its changes, times ascending.
Series = tuple[tuple[int, tuple[tuple[float, bool], ...]], ...]

_TRUE, _FALSE = {"1", "true", "yes"}, {"0", "false", "no"}


def _available(value: Any, where: str) -> bool:
    if isinstance(value, (int, float)) and value in (0, 1):  # True and False too
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(f"{where}: available must be 1/0, true/false or yes/no, got {value!r}")


def parse_availability(rows: Iterable[Mapping[str, Any]], name: str = "availability") -> Series:
    """The checked series of trace rows; ``ValueError`` naming the trace (``name``), the row and
    what is wrong."""
    series: dict[int, dict[float, bool]] = {}
    first: dict[tuple[int, float], int] = {}  # the row that set a node at a time
    for i, row in enumerate(rows, start=1):
        where = f"{name} row {i} ({dict(row)})"
        if set(row) != {"time", "node", "available"}:
            raise ValueError(f"{where}: columns must be time,node,available")
        try:
            t, node = float(row["time"]), int(row["node"])
        except (TypeError, ValueError):
            raise ValueError(f"{where}: time must be seconds and node a rank") from None
        if not (t >= 0 and math.isfinite(t)):
            raise ValueError(f"{where}: time must be simulated seconds >= 0")
        if node < 0:
            raise ValueError(f"{where}: node must be a rank >= 0")
        if (node, t) in first:
            raise ValueError(f"{where}: row {first[(node, t)]} sets node {node} at time {t:g} too; keep one of the two")
        first[(node, t)] = i
        series.setdefault(node, {})[t] = _available(row["available"], where)
    return tuple((node, tuple(sorted(points.items()))) for node, points in sorted(series.items()))


def absent_between(points: tuple[tuple[float, bool], ...], start: float, end: float) -> bool:
    """Whether a node with changes ``points`` (times in any unit) is absent at any moment of
    ``[start, end)`` (in that unit)."""
    state = True  # before the first row: present
    for time, available in points:
        if time <= start:
            state = available
        elif time < end and not available:
            return True
    return not state


@dataclass(frozen=True)
class Availability:
    """An availability trace (``Network(availability=...)``, ``Network.regions(availability=...)``,
    a world file's ``"availability"``): when each node is present, over simulated seconds.

    Args:
        trace: a CSV file with the columns ``time,node,available``, or its rows as dicts
            (see ``exogym.core.comm.availability`` for the format and the rule that turns it
            into rounds).
        step_seconds: the simulated seconds one training step is taken to last when the trace's
            times are mapped to rounds (> 0); ``None``: the network's ``compute`` seconds per
            step (then ``compute`` must be a number).

    Example::

        avail = Availability([{"time": 1.0, "node": 2, "available": 0},
                              {"time": 3.0, "node": 2, "available": 1}], step_seconds=0.5)
        net = Network(1e9, 1e-3, availability=avail)   # node 2 is away from 1 s to 3 s
    """

    #: Per node with rows, its ``(time, available)`` changes, times ascending: with
    #: ``step_seconds``, what two traces are equal by (whatever the form of ``trace``).
    series: Series = field(init=False, repr=False)
    trace: str | os.PathLike[str] | tuple[Mapping[str, Any], ...] = field(compare=False)
    step_seconds: float | None = None

    def __post_init__(self) -> None:
        s = self.step_seconds
        if s is not None and (
            isinstance(s, bool) or not isinstance(s, (int, float)) or not (s > 0 and math.isfinite(s))
        ):
            raise ValueError(f"Availability(step_seconds=...) must be seconds > 0, got {s!r}")
        path = isinstance(self.trace, (str, os.PathLike))
        if not path and (isinstance(self.trace, (bytes, Mapping)) or not isinstance(self.trace, Iterable)):
            raise TypeError(
                f"Availability(trace=...) must be a CSV path or a list of rows (dicts with time, node, available), "
                f"got {type(self.trace).__name__}"
            )
        rows = read_rows(self.trace)
        if not path:
            object.__setattr__(self, "trace", tuple(rows))
        object.__setattr__(self, "series", parse_availability(rows, self.name))

    @property
    def name(self) -> str:
        """How errors name the trace: its file, or its rows."""
        return f"availability {trace_name(self.trace)}"

    @property
    def drops(self) -> bool:
        """Whether the trace ever takes a node away."""
        return any(not available for _, points in self.series for _, available in points)

    def check_nodes(self, num_nodes: int) -> None:
        """``ValueError`` when the trace names a node outside ``0..num_nodes-1``, or takes every
        node away at some moment."""
        out = [node for node, _ in self.series if node >= num_nodes]
        if out:
            raise ValueError(f"{self.name} names node(s) {out}, but the run has nodes 0..{num_nodes - 1}")
        times = sorted({t for _, points in self.series for t, _ in points}) if len(self.series) == num_nodes else []
        for t in times:  # (a node without rows is always present)
            if all(absent_between(points, t, t) for _, points in self.series):
                raise ValueError(
                    f"{self.name} takes every node (0..{num_nodes - 1}) away at simulated second {t:g}: a run needs "
                    "one node present at every moment; keep a node present then (or bring one back), or drop the trace"
                )

    def drop_plan(self, num_nodes: int, round_steps: int, max_steps: int, step_seconds: float) -> dict[int, list[int]]:
        """``{round: nodes}`` (what ``Faults(drop=...)`` takes) for a run of ``max_steps`` steps in
        rounds of ``round_steps``, a step lasting ``step_seconds``: the rounds in which nodes are
        absent at some moment (module docstring). ``ValueError`` when every node is absent
        from a round."""
        self.check_nodes(num_nodes)
        # In steps (rounded: a time on a step's boundary belongs to the step it starts, whatever
        # the float error of time / step_seconds).
        in_steps = [(node, tuple((round(t / step_seconds, 9), a) for t, a in points)) for node, points in self.series]
        plan: dict[int, list[int]] = {}
        for r in range(-(-max_steps // round_steps)):
            start, end = r * round_steps, min((r + 1) * round_steps, max_steps)
            gone = [node for node, points in in_steps if absent_between(points, start, end)]
            if len(gone) >= num_nodes:
                raise ValueError(
                    f"{self.name}: every node is absent at some moment of round {r} (simulated seconds "
                    f"[{start * step_seconds:g}, {end * step_seconds:g}) at {step_seconds:g} s per step): at least "
                    "one node must stay present; keep a node present during that round, or drop the trace"
                )
            if gone:
                plan[r] = gone
        return plan


__all__ = ["Availability", "Series", "absent_between", "parse_availability"]
