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
Every node keeps its own simulated clock: its compute time (optionally scaled per node to mimic
heterogeneous hardware) advances it, and a step's collectives wait for their slowest
participant, then take the communication time priced here (the node loop's
``exogym.clocks``).

A node's compute time per training step comes from the network's ``compute`` model:

* ``"flops"`` (the default of ``fit`` and ``compare`` alike): the FLOPs of the step's forward
  and backward passes (counted once per node with ``torch.utils.flop_counter.FlopCounterMode``
  on its first training step; matrix products, convolutions and attention, which dominate)
  divided by ``flops_per_second``. Deterministic, and it grows with model and batch size as
  real compute does;
* a number: that many seconds per training step, on every node. Deterministic;
* ``"measured"``: the step's wall time minus the time spent inside collectives. Truthful for the
  machine you run on, but it varies with host load from run to run.

A network may describe a whole world instead of one link
([`Network.regions`][exogym.Network.regions], [`Network.preset`][exogym.Network.preset]): its
collectives are then priced on the links their participants use (``exogym.core.comm.world``).
Node speed is one concept, [`Network`][exogym.Network]'s ``compute_slowdown``;
``Faults(slowdown=...)`` draws a further factor per node and step (``exogym.runtime.faults``).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.distributions import Distribution

from exogym.core.comm.availability import Availability
from exogym.core.comm.ledger import RING, CollectiveRecord
from exogym.core.comm.links import Link, in_range, parse_bandwidth, parse_latency
from exogym.core.comm.world import World, build_world
from exogym.core.comm.world_file import is_world_file, load_world
from exogym.core.comm.world_presets import WORLD_PRESETS

#: The backward pass's share of a training step's compute by default (the forward pass is the rest).
BACKWARD_SHARE = 2.0 / 3.0

#: A stream of the run's seed for drawing node speeds (distinct from the faults' streams).
_SPEED_STREAM = 0x5EED

#: The factors ``compute_slowdown`` may have, the seconds per step ``compute`` may be and the
#: ``flops_per_second`` a node may have: values outside are refused, as no machine has them.
SLOWDOWN_RANGE, COMPUTE_RANGE, FLOPS_RANGE = (1e-6, 1e6), (0.0, 1e6), (1.0, 1e21)


@dataclass(frozen=True)
class Network:
    """A simulated network. ``Network(bandwidth, latency)`` is homogeneous: every link has
    ``bandwidth`` bits/s and ``latency`` seconds. [`regions`][exogym.Network.regions] and
    [`preset`][exogym.Network.preset] describe worlds with regions, access links and node speeds.

    Attributes:
        bandwidth: bits per second per link (1 to 1e15, a number or a string with a unit, as in
            [`Link`][exogym.Link]; ``float("inf")``: free links, whose transfers take their latency
            only); for a world, its slowest hop's (captions).
        latency: seconds per message hop (0 to 1e4); for a world, its slowest hop's.
        name: a label for tables and plots.
        compute_slowdown: node speeds, as factors multiplying compute time: a sequence (node
            ``r`` uses ``compute_slowdown[r % len]``; ``()`` means all 1), or a
            ``torch.distributions.Distribution`` of positive scalars drawn once per node from
            the run's seed (see [`for_run`][exogym.Network.for_run]).
        compute: how a training step's compute time is obtained: ``"flops"`` (default),
            seconds per step (a number >= 0), or ``"measured"`` (see the module docstring).
        flops_per_second: the sustained throughput of one node's device for ``compute="flops"``
            (default 1e13, i.e. 10 TFLOP/s: a recent GPU at a realistic utilisation).
        world: the regions, links and access links collectives are priced on
            (``World``); ``None``: the homogeneous network.
        availability: when each node is present ([`Availability`][exogym.Availability],
            or its trace: a CSV path or rows ``time,node,available``), turned into the rounds
            nodes drop out of at the start of a run ([`drop_plan`][exogym.Network.drop_plan]);
            ``None``: always present.
        backward_share: the share of a training step's compute that is its backward pass
            (default two thirds; the forward pass is the rest): the time a step's collectives
            overlap its compute (see [`records_time`][exogym.Network.records_time]).
    """

    bandwidth: float
    latency: float
    name: str = "custom"
    compute_slowdown: tuple[float, ...] | Distribution = field(default=())
    compute: str | float = "flops"
    flops_per_second: float = 1e13
    world: World | None = None
    availability: Availability | None = None
    backward_share: float = BACKWARD_SHARE

    def __post_init__(self) -> None:
        if self.world is None:  # (a world's are its slowest hop's, of links checked when made)
            if self.bandwidth != math.inf:  # (inf: transfers take their latency only, free links)
                object.__setattr__(self, "bandwidth", parse_bandwidth(self.bandwidth, "Network bandwidth"))
            object.__setattr__(self, "latency", parse_latency(self.latency, "Network latency"))
        if not isinstance(self.compute_slowdown, Distribution):
            what = "compute_slowdown factors must be"
            factors = tuple(in_range(s, what, SLOWDOWN_RANGE, "(x compute time)") for s in self.compute_slowdown)
            object.__setattr__(self, "compute_slowdown", factors)
        if self.compute not in ("measured", "flops"):
            what = "compute must be 'measured', 'flops' or seconds per step"
            object.__setattr__(self, "compute", in_range(self.compute, what, COMPUTE_RANGE, "s"))
        flops = in_range(self.flops_per_second, "flops_per_second must be", FLOPS_RANGE, "FLOP/s")
        object.__setattr__(self, "flops_per_second", flops)
        if not 0.0 <= self.backward_share <= 1.0:
            raise ValueError(
                f"backward_share must be in [0, 1] (the backward pass's share of a step), got {self.backward_share!r}"
            )
        a = self.availability
        if a is not None and not isinstance(a, Availability):
            a = Availability(a)  # type: ignore[arg-type]
            object.__setattr__(self, "availability", a)
        if a is not None and a.step_seconds is None and not isinstance(self.compute, (int, float)):
            raise ValueError(
                f"availability maps simulated seconds to rounds at the seconds a step lasts, but compute="
                f"{self.compute!r} gives none before the run: give Availability(trace, step_seconds=...) (a world "
                'file\'s availability as {"trace": ..., "step_seconds": ...}) or compute as seconds per step'
            )

    @classmethod
    def regions(
        cls,
        regions: Mapping[str, Sequence[int]],
        intra: Link | None = None,
        inter: Link | None = None,
        *,
        links: Mapping[tuple[str, str], Link] | None = None,
        access: Link | Sequence[Link] | None = None,
        traces: str | os.PathLike[str] | Iterable[Mapping[str, Any]] | None = None,
        availability: Availability | str | os.PathLike[str] | Iterable[Mapping[str, Any]] | None = None,
        name: str = "regions",
        compute_slowdown: Sequence[float] | Distribution = (),
        compute: str | float = "flops",
        flops_per_second: float = 1e13,
    ) -> Network:
        """A world of regions: ``regions`` maps each region's name to its nodes (ranks; together
        they are ``0..K-1``, each in one region).

        ``intra`` joins two nodes of one region, ``inter`` two nodes of different regions;
        ``links`` names the link of a pair of regions (either order; ``(r, r)`` for inside
        ``r``) and overrides them: a region-to-region matrix for more than two regions.
        ``access``: one [`Link`][exogym.Link] for every node, or one per node: a node's own
        connection, which bounds every hop out of it at its ``upload`` and every hop into it at
        its ``bandwidth`` (download), whatever the backbone. A ``shared`` link between two regions
        is divided among the transfers that cross it at once (see [`Link`][exogym.Link]).
        ``traces``: a CSV file (or its rows) of bandwidths over simulated seconds, per node or per
        pair of regions (``exogym.core.comm.traces``). ``availability``: when each node is present
        ([`Availability`][exogym.Availability]). The other arguments are the homogeneous
        network's. ``ValueError`` names a pair of regions without a link, and a link with a
        property its place does not take (``upload`` off an access link, ``shared`` off a link
        between two regions).
        """
        world = build_world(dict(regions), intra, inter, dict(links or {}), access, traces)
        latency, bandwidth = world.slowest_hop()
        net = cls(bandwidth, latency, name, compute_slowdown, compute, flops_per_second, world, availability)  # type: ignore[arg-type]
        if net.availability is not None:
            net.availability.check_nodes(world.num_nodes)
        return net

    @classmethod
    def preset(cls, name: str, num_nodes: int | None = None, seed: int = 0) -> Network:
        """A named network: the homogeneous ``PRESETS``, or a world for ``num_nodes`` nodes
        (``WORLD_PRESETS``: ``two-datacenters``, ``volunteers``) whose random parts come
        from ``seed``."""
        if name in PRESETS:
            return PRESETS[name]
        if name not in WORLD_PRESETS:
            raise ValueError(f"unknown network {name!r}; choose from {sorted(PRESETS) + sorted(WORLD_PRESETS)}")
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
            raise ValueError(f"network {name!r} is a world: give num_nodes (an int >= 1), got {num_nodes!r}")
        return WORLD_PRESETS[name](num_nodes, seed)

    def for_run(self, num_nodes: int, seed: int) -> Network:
        """This network for a run of ``num_nodes`` nodes from ``seed``: node speeds given as a
        distribution are drawn (once per node, the same on every rank); ``ValueError`` when the
        world describes another number of nodes. Returns ``self`` when there is nothing to do."""
        if self.world is not None and self.world.num_nodes != num_nodes:
            raise ValueError(
                f"network {self.name!r} describes {self.world.num_nodes} nodes but the run has {num_nodes}"
            )
        if self.availability is not None:
            self.availability.check_nodes(num_nodes)
        dist = self.compute_slowdown
        if not isinstance(dist, Distribution):
            return self
        state = np.random.SeedSequence([seed, _SPEED_STREAM]).generate_state(2, np.uint32)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(state[0]) << 32 | int(state[1]))
            drawn = dist.sample((num_nodes,)).reshape(num_nodes).tolist()
        what = f"compute_slowdown={dist!r} drew a node speed out of range: factors must be"
        for f in drawn:
            in_range(f, what, SLOWDOWN_RANGE, "")
        return dataclasses.replace(self, compute_slowdown=tuple(drawn))

    def drop_plan(self, num_nodes: int, round_steps: int, max_steps: int) -> dict[int, list[int]]:
        """``{round: nodes}`` (what ``Faults(drop=...)`` takes): the rounds of ``round_steps``
        steps each node is absent from by ``availability``, a step lasting its
        ``step_seconds`` or else this network's ``compute`` seconds (the rule:
        ``exogym.core.comm.availability``); ``{}`` without availability."""
        a = self.availability
        if a is None:
            return {}
        seconds = a.step_seconds if a.step_seconds is not None else float(self.compute)
        return a.drop_plan(num_nodes, round_steps, max_steps, seconds)

    def describe(self) -> str:
        """The network in words, for captions and logs."""
        speed, w = f"{self.bandwidth / 1e6:g} Mbit/s, {self.latency * 1e3:g} ms", self.world
        if w is None:
            return f"network {self.name} ({speed})"
        return f"network {self.name} ({len(w.region_names)} region(s), {w.num_nodes} nodes; slowest hop {speed})"

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
        """Seconds one collective takes (see the module table). On a world, the homogeneous
        formula at its slowest hop's bandwidth and latency:
        [`collective_seconds`][exogym.Network.collective_seconds] prices on the links the
        participants use."""
        n, a, bits = group_size, self.latency, 8.0 * payload
        if n <= 1:
            return 0.0
        if kind in RING:
            steps, split = RING[kind]
            return steps * (n - 1) * a + steps * (n - 1) / n * (bits if split else n * bits) / self.bandwidth
        if kind == "broadcast":
            return math.ceil(math.log2(n)) * (a + bits / self.bandwidth)
        if kind == "barrier":
            return math.ceil(math.log2(n)) * a
        raise ValueError(f"unknown collective kind {kind!r}")

    def collective_seconds(
        self,
        kind: str,
        payload: float,
        members: Sequence[int] | None = None,
        group_size: int | None = None,
        at: float = 0.0,
    ) -> float:
        """Seconds one collective takes among ``members`` (ranks; a tuple shared between calls
        is priced once), each with ``payload`` bytes. Without ``members``, among ``group_size``
        nodes: on a world, as if every hop were its slowest. ``at``: the simulated second it
        starts (for a world's traces). For one node's clock or a whole step."""
        n = len(members) if members is not None else group_size
        if n is None:
            raise ValueError("collective_seconds needs members or group_size")
        if members is not None and not isinstance(members, tuple):
            members = tuple(members)
        return self._seconds(kind, payload, members, n, at)

    def record_seconds(self, record: CollectiveRecord, at: float = 0.0) -> float:
        """Seconds the collective of one ledger record takes, starting at simulated second ``at``
        (by its participants on a world)."""
        return self._seconds(record.kind, record.payload, record.members, record.group_size, at)

    def _seconds(self, kind: str, payload: float, members: tuple[int, ...] | None, n: int, at: float) -> float:
        if self.world is None:
            return self.collective_time(kind, n, int(payload))
        return self.world.seconds(kind, payload, members, n, at)

    def records_span(self, records: Iterable[CollectiveRecord], compute: float = 0.0, at: float = 0.0) -> float:
        """Seconds from the start of a step's backward pass until its collectives let the step
        end. A step's collectives stream through its backward pass, as DDP's gradient buckets and
        the layer-by-layer schedules of the published simulations do: they start when the backward
        pass starts and run one after the other (``C`` seconds of blocking ones). Transfers the
        algorithm overlaps with its next ``k`` steps (``overlap_steps``, e.g. Eager DiLoCo's)
        follow them and may end ``k * compute`` later (``compute`` taken as the next steps' too):
        the span is ``max(C, C + C_overlapped - k * compute)``. A collective started with
        ``async_op=True`` (``blocking=False``) is not in it: its handle's wait stalls the step that
        waits (``exogym.core.comm.handles``). ``at``: the simulated second the collectives start
        (a world's traces price them on the bandwidths then)."""
        blocking = overlapped = budget = 0.0
        for r in records:
            if not r.blocking:
                continue
            t = self.record_seconds(r, at)
            if r.overlap_steps:
                overlapped += t
                budget = max(budget, r.overlap_steps * compute)
            else:
                blocking += t
        return max(blocking, blocking + overlapped - budget)

    def records_time(self, records: Iterable[CollectiveRecord], compute: float = 0.0, at: float = 0.0) -> float:
        """Seconds a node's step of ``compute`` seconds waits for its collectives beyond its
        compute: what of their [`records_span`][exogym.Network.records_span] exceeds its backward
        pass, ``max(0, span - backward_share * compute)``."""
        return max(0.0, self.records_span(records, compute, at) - self.backward_share * compute)

    @property
    def trace_changes(self) -> Sequence[float]:
        """The simulated seconds at which a world's bandwidth traces change a link, ascending
        (empty without traces): epoch ``0`` lasts until the first, epoch ``e`` starts at the
        ``e``-th."""
        return self.world.changes if self.world is not None else ()

    def slowdown(self, rank: int) -> float:
        """The compute factor of node ``rank``. ``RuntimeError`` while the speeds are a
        distribution not drawn yet ([`for_run`][exogym.Network.for_run] draws them)."""
        if isinstance(self.compute_slowdown, Distribution):
            raise RuntimeError(
                f"network {self.name!r}: compute_slowdown is a distribution; draw it with for_run(num_nodes, seed)"
            )
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


def resolve_network(
    network: Network | str | None,
    compute: str | float | None = None,
    num_nodes: int | None = None,
    seed: int = 0,
) -> Network:
    """A [`Network`][exogym.Network] from a preset name (``PRESETS``, or ``WORLD_PRESETS`` with
    ``num_nodes``), the path of a world file (``exogym.core.comm.world_file``), an instance,
    or ``None`` (``ethernet``); ``compute`` (when given, not ``None``) replaces
    its compute model. With ``num_nodes``, made ready for a run of that many nodes from ``seed``
    ([`Network.for_run`][exogym.Network.for_run])."""
    if network is None:
        net = PRESETS["ethernet"]
    elif isinstance(network, Network):
        net = network
    elif isinstance(network, str) and (network in PRESETS or network in WORLD_PRESETS):
        net = Network.preset(network, num_nodes, seed)
    elif isinstance(network, str) and is_world_file(network):
        net = load_world(network)
    else:
        raise ValueError(
            f"network must be a Network or one of {sorted(PRESETS) + sorted(WORLD_PRESETS)}, or a world file "
            f"(.json or .toml), got {network!r}"
        )
    if compute is not None:
        net = dataclasses.replace(net, compute=compute)
    return net if num_nodes is None else net.for_run(num_nodes, seed)
