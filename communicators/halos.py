"""HALoS (Kim et al. 2025, "HALoS: Hierarchical Asynchronous Local SGD over Slow Networks for
Geo-Distributed Large Language Model Training", arXiv 2506.04531): a local parameter server
(LPS) in every region and one global parameter server (GPS), all asynchronous.

- **Workers** (the nodes) take ``H_r`` local steps from the parameters their region's LPS sent
  them and push the pseudo-gradient ``g = start - local`` to it; they wait for its reply (one
  intra-region transfer each way). With dynamic local updates (``dylu``) a worker of speed
  ``v_r`` takes ``H_r = max(1, ceil(H v_r / v_max))`` steps.
- **An LPS** applies every worker update at once with delayed Nesterov momentum
  (``DelayedNesterov``, ``c = 0``) and sends the worker its
  parameters. When ``accumulation`` worker updates have arrived since its last merge it pushes
  ``d = b - theta`` (its progress since that merge, ``b`` its parameters right after it) to the
  GPS and keeps serving its workers; updates that arrive while the push is in flight are applied
  locally and never pushed.
- **The GPS** applies each ``d`` with its own delayed Nesterov momentum and sends its parameters
  back to that LPS, which merges them on arrival: ``theta = (1 - alpha) theta + alpha theta_G``
  (``alpha = merge_weight``), sets ``b = theta`` and counts updates from zero again.
- The run's result is the GPS's parameters after the drain (every push in flight received,
  applied and merged).

Staleness: of a worker update, LPS versions (worker updates applied) between the worker's pull
and its push; of an LPS push, GPS versions between the global model the LPS last merged and the
push's receipt.

The LPSs and the GPS are simulated on every node (every node holds a replica of each; the
nodes' replicas hold the same bits: no node is a server). Worker transfers are charged to the
worker (a transfer of the model within its region); transfers between the servers belong to no
node and are counted in the run's summary (``region_bytes``). On a world, region ``q``'s LPS sits
in region ``q`` and the GPS in the first region: a worker's transfer is priced on its region's
link and its access link, as the clock prices a transfer between two nodes of that region; an
LPS's on the link between its region and the first (within the first region, its link; free in
a region of one node). On a homogeneous network every node is in one region.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from communicators.async_diloco import DelayedNesterov
from communicators.checks import check_int, check_number
from exogym.core.comm.network import Network
from exogym.core.server import Result, Server, ServerContext, Train


def halos_steps(H: int, step_seconds: list[float], dylu: bool) -> list[int]:
    """Per node, its local steps per segment: ``H``, or with DyLU
    ``max(1, ceil(H * v_r / v_max))`` with speed ``v_r = 1 / step_seconds[r]``."""
    if not dylu:
        return [H] * len(step_seconds)
    fastest = min(step_seconds)
    return [max(1, math.ceil(H * fastest / s - 1e-9)) for s in step_seconds]


def region_transfer_seconds(network: Network, region: int, nbytes: int) -> float:
    """Seconds to move ``nbytes`` between region ``region``'s LPS and the GPS (in the first
    region): the link between the two regions (no access link)."""
    world = network.world
    if world is None:
        return network.latency + 8.0 * nbytes / network.bandwidth
    link = world.links[region][0]
    if link is None:  # the first region has one node: its LPS and the GPS share the machine room
        return 0.0
    return link.latency + 8.0 * nbytes / link.bandwidth


class HALoSServer(Server):
    """HALoS as servers (see the module docstring): a local parameter server (LPS) per region
    serving its region's workers, and a global one (GPS) in the first region.

    Args:
        H: local steps per segment (the fastest worker's, with ``dylu``).
        accumulation: worker updates an LPS applies before it pushes to the GPS (the paper's
            ``K``); ``None``: per region, the number of its workers, so that each LPS pushes
            after about one update per worker of its region whatever the regions' sizes (the
            paper's worlds have equal regions, where both readings agree).
        merge_weight: ``alpha``, the global model's weight when an LPS merges it (in ``[0, 1]``).
        lps_lr, lps_momentum, lps_period: each LPS's delayed Nesterov (``lps_period``
            ``None``: the workers in its region).
        gps_lr, gps_momentum, gps_period: the GPS's (``gps_period`` ``None``: the regions).
        dylu: dynamic local updates.
    """

    kinds = ("region_receive", "region_serve", "merge")
    drain_kinds = frozenset(kinds)

    def __init__(
        self,
        H: int,
        accumulation: int | None = None,
        merge_weight: float = 0.25,
        lps_lr: float = 0.7,
        lps_momentum: float = 0.5,
        lps_period: int | None = None,
        gps_lr: float = 0.5,
        gps_momentum: float = 0.5,
        gps_period: int | None = None,
        dylu: bool = True,
    ) -> None:
        super().__init__()
        check_int("H", H)
        check_int("accumulation", accumulation, none="each region's workers")
        check_int("lps_period", lps_period, none="the workers of its region")
        check_int("gps_period", gps_period, none="the regions")
        for name, lr, momentum in (("lps", lps_lr, lps_momentum), ("gps", gps_lr, gps_momentum)):
            check_number(f"{name}_lr", lr, 0, above=True)
            check_number(f"{name}_momentum", momentum, 0, 1)
        check_number("merge_weight", merge_weight, 0, 1, "the global model's weight", upto=True)
        if not isinstance(dylu, bool):
            raise ValueError(f"dylu must be True or False, got {dylu!r}")
        self.segment_steps, self.accumulation, self.merge_weight = H, accumulation, merge_weight
        self.lps_lr, self.lps_momentum, self.lps_period = lps_lr, lps_momentum, lps_period
        self.gps_lr, self.gps_momentum, self.gps_period = gps_lr, gps_momentum, gps_period
        self.dylu = dylu

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        k, network = ctx.num_clients, ctx.network
        self.region = [ctx.region_of(r) for r in range(k)]
        regions = ctx.regions
        self.region_transfer = [region_transfer_seconds(network, q, ctx.nbytes) for q in range(regions)]
        # a worker's transfer to its region's LPS: as the clock prices one between two nodes of the region
        self.worker_transfer = [network.collective_seconds("broadcast", ctx.nbytes, (r, r)) for r in range(k)]
        workers = [self.region.count(q) for q in range(regions)]
        self.per_region = [self.accumulation or n for n in workers]
        self.local_steps = halos_steps(self.segment_steps, [ctx.step_seconds(r) for r in range(k)], self.dylu)
        self.lps = [self.params.clone() for _ in range(regions)]
        self.baseline = [self.params.clone() for _ in range(regions)]
        self.lps_dn = [
            DelayedNesterov(self.params, self.lps_lr, self.lps_momentum, self.lps_period or workers[q])
            for q in range(regions)
        ]
        self.gps_dn = DelayedNesterov(self.params, self.gps_lr, self.gps_momentum, self.gps_period or regions)
        self.version = [0] * regions  # worker updates each LPS applied
        self.count = [0] * regions  # since its last merge
        self.merged = [0] * regions  # the GPS version each LPS last merged
        self.global_version = 0

    def _send(self, r: int, transfer: bool = True) -> None:
        q = self.region[r]
        self.send(
            r, Train(self.local_steps[r]), state=self.lps[q], info=lambda: self.version[q], transfer=transfer,
            seconds=self.worker_transfer[r],
        )  # fmt: skip

    def start(self) -> None:
        for r in range(self.ctx.num_clients):  # every worker holds the initial model
            self._send(r, transfer=False)

    def on_result(self, result: Result) -> None:
        r = result.client
        q = self.region[r]
        self.record_update(r, self.version[q] - result.info)
        self.version[q] += 1
        self.count[q] += 1
        self.lps_dn[q].step(self.lps[q], result.start - result.local)
        if self.count[q] == self.per_region[q]:  # ==: one push in flight per LPS at most
            self.schedule(self.region_transfer[q], "region_receive", q, self.baseline[q] - self.lps[q], self.merged[q])
        self._send(r)

    def on_region_receive(self, q: int, push: torch.Tensor, merged: int) -> None:
        self.record("region_updates", self.now, q, self.global_version - merged)
        self.global_version += 1
        self.gps_dn.step(self.params, push)
        self.schedule(0.0, "region_serve", q)

    def on_region_serve(self, q: int) -> None:
        self.schedule(self.region_transfer[q], "merge", q, self.params.clone(), self.global_version)

    def on_merge(self, q: int, reply: torch.Tensor, version: int) -> None:
        w = self.merge_weight
        self.lps[q].mul_(1 - w).add_(reply * w)
        self.baseline[q].copy_(self.lps[q])
        self.count[q] = 0
        self.merged[q] = version
        self.record("merges", self.now, q, version)

    def summary(self) -> dict[str, Any]:
        """The LPSs' pushes to the GPS (their number and staleness), the merges, and the bytes
        moved between the servers."""
        pushes, merges = self.records.get("region_updates", []), self.records.get("merges", [])
        return {
            "region_updates": len(pushes),
            "region_staleness_mean": sum(s for _, _, s in pushes) / len(pushes) if pushes else 0.0,
            "merges": len(merges),
            "region_bytes": (len(pushes) + len(merges)) * self.ctx.nbytes,
        }

    def state_dict(self) -> dict[str, Any]:
        keys = ("version", "count", "merged", "global_version")
        return {
            "lps": self.lps,
            "baseline": self.baseline,
            "lps_dn": [dn.state_dict() for dn in self.lps_dn],
            "gps_dn": self.gps_dn.state_dict(),
            **{k: getattr(self, k) for k in keys},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for mine, saved in zip(self.lps + self.baseline, state["lps"] + state["baseline"], strict=True):
            mine.copy_(saved)
        for dn, saved in zip(self.lps_dn, state["lps_dn"], strict=True):
            dn.load_state_dict(saved)
        self.gps_dn.load_state_dict(state["gps_dn"])
        self.version, self.count, self.merged = list(state["version"]), list(state["count"]), list(state["merged"])
        self.global_version = int(state["global_version"])

    def describe(self) -> str:
        return (
            f"HALoS(H={self.segment_steps}, accumulation={self.accumulation}, merge_weight={self.merge_weight}, "
            f"lps_lr={self.lps_lr}, lps_momentum={self.lps_momentum}, lps_period={self.lps_period}, "
            f"gps_lr={self.gps_lr}, gps_momentum={self.gps_momentum}, gps_period={self.gps_period}, dylu={self.dylu})"
        )


__all__ = [
    "HALoSServer",
    "halos_steps",
    "region_transfer_seconds",
]
