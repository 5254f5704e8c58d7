"""FedAsync (asynchronous federated optimization) with polynomial staleness, event by event.

Xie, Koyejo and Gupta 2019, "Asynchronous Federated Optimization" (arXiv 1903.03934),
Algorithm 1 with the polynomial staleness function, read on ExoGym's timing model (see
``tests/references/__init__.py``); the K nodes are the clients.

Server (Algorithm 1, server side). The server holds the global parameters ``x`` and a version
``t``, the number of updates applied so far (0 at the start). On receiving a client's local
parameters ``x_new``, trained from the server model of version ``tau``, with staleness
``s = t - tau``:

    alpha_t = alpha * (s + 1) ** (-a)          (polynomial staleness function, a >= 0;
                                                a = 0 gives the constant mixing weight alpha)
    x <- (1 - alpha_t) * x + alpha_t * x_new
    t <- t + 1

Per parameter tensor, in this order of torch operations: ``x.mul_(1 - alpha_t).add_(x_new *
alpha_t)`` with ``alpha_t`` a Python float. Receipts at one instant are applied by ascending rank.

Clients (Algorithm 1, worker side). A client's task: from the parameters it holds (the server's
``x`` as it was when it was sent, with the version ``tau`` it had then) take ``H`` =
``local_steps`` SGD steps with a fresh ``torch.optim.SGD(lr=client_lr)``, then upload its local
parameters ``x_new``; the server receives them one transfer after the end of the last step. A
client's ``k``-th step over its whole life uses its ``k``-th batch: batches continue across
tasks.

Concurrency. ``C`` = ``concurrency`` clients, ranks ``0 .. C-1`` (the lowest ranks), work at
once; the other clients never train. At time 0 each of these ``C`` clients holds the initial
model (version 0, no download) and starts training. After applying a client's update the
server sends that same client ``x`` as it is at that instant, after every receipt at that
instant (the reply phase), with the current version; the client starts its next task when the
download arrives, one transfer later. Once the run has stopped taking steps (the ticks are
closed) the server sends nothing more; the drain only delivers and applies the pushes whose
last local step was executed.
"""

from __future__ import annotations

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
    train_step,
    transfer_seconds,
)


def staleness_weight(alpha: float, a: float, staleness: int) -> float:
    """FedAsync's mixing weight with the polynomial staleness function:
    ``alpha * (staleness + 1) ** (-a)``."""
    return alpha * (staleness + 1) ** (-a)


def reference_fedasync(
    ds: Any,
    k: int,
    max_steps: int,
    *,
    slowdown: Sequence[float],
    step_seconds: float,
    bandwidth: float,
    latency: float,
    concurrency: int,
    local_steps: int,
    client_lr: float,
    alpha: float,
    a: float,
    seed: int = 0,
) -> dict[str, Any]:
    """Run FedAsync on ``k`` TinyNet clients for ``max_steps`` ticks, then drain.

    ``seed`` is accepted for a signature uniform with the other references; FedAsync's clients
    are fixed (ranks ``0 .. concurrency-1``), so nothing here is random.

    Returns ``dict(params, steps, updates, end_time)`` as described in ``tests.references``.
    Raises ``ValueError`` naming the argument on bad input.
    """
    check_world(k, max_steps, slowdown, step_seconds, bandwidth, latency)
    if not 1 <= concurrency <= k:
        raise ValueError(f"concurrency={concurrency}: give 1 to k={k} clients working at once")
    if local_steps < 1:
        raise ValueError(f"local_steps={local_steps}: give at least one client step")
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha={alpha}: give a mixing weight in (0, 1]")
    if not a >= 0:
        raise ValueError(f"a={a}: give a staleness exponent >= 0")

    server = [p.detach().clone() for p in TinyNet().parameters()]
    models = [TinyNet() for _ in range(k)]
    data = [batch_stream(ds, k, r) for r in range(k)]
    transfer = transfer_seconds(server, latency, bandwidth)
    ticks, events = Ticks(max_steps), Events()

    version, steps, updates, end_time = 0, [0] * k, [], 0.0
    held_version, done = [0] * k, [0] * k
    opts: list[torch.optim.Optimizer | None] = [None] * k

    for r in range(concurrency):  # time 0: the working clients hold the initial model, no download
        events.push(0.0, STEP, r, [p.clone() for p in server], 0)
    while events:
        t, phase, r, payload = events.pop()
        if phase == RECEIPT:
            x_new, tau = payload
            staleness = version - tau
            updates.append((t, r, staleness))
            alpha_t = staleness_weight(alpha, a, staleness)
            for x, xn in zip(server, x_new, strict=True):
                x.mul_(1 - alpha_t).add_(xn * alpha_t)
            version += 1
            end_time = max(end_time, t)
            if not ticks.closed:
                events.push(t, REPLY, r)
        elif phase == REPLY:  # the model after every receipt at this instant, with its version
            events.push(t + transfer, STEP, r, [p.clone() for p in server], version)
        else:
            if payload:  # a task starts from the held server model, with a fresh optimizer
                start, held_version[r], done[r] = payload[0], payload[1], 0
                with torch.no_grad():
                    for p, s0 in zip(models[r].parameters(), start, strict=True):
                        p.copy_(s0)
                opts[r] = torch.optim.SGD(models[r].parameters(), lr=client_lr)
            if not ticks.admit(t):
                continue
            train_step(models[r], opts[r], next(data[r]))
            duration = step_seconds * slowdown[r]
            steps[r], done[r] = steps[r] + 1, done[r] + 1
            end_time = max(end_time, t + duration)
            if done[r] == local_steps:
                x_new = [p.detach().clone() for p in models[r].parameters()]
                events.push(t + duration + transfer, RECEIPT, r, x_new, held_version[r])
            else:
                events.push(t + duration, STEP, r)
    return {"params": server, "steps": steps, "updates": updates, "end_time": end_time}
