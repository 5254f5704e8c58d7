"""Average the model or its gradients over all nodes every ``H`` steps."""

from __future__ import annotations

from typing import ClassVar

import torch

from exogym.core.flat import FlatBuffer, group_by_dtype
from exogym.core.pipeline import Communicator, NodeContext

TARGETS = ("params", "grads")


class AveragingCommunicator(Communicator):
    """Every ``H`` steps, replace the parameters (or gradients) by their mean over all nodes.

    ``target="grads"`` runs before the optimizer step (DDP when ``H=1``); ``target="params"`` runs
    after it (FedAvg / local SGD). One all-reduce per dtype per round, through a flat buffer.

    Args:
        H: communicate every ``H`` steps.
        target: ``"params"`` or ``"grads"``.
    """

    space: ClassVar[str] = "param"

    def __init__(self, H: int = 1, target: str = "params") -> None:
        super().__init__(H)
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        self.target = target
        self.space = "grad" if target == "grads" else "param"  # type: ignore[misc]

    def _init_node(self, ctx: NodeContext) -> None:
        super()._init_node(ctx)
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.groups = group_by_dtype(self.params)
        self.buffers = [FlatBuffer([self.params[i] for i in g]) for g in self.groups]

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        for idx, buf in zip(self.groups, self.buffers, strict=True):
            params = [self.params[i] for i in idx]
            if self.target == "grads":
                flat = buf.pack([p.grad for p in params])
                self.ctx.comm.all_reduce(flat, op="mean", tag="average_grads")
                for p, view in zip(params, buf.views, strict=True):
                    if p.grad is None:
                        p.grad = view.view_as(p).clone()
                    else:
                        p.grad.copy_(view.view_as(p))
            else:
                flat = buf.pack(params)
                self.ctx.comm.all_reduce(flat, op="mean", tag="average_params")
                buf.unpack(params)

    def describe(self) -> str:
        return f"Averaging({self.target}, H={self.H})"
