"""Event-driven references for ExoGym's asynchronous algorithms: the test oracles of their presets.

Plain Python and plain torch, written from the papers and from the timing model below, and
nothing else of ExoGym: a heap of timed events (``heapq``) drives K copies of
``tests.helpers.TinyNet`` and one server. ``async_diloco.py`` and ``fedbuff.py`` state each
algorithm's update rule; this module holds the timing model they share.

Timing model
------------
* K nodes; node ``r``'s training step lasts ``step_seconds * slowdown[r]`` simulated seconds
  (a node of speed ``v`` has slowdown ``1 / v``).
* One global server. A transfer of ``b`` bytes between a node and the server, either way, takes
  ``latency + 8 * b / bandwidth`` seconds (``bandwidth`` in bit/s; ``float("inf")`` makes it
  ``latency``). Pushes and pulls both carry the trainable parameters in float32: ``b = 4 * P``.
* Events at one simulated instant run in this order: (1) server receipts of pushes, by
  ascending rank; (2) server replies (pulls served), by ascending rank; (3) nodes starting
  steps. A pull served at ``t`` returns the server state after every push received at ``<= t``.
* Tick ``k`` is the ``k``-th distinct instant at which some node starts a training step. A run
  of ``max_steps`` executes exactly the steps that start at the first ``max_steps`` ticks (all
  nodes starting at one instant step together). It then drains: each push whose last local step
  was executed is delivered and applied, in the order above; nothing else happens.
* Data: node ``r``'s ``k``-th step uses the ``k``-th batch of ``node_batches(ds, K, r)``; the
  loss is ``model(batch)``.

Every reference returns ``dict(params, steps, updates, end_time)``: the server's parameters
after the drain (a list of tensors in ``model.parameters()`` order), the number of steps each
node took, the applied updates as ``(receipt time, rank, staleness)`` in the order applied, and
the last instant at which anything happened (the end of the last executed step or the last
receipt, whichever is later).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from tests.helpers import node_batches

#: Phases of the events at one instant, in the order they run.
RECEIPT, REPLY, STEP = 0, 1, 2

_INNER = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}


class Events:
    """A heap of timed events ordered by ``(time, phase, rank, insertion)``."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int, tuple[Any, ...]]] = []
        self._count = 0

    def push(self, time: float, phase: int, rank: int, *payload: Any) -> None:
        heapq.heappush(self._heap, (time, phase, rank, self._count, payload))
        self._count += 1

    def pop(self) -> tuple[float, int, int, tuple[Any, ...]]:
        time, phase, rank, _, payload = heapq.heappop(self._heap)
        return time, phase, rank, payload

    def __bool__(self) -> bool:
        return bool(self._heap)


class Ticks:
    """Admits the step starts of the first ``max_steps`` ticks; ``admit`` is called in time order."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps, self.count, self.last, self.closed = max_steps, 0, None, False

    def admit(self, time: float) -> bool:
        """Whether a step starting at ``time`` executes (False from the first refused one on)."""
        if self.closed:
            return False
        if time != self.last:
            if self.count == self.max_steps:
                self.closed = True
                return False
            self.count, self.last = self.count + 1, time
        return True


def transfer_seconds(params: Sequence[torch.Tensor], latency: float, bandwidth: float) -> float:
    """Seconds one transfer of ``params`` in float32 takes: ``latency + 8 * 4P / bandwidth``."""
    return latency + 8 * 4 * sum(p.numel() for p in params) / bandwidth


def batch_stream(ds: Any, k: int, rank: int) -> Iterator[Any]:
    """Node ``rank``'s batches in order; raises ``ValueError`` when the shard runs out."""
    yield from node_batches(ds, k, rank)
    raise ValueError(f"node {rank} ran out of batches: give the reference a dataset with more examples")


def inner_optimizer(inner: tuple[str, dict[str, Any]], params: Any) -> torch.optim.Optimizer:
    """``torch.optim.SGD`` or ``torch.optim.AdamW`` from ``("sgd" | "adamw", kwargs)``."""
    name, kwargs = inner
    if name not in _INNER:
        raise ValueError(f"inner={inner!r}: the optimizer name must be one of {sorted(_INNER)}")
    return _INNER[name](params, **kwargs)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Any) -> None:
    """One inner step: ``zero_grad``, ``model(batch).backward()``, ``opt.step()``."""
    opt.zero_grad()
    model(batch).backward()
    opt.step()


def check_world(
    k: int, max_steps: int, slowdown: Sequence[float], step_seconds: float, bandwidth: float, latency: float
):
    """Raise ``ValueError`` naming the argument when the world description is not usable."""
    if k < 1:
        raise ValueError(f"k={k}: give at least one node")
    if max_steps < 0:
        raise ValueError(f"max_steps={max_steps}: give a number of ticks >= 0")
    if len(slowdown) != k or not all(s > 0 and math.isfinite(s) for s in slowdown):
        raise ValueError(f"slowdown={list(slowdown)}: give {k} finite values > 0, one per node")
    if not step_seconds > 0:
        raise ValueError(f"step_seconds={step_seconds}: give a duration > 0")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth={bandwidth}: give bits per second > 0 (float('inf') for free transfers)")
    if not (latency >= 0 and math.isfinite(latency)):
        raise ValueError(f"latency={latency}: give a finite number of seconds >= 0")
