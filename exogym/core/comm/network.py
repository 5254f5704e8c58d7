"""The network model: turns the ledger's collectives into simulated seconds.

Alpha-beta costs (latency ``a`` seconds, bandwidth ``B`` bits/s, ``n`` nodes in the group, ``b``
the node's payload in bytes):

===============  ==========================================================
all_reduce       ``2(n-1) a + 2(n-1)/n * 8b / B``  (ring: reduce-scatter + all-gather)
all_gather       ``(n-1) a + (n-1)/n * 8(n b) / B``  (ring; total gathered size ``n b``)
reduce_scatter   ``(n-1) a + (n-1)/n * 8b / B``  (ring; ``b`` is the full input)
broadcast        ``ceil(log2 n) * (a + 8b / B)``  (binomial tree)
barrier          ``ceil(log2 n) * a``
===============  ==========================================================

A group of one costs nothing. A collective over an island costs by the island's size.
The simulated time of a step is the slowest node's compute time (measured, optionally scaled
per node to mimic heterogeneous hardware) plus the slowest node's communication time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from exogym.core.comm.ledger import CollectiveRecord


@dataclass(frozen=True)
class Network:
    """A homogeneous network: every link has ``bandwidth`` bits/s and ``latency`` seconds.

    Attributes:
        bandwidth: bits per second per link (> 0).
        latency: seconds per message hop (>= 0).
        name: a label for tables and plots.
        compute_slowdown: per-node factors multiplying measured compute time (node ``r`` uses
            ``compute_slowdown[r % len]``); ``()`` means all 1.
    """

    bandwidth: float
    latency: float
    name: str = "custom"
    compute_slowdown: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0 bits/s, got {self.bandwidth}")
        if not self.latency >= 0:
            raise ValueError(f"latency must be >= 0 s, got {self.latency}")
        if any(not s > 0 for s in self.compute_slowdown):
            raise ValueError(f"compute_slowdown factors must be > 0, got {self.compute_slowdown}")

    def collective_time(self, kind: str, group_size: int, payload: int) -> float:
        """Seconds one collective takes (see the module table)."""
        n, a, bits = group_size, self.latency, 8.0 * payload
        if n <= 1:
            return 0.0
        if kind == "all_reduce":
            return 2 * (n - 1) * a + 2 * (n - 1) / n * bits / self.bandwidth
        if kind == "all_gather":
            return (n - 1) * a + (n - 1) / n * (n * bits) / self.bandwidth
        if kind == "reduce_scatter":
            return (n - 1) * a + (n - 1) / n * bits / self.bandwidth
        if kind == "broadcast":
            return math.ceil(math.log2(n)) * (a + bits / self.bandwidth)
        if kind == "barrier":
            return math.ceil(math.log2(n)) * a
        raise ValueError(f"unknown collective kind {kind!r}")

    def records_time(self, records: Iterable[CollectiveRecord]) -> float:
        """Seconds for a node's collectives of one step, run one after the other."""
        return sum(self.collective_time(r.kind, r.group_size, r.payload) for r in records)

    def slowdown(self, rank: int) -> float:
        """The compute factor of node ``rank``."""
        return self.compute_slowdown[rank % len(self.compute_slowdown)] if self.compute_slowdown else 1.0

    def step_time(self, compute: Sequence[float], comm: Sequence[float]) -> float:
        """A step's simulated seconds from every node's measured compute and modelled comm time."""
        return max(c * self.slowdown(r) for r, c in enumerate(compute)) + max(comm)


#: Named networks for ``fit(network=...)`` and ``exogym compare --network``.
PRESETS: dict[str, Network] = {
    "datacenter": Network(100e9, 10e-6, "datacenter"),
    "ethernet": Network(1e9, 1e-3, "ethernet"),
    "internet": Network(100e6, 30e-3, "internet"),
}


def resolve_network(network: Network | str | None) -> Network:
    """A :class:`Network` from a preset name, an instance, or ``None`` (``ethernet``)."""
    if network is None:
        return PRESETS["ethernet"]
    if isinstance(network, Network):
        return network
    if isinstance(network, str) and network in PRESETS:
        return PRESETS[network]
    raise ValueError(f"network must be a Network or one of {sorted(PRESETS)}, got {network!r}")
