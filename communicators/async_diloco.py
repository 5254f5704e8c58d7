"""Asynchronous DiLoCo (Liu et al. 2024, "Asynchronous Local-SGD Training for Language Modeling",
arXiv 2401.09135): every node trains on its own clock and pushes its pseudo-gradient to a
server as soon as its local steps are done; the server applies each one as it arrives and sends
the node its parameters back.

- **Delayed Nesterov (DN)** (the paper's Section 5.1): the server adds each pseudo-gradient
  ``g`` to a buffer ``D`` and counts them; the ``t``-th, with ``N = dn_period`` (default the number
  of nodes) and ``c = dn_c`` in ``[0, 1/N]`` (default 0)::

      D <- D + g
      if t % N == 0:  m <- beta m + D / N
                      theta <- theta - lr ((1 - cN + c) beta m + g / N);  D <- 0
      else:           theta <- theta - lr (c beta m + g / N)

  Every update moves the parameters at once; the momentum changes only every ``N``-th, from the
  mean of the last ``N``. With equal speeds, ``N`` = the number of nodes and ``c = 0``, a round in
  which every node's update arrives at one instant is synchronous DiLoCo's outer step (Nesterov
  SGD on the mean pseudo-gradient).
- **Dynamic local updates (DyLU)**: node ``r`` takes ``H_r = max(1, floor(H * v_r / v_max))``
  local steps per segment (``v``: step speed), so every node's segment lasts about as long as the
  fastest node's ``H`` steps.

[`AsyncDiLoCoServer`][communicators.AsyncDiLoCoServer] writes these rules as a server on the
simulated clock ([`Server`][exogym.Server]).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from communicators.checks import check_int, check_number
from exogym.core.server import Result, Server, ServerContext, Train


def dylu_steps(H: int, step_seconds: list[float]) -> list[int]:
    """Per node, its local steps per segment under DyLU: ``max(1, floor(H * v_r / v_max))``
    with speed ``v_r = 1 / step_seconds[r]`` (every step takes time)."""
    fastest = min(step_seconds)
    return [max(1, math.floor(H * fastest / s + 1e-9)) for s in step_seconds]


class DelayedNesterov:
    """The delayed Nesterov (DN) server update on a flat parameter tensor (updated in place).

    Counts the pseudo-gradients ``g`` it applies; with ``N = period``, ``c`` and momentum
    ``beta``, the ``t``-th: ``D += g``; every ``N``-th ``m = beta m + D / N``,
    ``theta -= lr ((1 - cN + c) beta m + g / N)``, ``D = 0``; else ``theta -= lr (c beta m + g / N)``.

    Args:
        like: a tensor of the parameters' shape and dtype (the buffers are zeros like it).
        lr, beta, period, c: as above.
    """

    def __init__(self, like: torch.Tensor, lr: float, beta: float, period: int, c: float = 0.0) -> None:
        self.lr, self.beta, self.period, self.c = lr, beta, period, c
        self.momentum = torch.zeros_like(like)
        self.buffer = torch.zeros_like(like)
        self.count = 0

    def step(self, theta: torch.Tensor, g: torch.Tensor) -> None:
        """Apply pseudo-gradient ``g`` to ``theta`` in place."""
        lr, beta, n, c = self.lr, self.beta, self.period, self.c
        self.count += 1
        self.buffer.add_(g)
        if self.count % n == 0:
            self.momentum.mul_(beta).add_(self.buffer / n)
            theta.sub_(lr * ((1 - c * n + c) * beta * self.momentum + g / n))
            self.buffer.zero_()
        else:
            theta.sub_(lr * (c * beta * self.momentum + g / n))

    def state_dict(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "buffer": self.buffer, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.momentum.copy_(state["momentum"])
        self.buffer.copy_(state["buffer"])
        self.count = int(state["count"])


class AsyncDiLoCoServer(Server):
    """Asynchronous DiLoCo as a server: every client starts at second 0 from the initial model
    and trains its segment (``H`` steps, fewer on slower clients with DyLU), keeping its inner
    optimizer across segments; each pseudo-gradient ``start - local`` is applied as it arrives
    with delayed Nesterov, and the client is sent the server's parameters for its next segment.

    Args:
        H: local steps per segment (of the fastest client, with DyLU).
        outer_lr: the server's learning rate (default 0.7).
        outer_momentum: its Nesterov momentum ``beta`` (default 0.9).
        dn_period: ``N``, updates per momentum step (default: the number of clients).
        dn_c: ``c``, the factor of the plain steps between momentum steps (default 0).
        dylu: dynamic local updates (default ``True``); ``False``: every client takes ``H``.
    """

    def __init__(
        self,
        H: int,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        dn_period: int | None = None,
        dn_c: float = 0.0,
        dylu: bool = True,
    ) -> None:
        super().__init__()
        check_int("H", H, why="local steps per segment")
        check_number("outer_lr", outer_lr, 0, above=True)
        check_number("outer_momentum", outer_momentum, 0, 1)
        check_int("dn_period", dn_period, none="the number of nodes")
        check_number("dn_c", dn_c, 0)
        self.segment_steps, self.outer_lr, self.outer_momentum = H, outer_lr, outer_momentum
        self.dn_period, self.dn_c, self.dylu = dn_period, dn_c, dylu

    def setup(self, ctx: ServerContext) -> None:
        super().setup(ctx)
        k = ctx.num_clients
        period = self.dn_period or k
        if self.dn_c > 1 / period:
            raise ValueError(f"dn_c must be in [0, 1/N] = [0, {1 / period:g}] (N = dn_period), got {self.dn_c}")
        seconds = [ctx.step_seconds(r) for r in range(k)]
        self.local_steps = dylu_steps(self.segment_steps, seconds) if self.dylu else [self.segment_steps] * k
        self.dn = DelayedNesterov(self.params, self.outer_lr, self.outer_momentum, period, self.dn_c)
        self.version = 0

    def start(self) -> None:
        for r in range(self.ctx.num_clients):  # every client holds the initial model
            self.send(r, Train(self.local_steps[r]), info=0, transfer=False)

    def on_result(self, result: Result) -> None:
        self.record_update(result.client, self.version - result.info)
        self.version += 1
        self.dn.step(self.params, result.start - result.local)
        self.send(result.client, Train(self.local_steps[result.client]), info=lambda: self.version)

    def state_dict(self) -> dict[str, Any]:
        return {**self.dn.state_dict(), "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dn.load_state_dict(state)
        self.version = int(state["version"])

    def describe(self) -> str:
        return (
            f"AsyncDiLoCo(H={self.segment_steps}, outer_lr={self.outer_lr}, outer_momentum={self.outer_momentum}, "
            f"dn_period={self.dn_period}, dn_c={self.dn_c}, dylu={self.dylu})"
        )


__all__ = ["AsyncDiLoCoServer", "DelayedNesterov", "dylu_steps"]
