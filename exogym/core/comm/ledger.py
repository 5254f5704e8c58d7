"""The byte ledger: every logical collective a node takes part in, and what it costs.

A record stores what the *algorithm* puts on a real network, which need not be what the
simulator physically moved (an island average done with a world-wide collective is still charged
as an all-reduce among the island's members).

Per-node wire bytes follow the bandwidth-optimal algorithms (``n`` = group size, ``b`` = this
node's payload in bytes):

==============  ==========================  ==========================
kind            sent                        received
==============  ==========================  ==========================
all_reduce      ``2 (n-1)/n * b`` (ring)    ``2 (n-1)/n * b``
all_gather      ``(n-1) * b``               ``(n-1) * b``
reduce_scatter  ``(n-1)/n * b``             ``(n-1)/n * b``
broadcast       ``b`` at the root, else 0   ``b`` off the root, else 0
barrier         0                           0
==============  ==========================  ==========================

A group of one sends and receives nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier")
#: The ring collectives: ``(steps, split)``: a node takes ``steps * (n - 1)`` ring steps, each
#: moving ``1/n`` of its payload (``split``) or the whole of it.
RING = {"all_reduce": (2, True), "all_gather": (1, False), "reduce_scatter": (1, True)}


def wire_bytes(kind: str, group_size: int, payload: int, is_root: bool = False) -> tuple[float, float]:
    """Bytes ``(sent, received)`` by one node for one collective, per the table above."""
    n = group_size
    if kind not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {KINDS}")
    if n <= 1 or kind == "barrier":
        return 0.0, 0.0
    if kind in RING:
        steps, split = RING[kind]
        v = steps * (n - 1) / n * payload if split else float(steps * (n - 1) * payload)
        return v, v
    return (float(payload), 0.0) if is_root else (0.0, float(payload))


@dataclass(frozen=True)
class CollectiveRecord:
    """One logical collective as seen by one node.

    Attributes:
        kind: one of ``KINDS``.
        group_size: number of nodes taking part (the island, the sampled clients, or the world).
        payload: bytes of this node's input (for all_gather: its own contribution).
        sent: bytes this node puts on the network, per the module table.
        received: bytes this node takes off the network.
        tag: free-form name of the issuer (e.g. the communicator), for breakdowns.
        overlap_steps: the algorithm overlaps this transfer with its next ``overlap_steps``
            steps of compute (Eager DiLoCo's inner phase); ``0``: the step waits for it. The
            network model hides it behind that compute.
        members: the participating ranks (``group_size`` of them), or ``None`` where the
            charge did not name them. Records of one group share one tuple, so a record stays
            a few pointers whatever the group's size; a network of regions prices the
            collective on the links these ranks use.
        blocking: ``False`` for a collective started with ``async_op=True``: the step does not
            wait for it (its handle's wait does, ``exogym.core.comm.handles``), and it is no
            meeting of its members.
    """

    kind: str
    group_size: int
    payload: int
    sent: float
    received: float
    tag: str = ""
    overlap_steps: int = 0
    members: tuple[int, ...] | None = None
    blocking: bool = True


@dataclass
class Ledger:
    """Records of one node: the current step's list plus cumulative totals.

    The training loop calls ``end_step`` once per step; per-step records are then dropped,
    so memory does not grow with the run length.
    """

    step_records: list[CollectiveRecord] = field(default_factory=list)
    total_sent: float = 0.0
    total_received: float = 0.0
    total_payload: int = 0
    total_collectives: int = 0
    #: Records made now overlap this many steps of compute (see ``overlapping``).
    overlap_steps: int = 0
    #: Whether records made now block their step (see ``nonblocking``).
    blocking: bool = True
    #: A scale's projection (``exogym.projection.Projection``): records carry the target's
    #: payloads, not the proxy's; ``None``: the proxy's own.
    projection: Any = None
    #: ``(tag, kind, proxy payload)`` of the running step's records, with a projection.
    _calls: list[tuple[str, str, int]] = field(default_factory=list)

    @contextlib.contextmanager
    def overlapping(self, steps: int) -> Iterator[None]:
        """Within the block, records carry ``overlap_steps=steps``: transfers the algorithm
        overlaps with its next ``steps`` steps of compute."""
        previous, self.overlap_steps = self.overlap_steps, steps
        try:
            yield
        finally:
            self.overlap_steps = previous

    @contextlib.contextmanager
    def nonblocking(self) -> Iterator[None]:
        """Within the block, records carry ``blocking=False``: the collectives of a handle
        (``exogym.core.comm.handles``), which the step does not wait for."""
        previous, self.blocking = self.blocking, False
        try:
            yield
        finally:
            self.blocking = previous

    def record(
        self,
        kind: str,
        group_size: int,
        payload: int,
        tag: str = "",
        is_root: bool = False,
        count: int = 1,
        members: tuple[int, ...] | None = None,
    ) -> CollectiveRecord:
        """Charge one collective to this node (``count`` identical ones in a row: the same
        record ``count`` times) among ``members`` (``group_size`` ranks, or ``None``: not
        named) and return its record."""
        if members is not None and len(members) != group_size:
            raise ValueError(f"members names {len(members)} ranks for a group of {group_size}")
        if self.projection is not None:
            self._calls.extend([(tag, kind, int(payload))] * count)
            payload = self.projection.payload(tag, kind, int(payload))
        sent, received = wire_bytes(kind, group_size, payload, is_root)
        rec = CollectiveRecord(
            kind, group_size, int(payload), sent, received, tag, self.overlap_steps, members, self.blocking
        )
        self.step_records.extend([rec] * count)
        self.total_sent += sent * count
        self.total_received += received * count
        self.total_payload += rec.payload * count
        self.total_collectives += count
        return rec

    def end_step(self) -> list[CollectiveRecord]:
        """Return the records charged since the last call and start a new step. With a
        projection, a step whose collectives the target makes differently (in number or kind)
        returns the target's (``Projection.step``)."""
        records, self.step_records = self.step_records, []
        if self._calls:
            calls, self._calls = tuple(self._calls), []
            theirs = self.projection.step(calls, records)
            if theirs is not None:
                for sign, recs in ((-1, records), (1, theirs)):
                    self.total_sent += sign * sum(r.sent for r in recs)
                    self.total_received += sign * sum(r.received for r in recs)
                    self.total_payload += sign * sum(r.payload for r in recs)
                    self.total_collectives += sign * len(recs)
                records = theirs
        return records
