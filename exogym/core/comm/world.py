"""A simulated world's topology, and what one collective costs on it.

A ``World`` puts every node in a region, joins every pair of regions (and each region with
itself) by a [`Link`][exogym.Link], and may give every node an access link (a
home connection). A message from node ``i`` to node ``j`` crosses a *hop*:

* latency: ``a(i, j) = link(R_i, R_j).latency (+ access_i.latency + access_j.latency)``;
* bandwidth: ``B(i, j) = min(link(R_i, R_j).bandwidth / m (, access_i.upload, access_j.bandwidth))``:
  ``i`` sends at its upload and ``j`` receives at its download (an access link's ``bandwidth``).

``m`` is 1 unless the link between the two regions is ``shared``: then ``m`` is the number of
the transfers at once (one ring step or one tree round) that cross it from ``R_i`` to ``R_j``.
A shared link is full-duplex: each direction has the whole bandwidth, and the transfers of one
direction divide it equally (a transfer slowed elsewhere leaves its share unused; the step waits
for its slowest transfer either way). A ring crosses from one region to another once at most,
so only a broadcast's rounds divide a shared link.

A collective among some participants runs on a ring over them, ordered region by region (ranks
ascending inside a region), so that the ring crosses between regions once per region it touches;
with more than two regions, in the order of regions whose slowest crossing is fastest (bandwidth
first, then latency; tried exhaustively up to 7 regions, region index order beyond). Every step
of a ring moves one chunk over every hop at once and waits for the slowest hop:
``step(s) = max over the ring's hops of a(i, j) + 8 s / B(i, j)`` for a chunk of ``s`` bytes.
With ``n`` participants and ``b`` the payload bytes of each:

===============  ==========================================================
all_reduce       ``2(n-1) * step(b / n)``  (reduce-scatter + all-gather)
all_gather       ``(n-1) * step(b)``
reduce_scatter   ``(n-1) * step(b / n)``
broadcast        ``sum over rounds d of max over the round's edges (a + 8b / B)``: a binomial
                 tree over the ring's order from its first node (round ``d``: position ``i``
                 sends to ``i + 2^d`` for ``i < 2^d``)
barrier          the broadcast's rounds with no bytes
===============  ==========================================================

On a world of one region without access links every hop is the same link and these are the
homogeneous formulas of ``exogym.core.comm.network``. A charge whose participants are not
known (a communicator that charges by group size alone) is priced as ``n`` nodes whose every
hop is the world's slowest one (alone on a shared link). With bandwidth traces, a collective is
priced on the bandwidths in force at the simulated second it starts.
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exogym.core.comm.ledger import RING
from exogym.core.comm.links import Link
from exogym.core.comm.traces import Traces, change_times, load_traces, value_at

#: ``(latency seconds, seconds per byte)`` of the hops a ring step or tree round may wait for:
#: only those that are the slowest for some chunk size (neither larger in both is kept).
Front = tuple[tuple[float, float], ...]

_EXHAUSTIVE_REGIONS = 7
_CACHE_MAX = 256
_PRICES_MAX = 4096


def _front(hops: Sequence[tuple[float, float]]) -> Front:
    """The hops ``(a, c)`` not dominated by another (one with ``a`` and ``c`` both at least as large)."""
    kept: list[tuple[float, float]] = []
    for a, c in sorted(set(hops), reverse=True):  # latency descending
        if not kept or c > kept[-1][1]:
            kept.append((a, c))
    return tuple(kept)


def _slowest(front: Front, nbytes: float) -> float:
    """Seconds a chunk of ``nbytes`` takes over the slowest hop of ``front``."""
    return max(a + nbytes * c for a, c in front)


@dataclass(frozen=True)
class _Shape:
    """What pricing needs of one group: its ring's hops and its broadcast tree's rounds."""

    ring: Front
    rounds: tuple[Front, ...]


@dataclass(frozen=True)
class World:
    """Regions, the links between them, and optional per-node access links.

    Attributes:
        region_names: the regions' names.
        region_of: node ``r``'s region, an index into ``region_names``, for every node.
        links: ``links[p][q]``: the link between regions ``p`` and ``q`` (symmetric; ``[p][p]``
            joins two nodes of region ``p``, ``None`` for a region of one node).
        access: every node's access link (download ``bandwidth``, ``upload``), or ``()`` for none.
        traces: bandwidths over simulated time (``exogym.core.comm.traces``), or ``()``.
    """

    region_names: tuple[str, ...]
    region_of: tuple[int, ...]
    links: tuple[tuple[Link | None, ...], ...]
    access: tuple[Link, ...] = ()
    traces: Traces = ()

    def __post_init__(self) -> None:
        # Not fields: caches are no part of the description (equality, pickles, configs).
        object.__setattr__(self, "_shapes", {})  # id(members) or ("size", n) -> (members, _Shape)
        object.__setattr__(self, "_prices", {})  # (kind, payload, id(members)) -> (members, seconds)
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_changes", change_times(self.traces))
        object.__setattr__(self, "_epochs", {})  # index into _changes -> the world from then on (a few)
        shared = [(p, q) for p, row in enumerate(self.links) for q, link in enumerate(row) if link and link.shared]
        object.__setattr__(self, "_shared", frozenset(shared))  # ordered pairs of regions on a shared link

    def __reduce__(self) -> tuple:
        return World, (self.region_names, self.region_of, self.links, self.access, self.traces)

    def at(self, t: float) -> World:
        """The world (without traces) as its traces make it at simulated second ``t``; itself
        when it has none."""
        if not self.traces:
            return self
        e = int(np.searchsorted(self._changes, t, side="right"))  # 0: before the first change
        world = self._epochs.get(e)
        if world is None:
            world = self._untraced(self._changes[e - 1] if e else -math.inf)
            with self._lock:
                if len(self._epochs) >= _CACHE_MAX:
                    self._epochs.clear()
                self._epochs[e] = world
        return world

    def _untraced(self, t: float) -> World:
        """A world without traces whose bandwidths are this one's at ``t``."""
        links = [list(row) for row in self.links]
        access = list(self.access)
        for (kind, key), points in self.traces:
            bw = value_at(points, t)
            if bw is None:
                continue
            if kind == "node":
                access[key[0]] = access[key[0]].scaled(bw)
            else:
                p, q = key
                link = links[p][q]
                if link is not None:
                    links[p][q] = links[q][p] = link.scaled(bw)
        return World(self.region_names, self.region_of, tuple(tuple(row) for row in links), tuple(access))

    @property
    def changes(self) -> np.ndarray:
        """The simulated seconds at which the traces change a link, ascending (read-only; empty:
        none)."""
        return self._changes

    @property
    def num_nodes(self) -> int:
        return len(self.region_of)

    def _hop(self, p: int, q: int, src: Link | None, dst: Link | None, share: int = 1) -> tuple[float, float]:
        """``(latency seconds, seconds per byte)`` of a message from region ``p`` to region ``q`` on
        ``1 / share`` of their link, sent at access link ``src``'s upload and received at ``dst``'s
        download (``None``: a world without access links)."""
        link = self.links[p][q]
        assert link is not None  # (only a region of one node lacks its inner link)
        a, bw = link.latency, link.bandwidth / share
        if src is not None and dst is not None:
            a += src.latency + dst.latency
            bw = min(bw, src.upload, dst.bandwidth)
        return a, 8.0 / bw

    def ring(self, members: Sequence[int]) -> list[int]:
        """``members`` in ring order: region by region, ranks ascending inside a region."""
        regions = self._region_order(sorted({self.region_of[r] for r in members}))
        place = {p: i for i, p in enumerate(regions)}
        return sorted(members, key=lambda r: (place[self.region_of[r]], r))

    def _region_order(self, regions: list[int]) -> Sequence[int]:
        """The cyclic order of ``regions`` whose slowest crossing is fastest."""
        if len(regions) <= 3 or len(regions) > _EXHAUSTIVE_REGIONS:
            return regions  # every cyclic order of 3 regions uses the same 3 crossings

        def slowest(order: tuple[int, ...]) -> tuple[float, float]:
            links = [self.links[p][q] for p, q in zip(order, order[1:] + order[:1], strict=True)]
            return max((1 / link.bandwidth, link.latency) for link in links if link is not None)

        return min(((regions[0], *perm) for perm in itertools.permutations(regions[1:])), key=slowest)

    def _costs(self, edges: Sequence[tuple[int, int]]) -> Front:
        """The front of ``(latency, seconds per byte)`` of transfers at once from node to node:
        those that cross a shared link in one direction divide it."""
        region, access = self.region_of, self.access or (None,) * self.num_nodes
        crossings = [(region[i], region[j]) for i, j in edges]
        share = collections.Counter(c for c in crossings if c in self._shared) if self._shared else {}
        pairs = zip(edges, crossings, strict=True)
        return _front([self._hop(*c, access[i], access[j], share.get(c, 1)) for (i, j), c in pairs])

    def _shape_of(self, members: tuple[int, ...]) -> _Shape:
        order = self.ring(members)
        n = len(order)
        steps = [1 << d for d in range(math.ceil(math.log2(n)))]  # round d: i sends to i + 2^d
        rounds = tuple(self._costs([(order[i], order[i + s]) for i in range(min(s, n - s))]) for s in steps)
        return _Shape(self._costs(list(zip(order, order[1:] + order[:1], strict=True))), rounds)

    def _worst_shape(self, n: int) -> _Shape:
        """``n`` nodes whose every hop is the world's slowest (participants unknown; a hop alone
        on its link, between the slowest access links of its regions: their largest latency and
        the smallest of their uploads and downloads)."""
        nodes: dict[int, list[int]] = {}
        for r, p in enumerate(self.region_of):
            nodes.setdefault(p, []).append(r)
        slowest: dict[int, Link] = {}
        for p, ranks in nodes.items() if self.access else ():
            acc = [self.access[r] for r in ranks]
            slowest[p] = Link(min(min(x.bandwidth, x.upload) for x in acc), max(x.latency for x in acc))
        pairs = itertools.combinations_with_replacement(sorted(nodes), 2)
        hops = [self._hop(p, q, slowest.get(p), slowest.get(q)) for p, q in pairs if p != q or len(nodes[p]) > 1]
        worst = _front(hops or [(0.0, 0.0)])  # a world of one node: no hop at all
        return _Shape(worst, (worst,) * math.ceil(math.log2(n)))

    def shape(self, members: tuple[int, ...] | None, group_size: int) -> _Shape:
        """The pricing shape of a group (cached by the tuple's identity: records of a world or
        an island share one tuple)."""
        key: object = id(members) if members is not None else ("size", group_size)
        hit = self._shapes.get(key)
        if hit is not None and hit[0] is members:
            return hit[1]
        shape = self._shape_of(members) if members is not None else self._worst_shape(group_size)
        with self._lock:
            if len(self._shapes) >= _CACHE_MAX:
                self._shapes.clear()
            self._shapes[key] = (members, shape)  # holds the tuple: its id is not reused meanwhile
        return shape

    def seconds(
        self, kind: str, payload: float, members: tuple[int, ...] | None, group_size: int, at: float = 0.0
    ) -> float:
        """Seconds one collective of ``kind`` takes among ``members`` (``None``: ``group_size``
        unknown participants), each with ``payload`` bytes, starting at simulated second ``at``
        (see the module table; traces set the bandwidths at ``at``). Cached by the tuple's
        identity: every node prices its step's records, and they repeat."""
        if self.traces:
            return self.at(at).seconds(kind, payload, members, group_size)
        key = (kind, payload, id(members) if members is not None else -group_size)
        hit = self._prices.get(key)
        if hit is not None and hit[0] is members:
            return hit[1]
        t = self._seconds(kind, payload, members, group_size)
        with self._lock:
            if len(self._prices) >= _PRICES_MAX:
                self._prices.clear()
            self._prices[key] = (members, t)  # holds the tuple: its id is not reused meanwhile
        return t

    def _seconds(self, kind: str, payload: float, members: tuple[int, ...] | None, group_size: int) -> float:
        n = len(members) if members is not None else group_size
        if n <= 1:
            return 0.0
        shape = self.shape(members, n)
        if kind in RING:
            steps, split = RING[kind]
            return steps * (n - 1) * _slowest(shape.ring, payload / n if split else payload)
        if kind in ("broadcast", "barrier"):
            nbytes = payload if kind == "broadcast" else 0.0
            return sum(_slowest(front, nbytes) for front in shape.rounds)
        raise ValueError(f"unknown collective kind {kind!r}")

    def slowest_hop(self) -> tuple[float, float]:
        """``(latency, bandwidth)``: the largest latency and the smallest bandwidth of any hop."""
        front = self._worst_shape(2).ring
        c = max(c for _, c in front)
        return max(a for a, _ in front), 8.0 / c if c else math.inf


def build_world(
    regions: dict[str, Sequence[int]],
    intra: Link | None,
    inter: Link | None,
    links: dict[tuple[str, str], Link] | None,
    access: Link | Sequence[Link] | None,
    traces: str | os.PathLike[str] | Iterable[Mapping[str, Any]] | None = None,
) -> World:
    """A ``World`` from region members and links (see ``Network.regions``); ``ValueError``
    naming what is missing or inconsistent."""
    _check_roles(intra, inter, links, access)
    if not regions:
        raise ValueError("regions must name at least one region and its nodes")
    names = tuple(str(k) for k in regions)
    owner: dict[int, int] = {}
    for p, (name, nodes) in enumerate(regions.items()):
        if isinstance(nodes, (str, bytes)) or not isinstance(nodes, Sequence) or not nodes:
            raise ValueError(f"region {name!r} must list its nodes (ranks), got {nodes!r}")
        for r in nodes:
            if isinstance(r, bool) or not isinstance(r, int) or r < 0:
                raise ValueError(f"region {name!r}: nodes are ranks (ints >= 0), got {r!r}")
            if r in owner:
                raise ValueError(f"node {r} is in regions {names[owner[r]]!r} and {name!r}: a node is in one region")
            owner[r] = p
    k = len(owner)
    if sorted(owner) != list(range(k)):
        missing = sorted(set(range(max(owner) + 1)) - set(owner))
        raise ValueError(f"regions must cover nodes 0..{max(owner)} without gaps; missing {missing}")
    pairs: dict[tuple[str, str], Link] = {}
    for (p, q), link in (links or {}).items():
        if p not in regions or q not in regions:
            raise ValueError(f"links names region {p if p not in regions else q!r}, which regions does not have")
        if not isinstance(link, Link):
            raise TypeError(f"links[{(p, q)!r}] must be a Link, got {link!r}")
        pairs[(p, q)] = pairs[(q, p)] = link
    matrix = []
    for p in names:
        row: list[Link | None] = []
        for q in names:
            link = pairs.get((p, q), intra if p == q else inter)
            if link is None and not (p == q and len(regions[p]) == 1):  # (None: a region of one node, no hop inside)
                what = f"intra (or links[({p!r}, {p!r})])" if p == q else f"inter (or links[({p!r}, {q!r})])"
                raise ValueError(f"no link between regions {p!r} and {q!r}: give {what}")
            row.append(link)
        matrix.append(tuple(row))
    acc = (access,) * k if isinstance(access, Link) else tuple(access or ())
    if access is not None and (len(acc) != k or not all(isinstance(x, Link) for x in acc)):
        raise ValueError(f"access must be a Link or one Link per node ({k}), got {len(acc)} entries")
    parsed = load_traces(traces, names, k, bool(acc)) if traces is not None else ()
    return World(names, tuple(owner[r] for r in range(k)), tuple(matrix), acc, parsed)


def _check_roles(
    intra: Link | None,
    inter: Link | None,
    links: dict[tuple[str, str], Link] | None,
    access: Link | Sequence[Link] | None,
) -> None:
    """``ValueError`` where a link has a property its place does not take: ``upload`` belongs to
    a node's access link, ``shared`` to a link between two regions."""
    pairs = list((links or {}).items())
    backbone = [("intra", intra), ("inter", inter), *((f"links[{pair!r}]", link) for pair, link in pairs)]
    for where, link in backbone:
        if isinstance(link, Link) and not link.symmetric:
            raise ValueError(
                f"{where}: a link of the backbone (intra, inter, links) carries one bandwidth each way; upload= is for "
                f"a node's access link (access=Link(download, latency, upload=...)): leave upload out of {where}"
            )
    inside = [("intra", intra), *((f"links[{(p, q)!r}]", link) for (p, q), link in pairs if p == q)]
    nodes = (
        [("access", access)] if isinstance(access, Link) else [(f"access[{r}]", x) for r, x in enumerate(access or ())]
    )
    for where, link in inside + nodes:
        if isinstance(link, Link) and link.shared:
            raise ValueError(
                f"{where}: shared=True divides a link between two regions among the transfers that cross it; give it "
                f"to inter= or links[(region_a, region_b)] with two different regions, and leave it out of {where}"
            )


__all__ = ["World", "build_world"]
