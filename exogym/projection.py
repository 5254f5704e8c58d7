"""Projecting a proxy's payloads onto a scale's target: the bytes a run charges at ``Scale``.

Before a scaled run, ``probe`` runs the strategy twice side by side on one simulated node, with
collectives that move nothing: once on the proxy (the model being trained) and once on the
target (``Scale.target_model``: its tensors on the ``meta`` device, exact shapes and no memory).
Both make the same collectives in the same order, since what a strategy sends depends on the
tensors' shapes and the step, not their values; the probe pairs them and keeps, per
``(tag, kind, proxy payload)``, the payload the target sends there. The run's ledgers then
record every collective with the target's payload (``Projection.payload``): its bytes on the
wire and its simulated seconds are the target's, and the learning stays the proxy's.

The probe runs three windows of the run (``probe_schedule``: its start, middle and end, each six
times the longest communication period, so that slower schedules such as DES-LOC's moments
appear; a step that communicates costs a few milliseconds to a second on a 10B target, so at most
``MAX_PROBED_ROUNDS`` of them per window). A payload the probe did
not meet is projected by its tag's ratio (target over proxy bytes, over the pairs of that tag),
or else by the ratio of the target's parameter bytes to the proxy's.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from exogym.core.comm.comm import NodeComm
from exogym.core.comm.ledger import CollectiveRecord, wire_bytes
from exogym.core.comm.transport import Transport
from exogym.runtime.faults import round_steps
from exogym.scale import Scale

logger = logging.getLogger(__name__)

#: Steps that communicate, at most, in each window of a probe.
MAX_PROBED_ROUNDS = 4


class NullTransport(Transport):
    """Collectives that move nothing: every rank's values are taken to be this rank's (what a
    payload's size needs, not its values)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def all_reduce(self, tensor: torch.Tensor, op: str, members: Sequence[int] | None = None) -> None:
        return None

    def all_gather(self, tensor: torch.Tensor, members: Sequence[int] | None = None) -> torch.Tensor:
        n = len(members) if members is not None else self.world_size
        return tensor.unsqueeze(0).expand(n, *tensor.shape).clone()

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        return None

    def barrier(self) -> None:
        return None


Call = tuple[str, str, int]  # (tag, kind, payload bytes)


@dataclass
class Projection:
    """The target's collectives for the proxy's (plain data: it travels to the nodes).

    Attributes:
        steps: a step's collectives on the proxy -> the target's at that step, where the two
            differ in number or kind (a small tensor the proxy sends dense, say, that the
            target compresses).
        pairs: ``(tag, kind, proxy payload) -> target payload`` met by the probe (the mean
            where one key met several).
        tag_ratio: per tag, target bytes over proxy bytes of its pairs.
        ratio: the target's parameter bytes over the proxy's (anything else).
        scale: the scale in words (``Scale.describe``).
    """

    steps: dict[tuple[Call, ...], tuple[Call, ...]] = field(default_factory=dict)
    pairs: dict[Call, int] = field(default_factory=dict)
    tag_ratio: dict[str, float] = field(default_factory=dict)
    ratio: float = 1.0
    scale: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain values for logs: the scale, the parameter ratio and the projected pairs."""
        return {
            "scale": self.scale,
            "ratio": self.ratio,
            "pairs": [[tag, kind, proxy, target] for (tag, kind, proxy), target in self.pairs.items()],
        }

    def payload(self, tag: str, kind: str, payload: int) -> int:
        """The target's bytes for a collective the proxy makes with ``payload`` bytes."""
        hit = self.pairs.get((tag, kind, payload))
        if hit is not None:
            return hit
        return int(round(payload * self.tag_ratio.get(tag, self.ratio)))

    def step(self, calls: tuple[Call, ...], records: list[CollectiveRecord]) -> list[CollectiveRecord] | None:
        """The target's records for a step whose collectives on the proxy were ``calls`` and
        are ``records`` (their payloads already projected), where the target makes other
        collectives there; ``None`` where it makes the same ones. Each of the target's takes the
        group, members and timing of the proxy's of the same tag and kind (else the first)."""
        theirs = self.steps.get(calls)
        if theirs is None:
            return None
        out = []
        for tag, kind, payload in theirs:
            like = next((r for r in records if r.tag == tag and r.kind == kind), records[0])
            out.append(_resized(dataclasses.replace(like, kind=kind, tag=tag), payload))
        return out


def _resized(record: CollectiveRecord, payload: int) -> CollectiveRecord:
    """``record`` with ``payload`` bytes (and the bytes sent and received that follow)."""
    root = record.sent > 0 and record.kind == "broadcast"
    sent, received = wire_bytes(record.kind, record.group_size, payload, root)
    return dataclasses.replace(record, payload=payload, sent=sent, received=received)


def param_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s trainable parameters."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def probe_schedule(strategy: Any, max_steps: int) -> list[list[int]]:
    """The steps a probe runs: three windows, at the start, the middle and the end of the run
    (a schedule may change over it: PowerSGD's dense warm-up), each six times the longest period
    of the strategy's communicators plus two steps (at least 8), in order, without repeats."""
    width = max(8, 6 * round_steps(strategy) + 2)
    windows: list[list[int]] = []
    done = 0
    for start in (0, max_steps // 2, max_steps - width):
        window = list(range(max(start, done), min(start + width, max_steps)))
        if window:
            windows.append(window)
            done = window[-1] + 1
    return windows


class _Probe:
    """One copy of the strategy on one model, with a null transport."""

    def __init__(self, strategy: Any, model: torch.nn.Module, num_nodes: int, max_steps: int, seed: int) -> None:
        self.strategy = copy.deepcopy(strategy)
        self.comm = NodeComm(0, num_nodes, NullTransport(num_nodes))
        self.strategy._attach(self.comm, max_steps, seed, max(1, max_steps), None)
        self.strategy._init_node(model, 0, num_nodes)
        optim = self.strategy.optim
        first = optim.step

        def step_once(*args: Any, **kwargs: Any) -> Any:
            # The first step makes the optimizer's state (which some modules average); the
            # values of later ones do not change a payload's size.
            optim.step = lambda *args, **kwargs: None
            return first(*args, **kwargs)

        optim.step = step_once
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)

    def step(self) -> list[Any]:
        self.strategy.step()
        return self.comm.ledger.end_step()


def probe(strategy: Any, proxy: torch.nn.Module, scale: Scale, num_nodes: int, max_steps: int, seed: int) -> Projection:
    """The projection of ``strategy``'s payloads from ``proxy`` onto ``scale``'s target (see the
    module docstring). ``strategy`` is not bound (a copy is). A strategy that cannot run on the
    target's meta tensors (one that reads their values, e.g. ``.item()``) is projected by the
    ratio of parameter bytes, with a warning naming the error."""
    target = scale.target_model()
    ratio = param_bytes(target) / max(1, param_bytes(proxy))
    try:
        return dataclasses.replace(
            _pair(strategy, proxy, target, ratio, num_nodes, max_steps, seed), scale=scale.describe()
        )
    except Exception as e:  # noqa: BLE001 - reported, and the run goes on with the ratio
        logger.warning(
            "scale: %s could not run on the target's meta tensors (%s: %s); its payloads are projected by the ratio "
            "of parameter bytes (%.3g)",
            type(strategy).__name__,
            type(e).__name__,
            e,
            ratio,
        )
        return Projection(ratio=ratio, scale=scale.describe())


def _pair(
    strategy: Any,
    proxy: torch.nn.Module,
    target: torch.nn.Module,
    ratio: float,
    num_nodes: int,
    max_steps: int,
    seed: int,
) -> Projection:
    small = _Probe(strategy, copy.deepcopy(proxy).cpu(), num_nodes, max_steps, seed)
    large = _Probe(strategy, target, num_nodes, max_steps, seed)
    seen: dict[Call, list[int]] = defaultdict(list)
    per_tag: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    steps: dict[tuple[Call, ...], tuple[Call, ...]] = {}
    for window in probe_schedule(strategy, max_steps):
        _probe_window(small, large, window, seen, per_tag, steps)
    pairs = {key: int(round(sum(v) / len(v))) for key, v in seen.items()}
    tag_ratio = {tag: b / a for tag, (a, b) in per_tag.items() if a > 0 and b > 0}
    return Projection(steps, pairs, tag_ratio, ratio)


def _probe_window(
    small: _Probe,
    large: _Probe,
    window: list[int],
    seen: dict[Call, list[int]],
    per_tag: dict[str, list[int]],
    steps: dict[tuple[Call, ...], tuple[Call, ...]],
) -> None:
    """Run both copies over the steps of ``window`` (at most ``MAX_PROBED_ROUNDS`` that
    communicate) and pair what they send."""
    rounds = 0
    for step in window:
        for p in (small, large):
            p.strategy.skip_steps(step - p.strategy.local_step)
        ours, theirs = small.step(), large.step()
        if [(a.tag, a.kind) for a in ours] != [(b.tag, b.kind) for b in theirs]:
            steps[tuple((a.tag, a.kind, a.payload) for a in ours)] = tuple((b.tag, b.kind, b.payload) for b in theirs)
        else:
            for a, b in zip(ours, theirs, strict=True):
                seen[(a.tag, a.kind, a.payload)].append(b.payload)
        for tag, size, i in [(a.tag, a.payload, 0) for a in ours] + [(b.tag, b.payload, 1) for b in theirs]:
            per_tag[tag][i] += size
        rounds += bool(ours)
        if rounds >= MAX_PROBED_ROUNDS:
            return


__all__ = ["MAX_PROBED_ROUNDS", "NullTransport", "Projection", "param_bytes", "probe", "probe_schedule"]
