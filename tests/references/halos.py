"""HALoS (hierarchical asynchronous Local SGD) with local and global parameter servers, event by event.

Kim et al. 2025, "HALoS: Hierarchical Asynchronous Local SGD over Slow Networks for
Geo-Distributed Large Language Model Training" (ICML 2025, arXiv 2506.04531), Algorithm 1, read
on ExoGym's timing model (``tests/references/__init__.py``) extended to two levels. The paper's
abstract and introduction fix the structure; the exact rules below (when an LPS talks to the
GPS, what it sends, how it merges, the momentum update) follow the authors' released simulator
(github.com/utnslab/halos, ``exec_halos.py``, ``ps.py``, ``opt.py``); where neither settles a
point, the choice is marked CHOICE.

Roles. Nodes are the workers. Node ``r`` belongs to region ``region[r]`` (regions ``0 .. R-1``,
``R = len(region_transfer)``, each with at least one node). Each region has one local parameter
server (LPS); one global parameter server (GPS) serves the R LPSs. The LPSs and the GPS are not
nodes: they take no steps and hold no data. All start from the initial model ``theta_0``
(``TinyNet()``'s parameters), as does every worker.

Workers (Algorithm 1, worker). A segment starts from parameters ``s`` (at time 0 ``theta_0``,
LPS version 0, no download); the node takes ``H_r`` inner steps with its own inner optimizer
(its state kept across segments; the model's parameters are overwritten with ``s`` by
``copy_`` at the start of each segment, the optimizer is not rebuilt), then pushes the
pseudo-gradient ``g = s - theta_local`` (per tensor ``s - p.detach()``; the paper writes the
worker's ``theta_H - theta_0``, the same update with the opposite sign) to its LPS. Without
DyLU ``H_r = H``; with ``dylu=True`` ``H_r = max(1, math.ceil(H * min(slowdown) / slowdown[r]))``
in float64 (the released scripts' "rescale_num_local_steps": slower workers take fewer steps,
rounded up; Async DiLoCo's reference rounds down; both agree on speeds 1, 1, 2, 4).

Momentum at both servers: Delayed Nesterov (DN) of Async DiLoCo, the update the released
simulator uses at the LPS and the GPS, with ``c = 0``: the class ``DelayedNesterov`` of
``tests/references/async_diloco.py`` (its docstring gives the torch operations). A server with
learning rate ``lr``, momentum ``beta`` and period ``N`` counts the pseudo-gradients ``g`` it
receives; on each one ``Delta += g``; on every N-th ``m = beta*m + Delta/N``,
``theta -= lr*(beta*m + g/N)``, ``Delta = 0``; otherwise ``theta -= lr*(g/N)``. With ``N = 1``
this is Nesterov momentum SGD on ``g`` (``torch.optim.SGD(nesterov=True)`` up to rounding).

LPS of region ``q`` (Algorithm 1, LPS). State: parameters ``theta_q``, its DN state (lr
``lps_lr``, momentum ``lps_momentum``, period ``lps_period``), a version ``v_q`` (worker
updates applied so far; merges do not count), a count ``n_q`` of worker updates applied since
the last merge, the baseline ``b_q`` (its parameters right after the last merge; ``theta_0``
at the start) and ``gv_q``, the GPS version of the last global model merged (0 at the start).

* Receipt of a worker's ``g`` (pushed from LPS version ``v_start``): staleness
  ``v_q - v_start``; DN step of ``theta_q`` with ``g``; ``v_q += 1``; ``n_q += 1``. If
  ``n_q == K_q`` (the paper's K; ``accumulation`` gives one for all regions or one per
  region): push ``d = b_q - theta_q`` (per tensor, the accumulated update since the last merge)
  to the GPS, tagged with ``gv_q``. The count is not
  reset by the push, only by the merge, so at most one push per LPS is in flight: updates that
  arrive while it is in flight are applied to ``theta_q`` but never pushed (the merge folds them
  into the next baseline). Then the worker's pull is served (the worker reply phase below).
* Receipt of a global model ``G`` (GPS version ``gv``): per tensor
  ``p.mul_(1 - merge_weight).add_(G * merge_weight)`` (``merge_weight`` = the paper's alpha, the
  weight of the global model; Python float scalars); then ``b_q = clone(theta_q)``,
  ``n_q = 0``, ``gv_q = gv``. The DN state is kept.

GPS (Algorithm 1, GPS). State: parameters ``theta_g``, its DN state (``gps_lr``,
``gps_momentum``, ``gps_period``), a version ``V`` (LPS pushes applied). Receipt of region
``q``'s ``d`` tagged ``gv``: staleness ``V - gv``; DN step of ``theta_g`` with ``d``; ``V += 1``;
then it replies to that LPS with ``clone(theta_g)`` and ``V`` as of the reply phase below.

Timing (explicit seconds, no world): node ``r``'s step lasts ``step_seconds * slowdown[r]``; a
transfer between node ``r`` and its LPS takes ``worker_transfer[r]`` seconds either way; between
the LPS of region ``q`` and the GPS ``region_transfer[q]`` seconds either way. Every transfer
carries the trainable parameters in float32 (``4 * P`` bytes): worker push ``g``, LPS reply
``theta_q``, LPS push ``d``, GPS reply ``theta_g``. A worker's last step of a segment ending at
``t`` lands at its LPS at ``t + worker_transfer[r]``; the LPS serves its pull at that instant
and the node starts its next segment ``worker_transfer[r]`` later. An LPS push made at ``t``
lands at the GPS at ``t + region_transfer[q]``; the GPS replies at that instant and the LPS
merges ``region_transfer[q]`` later.

Events at one instant, in this order (phases; ties inside a phase by ascending rank or region):
(0) LPS receipts of worker pushes, by rank; (1) GPS receipts of LPS pushes, by region; (2) GPS
replies, by region: the GPS state after every receipt at ``<= t``; (3) LPS merges of global
models, by region; (4) LPS replies to workers, by rank: the LPS state after every receipt and
merge at ``<= t``, with its version ``v_q``; (5) workers starting steps, by rank. The order is
causal, so zero-second transfers complete a whole round trip within one instant. CHOICE: the
released simulator replies from the GPS right after each receipt, not after all receipts of the
instant; the two differ only for pushes landing at the same instant.

Ticks and drain (as in ``tests/references``): a run of ``max_steps`` executes the steps that
start at the first ``max_steps`` distinct instants at which some node starts a step. Then it
drains: LPSs serve no more worker pulls (no node starts again), everything else runs until
no event is left: each push whose last step was executed lands and is applied at its LPS (which
may push to the GPS), LPS pushes land and are applied at the GPS, GPS replies land and are
merged at their LPS (a merge may be followed by ``accumulation`` further receipts and a push).

Result: ``dict(params, lps_params, steps, updates, region_updates, merges, end_time)``.
``params``: the GPS's parameters after the drain (list of tensors, ``model.parameters()``
order); ``lps_params``: each region's LPS parameters after the drain; ``steps``: steps each node
took; ``updates``: worker pushes applied, ``(time, rank, staleness)`` in the order applied
(all regions); ``region_updates``: LPS pushes applied at the GPS, ``(time, region, staleness)``;
``merges``: ``(time, region, GPS version merged)``; ``end_time``: the last instant at which
anything happened (end of the last executed step, last receipt at an LPS or the GPS, or last
merge). Data: node ``r``'s ``k``-th step uses the ``k``-th batch of ``node_batches(ds, K, r)``.

Values of the paper's experiments (released ``examples/run_halos.sh``; Pythia-70M, 4 regions x 4
workers): H = 8 with DyLU, accumulation K = 32, merge_weight alpha = 0.25; LPS: per-update lr 0.2
(DN ``lps_lr = 0.2 * 16 = 3.2``), momentum 0.9, period 16; GPS: per-update lr 0.15
(``gps_lr = 0.15 * 2 = 0.3``), momentum 0.5, period 2; workers AdamW (betas 0.9, 0.95, weight
decay 0.1, warmup and cosine decay, gradient clipping 1.0). The reference takes every one of them
explicitly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from tests.helpers import TinyNet
from tests.references import Events, Ticks, batch_stream, check_world, inner_optimizer, train_step
from tests.references.async_diloco import DelayedNesterov

#: Phases of the events at one instant, in the order they run.
WORKER_RECEIPT, GPS_RECEIPT, GPS_REPLY, LPS_MERGE, WORKER_REPLY, STEP = range(6)


def halos_steps(H: int, slowdown: Sequence[float], dylu: bool) -> list[int]:
    """Inner steps per segment of each node: ``max(1, ceil(H * min(slowdown) / slowdown[r]))``
    with DyLU, ``H`` without."""
    if not dylu:
        return [H] * len(slowdown)
    fastest = min(slowdown)
    return [max(1, math.ceil(H * fastest / s)) for s in slowdown]


class LocalServer:
    """One region's LPS: parameters, DN state, version, count since the last merge, baseline."""

    def __init__(self, init: list[torch.Tensor], lr: float, beta: float, period: int) -> None:
        self.params = [p.clone() for p in init]
        self.dn = DelayedNesterov(self.params, lr, beta, period, 0.0)
        self.version, self.since_merge, self.merged_version = 0, 0, 0
        self.baseline = [p.clone() for p in init]

    def apply(self, g: list[torch.Tensor]) -> None:
        """A worker's pseudo-gradient: one DN step; counts a version and an update since the merge."""
        self.dn.apply(self.params, g)
        self.version, self.since_merge = self.version + 1, self.since_merge + 1

    def accumulated(self) -> list[torch.Tensor]:
        """The update since the last merge: ``baseline - params`` per tensor."""
        return [b - p for b, p in zip(self.baseline, self.params, strict=True)]

    def merge(self, global_params: list[torch.Tensor], weight: float, global_version: int) -> None:
        """``p <- (1 - weight) * p + weight * G`` in place; the result becomes the baseline."""
        for p, q in zip(self.params, global_params, strict=True):
            p.mul_(1 - weight).add_(q * weight)
        self.baseline = [p.clone() for p in self.params]
        self.since_merge, self.merged_version = 0, global_version


def check_halos(
    k: int,
    region: Sequence[int],
    worker_transfer: Sequence[float],
    region_transfer: Sequence[float],
    counts: dict[str, int],
    rates: dict[str, float],
    momenta: dict[str, float],
    merge_weight: float,
) -> None:
    """Raise ``ValueError`` naming the argument when the hierarchy or a hyper-parameter is not usable."""
    n = len(region_transfer)
    if n < 1 or not all(t >= 0 and math.isfinite(t) for t in region_transfer):
        raise ValueError(f"region_transfer={list(region_transfer)}: give one finite number of seconds >= 0 per region")
    if len(region) != k or any(q not in range(n) for q in region) or set(region) != set(range(n)):
        raise ValueError(f"region={list(region)}: give {k} region numbers in 0..{n - 1}, every region with a node")
    if len(worker_transfer) != k or not all(t >= 0 and math.isfinite(t) for t in worker_transfer):
        raise ValueError(f"worker_transfer={list(worker_transfer)}: give {k} finite numbers of seconds >= 0")
    for name, value in counts.items():
        if value < 1:
            raise ValueError(f"{name}={value}: give an integer >= 1")
    for name, value in rates.items():
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"{name}={value}: give a finite learning rate >= 0")
    for name, value in momenta.items():
        if not 0 <= value < 1:
            raise ValueError(f"{name}={value}: give a momentum in [0, 1)")
    if not 0 <= merge_weight <= 1:
        raise ValueError(f"merge_weight={merge_weight}: give the global model's weight in [0, 1]")


def reference_halos(
    ds: Any,
    k: int,
    max_steps: int,
    *,
    slowdown: Sequence[float],
    step_seconds: float,
    region: Sequence[int],
    worker_transfer: Sequence[float],
    region_transfer: Sequence[float],
    H: int,
    accumulation: int | Sequence[int],
    lps_lr: float,
    lps_momentum: float,
    gps_lr: float,
    gps_momentum: float,
    merge_weight: float,
    lps_period: int = 1,
    gps_period: int = 1,
    dylu: bool = False,
    inner: tuple[str, dict[str, Any]] = ("sgd", {"lr": 0.05}),
) -> dict[str, Any]:
    """Run HALoS on ``k`` TinyNets in ``len(region_transfer)`` regions for ``max_steps`` ticks, then drain.

    Returns ``dict(params, lps_params, steps, updates, region_updates, merges, end_time)`` as the
    module docstring describes. Raises ``ValueError`` naming the argument on bad input.
    """
    check_world(k, max_steps, slowdown, step_seconds, float("inf"), 0.0)  # no bandwidth or latency here
    per_region = [accumulation] * len(region_transfer) if isinstance(accumulation, int) else list(accumulation)
    counts = {"H": H, "lps_period": lps_period, "gps_period": gps_period}
    if isinstance(accumulation, int):
        counts["accumulation"] = accumulation
    else:
        counts.update({f"accumulation[{q}]": a for q, a in enumerate(per_region)})
    rates, momenta = {"lps_lr": lps_lr, "gps_lr": gps_lr}, {"lps_momentum": lps_momentum, "gps_momentum": gps_momentum}
    check_halos(k, region, worker_transfer, region_transfer, counts, rates, momenta, merge_weight)

    init = [p.detach().clone() for p in TinyNet().parameters()]
    gps = [p.clone() for p in init]
    gps_dn = DelayedNesterov(gps, gps_lr, gps_momentum, gps_period, 0.0)
    lps = [LocalServer(init, lps_lr, lps_momentum, lps_period) for _ in region_transfer]
    models = [TinyNet() for _ in range(k)]
    opts = [inner_optimizer(inner, m.parameters()) for m in models]
    data = [batch_stream(ds, k, r) for r in range(k)]
    seg_steps = halos_steps(H, slowdown, dylu)
    ticks, events = Ticks(max_steps), Events()

    gps_version, steps, end_time = 0, [0] * k, 0.0
    updates: list[tuple[float, int, int]] = []
    region_updates: list[tuple[float, int, int]] = []
    merges: list[tuple[float, int, int]] = []
    seg_start: list[list[torch.Tensor]] = [[] for _ in range(k)]
    seg_version, seg_done = [0] * k, [0] * k
    for r in range(k):
        events.push(0.0, STEP, r, [p.clone() for p in init], 0)
    while events:
        t, phase, i, payload = events.pop()  # i: a rank, or a region for GPS_* and LPS_MERGE
        if phase == WORKER_RECEIPT:
            g, started_at = payload
            q = region[i]
            updates.append((t, i, lps[q].version - started_at))
            lps[q].apply(g)
            end_time = max(end_time, t)
            if lps[q].since_merge == per_region[q]:  # ==, not >=: one push in flight at most
                events.push(t + region_transfer[q], GPS_RECEIPT, q, lps[q].accumulated(), lps[q].merged_version)
            events.push(t, WORKER_REPLY, i)
        elif phase == GPS_RECEIPT:
            d, merged_version = payload
            region_updates.append((t, i, gps_version - merged_version))
            gps_dn.apply(gps, d)
            gps_version += 1
            end_time = max(end_time, t)
            events.push(t, GPS_REPLY, i)
        elif phase == GPS_REPLY:
            events.push(t + region_transfer[i], LPS_MERGE, i, [p.clone() for p in gps], gps_version)
        elif phase == LPS_MERGE:
            lps[i].merge(payload[0], merge_weight, payload[1])
            merges.append((t, i, payload[1]))
            end_time = max(end_time, t)
        elif phase == WORKER_REPLY:
            if not ticks.closed:
                server = lps[region[i]]
                events.push(t + worker_transfer[i], STEP, i, [p.clone() for p in server.params], server.version)
        else:
            if payload:  # a segment starts from the pulled parameters
                seg_start[i], seg_version[i], seg_done[i] = payload[0], payload[1], 0
                with torch.no_grad():
                    for p, s in zip(models[i].parameters(), seg_start[i], strict=True):
                        p.copy_(s)
            if not ticks.admit(t):
                continue
            train_step(models[i], opts[i], next(data[i]))
            duration = step_seconds * slowdown[i]
            steps[i], seg_done[i] = steps[i] + 1, seg_done[i] + 1
            end_time = max(end_time, t + duration)
            if seg_done[i] == seg_steps[i]:
                g = [s - p.detach() for s, p in zip(seg_start[i], models[i].parameters(), strict=True)]
                events.push(t + duration + worker_transfer[i], WORKER_RECEIPT, i, g, seg_version[i])
            else:
                events.push(t + duration, STEP, i)
    return {
        "params": gps,
        "lps_params": [server.params for server in lps],
        "steps": steps,
        "updates": updates,
        "region_updates": region_updates,
        "merges": merges,
        "end_time": end_time,
    }
