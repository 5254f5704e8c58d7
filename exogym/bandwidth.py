"""Time only: the bandwidth a method needs for a compute utilisation, and the utilisation a
bandwidth gives, at a scale, without training.

A strategy's collectives depend on the step and the tensors' shapes, not on their values, so its
schedule at a scale is recorded once by running it on the target's meta tensors
(``exogym.projection``) for a few of its periods: per step, the collectives it makes and the
handles it starts and waits for. ``Schedule.utilisation`` then prices that schedule on a network
with the clock every run uses (``Network.records_time`` for a step's collectives,
``LocalClock`` for the handles of overlapped ones): compute over the simulated time. The
bandwidth a utilisation needs is found by bisection, the utilisation growing with the bandwidth.

::

    s = schedule(DiLoCoStrategy(H=100), Scale("10B", step_seconds=0.8))
    s.utilisation(Network(1e9, 0.0, compute=0.8))        # at 1 Gbit/s
    bandwidth_for(s, Network(1e9, 0.0, compute=0.8), 0.9)  # bits/s for 90%
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from exogym.core.comm.handles import LocalClock
from exogym.core.comm.ledger import CollectiveRecord
from exogym.core.comm.links import BANDWIDTH_RANGE
from exogym.core.comm.network import Network
from exogym.core.server import ServerStrategy
from exogym.projection import _Probe
from exogym.runtime.faults import round_steps
from exogym.scale import Scale

#: The bandwidths a search looks between, bits per second (up to the largest a link may have).
SEARCH_RANGE = (1e3, BANDWIDTH_RANGE[1])


class _Recorder(LocalClock):
    """A clock that keeps the running step's starts and waits, pricing nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.step_events: list[tuple[bool, Any]] = []

    def started(self, handle: Any) -> None:
        self.step_events.append((True, handle))

    def waiting(self, handle: Any) -> None:
        self.step_events.append((False, handle))

    def has_arrived(self, handle: Any) -> bool:
        raise ValueError(
            "a schedule without training cannot tell when a transfer arrives (overlap_steps='auto' or delay='auto'): "
            "give the overlap as a number of steps"
        )


@dataclass
class _Handle:
    """A handle's records as the clock prices them on replay."""

    records: list[CollectiveRecord]
    arrival: float | None = None


@dataclass
class Step:
    """One step of a schedule: its collectives, and its handles' starts and waits in order
    (``(True, i)``: handle ``i`` starts; ``(False, i)``: the step waits for it)."""

    records: list[CollectiveRecord]
    events: list[tuple[bool, int]] = field(default_factory=list)


@dataclass
class Schedule:
    """One node's collectives over ``len(steps)`` steps of a strategy at a scale.

    Attributes:
        label: the strategy, for tables.
        scale: the scale it was recorded at.
        steps: per step, its collectives and handle events.
        handles: per handle, its records.
    """

    label: str
    scale: Scale
    steps: list[Step]
    handles: list[list[CollectiveRecord]]

    def seconds(self, network: Network) -> tuple[float, float]:
        """``(compute, total)`` simulated seconds of the schedule on ``network`` (a step's compute
        is the network's ``compute`` seconds)."""
        compute = _step_seconds(network)
        clock = LocalClock()
        clock.attach(network, lambda: compute)
        handles = [_Handle(records) for records in self.handles]
        for step in self.steps:
            for is_start, i in step.events:
                (clock.started if is_start else clock.waiting)(handles[i])  # type: ignore[arg-type]
            at = clock.seconds + compute * (1 - network.backward_share)  # where its backward pass starts
            clock.close_step(compute, network.records_time(step.records, compute, at))
        return compute * len(self.steps), clock.seconds

    def utilisation(self, network: Network) -> float:
        """Compute over simulated time on ``network``, in ``(0, 1]``."""
        compute, total = self.seconds(network)
        return compute / total if total > 0 else 1.0

    def bytes_per_step(self) -> float:
        """Mean bytes one node sends per step."""
        return sum(r.sent for s in self.steps for r in s.records) / max(1, len(self.steps))


def _step_seconds(network: Network) -> float:
    c = network.compute
    if isinstance(c, str):
        raise ValueError(
            f"a schedule is priced with modelled compute: the network has compute={c!r}; give Scale(step_seconds=...) "
            "or Network(compute=<seconds per step>)"
        )
    return float(c)


#: Steps a schedule skips by default: a long run's steady state, after warm-ups such as PowerSGD's
#: dense steps.
START = 1000


def schedule(
    strategy: Any,
    scale: Scale,
    num_nodes: int = 2,
    steps: int | None = None,
    seed: int = 0,
    label: str = "",
    start: int = START,
) -> Schedule:
    """The schedule of ``strategy`` (not bound; a copy is) at ``scale`` on ``num_nodes`` nodes
    over ``steps`` steps from step ``start`` (a long run's steady state; ``start=0``: its first
    steps). ``steps`` defaults to six of its longest communication periods (at least 8: slower
    schedules such as DES-LOC's moments repeat within it). ``ValueError`` for a server
    strategy (its schedule is its clock's: train it)."""
    if isinstance(strategy, ServerStrategy):
        raise ValueError(f"{type(strategy.server).__name__} is a server algorithm: its timeline needs training")
    if steps is None:
        steps = max(8, 6 * round_steps(strategy))
    probe = _Probe(strategy, scale.target_model(), num_nodes, start + steps, seed)
    probe.strategy.skip_steps(start)
    recorder = probe.comm.clock = _Recorder()
    index: dict[int, int] = {}
    handles: list[list[CollectiveRecord]] = []
    out = []
    for _ in range(steps):
        records = probe.step()
        events = []
        for is_start, handle in recorder.step_events:
            if is_start:
                index[id(handle)] = len(handles)
                handles.append(list(handle.records))
            events.append((is_start, index[id(handle)]))
        recorder.step_events = []
        out.append(Step([r for r in records if r.blocking], events))
    return Schedule(label or type(strategy).__name__, scale, out, handles)


def bandwidth_for(schedule: Schedule, network: Network, utilisation: float, tolerance: float = 1e-3) -> float:
    """The bandwidth (bits/s) at which ``schedule`` reaches ``utilisation`` on ``network`` with
    its bandwidth replaced (within ``tolerance``, relative); ``math.inf`` where no bandwidth in
    ``SEARCH_RANGE`` reaches it (latency alone prevents it)."""
    if not 0 < utilisation <= 1:
        raise ValueError(f"utilisation must be in (0, 1], got {utilisation!r}")

    def reaches(bw: float) -> bool:
        return schedule.utilisation(dataclasses.replace(network, bandwidth=bw)) >= utilisation

    lo, hi = SEARCH_RANGE
    if reaches(lo):
        return lo
    if not reaches(hi):
        return math.inf
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return hi


__all__ = ["SEARCH_RANGE", "START", "Schedule", "Step", "bandwidth_for", "schedule"]
