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
The simulated time of a step is the slowest node's compute time (optionally scaled per node to
mimic heterogeneous hardware) plus the slowest node's communication time.

A node's compute time per training step comes from the network's ``compute`` model:

* ``"measured"``: the step's wall time minus the time spent inside collectives. Truthful for the
  machine you run on, but it varies with host load from run to run;
* a number: that many seconds per training step, on every node. Deterministic;
* ``"flops"``: the FLOPs of the step's forward and backward passes (counted once per node with
  ``torch.utils.flop_counter.FlopCounterMode`` on its first training step; matrix products,
  convolutions and attention, which dominate) divided by ``flops_per_second``. Deterministic,
  and it grows with model and batch size as real compute does.

A step a node sits out (a client not sampled in a round) costs no compute in any model.
"""

from __future__ import annotations

import dataclasses
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
        compute_slowdown: per-node factors multiplying compute time (node ``r`` uses
            ``compute_slowdown[r % len]``); ``()`` means all 1.
        compute: how a training step's compute time is obtained: ``"measured"`` (default),
            seconds per step (a number >= 0), or ``"flops"`` (see the module docstring).
        flops_per_second: the sustained throughput of one node's device for ``compute="flops"``
            (default 1e13, i.e. 10 TFLOP/s: a recent GPU at a realistic utilisation).
    """

    bandwidth: float
    latency: float
    name: str = "custom"
    compute_slowdown: tuple[float, ...] = field(default=())
    compute: str | float = "measured"
    flops_per_second: float = 1e13

    def __post_init__(self) -> None:
        if not self.bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0 bits/s, got {self.bandwidth}")
        if not self.latency >= 0:
            raise ValueError(f"latency must be >= 0 s, got {self.latency}")
        if any(not s > 0 for s in self.compute_slowdown):
            raise ValueError(f"compute_slowdown factors must be > 0, got {self.compute_slowdown}")
        c = self.compute
        if isinstance(c, bool) or not (
            c in ("measured", "flops") or (isinstance(c, (int, float)) and math.isfinite(c) and c >= 0)
        ):
            raise ValueError(f"compute must be 'measured', 'flops' or seconds per step (a number >= 0), got {c!r}")
        if not self.flops_per_second > 0:
            raise ValueError(f"flops_per_second must be > 0, got {self.flops_per_second}")

    @property
    def counts_flops(self) -> bool:
        """Whether nodes must count their step's FLOPs (``compute="flops"``)."""
        return self.compute == "flops"

    def compute_seconds(self, measured: float, flops: float) -> float:
        """A training step's compute seconds under this network's ``compute`` model, from the
        step's ``measured`` seconds and its counted ``flops`` (before ``compute_slowdown``)."""
        if self.compute == "measured":
            return measured
        if self.compute == "flops":
            return flops / self.flops_per_second
        return float(self.compute)

    def describe_compute(self) -> str:
        """The compute model in words, for captions and logs."""
        if self.compute == "measured":
            return "measured compute"
        if self.compute == "flops":
            return f"compute from FLOPs at {self.flops_per_second / 1e12:g} TFLOP/s"
        return f"compute {float(self.compute):g} s/step"

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

    def records_time(self, records: Iterable[CollectiveRecord], compute: float = 0.0) -> float:
        """Seconds a node's step waits for its collectives, run one after the other. Transfers
        the algorithm overlaps with its next ``k`` steps (``overlap_steps``) are hidden behind
        ``k * compute`` (``compute``: this step's compute seconds, taken as the next steps' too);
        only what exceeds it is waited for."""
        blocking = overlapped = 0.0
        budget = 0.0
        for r in records:
            t = self.collective_time(r.kind, r.group_size, r.payload)
            if r.overlap_steps:
                overlapped += t
                budget = max(budget, r.overlap_steps * compute)
            else:
                blocking += t
        return blocking + max(0.0, overlapped - budget)

    def slowdown(self, rank: int) -> float:
        """The compute factor of node ``rank``."""
        return self.compute_slowdown[rank % len(self.compute_slowdown)] if self.compute_slowdown else 1.0

    def step_time(self, compute: Sequence[float], comm: Sequence[float]) -> float:
        """A step's simulated seconds from every node's compute and modelled comm time."""
        return max(c * self.slowdown(r) for r, c in enumerate(compute)) + max(comm)


#: Named networks for ``fit(network=...)`` and ``exogym compare --network``.
PRESETS: dict[str, Network] = {
    "datacenter": Network(100e9, 10e-6, "datacenter"),
    "ethernet": Network(1e9, 1e-3, "ethernet"),
    "internet": Network(100e6, 30e-3, "internet"),
}


def resolve_network(network: Network | str | None, compute: str | float | None = None) -> Network:
    """A :class:`Network` from a preset name, an instance, or ``None`` (``ethernet``);
    ``compute`` (when given) replaces its compute model."""
    if network is None:
        net = PRESETS["ethernet"]
    elif isinstance(network, Network):
        net = network
    elif isinstance(network, str) and network in PRESETS:
        net = PRESETS[network]
    else:
        raise ValueError(f"network must be a Network or one of {sorted(PRESETS)}, got {network!r}")
    return net if compute is None else dataclasses.replace(net, compute=compute)
