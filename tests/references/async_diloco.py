"""Async DiLoCo with delayed Nesterov (DN) and dynamic local updates (DyLU), event by event.

Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling" (arXiv 2401.09135),
read on ExoGym's timing model (see ``tests/references/__init__.py``).

Workers (Section 3, asynchronous Local-SGD). Node ``r`` starts a segment from parameters
``theta_start`` (at time 0 the initial parameters, server version 0, no download), takes
``H_r`` inner steps with its own inner optimizer (its state kept across segments), then pushes
the pseudo-gradient ``g = theta_start - theta_local``. The server applies ``g`` at receipt and
serves this node's pull at that instant (after every receipt at that instant); the node starts
its next segment from those parameters when the reply arrives, one transfer later.

Dynamic local updates (Section 5.2, DyLU): a worker of speed ``v_r`` takes
``H_r = max(1, floor(H * v_r / max_j v_j))`` inner steps per segment, so every segment lasts
about as long as the fastest worker's ``H`` steps. With ``v = 1 / slowdown`` this is computed,
in float64, as ``max(1, math.floor(H * min(slowdown) / slowdown[r]))``. ``dylu=False``: ``H_r = H``.

Delayed Nesterov (Section 5.1 and its DN algorithm box; ``N`` = ``dn_period``, default K, the
number of workers; ``c`` = ``dn_c``, the paper's momentum activation, in ``[0, 1/N]``). The
server keeps a momentum ``m`` and a sum ``Delta`` (both zero at the start) and counts received
pseudo-gradients ``t = 1, 2, ...``; on receiving ``g``:

    Delta <- Delta + g
    if t % N == 0:   m <- beta * m + Delta / N
                     theta <- theta - lr * ((1 - c*N + c) * beta * m + g / N)
                     Delta <- 0
    else:            theta <- theta - lr * (c * beta * m + g / N)

Every push moves the server parameters; momentum is updated only every N-th push, from the
mean of the last N pseudo-gradients. With ``c = 0`` (the value this reference uses by default,
the plain delayed update: no momentum between momentum updates) and all N = K pushes of a
round arriving at one instant, the round equals one synchronous DiLoCo outer step, Nesterov SGD
(``torch.optim.SGD(nesterov=True)``) on the mean pseudo-gradient. Per parameter tensor, in this
order of torch operations: ``delta.add_(g)``; at a momentum update
``m.mul_(beta).add_(delta / N)``, ``p.sub_(lr * ((1 - c * N + c) * beta * m + g / N))``,
``delta.zero_()``; else ``p.sub_(lr * (c * beta * m + g / N))`` (Python floats for the scalars).

Staleness of an update: server versions (pseudo-gradients applied so far) between the version
the node's segment started from and the version it is applied to.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from tests.helpers import TinyNet
from tests.references import (
    RECEIPT,
    REPLY,
    STEP,
    Events,
    Ticks,
    batch_stream,
    check_world,
    inner_optimizer,
    train_step,
    transfer_seconds,
)


def dylu_steps(H: int, slowdown: Sequence[float], dylu: bool) -> list[int]:
    """Inner steps per segment of each node: ``max(1, floor(H * min(slowdown) / slowdown[r]))``
    with DyLU, ``H`` without."""
    if not dylu:
        return [H] * len(slowdown)
    fastest = min(slowdown)
    return [max(1, math.floor(H * fastest / s)) for s in slowdown]


class DelayedNesterov:
    """The DN server update on a list of parameter tensors (updated in place)."""

    def __init__(self, params: list[torch.Tensor], lr: float, beta: float, period: int, c: float) -> None:
        self.lr, self.beta, self.period, self.c, self.t = lr, beta, period, c, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.delta = [torch.zeros_like(p) for p in params]

    def apply(self, params: list[torch.Tensor], g: list[torch.Tensor]) -> None:
        self.t += 1
        lr, beta, n, c = self.lr, self.beta, self.period, self.c
        for p, m, delta, gi in zip(params, self.m, self.delta, g, strict=True):
            delta.add_(gi)
            if self.t % n == 0:
                m.mul_(beta).add_(delta / n)
                p.sub_(lr * ((1 - c * n + c) * beta * m + gi / n))
                delta.zero_()
            else:
                p.sub_(lr * (c * beta * m + gi / n))


def reference_async_diloco(
    ds: Any,
    k: int,
    max_steps: int,
    *,
    slowdown: Sequence[float],
    step_seconds: float,
    bandwidth: float,
    latency: float,
    H: int,
    outer_lr: float,
    outer_momentum: float,
    dn_period: int | None = None,
    dn_c: float = 0.0,
    dylu: bool = True,
    inner: tuple[str, dict[str, Any]] = ("sgd", {"lr": 0.05}),
) -> dict[str, Any]:
    """Run Async DiLoCo (DN + DyLU) on ``k`` TinyNets for ``max_steps`` ticks, then drain.

    Returns ``dict(params, steps, updates, end_time)`` as described in ``tests.references``.
    Raises ``ValueError`` naming the argument on bad input.
    """
    check_world(k, max_steps, slowdown, step_seconds, bandwidth, latency)
    period = k if dn_period is None else dn_period
    if H < 1:
        raise ValueError(f"H={H}: give at least one inner step per segment")
    if period < 1:
        raise ValueError(f"dn_period={dn_period}: give a momentum period >= 1 (default: k)")
    if not 0 <= dn_c <= 1 / period:
        raise ValueError(f"dn_c={dn_c}: the paper's c lies in [0, 1/N] = [0, {1 / period}]")

    server = [p.detach().clone() for p in TinyNet().parameters()]
    models = [TinyNet() for _ in range(k)]
    opts = [inner_optimizer(inner, m.parameters()) for m in models]
    data = [batch_stream(ds, k, r) for r in range(k)]
    seg_steps = dylu_steps(H, slowdown, dylu)
    transfer = transfer_seconds(server, latency, bandwidth)
    dn = DelayedNesterov(server, outer_lr, outer_momentum, period, dn_c)
    ticks, events = Ticks(max_steps), Events()

    version, steps, updates, end_time = 0, [0] * k, [], 0.0
    seg_start: list[list[torch.Tensor]] = [[] for _ in range(k)]
    seg_version, seg_done = [0] * k, [0] * k
    for r in range(k):
        events.push(0.0, STEP, r, [p.clone() for p in server], 0)
    while events:
        t, phase, r, payload = events.pop()
        if phase == RECEIPT:
            g, started_at = payload
            updates.append((t, r, version - started_at))
            dn.apply(server, g)
            version += 1
            end_time = max(end_time, t)
            events.push(t, REPLY, r)
        elif phase == REPLY:
            if not ticks.closed:
                events.push(t + transfer, STEP, r, [p.clone() for p in server], version)
        else:
            if payload:  # a segment starts from the pulled parameters
                seg_start[r], seg_version[r], seg_done[r] = payload[0], payload[1], 0
                with torch.no_grad():
                    for p, s in zip(models[r].parameters(), seg_start[r], strict=True):
                        p.copy_(s)
            if not ticks.admit(t):
                continue
            train_step(models[r], opts[r], next(data[r]))
            duration = step_seconds * slowdown[r]
            steps[r], seg_done[r] = steps[r] + 1, seg_done[r] + 1
            end_time = max(end_time, t + duration)
            if seg_done[r] == seg_steps[r]:
                g = [s - p.detach() for s, p in zip(seg_start[r], models[r].parameters(), strict=True)]
                events.push(t + duration + transfer, RECEIPT, r, g, seg_version[r])
            else:
                events.push(t + duration, STEP, r)
    return {"params": server, "steps": steps, "updates": updates, "end_time": end_time}
