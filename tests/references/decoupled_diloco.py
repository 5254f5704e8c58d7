"""Decoupled DiLoCo: learners on their own clocks, a synchronizer merging fragments by quorum.

Douillard et al. 2026, "Decoupled DiLoCo for Resilient Distributed Pre-training" (arXiv
2604.21428), Section 3 and Algorithms 1-2, read on ExoGym's timing model (see
``tests/references/__init__.py``). The K nodes are the learners; the server is the synchronizer.

Fragments (Section 3, as in Streaming DiLoCo). The trainable parameters, flattened in
``model.parameters()`` order (float32, ``N`` entries), are cut into ``P`` = ``fragments``
contiguous slices of near-equal size (``numpy.array_split``: the first ``N % P`` slices hold one
entry more). Fragment ``p`` has the offset ``t_p = ((p + 1) * H // P) % H``; the offsets are
distinct for ``1 <= P <= H``, and ``P = 1`` gives ``t_0 = 0``.

Learners (Algorithm 1). Learner ``r`` counts its executed inner steps ``s = 1, 2, ...`` over its
whole life and, per fragment, ``c_steps[p]``: the steps taken since it last adopted fragment
``p`` (a broadcast or a pull). At the end of step ``s``, if ``s % H == t_p`` for some ``p``, it
sends its current slice ``theta_{r,p}`` with ``c_steps[p]`` and ``v[p]`` (the version of fragment
``p`` it last adopted) to the synchronizer, and goes on training at once: a learner never waits.
The send arrives one fragment transfer later. Its inner optimizer keeps its state throughout.

Synchronizer (Algorithm 2). Per fragment ``p`` it holds ``Theta_p``, a Nesterov momentum buffer
(zero at the start), a version (merges applied, 0 at the start) and a round: the contributions
received since its last merge of ``p``, one per learner (a later contribution from the same
learner replaces its earlier one). The round opens at ``t_open``, the receipt of its first
contribution. When a receipt brings the number of learners in the round to ``quorum`` (at
``t_q``), the merge is scheduled at ``t_q + window`` (the adaptive grace window, Section 3):

    window = grace * max(0, tau * step_ref - (t_q - t_open) - sync_seconds)

``grace`` is the paper's gamma in [0, 1), ``tau`` its overlap in steps, ``sync_seconds`` one
fragment transfer, and ``step_ref = step_seconds * sorted(slowdown)[quorum - 1]`` the step time
of the ``quorum``-th fastest learner (the paper's xi_step; this reference's choice). Every
contribution received up to the merge instant is merged. At the merge, learner ``m``'s weight is
the paper's ``c_tokens * (c_tokens / c_steps)``; with equal batches ``c_tokens = b * c_steps``,
so ``w_m = b**2 * c_steps`` and the normalised weight is ``c_steps_m / sum(c_steps)``, computed
as the Python float ``float(c_m) / float(sum of c)``. Per fragment, in this order of torch
operations (1-D float32 tensors; contributors in ascending rank):

    delta = torch.zeros_like(Theta_p)
    for each contributor m: delta.add_(Theta_p - theta_mp, alpha=w_m)   # measured from Theta_p
    buf.mul_(mu).add_(delta)
    Theta_p.add_(delta.add(buf, alpha=mu), alpha=-lr)

which is ``torch.optim.SGD(lr, momentum=mu, nesterov=True)`` on the fragment. With
``outer="cgad"`` (Shah & Sun 2026, "Cosine-Gated Adam-Decay", arXiv 2605.09126, read from its
abstract: each pseudo-gradient is scaled by ``sigma(tau) = gamma(tau) exp(-alpha tau)`` before
it enters Adam's moments; the per-fragment variant PA-CGAD) the merge is instead, with
``tau_m`` the contribution's staleness (defined below) and the cosine gate
``gamma(tau) = (1 + cos(pi tau / cutoff)) / 2`` below the cutoff, 0 from it on (ExoGym's choice):
contributions with ``sigma = 0`` are left out; if none is left the merge makes no step (``Theta_p``
and the fragment's Adam state stay); otherwise

    delta = torch.zeros_like(Theta_p)
    for each contributor m left: delta.add_(Theta_p - theta_mp, alpha=w_m * sigma(tau_m))

is the gradient of one ``torch.optim.Adam(lr, betas, eps)`` step of the fragment's own optimizer
(the fragment a ``torch.nn.Parameter`` of its own). The version goes
up by one, the round empties, and ``Theta_p`` is sent to every learner, arriving one fragment
transfer later. When a step starts, the learner first adopts every fragment that has arrived
by that instant (deliveries run before step starts) with a version newer than its ``v[p]``: it
overwrites its slice with ``Theta_p`` (no mixing), sets ``v[p]`` and ``c_steps[p] = 0``; older
versions are ignored. Contributions that arrive after a merge belong to the next round.

Absences (the fault model). ``down = {rank: [(start, end), ...]}`` in simulated seconds, sorted,
not overlapping, ``end`` may be ``inf``; the learner is absent on ``[start, end)``. A learner
absent at any moment of a step ``[t, t + d)`` does not take it (no batch, no tick): the segment
since its last send is lost. It sends nothing while absent; merged fragments that arrive while
it is absent are dropped; contributions already received stay in their round. At ``end`` it
pulls the whole current ``Theta`` (served after every merge at that instant, one transfer of all
``N`` entries), overwrites all its parameters, sets every ``v[p]`` to the current versions and
every ``c_steps[p]`` to 0, and starts its next step when the pull arrives. Its step count ``s``,
its batch position and its inner optimizer state carry on. Merges need no absent learner: a
round below quorum waits, and training goes on.

Events at one instant run in this order: (0) contributions received, by rank; (1) merges, by
fragment; (2) pulls served, by rank; (3) merged fragments delivered, by rank; (4) step starts.
Ticks and the drain are as in ``tests.references``: after the last tick, contributions whose
last step was executed are received and every scheduled merge happens; a round below quorum
stays unmerged.

Returns ``dict(params, steps, updates, end_time, merges)``: ``updates`` lists the merged
contributions as ``(receipt time, rank, staleness)`` in the order applied (staleness: merges of
the fragment between the version the learner held when it sent and the merge), ``merges`` lists
``(time, fragment, ranks, weights)`` with ranks ascending, and ``end_time`` is the latest end of
an executed step, receipt or merge.

What comes from the paper and what is chosen here. From the paper (Section 3, Algorithms 1-2):
the fragment schedule ``s mod H == t_p``; learners that never block; the minimum quorum; the
grace bound ``gamma * (tau * xi_step - (xi_quorum + xi_sync))``; the weights
``c_tokens * c_tokens / c_steps``; pseudo-gradients measured from the synchronizer's own
``Theta_p``; Nesterov SGD as outer optimizer; learners overwriting the fragment they receive and
resetting its counters. Chosen here where the paper leaves room or describes a production
system: sends on the learner's own step count (no global clock; the quorum counts learners with
a contribution in the round); the round opening at its first receipt (``xi_quorum = t_q -
t_open``); ``xi_step`` as above; one contribution per learner per round, the latest; weighted
averaging where the paper uses radial-directional averaging (RDA) for non-embedding fragments;
recovery by a pull from the synchronizer where the paper copies a healthy peer's checkpoint;
CGAD's gate shape and the scaling of the token weights by ``sigma`` (not renormalised).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from tests.helpers import TinyNet
from tests.references import Events, Ticks, batch_stream, check_world, inner_optimizer, train_step

#: Phases of the events at one instant, in the order they run.
RECEIPT, MERGE, PULL, DELIVER, STEP = 0, 1, 2, 3, 4

Interval = tuple[float, float]


def fragment_bounds(n: int, fragments: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each of ``fragments`` contiguous near-equal slices of ``n`` entries."""
    sizes = [len(a) for a in np.array_split(np.arange(n), fragments)]
    starts = np.cumsum([0, *sizes]).tolist()
    return list(zip(starts[:-1], starts[1:], strict=True))


def fragment_offsets(H: int, fragments: int) -> list[int]:
    """The offset ``t_p = ((p + 1) * H // P) % H`` of each fragment: it is sent when ``s % H == t_p``."""
    return [((p + 1) * H // fragments) % H for p in range(fragments)]


def grace_window(grace: float, tau: int, step_ref: float, quorum_wait: float, sync_seconds: float) -> float:
    """The adaptive grace window ``grace * max(0, tau * step_ref - quorum_wait - sync_seconds)``."""
    return grace * max(0.0, tau * step_ref - quorum_wait - sync_seconds)


def nesterov_merge(
    theta: torch.Tensor, buf: torch.Tensor, parts: Sequence[tuple[torch.Tensor, float]], lr: float, mu: float
):
    """Merge ``parts`` = ``[(theta_mp, w_m)]`` into ``theta`` (in place) by Nesterov SGD."""
    delta = torch.zeros_like(theta)
    for local, w in parts:
        delta.add_(theta - local, alpha=w)
    buf.mul_(mu).add_(delta)
    theta.add_(delta.add(buf, alpha=mu), alpha=-lr)


def cgad_sigma(tau: int, alpha: float, cutoff: float) -> float:
    """``gamma(tau) * exp(-alpha * tau)``: the cosine gate ``(1 + cos(pi tau / cutoff)) / 2``
    below ``cutoff`` (0 from it on) times the exponential decay."""
    gate = (1 + math.cos(math.pi * tau / cutoff)) / 2 if tau < cutoff else 0.0
    return gate * math.exp(-alpha * tau)


def cgad_merge(
    theta: torch.Tensor,
    fragment: torch.nn.Parameter,
    opt: torch.optim.Optimizer,
    parts: Sequence[tuple[torch.Tensor, float, float]],
) -> None:
    """Merge ``parts`` = ``[(theta_mp, w_m, sigma_m)]`` into ``theta`` (in place) by one step of
    ``opt`` (a ``torch.optim.Adam`` over ``fragment``) on the scaled pseudo-gradient; none with
    ``sigma_m > 0``: no step."""
    kept = [(local, w * sigma) for local, w, sigma in parts if sigma > 0]
    if not kept:
        return
    delta = torch.zeros_like(theta)
    for local, scale in kept:
        delta.add_(theta - local, alpha=scale)
    with torch.no_grad():
        fragment.copy_(theta)
    fragment.grad = delta
    opt.step()
    theta.copy_(fragment.detach())


def _check(k, H, fragments, quorum, grace, tau, outer_lr, outer_momentum, down) -> None:
    if H < 1:
        raise ValueError(f"H={H}: give at least one inner step between two sends of a fragment")
    if not 1 <= fragments <= H:
        raise ValueError(f"fragments={fragments}: give 1 to H={H} fragments (their offsets must differ)")
    if not 1 <= quorum <= k:
        raise ValueError(f"quorum={quorum}: give 1 to k={k} learners")
    if not 0 <= grace < 1:
        raise ValueError(f"grace={grace}: the paper's gamma lies in [0, 1)")
    if tau < 0:
        raise ValueError(f"tau={tau}: give an overlap of at least 0 steps")
    if not (outer_lr >= 0 and math.isfinite(outer_lr)):
        raise ValueError(f"outer_lr={outer_lr}: give a finite learning rate >= 0")
    if not 0 <= outer_momentum < 1:
        raise ValueError(f"outer_momentum={outer_momentum}: give a momentum in [0, 1)")
    for rank, spans in down.items():
        if not 0 <= rank < k:
            raise ValueError(f"down: rank {rank} is not a learner; give ranks 0 to {k - 1}")
        ends = [0.0]
        for start, end in spans:
            if not (math.isfinite(start) and ends[-1] <= start < end):
                raise ValueError(
                    f"down[{rank}]={spans}: give sorted, non-overlapping (start, end) with 0 <= start < end"
                )
            ends.append(end)


def _blocking(spans: Sequence[Interval], t: float, d: float) -> Interval | None:
    """The first absence that overlaps the step ``[t, t + d)``, if any."""
    return next(((s, e) for s, e in spans if s < t + d and e > t), None)


def _is_down(spans: Sequence[Interval], t: float) -> bool:
    return any(s <= t < e for s, e in spans)


class _Learners:
    """K TinyNets with their flat views, counters and the fragments waiting to be adopted."""

    def __init__(self, k: int, ds: Any, inner: tuple[str, dict[str, Any]], bounds: list[tuple[int, int]]):
        self.models = [TinyNet() for _ in range(k)]
        self.opts = [inner_optimizer(inner, m.parameters()) for m in self.models]
        self.data = [batch_stream(ds, k, r) for r in range(k)]
        self.bounds = bounds
        self.count = [0] * k
        self.c_steps = [[0] * len(bounds) for _ in range(k)]
        self.version = [[0] * len(bounds) for _ in range(k)]
        self.inbox: list[dict[int, tuple[torch.Tensor, int]]] = [{} for _ in range(k)]

    def flat(self, r: int) -> torch.Tensor:
        return torch.nn.utils.parameters_to_vector(self.models[r].parameters()).detach().clone()

    def write(self, r: int, flat: torch.Tensor) -> None:
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(flat.clone(), self.models[r].parameters())

    def adopt_inbox(self, r: int) -> None:
        newer = {p: got for p, got in self.inbox[r].items() if got[1] > self.version[r][p]}
        self.inbox[r] = {}
        if newer:
            flat = self.flat(r)
            for p, (theta_p, version) in sorted(newer.items()):
                start, end = self.bounds[p]
                flat[start:end] = theta_p
                self.version[r][p], self.c_steps[r][p] = version, 0
            self.write(r, flat)

    def adopt_pull(self, r: int, theta: torch.Tensor, versions: list[int]) -> None:
        self.write(r, theta)
        self.version[r], self.c_steps[r] = list(versions), [0] * len(self.bounds)

    def step(self, r: int) -> None:
        train_step(self.models[r], self.opts[r], next(self.data[r]))
        self.count[r] += 1
        self.c_steps[r] = [c + 1 for c in self.c_steps[r]]


class _Synchronizer:
    """Global fragments, their momentum, versions and open rounds."""

    def __init__(
        self, theta: torch.Tensor, bounds: list[tuple[int, int]], lr: float, mu: float, cgad: dict | None
    ) -> None:
        self.theta, self.bounds, self.lr, self.mu, self.cgad = theta, bounds, lr, mu, cgad
        self.buf = [torch.zeros(end - start) for start, end in bounds]
        if cgad is not None:  # per fragment its own parameter and Adam
            self.fragments = [torch.nn.Parameter(theta[start:end].clone()) for start, end in bounds]
            self.adams = [torch.optim.Adam([f], lr=lr, betas=cgad["betas"], eps=cgad["eps"]) for f in self.fragments]
        self.version = [0] * len(bounds)
        self.rounds: list[dict[int, tuple[float, torch.Tensor, int, int]]] = [{} for _ in bounds]
        self.opened = [0.0] * len(bounds)
        self.scheduled = [False] * len(bounds)

    def receive(self, t: float, r: int, p: int, theta_p: torch.Tensor, c_steps: int, version: int) -> int:
        """Put a contribution in fragment ``p``'s round; returns the number of learners in it."""
        if not self.rounds[p]:
            self.opened[p] = t
        self.rounds[p][r] = (t, theta_p, c_steps, version)
        return len(self.rounds[p])

    def merge(self, p: int) -> tuple[list[int], list[float], list[tuple[float, int, int]]]:
        """Merge fragment ``p``'s round: returns its ranks, weights and ``(receipt, rank, staleness)``."""
        ranks = sorted(self.rounds[p])
        total = float(sum(self.rounds[p][r][2] for r in ranks))
        weights = [float(self.rounds[p][r][2]) / total for r in ranks]
        start, end = self.bounds[p]
        applied = [(self.rounds[p][r][0], r, self.version[p] - self.rounds[p][r][3]) for r in ranks]
        if self.cgad is None:
            parts = [(self.rounds[p][r][1], w) for r, w in zip(ranks, weights, strict=True)]
            nesterov_merge(self.theta[start:end], self.buf[p], parts, self.lr, self.mu)
        else:
            sigmas = [cgad_sigma(tau, self.cgad["alpha"], self.cgad["cutoff"]) for _, _, tau in applied]
            cparts = [(self.rounds[p][r][1], w, s) for r, w, s in zip(ranks, weights, sigmas, strict=True)]
            cgad_merge(self.theta[start:end], self.fragments[p], self.adams[p], cparts)
        self.version[p] += 1
        self.rounds[p], self.scheduled[p] = {}, False
        return ranks, weights, applied


class _Run:
    """One run's event handlers: the world, the synchronizer, the learners and the records."""

    def __init__(self, k, slowdown, step_seconds, bandwidth, latency, H, quorum, grace, tau, down, sync, learners):
        self.k, self.slowdown, self.step_seconds, self.H, self.down = k, slowdown, step_seconds, H, down
        self.quorum, self.grace, self.tau = quorum, grace, tau
        self.sync, self.learners = sync, learners
        self.offsets = fragment_offsets(H, len(sync.bounds))
        self.part_seconds = [latency + 8 * 4 * (end - start) / bandwidth for start, end in sync.bounds]
        self.pull_seconds = latency + 8 * 4 * sync.theta.numel() / bandwidth
        self.step_ref = step_seconds * sorted(slowdown)[quorum - 1]
        self.events = Events()
        self.updates: list[tuple[float, int, int]] = []
        self.merges: list[tuple[float, int, tuple[int, ...], tuple[float, ...]]] = []
        self.end_time = 0.0

    def receipt(self, t: float, r: int, p: int, theta_p: torch.Tensor, c_steps: int, version: int) -> None:
        self.end_time = max(self.end_time, t)
        if self.sync.receive(t, r, p, theta_p, c_steps, version) >= self.quorum and not self.sync.scheduled[p]:
            wait = grace_window(self.grace, self.tau, self.step_ref, t - self.sync.opened[p], self.part_seconds[p])
            self.sync.scheduled[p] = True
            self.events.push(t + wait, MERGE, p)

    def merge(self, t: float, p: int) -> None:
        ranks, weights, applied = self.sync.merge(p)
        self.updates += applied
        self.merges.append((t, p, tuple(ranks), tuple(weights)))
        self.end_time = max(self.end_time, t)
        start, end = self.sync.bounds[p]
        for m in range(self.k):
            theta_p = self.sync.theta[start:end].clone()
            self.events.push(t + self.part_seconds[p], DELIVER, m, p, theta_p, self.sync.version[p])

    def pull(self, t: float, r: int) -> None:
        self.events.push(t + self.pull_seconds, STEP, r, self.sync.theta.clone(), list(self.sync.version))

    def deliver(self, t: float, r: int, p: int, theta_p: torch.Tensor, version: int) -> None:
        if not _is_down(self.down.get(r, []), t):
            self.learners.inbox[r][p] = (theta_p, version)

    def step(self, t: float, r: int, ticks: Ticks) -> None:
        duration = self.step_seconds * self.slowdown[r]
        absence = _blocking(self.down.get(r, []), t, duration)
        if absence is not None:
            if math.isfinite(absence[1]):
                self.events.push(absence[1], PULL, r)
            return
        if not ticks.admit(t):
            return
        self.learners.adopt_inbox(r)
        self.learners.step(r)
        self.end_time = max(self.end_time, t + duration)
        s = self.learners.count[r]
        for p, offset in enumerate(self.offsets):
            if s % self.H == offset:
                start, end = self.sync.bounds[p]
                c_steps, version = self.learners.c_steps[r][p], self.learners.version[r][p]
                sent = (p, self.learners.flat(r)[start:end], c_steps, version)
                self.events.push(t + duration + self.part_seconds[p], RECEIPT, r, *sent)
        self.events.push(t + duration, STEP, r)


def reference_decoupled_diloco(
    ds: Any,
    k: int,
    max_steps: int,
    *,
    slowdown: Sequence[float],
    step_seconds: float,
    bandwidth: float,
    latency: float,
    H: int,
    fragments: int,
    quorum: int,
    grace: float,
    outer_lr: float,
    outer_momentum: float,
    tau: int = 2,
    down: Mapping[int, Sequence[Interval]] | None = None,
    inner: tuple[str, dict[str, Any]] = ("sgd", {"lr": 0.05}),
    outer: str = "nesterov",
    cgad_alpha: float = 0.1,
    cgad_cutoff: float = 16,
    cgad_betas: tuple[float, float] = (0.9, 0.999),
    cgad_eps: float = 1e-8,
) -> dict[str, Any]:
    """Run Decoupled DiLoCo on ``k`` TinyNet learners for ``max_steps`` ticks, then drain.

    ``outer``: ``"nesterov"`` (``outer_lr``, ``outer_momentum``) or ``"cgad"`` (``outer_lr``
    and the ``cgad_*`` settings; ``outer_momentum`` unused).
    Returns ``dict(params, steps, updates, end_time, merges)`` as the module docstring states.
    Raises ``ValueError`` naming the argument on bad input.
    """
    if outer not in ("nesterov", "cgad"):
        raise ValueError(f"outer={outer!r}: give 'nesterov' or 'cgad'")
    if not (cgad_alpha >= 0 and cgad_cutoff > 0):
        raise ValueError(f"cgad_alpha={cgad_alpha}, cgad_cutoff={cgad_cutoff}: give alpha >= 0 and a cutoff > 0")
    cgad = {"alpha": cgad_alpha, "cutoff": cgad_cutoff, "betas": cgad_betas, "eps": cgad_eps}
    down = {} if down is None else {r: [(float(s), float(e)) for s, e in v] for r, v in down.items()}
    check_world(k, max_steps, slowdown, step_seconds, bandwidth, latency)
    _check(k, H, fragments, quorum, grace, tau, outer_lr, outer_momentum, down)

    shapes = [p.shape for p in TinyNet().parameters()]
    theta = torch.nn.utils.parameters_to_vector(TinyNet().parameters()).detach().clone()
    bounds = fragment_bounds(theta.numel(), fragments)
    sync = _Synchronizer(theta, bounds, outer_lr, outer_momentum, cgad if outer == "cgad" else None)
    learners = _Learners(k, ds, inner, bounds)
    run = _Run(k, slowdown, step_seconds, bandwidth, latency, H, quorum, grace, tau, down, sync, learners)
    ticks = Ticks(max_steps)
    for r in range(k):
        run.events.push(0.0, STEP, r)
    while run.events:
        t, phase, r, payload = run.events.pop()
        if phase == RECEIPT:
            run.receipt(t, r, *payload)
        elif phase == MERGE:
            run.merge(t, r)
        elif phase == PULL:
            run.pull(t, r)
        elif phase == DELIVER:
            run.deliver(t, r, *payload)
        else:
            if payload:  # the pull that ends an absence has arrived
                learners.adopt_pull(r, *payload)
            if not ticks.closed:
                run.step(t, r, ticks)
    chunks = sync.theta.split([math.prod(shape) for shape in shapes])
    params = [chunk.view(shape).clone() for chunk, shape in zip(chunks, shapes, strict=True)]
    return {
        "params": params,
        "steps": list(learners.count),
        "updates": run.updates,
        "end_time": run.end_time,
        "merges": run.merges,
    }
