"""Aggregation rules: how the updates of ``n`` nodes become one.

A rule is a function ``rule(updates) -> aggregate`` of a ``[n, d]`` tensor (one row per node,
each a flat update: gradients, pseudo-gradients or model deltas) returning a ``[d]`` tensor. A
strategy's ``aggregate`` names one (``"mean"``, ``"median"``, ``"trimmed_mean"``, ``"krum"``,
``"multi_krum"``, ``"centered_clip"``) or is a function of your own with that signature; a rule's
parameters are bound with ``functools.partial`` (``partial(trimmed_mean, beta=0.25)``).

Every rank computes the rule on the same rows, so the result is the same everywhere. ``mean``
is an all-reduce; every other rule needs each node's update and is an all-gather, and the ledger
charges it as one (see [`aggregate_all_reduce`][communicators.aggregation.aggregate_all_reduce]).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from exogym.core.comm.entries import Entries
from exogym.core.comm.handles import CollectiveHandle, start
from exogym.privacy import DifferentialPrivacy, clip_, gaussian

#: A rule: ``[n, d]`` updates -> ``[d]`` aggregate.
Rule = Callable[[torch.Tensor], torch.Tensor]


def mean(updates: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise mean: the plain average every method uses by default."""
    return updates.mean(0)


def median(updates: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise median (Yin et al. 2018, arXiv 1803.01498): for an even ``n`` the
    mean of the two middle values."""
    n = updates.shape[0]
    ordered = updates.sort(0).values
    if n % 2:
        return ordered[n // 2].clone()
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def trimmed_mean(updates: torch.Tensor, beta: float = 0.25) -> torch.Tensor:
    """The coordinate-wise trimmed mean (Yin et al. 2018): per coordinate, drop the ``floor(beta
    n)`` largest and as many smallest values and average the rest.

    Raises:
        ValueError: ``beta`` outside ``[0, 0.5)`` or one that leaves no value.
    """
    n = updates.shape[0]
    if not 0 <= beta < 0.5:
        raise ValueError(f"trimmed_mean: beta (the fraction trimmed at each end) must be in [0, 0.5), got {beta}")
    k = math.floor(beta * n)
    if n - 2 * k < 1:
        raise ValueError(f"trimmed_mean: beta={beta} trims every one of {n} updates")
    return updates.sort(0).values[k : n - k].mean(0)


def krum_scores(updates: torch.Tensor, f: int) -> torch.Tensor:
    """Krum's score of each update (Blanchard et al. 2017): the sum of its squared distances to
    its ``n - f - 2`` nearest other updates."""
    n = updates.shape[0]
    if n - f - 2 < 1:
        raise ValueError(f"krum needs n > f + 2 updates (f: the malicious ones it tolerates), got n={n}, f={f}")
    distances = torch.cdist(updates.double(), updates.double()).pow(2)
    distances.fill_diagonal_(math.inf)
    return distances.sort(1).values[:, : n - f - 2].sum(1)


def default_f(n: int) -> int:
    """The most malicious updates Krum tolerates among ``n``: ``f`` with ``2 f + 2 < n``."""
    return max(0, (n - 3) // 2)


def krum(updates: torch.Tensor, f: int | None = None) -> torch.Tensor:
    """Krum (Blanchard et al. 2017, NeurIPS): the update with the lowest score (``krum_scores``);
    ``f`` defaults to ``default_f(n)``. Ties go to the lowest row."""
    f = default_f(updates.shape[0]) if f is None else f
    return updates[int(torch.argmin(krum_scores(updates, f)))].clone()


def multi_krum(updates: torch.Tensor, f: int | None = None, m: int | None = None) -> torch.Tensor:
    """Multi-Krum (Blanchard et al. 2017): the mean of the ``m`` updates with the lowest scores
    (``m`` defaults to ``n - f``). ``m = 1`` is Krum."""
    n = updates.shape[0]
    f = default_f(n) if f is None else f
    m = n - f if m is None else m
    if not 1 <= m <= n:
        raise ValueError(f"multi_krum: m (updates averaged) must be in [1, {n}], got {m}")
    chosen = torch.argsort(krum_scores(updates, f), stable=True)[:m]
    return updates[chosen].mean(0)


def centered_clip(
    updates: torch.Tensor, tau: float = 1.0, iterations: int = 3, center: torch.Tensor | None = None
) -> torch.Tensor:
    """Centered clipping (Karimireddy, He and Jaggi 2021, ICML): from ``v = center``,
    ``iterations`` times ``v <- v + mean_i (x_i - v) min(1, tau / ||x_i - v||)``. ``center``
    defaults to the coordinate-wise median (the paper starts from the previous aggregate; a
    stateless rule has none)."""
    if not tau > 0:
        raise ValueError(f"centered_clip: tau (the clipping radius) must be > 0, got {tau}")
    v = median(updates) if center is None else center.clone()
    for _ in range(iterations):
        diff = updates - v
        norms = diff.norm(dim=1, keepdim=True)
        scale = torch.clamp(tau / norms.clamp_min(torch.finfo(updates.dtype).tiny), max=1.0)
        v = v + (diff * scale).mean(0)
    return v


#: The rules by name (``aggregate="..."``).
RULES: dict[str, Rule] = {
    "mean": mean,
    "median": median,
    "trimmed_mean": trimmed_mean,
    "krum": krum,
    "multi_krum": multi_krum,
    "centered_clip": centered_clip,
}


def resolve(aggregate: str | Rule, argument: str = "aggregate") -> Rule:
    """The rule ``aggregate`` names (``RULES``), or ``aggregate`` itself when it is callable.

    Raises:
        ValueError: an unknown name, naming ``argument`` and the choices.
    """
    if callable(aggregate):
        return aggregate
    if isinstance(aggregate, str) and aggregate in RULES:
        return RULES[aggregate]
    raise ValueError(
        f"{argument}={aggregate!r} is not an aggregation rule; choose from {sorted(RULES)} "
        "or pass a function of a [n, d] tensor returning a [d] tensor"
    )


def is_mean(rule: Rule) -> bool:
    """Whether ``rule`` is the plain mean (an all-reduce; any other rule is an all-gather)."""
    return rule is mean or (isinstance(rule, functools.partial) and rule.func is mean)


def rule_name(rule: Rule) -> str:
    """A rule's name for captions and tables."""
    base = rule.func if isinstance(rule, functools.partial) else rule
    name = getattr(base, "__name__", type(base).__name__)
    if isinstance(rule, functools.partial) and rule.keywords:
        return f"{name}({', '.join(f'{k}={v}' for k, v in rule.keywords.items())})"
    return name


def describe_rule(rule: Rule) -> str:
    """``", aggregate=<name>"`` for a module's ``describe()``; nothing for the mean."""
    return "" if is_mean(rule) else f", aggregate={rule_name(rule)}"


def group_of(rank: int, num_nodes: int, groups: Sequence[Sequence[int]] | None) -> tuple[int, ...]:
    """The ranks of ``rank``'s group (``groups``: a partition of the ranks; ``None``: everyone)."""
    if groups is None:
        return tuple(range(num_nodes))
    return next(tuple(g) for g in groups if rank in g)


def aggregate_all_reduce(
    ctx: Any,
    flat: torch.Tensor,
    rule: Rule,
    step: int,
    tag: str = "",
    groups: Sequence[Sequence[int]] | None = None,
    privacy: DifferentialPrivacy | None = None,
    offset: torch.Tensor | None = None,
    entries: Entries | None = None,
    async_op: bool = False,
) -> torch.Tensor | CollectiveHandle:
    """Replace ``flat`` (this node's update, one flat tensor) by the aggregate of its group's
    updates under ``rule``, in place. Collective: every rank of the group calls it. A module of
    your own that aggregates through it keeps its rule as ``self.rule``: ``fit(adversaries=...)``
    looks for a module with one (the attacks act here).

    The plain ``mean`` with no attack acting is the all-reduce every averaging module makes (the
    same bits). Otherwise every rank gathers the group's updates (``[n, d]``), the run's
    adversaries (``ctx.adversaries``) replace their rows
    ([`AdversaryPlan.attack_rows`][exogym.adversaries.AdversaryPlan.attack_rows]) and ``rule``
    runs on the rows. The ledger charges what the rule needs on the wire: an all-reduce of
    ``flat``'s bytes for the mean, an all-gather of them for any other rule (the bytes a wire
    transform such as ``QuantizeCommunicator`` sends for them, where one wraps the module).

    With ``privacy`` ([`DifferentialPrivacy`][exogym.privacy.DifferentialPrivacy]) each
    node's update is clipped first, and the noise is added to it (``side="client"``) or to the
    aggregate (``side="server"``). ``offset``: where the nodes' values are parameters, their last
    average (the same on every rank of the group): the attack and the rule act on the updates
    ``values - offset``, and the result is ``offset`` plus their aggregate. ``entries``: which
    of the model's entries ``flat`` holds, for a wire transform of the mean's all-reduce.

    ``async_op=True``: as a collective started with it, a
    [`CollectiveHandle`][exogym.strategy.CollectiveHandle]: the aggregate is computed at the
    call, its bytes charged then, and the handle's ``wait()`` writes it into ``flat`` when its
    transfer has arrived on the node's clock.
    """
    adversaries = getattr(ctx, "adversaries", None)
    attacked = adversaries is not None and adversaries.active(step)
    if async_op:
        if is_mean(rule) and not attacked and privacy is None:
            return ctx.comm.all_reduce(flat, op="mean", groups=groups, tag=tag, entries=entries, async_op=True)
        return start(
            ctx.comm,
            "all_reduce",
            flat,
            lambda copy: aggregate_all_reduce(ctx, copy, rule, step, tag, groups, privacy, offset, entries),
        )
    if privacy is not None:
        clip_(flat, privacy.clip)
        if privacy.side == "client" and privacy.noise_multiplier > 0:
            std = privacy.noise_multiplier * privacy.clip
            flat.add_(gaussian(flat.shape, std, ctx.seed, "dp", ctx.rank, step, tag, dtype=flat.dtype))
    if is_mean(rule) and not attacked:
        ctx.comm.all_reduce(flat, op="mean", groups=groups, tag=tag, entries=entries)
    else:
        members = group_of(ctx.rank, ctx.num_nodes, groups)
        rows = ctx.comm.all_gather(flat, groups=groups, charge=False)
        if offset is not None:
            rows = rows - offset
        if attacked:
            rows = adversaries.attack_rows(rows, members, step, tag)
        flat.copy_(rule(rows).to(flat.dtype) if offset is None else offset + rule(rows).to(flat.dtype))
        kind = "all_reduce" if is_mean(rule) else "all_gather"
        ctx.comm.charge(kind, len(members), *ctx.comm.wire_payload(flat, tag), members=members)
    if privacy is not None and privacy.side == "server" and privacy.noise_multiplier > 0:
        members = group_of(ctx.rank, ctx.num_nodes, groups)
        std = privacy.noise_multiplier * privacy.clip / len(members)  # the sum's noise, over n
        flat.add_(gaussian(flat.shape, std, ctx.seed, "dp-server", members, step, tag, dtype=flat.dtype))
    return flat


__all__ = [
    "RULES",
    "aggregate_all_reduce",
    "group_of",
    "Rule",
    "centered_clip",
    "default_f",
    "describe_rule",
    "is_mean",
    "krum",
    "krum_scores",
    "mean",
    "median",
    "multi_krum",
    "resolve",
    "rule_name",
    "trimmed_mean",
]
