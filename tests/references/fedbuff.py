"""FedBuff (buffered asynchronous aggregation) with staleness scaling, event by event.

Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous Aggregation" (AISTATS,
arXiv 2106.06639), Algorithm 1 (FedBuff), read on ExoGym's timing model (see
``tests/references/__init__.py``); the K nodes are the clients.

Clients (Algorithm 1, client side). A client downloads the server model ``x`` (a transfer),
takes ``Q`` = ``local_steps`` SGD steps with a fresh ``torch.optim.SGD(lr=client_lr)`` and
uploads ``Delta = y_Q - y_0`` (local minus downloaded parameters; a server that receives
``y_0 - y_Q`` and subtracts it makes the same update). A client's ``k``-th step over its whole life
uses its ``k``-th batch: batches continue across participations.

Server (Algorithm 1, server side; staleness scaling of the experiments). A receipt with
staleness ``tau`` (server versions since the client's download was served) adds
``s(tau) * Delta`` to the buffer, ``s(tau) = 1 / sqrt(1 + tau)`` (the paper's choice). When
``B`` = ``buffer_size`` updates are buffered: ``x <- x + eta_g * buffer / B``, version += 1,
buffer cleared. The buffer is averaged (``/ B``), so that ``eta_g`` means what FedAvg's server
learning rate means: with ``B = C`` and no staleness a server step is a FedAvg round. A server
step that adds the plain sum is this rule with ``eta_g`` times ``B``. Per parameter tensor,
in this order of torch operations:
``buf.add_(delta * s)`` with ``s = 1 / math.sqrt(1 + tau)`` a Python float, and at a server step
``p.add_(buf / B * eta_g)``, ``buf.zero_()``.

Concurrency (Algorithm 1's ``C`` clients training at once). At time 0, ``C`` clients are drawn
one after another and served the initial model; each starts training when its download arrives.
At each receipt (ascending rank at one instant) the client received stops being in flight and
one client is drawn among those not in flight; the server serves it the model at that instant
after every receipt there and any server step they triggered. Clients drawn after the last
tick never start a step, so draws made during the drain change nothing.

Client draws (the rule ExoGym's preset uses): ``draw_client``, draw ``i`` (counted from 0
over the whole run) picks uniformly among the free clients in ascending order with a generator
seeded by ``(seed, i)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
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


def draw_client(seed: int, draw_index: int, free_clients: Sequence[int]) -> int:
    """The client draw ``draw_index`` picks: ``sorted(free_clients)[rng.integers(len(free_clients))]``
    with ``rng = numpy.random.Generator(numpy.random.PCG64(numpy.random.SeedSequence([seed,
    draw_index])))``. Raises ``ValueError`` when no client is free."""
    pool = sorted(free_clients)
    if not pool:
        raise ValueError("free_clients is empty: a draw needs at least one client not in flight")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, draw_index])))
    return pool[int(rng.integers(len(pool)))]


def staleness_scale(tau: int) -> float:
    """FedBuff's staleness scaling ``s(tau) = 1 / sqrt(1 + tau)``."""
    return 1 / math.sqrt(1 + tau)


def reference_fedbuff(
    ds: Any,
    k: int,
    max_steps: int,
    *,
    slowdown: Sequence[float],
    step_seconds: float,
    bandwidth: float,
    latency: float,
    concurrency: int,
    buffer_size: int,
    local_steps: int,
    client_lr: float,
    server_lr: float,
    seed: int = 0,
) -> dict[str, Any]:
    """Run FedBuff on ``k`` TinyNet clients for ``max_steps`` ticks, then drain.

    Returns ``dict(params, steps, updates, end_time)`` as described in ``tests.references``.
    Raises ``ValueError`` naming the argument on bad input.
    """
    check_world(k, max_steps, slowdown, step_seconds, bandwidth, latency)
    if not 1 <= concurrency <= k:
        raise ValueError(f"concurrency={concurrency}: give 1 to k={k} clients in flight")
    if buffer_size < 1:
        raise ValueError(f"buffer_size={buffer_size}: give at least one update per server step")
    if local_steps < 1:
        raise ValueError(f"local_steps={local_steps}: give at least one client step")

    server = [p.detach().clone() for p in TinyNet().parameters()]
    buffer = [torch.zeros_like(p) for p in server]
    models = [TinyNet() for _ in range(k)]
    data = [batch_stream(ds, k, r) for r in range(k)]
    transfer = transfer_seconds(server, latency, bandwidth)
    ticks, events = Ticks(max_steps), Events()

    version, buffered, draws = 0, 0, 0
    steps, updates, end_time = [0] * k, [], 0.0
    free = set(range(k))
    start: list[list[torch.Tensor]] = [[] for _ in range(k)]
    served_at, done = [0] * k, [0] * k
    opts: list[torch.optim.Optimizer | None] = [None] * k

    def draw(t: float) -> None:
        nonlocal draws
        client = draw_client(seed, draws, sorted(free))
        draws += 1
        free.remove(client)
        events.push(t, REPLY, client)

    for _ in range(concurrency):
        draw(0.0)
    while events:
        t, phase, r, payload = events.pop()
        if phase == RECEIPT:
            delta, tau = payload[0], version - payload[1]
            updates.append((t, r, tau))
            s = staleness_scale(tau)
            for buf, d in zip(buffer, delta, strict=True):
                buf.add_(d * s)
            buffered += 1
            if buffered == buffer_size:
                for p, buf in zip(server, buffer, strict=True):
                    p.add_(buf / buffer_size * server_lr)
                    buf.zero_()
                version, buffered = version + 1, 0
            end_time = max(end_time, t)
            free.add(r)
            if not ticks.closed:
                draw(t)
        elif phase == REPLY:
            events.push(t + transfer, STEP, r, [p.clone() for p in server], version)
        else:
            if payload:  # a participation starts from the downloaded model, with a fresh optimizer
                start[r], served_at[r], done[r] = payload[0], payload[1], 0
                with torch.no_grad():
                    for p, s0 in zip(models[r].parameters(), start[r], strict=True):
                        p.copy_(s0)
                opts[r] = torch.optim.SGD(models[r].parameters(), lr=client_lr)
            if not ticks.admit(t):
                continue
            train_step(models[r], opts[r], next(data[r]))
            duration = step_seconds * slowdown[r]
            steps[r], done[r] = steps[r] + 1, done[r] + 1
            end_time = max(end_time, t + duration)
            if done[r] == local_steps:
                delta = [p.detach() - s0 for p, s0 in zip(models[r].parameters(), start[r], strict=True)]
                events.push(t + duration + transfer, RECEIPT, r, delta, served_at[r])
            else:
                events.push(t + duration, STEP, r)
    return {"params": server, "steps": steps, "updates": updates, "end_time": end_time}
