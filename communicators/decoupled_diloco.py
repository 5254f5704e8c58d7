"""Decoupled DiLoCo (Douillard et al. 2026, "Decoupled DiLoCo for Resilient Distributed
Pre-training", arXiv 2604.21428): learners on their own clocks, never waiting; a synchronizer
that merges the fragments that arrived once a minimum quorum of learners sent one, after an
adaptive grace window, weighting each learner by the steps (tokens) behind its fragment.

- **Fragments.** The trainable parameters, flat in ``model.parameters()`` order, are cut into
  ``fragments`` contiguous slices of near-equal size (the first ``N % P`` one entry longer).
  Fragment ``p`` is due at the offset ``t_p = ((p + 1) H // P) % H``.
- **Learners.** A learner counts its steps ``s`` over the run and, per fragment, the steps
  ``c_p`` since it last adopted that fragment. At the end of step ``s`` it sends its slice of
  every fragment with ``s % H == t_p`` (with ``c_p``) and trains on at once. When a step starts
  it first adopts every merged fragment that has reached it with a version newer than its own:
  it overwrites its slice and sets ``c_p = 0``.
- **Synchronizer.** Per fragment it keeps ``Theta_p``, a Nesterov momentum buffer and the round
  of contributions since its last merge (the latest from each learner). A round opens with its
  first contribution (at ``t_open``); when ``quorum`` learners have contributed (at ``t_q``) the
  merge is set for ``t_q + grace * max(0, tau * step_ref - (t_q - t_open) - sync)`` (the adaptive
  grace window: ``step_ref`` the step seconds of the ``quorum``-th fastest learner, ``sync`` one
  fragment transfer: the upload of the learner that completed the quorum), and takes every
  contribution received by then. With weights ``w_m = c_m / sum c`` (tokens times tokens per
  step, equal batches: steps),
  ``Delta = sum_m w_m (Theta_p - theta_mp)`` and Nesterov SGD:
  ``b = mu b + Delta``, ``Theta_p -= lr (Delta + mu b)``. The merged fragment goes to every
  learner present, one fragment transfer later.
- **Staleness-aware outer optimizer** (``outer="cgad"``, ``communicators.cgad``). Each
  contribution's staleness ``tau_m`` (merges of the fragment since the version the learner held
  when it sent) scales it: ``Delta = sum_m w_m sigma(tau_m) (Theta_p - theta_mp)``, and Adam with
  its own moments and step count per fragment steps ``Theta_p`` on ``Delta``. A merge whose every
  contribution is gated out (``sigma = 0``) leaves ``Theta_p`` and Adam's state as they were.
- **Absences.** From the network's availability trace (``Network(availability=...)``: a node is
  absent from a row's time until its next row): a learner absent at any moment of a step does
  not take it (the work since its last send is lost), sends nothing and drops the fragments that
  reach it; when it returns it pulls the whole model (one transfer) and starts from it. A round
  below quorum waits; the others train on.
- The run's result is the synchronizer's parameters after the drain (contributions in flight
  received, the merges due made).

The synchronizer is the server; each learner runs its steps as tasks of one step each. A learner
is charged its fragments sent, the merged fragments and pulls it receives; only a pull blocks
its steps (it does not wait for the others). Contributions are pseudo-gradients measured from
the synchronizer's own fragment; the paper's radial-directional averaging is not modelled.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

from communicators.aggregation import Rule, describe_rule, is_mean, resolve
from communicators.cgad import CGAD, cgad_scale, check_cgad
from communicators.checks import check_int, check_number
from exogym.core.comm.network import Network
from exogym.core.server import Result, Server, ServerContext, Train

#: ``(start, end)``: simulated seconds a learner is absent, ``end`` excluded (may be ``inf``).
Interval = tuple[float, float]

#: The outer optimizers and their default learning rates.
OUTER_LR = {"nesterov": 0.7, "cgad": 0.1}


def fragment_bounds(n: int, fragments: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each fragment of ``n`` entries: contiguous, near-equal (the first
    ``n % fragments`` one entry longer)."""
    size, extra = divmod(n, fragments)
    cuts = [p * size + min(p, extra) for p in range(fragments + 1)]
    return list(itertools.pairwise(cuts))


def fragment_offsets(H: int, fragments: int) -> list[int]:
    """The step offset ``t_p = ((p + 1) H // P) % H`` at which fragment ``p`` is sent."""
    return [((p + 1) * H // fragments) % H for p in range(fragments)]


def absences(network: Network, num_nodes: int) -> list[list[Interval]]:
    """Per node, the intervals its availability trace makes it absent (none without a trace)."""
    out: list[list[Interval]] = [[] for _ in range(num_nodes)]
    if network.availability is None:
        return out
    for node, points in network.availability.series:
        if node >= num_nodes:
            continue
        start = None
        for t, present in [*points, (math.inf, True)]:  # an absence at the end lasts to math.inf
            if not present and start is None:
                start = t
            elif present and start is not None:
                if t > start:
                    out[node].append((start, t))
                start = None
    return out


class DecoupledDiLoCoServer(Server):
    """Decoupled DiLoCo as a synchronizer and learners (see the module docstring). A learner's
    steps are tasks of one step each from its own parameters (it never waits): the synchronizer
    holds every learner's parameters between its steps, applies the merged fragments that reached
    it before each step, and collects its fragments at the steps they are due.

    Args:
        H: steps between two sends of one fragment.
        fragments: ``P``, the fragments (``1 <= P <= H``).
        quorum: learners whose contribution a merge waits for (``1 <= quorum <=`` the nodes;
            ``None``: half the nodes, at least one).
        grace: ``gamma`` in ``[0, 1)``, the share of the slack the synchronizer waits after the
            quorum (``0``: merge at the quorum).
        tau: the overlap, in steps, the grace window's slack is measured in.
        outer_lr: the synchronizer's learning rate (``None``: 0.7 for Nesterov, 0.1 for CGAD).
        outer_momentum: Nesterov's momentum (``outer="nesterov"`` only).
        outer: the synchronizer's optimizer: ``"nesterov"`` (Nesterov SGD) or ``"cgad"`` (Adam on
            staleness-scaled pseudo-gradients, ``communicators.cgad``).
        cgad_alpha, cgad_cutoff: CGAD's decay per merge of age and the age (merges) from which a
            contribution is gated out (``float("inf")``: no gate); ``outer="cgad"`` only.
        cgad_betas, cgad_eps: CGAD's Adam betas and epsilon; ``outer="cgad"`` only.
        aggregate: how a merge combines its contributions
            ([`communicators.aggregation`][communicators.aggregation]): ``"mean"`` (default, the
            paper's token-weighted mean) or a robust rule, unweighted, on the (staleness-scaled)
            pseudo-gradients; the run's adversaries attack the contributions of malicious learners.
    """

    kinds = ("contribution", "merge", "pull", "deliver", "restore")
    drain_kinds = frozenset({"contribution", "merge"})
    #: Learners absent in the network's availability trace take no steps and send nothing.
    follows_availability = True

    def __init__(
        self,
        H: int,
        fragments: int = 1,
        quorum: int | None = None,
        grace: float = 0.5,
        tau: int = 2,
        outer_lr: float | None = None,
        outer_momentum: float = 0.9,
        outer: str = "nesterov",
        cgad_alpha: float = 0.1,
        cgad_cutoff: float = 16,
        cgad_betas: tuple[float, float] = (0.9, 0.999),
        cgad_eps: float = 1e-8,
        aggregate: str | Rule = "mean",
    ) -> None:
        super().__init__()
        #: The aggregation rule (``aggregate``).
        self.rule = resolve(aggregate)
        check_int("H", H)
        check_int("fragments", fragments)
        check_int("quorum", quorum, none="half the nodes")
        check_int("tau", tau, 0)
        if fragments > H:
            raise ValueError(f"fragments must be at most H={H} (one fragment due per step at most), got {fragments}")
        check_number("grace", grace, 0, 1, "the share of the slack waited")
        if outer not in OUTER_LR:
            raise ValueError(f"outer must be one of {sorted(OUTER_LR)} (the synchronizer's optimizer), got {outer!r}")
        outer_lr = OUTER_LR[outer] if outer_lr is None else outer_lr
        check_number("outer_lr", outer_lr, 0, why="None: the outer optimizer's default", above=True)
        check_number("outer_momentum", outer_momentum, 0, 1)
        check_cgad(cgad_alpha, cgad_cutoff, cgad_betas, cgad_eps)
        self.sync_steps, self.fragments, self.quorum, self.grace, self.tau = H, fragments, quorum, grace, tau
        self.outer, self.outer_lr, self.outer_momentum = outer, outer_lr, outer_momentum
        self.cgad_alpha, self.cgad_cutoff = cgad_alpha, cgad_cutoff
        self.cgad_betas, self.cgad_eps = cgad_betas, cgad_eps

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        k, P, n = ctx.num_clients, self.fragments, self.params.numel()
        if P > n:
            raise ValueError(f"fragments={P} is more than the model's {n} trainable entries")
        self._quorum = self.quorum if self.quorum is not None else max(1, k // 2)
        if self._quorum > k:
            raise ValueError(f"quorum={self.quorum} is more than num_nodes={k} (each node is a learner)")
        self.bounds = fragment_bounds(n, P)
        self.offsets = fragment_offsets(self.sync_steps, P)
        self.down = absences(ctx.network, k)
        # A fragment's share of a model's bytes on the wire (``ctx.nbytes``: a scale's target's).
        self.fragment_bytes = [ctx.nbytes * (b - a) // n for a, b in self.bounds]
        # Per learner and fragment: its contribution's transfer (up) and a merged fragment's (down).
        self.fragment_up, self.fragment_down = (
            [[ctx.transfer_seconds(r, nb, direction=d) for nb in self.fragment_bytes] for r in range(k)]
            for d in ("up", "down")
        )
        self.pull_seconds = [ctx.transfer_seconds(r, direction="down") for r in range(k)]
        self.step_seconds = [ctx.step_seconds(r) for r in range(k)]
        self.step_ref = sorted(self.step_seconds)[self._quorum - 1]
        cgad = self.outer == "cgad"
        self.momentum = None if cgad else torch.zeros_like(self.params)
        self.cgad = CGAD(self.params, P, self.outer_lr, self.cgad_betas, self.cgad_eps) if cgad else None
        #: Per learner: its parameters, steps, sends, steps since each fragment was adopted (c)
        #: and the version of each it holds (v), the newest that reached it, and those in its inbox.
        self.learner = [self.params.clone() for _ in range(k)]
        self.steps_taken, self.sends = [0] * k, [0] * k
        self.c = [[0] * P for _ in range(k)]
        self.v = [[0] * P for _ in range(k)]
        self.arrived = [[0] * P for _ in range(k)]
        self.inbox: list[dict[int, dict[int, torch.Tensor]]] = [{} for _ in range(k)]
        #: Per fragment: its merges so far, the contributions of its open round, when it opened.
        self.version = [0] * P
        self.round: list[dict[int, tuple]] = [{} for _ in range(P)]
        self.opened, self.merging = [0.0] * P, [False] * P
        #: With a robust rule or adversaries, a merge gathers its contributions as rows.
        self.keeps_rows = not is_mean(self.rule) or ctx.adversaries is not None

    def aggregation_group(self, num_clients: int, attacked: bool) -> int:
        """The fewest contributions a merge's rule combines: the quorum's."""
        return self.quorum if self.quorum is not None else max(1, num_clients // 2)

    def _slice(self, t: torch.Tensor, p: int) -> torch.Tensor:
        a, b = self.bounds[p]
        return t[a:b]

    def _step_or_leave(self, r: int, adopt: bool) -> None:
        """Learner ``r`` takes its next step at once, or, absent during it, pulls the model when it
        returns."""
        t, d = self.now, self.step_seconds[r]  # the step would take [t, t + d)
        span = next(((a, b) for a, b in self.down[r] if a < t + d and b > t), None)  # the first absence in it
        if span is None:
            state = (lambda: self._adopt(r)) if adopt else self.learner[r]
            self.send(r, Train(1), state=state, transfer=False, upload=False)
        elif not math.isinf(span[1]):
            self.schedule(span[1] - self.now, "pull", r)

    def _adopt(self, r: int) -> torch.Tensor:
        """Learner ``r``'s parameters with the newest merged fragments that reached it."""
        for p, version in enumerate(self.arrived[r]):
            if version > self.v[r][p]:
                box = self.inbox[r][p]
                self._slice(self.learner[r], p).copy_(box[version])
                self.inbox[r][p] = {v: merged for v, merged in box.items() if v > version}
                self.v[r][p], self.c[r][p] = version, 0
        return self.learner[r]

    def start(self) -> None:
        for r in range(self.ctx.num_clients):
            self._step_or_leave(r, adopt=False)

    def on_result(self, result: Result) -> None:
        r = result.client
        self.learner[r] = result.local.clone()
        self.steps_taken[r] += 1
        s = self.steps_taken[r]
        c = self.c[r] = [n + 1 for n in self.c[r]]
        for p, offset in enumerate(self.offsets):
            if s % self.sync_steps == offset:
                sent = self._slice(self.learner[r], p).clone()
                self.transfer(r, sent=self.fragment_bytes[p])  # it trains on meanwhile
                self.schedule(self.fragment_up[r][p], "contribution", r, p, c[p], self.v[r][p], sent)
                self.sends[r] += 1
        self._step_or_leave(r, adopt=True)

    def on_contribution(self, r: int, p: int, c: int, v: int, sent: torch.Tensor) -> None:
        contributions = self.round[p]
        if not contributions:
            self.opened[p] = self.now
        contributions[r] = (c, v, self.now, sent)  # a later contribution replaces the learner's earlier
        if not self.merging[p] and len(contributions) >= self._quorum:
            self.merging[p] = True
            slack = self.tau * self.step_ref - (self.now - self.opened[p]) - self.fragment_up[r][p]
            self.schedule(self.grace * max(0.0, slack), "merge", p)

    def on_merge(self, p: int) -> None:
        contributions = sorted(self.round[p].items())
        total = float(sum(c for _, (c, _, _, _) in contributions))
        theta = self._slice(self.params, p)
        delta = torch.zeros_like(theta)
        scales, rows = [], []
        for r, (c, v, received, sent) in contributions:
            staleness = self.version[p] - v
            self.record_update(r, staleness, received)
            scale = cgad_scale(staleness, self.cgad_alpha, self.cgad_cutoff) if self.cgad is not None else 1.0
            scales.append(scale)
            if self.keeps_rows:
                rows.append((theta - sent) * scale)
            else:
                delta.add_((theta - sent) * (float(c) / total * scale))
        if self.keeps_rows:
            weights = torch.tensor([float(c) / total for _, (c, _, _, _) in contributions], dtype=theta.dtype)
            delta = self._aggregate(p, [r for r, _ in contributions], torch.stack(rows), weights)
        if self.cgad is None:
            assert self.momentum is not None
            buf = self._slice(self.momentum, p)
            buf.mul_(self.outer_momentum).add_(delta)
            theta.add_(delta.add(buf, alpha=self.outer_momentum), alpha=-self.outer_lr)
        elif any(s > 0 for s in scales):  # all gated out: nothing arrived to step on
            self.cgad.step(p, self.bounds[p], theta, delta)
        self.version[p] += 1
        self.round[p], self.merging[p] = {}, False
        weights = tuple(float(c) / total for _, (c, _, _, _) in contributions)
        self.record("merges", self.now, p, tuple(r for r, _ in contributions), weights)
        merged = theta.clone()  # (read only by the learners it reaches)
        for r in range(self.ctx.num_clients):
            arrival = self.now + self.fragment_down[r][p]
            if not any(a <= arrival < b for a, b in self.down[r]):  # a learner absent then drops it
                self.schedule(self.fragment_down[r][p], "deliver", r, p, self.version[p], merged)

    def _aggregate(self, p: int, learners: list[int], rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """A merge's pseudo-gradient from its contributions ``rows`` (the malicious learners'
        attacked first, at step ``merges of p * H``): the ``weights``' mean, or the rule."""
        adversaries = self.ctx.adversaries
        if adversaries is not None:
            rows = adversaries.attack_rows(rows, learners, self.version[p] * self.sync_steps, f"decoupled_{p}")
        return weights @ rows if is_mean(self.rule) else self.rule(rows).to(rows.dtype)

    def on_deliver(self, r: int, p: int, version: int, merged: torch.Tensor) -> None:
        self.transfer(r, received=self.fragment_bytes[p])  # it trains on meanwhile
        self.arrived[r][p] = max(self.arrived[r][p], version)
        self.inbox[r].setdefault(p, {})[version] = merged

    def on_pull(self, r: int) -> None:
        self.schedule(self.pull_seconds[r], "restore", r, tuple(self.version), self.params.clone())

    def on_restore(self, r: int, versions: tuple[int, ...], model: torch.Tensor) -> None:
        self.transfer(r, received=self.ctx.nbytes, seconds=self.pull_seconds[r])  # it waited for the model
        self.learner[r] = model
        self.v[r] = list(versions)
        self.c[r] = [0] * self.fragments
        # what reached it before is older than the pull
        self.inbox[r] = {p: {v: m for v, m in box.items() if v > versions[p]} for p, box in self.inbox[r].items()}
        self._step_or_leave(r, adopt=True)

    def summary(self) -> dict[str, Any]:
        """The merges: their number and the mean number of learners a merge takes; with CGAD,
        ``gated``: the merged contributions at or past the cutoff (scaled to zero)."""
        merges = self.records.get("merges", [])
        out: dict[str, Any] = {
            "merges": len(merges),
            "learners_per_merge": sum(len(m[2]) for m in merges) / len(merges) if merges else 0.0,
        }
        if self.cgad is not None:
            out["gated"] = sum(1 for _, _, tau in self.updates if tau >= self.cgad_cutoff)
        return out

    def state_dict(self) -> dict[str, Any]:
        kept = ("learner", "steps_taken", "sends", "c", "v", "arrived", "version", "opened", "merging", "momentum")
        return {
            **{k: getattr(self, k) for k in kept},
            "inbox": [{p: dict(box) for p, box in boxes.items()} for boxes in self.inbox],
            "round": [{r: tuple(m) for r, m in contributions.items()} for contributions in self.round],
            "cgad": None if self.cgad is None else self.cgad.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner = [t.clone() for t in state["learner"]]
        for k in ("steps_taken", "sends", "version", "opened", "merging"):
            setattr(self, k, list(state[k]))
        self.c, self.v, self.arrived = ([list(x) for x in state[k]] for k in ("c", "v", "arrived"))
        self.inbox = [
            {int(p): {int(v): t for v, t in box.items()} for p, box in boxes.items()} for boxes in state["inbox"]
        ]
        self.round = [{int(r): tuple(m) for r, m in contributions.items()} for contributions in state["round"]]
        if self.cgad is not None:
            self.cgad.load_state_dict(state["cgad"])
        else:
            assert self.momentum is not None
            self.momentum.copy_(state["momentum"])

    def describe(self) -> str:
        outer = f"outer_lr={self.outer_lr}, outer_momentum={self.outer_momentum}"
        if self.outer == "cgad":
            outer = (
                f"outer='cgad', outer_lr={self.outer_lr}, cgad_alpha={self.cgad_alpha}, "
                f"cgad_cutoff={self.cgad_cutoff}, cgad_betas={self.cgad_betas}, cgad_eps={self.cgad_eps}"
            )
        return (
            f"DecoupledDiLoCo(H={self.sync_steps}, fragments={self.fragments}, quorum={self.quorum}, "
            f"grace={self.grace}, tau={self.tau}, {outer}" + describe_rule(self.rule) + ")"
        )


__all__ = [
    "DecoupledDiLoCoServer",
    "absences",
    "fragment_bounds",
    "fragment_offsets",
]
