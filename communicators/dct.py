"""DCT top-k compression of gradient-like tensors, and DeMo's communicator built on it.

[`DCTTopKExchange`][communicators.DCTTopKExchange] averages a fixed list of tensors across nodes the
DeMo way: each node sends, per tensor, the ``topk`` largest coefficients of each chunk of its
chunked DCT-II (``exogym.ops.dct``); the receivers average every coefficient over the nodes that
chose it and invert the DCT. All compressed tensors of a call travel in **one** all-gather of a byte
buffer. A tensor for which top-k keeps every coefficient of its chunks (``topk >= chunk size``:
scalars, tiny tensors) loses nothing by compression, so it is averaged exactly by **one** dense
all-reduce shared by all such tensors instead.

Bytes per node and call (ledger): an all-gather of ``sum_t chunks_t * k_t * (index bytes +
value bytes)`` over compressed tensors ``t`` (index bytes 2 for chunks of at most 32,768
entries, else 4; value bytes the tensor's element size), plus an all-reduce of the dense
tensors' bytes when there are any.

[`DCTCompressCommunicator`][communicators.DCTCompressCommunicator] is DeMo (Peng, Quesnelle, Kingma
2024, arXiv 2411.19870, Algorithm 1) as a gradient-space module (its docstring gives the update):
the inner SGD applies its signs as ``p -= lr * sign(...)`` (with SGD's weight decay,
``p *= 1 - lr * wd`` first, up to float rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from communicators.bitpack import all_gather_bytes
from communicators.checks import check_number
from exogym import ops
from exogym.core.comm.comm import Comm, Groups
from exogym.core.pipeline import Communicator, NodeContext
from exogym.ops.dct import as_2d_shape, chunk_shape, index_dtype


@dataclass(frozen=True)
class TensorPlan:
    """How one tensor travels: ``compressed`` (DCT top-k, ``k`` coefficients of each chunk) or dense."""

    shape: tuple[int, ...]
    compressed: bool
    k: int
    payload: int  # bytes this node sends for the tensor


def plan_tensor(shape: tuple[int, ...], dtype: torch.dtype, topk: int, chunk: int) -> TensorPlan:
    """Compress unless top-k keeps every coefficient of a chunk: only then is the dense mean the
    same result (the DCT round-trips losslessly), and cheaper. A small tensor whose top-k payload
    is not smaller than the tensor is still compressed, as DeMo does (its unsent coefficients
    stay in the residual)."""
    cr, cc = chunk_shape(shape, chunk)
    rows, cols = as_2d_shape(shape)
    k = min(topk, cr * cc)
    if k < cr * cc:
        chunks = (rows // cr) * (cols // cc)
        return TensorPlan(tuple(shape), True, k, chunks * k * (index_dtype(cr, cc).itemsize + dtype.itemsize))
    return TensorPlan(tuple(shape), False, 0, rows * cols * dtype.itemsize)


class DCTTopKExchange:
    """Average a fixed list of tensors over the nodes with DCT top-k compression.

    Args:
        like: tensors with the shapes and dtypes of every later call.
        topk: coefficients kept per chunk.
        chunk: target chunk side (see [`exogym.ops.dct.chunk_shape`][exogym.ops.chunk_shape]).
    """

    def __init__(self, like: Sequence[torch.Tensor], topk: int, chunk: int) -> None:
        if topk < 1 or chunk < 1:
            raise ValueError(f"topk and chunk must be >= 1, got topk={topk}, chunk={chunk}")
        self.topk, self.chunk = topk, chunk
        self.plans = [plan_tensor(tuple(t.shape), t.dtype, topk, chunk) for t in like]

    @property
    def compressed_payload(self) -> int:
        """Bytes of the all-gather payload per node and call."""
        return sum(p.payload for p in self.plans if p.compressed)

    @property
    def dense_payload(self) -> int:
        """Bytes of the dense all-reduce payload per node and call (0 when none)."""
        return sum(p.payload for p in self.plans if not p.compressed)

    @torch.no_grad()
    def exchange(
        self,
        comm: Comm,
        tensors: Sequence[torch.Tensor],
        sign: bool = False,
        groups: Groups | None = None,
        tag: str = "dct_topk",
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Collective. Returns ``(averaged, sent)``: per tensor the decoded mean over the group
        (its sign when ``sign``), and what this node's own message represents (the decode of its
        top-k; the tensor itself when it went dense), for error feedback."""
        averaged: list[Any] = [None] * len(tensors)
        sent: list[Any] = [None] * len(tensors)
        compressed = [i for i, p in enumerate(self.plans) if p.compressed]
        parts = [x for i in compressed for x in ops.dct_encode(tensors[i], self.chunk, self.plans[i].k)]
        if parts:  # per compressed tensor: its indices, its values
            received = all_gather_bytes(comm, parts, groups=groups, charge=False)
            comm.charge("all_gather", received[0].shape[0], sum(t.numel() * t.element_size() for t in parts), tag)
            own, every = zip(parts[::2], parts[1::2], strict=True), zip(received[::2], received[1::2], strict=True)
            for i, (idx, vals), (all_idx, all_vals) in zip(compressed, own, every, strict=True):
                sent[i] = ops.dct_decode(idx[None], vals[None], self.plans[i].shape, self.chunk)
                averaged[i] = ops.dct_decode(all_idx, all_vals, self.plans[i].shape, self.chunk, sign=sign)
        dense = [i for i, p in enumerate(self.plans) if not p.compressed]
        if dense:
            flat = torch.cat([tensors[i].reshape(-1) for i in dense])
            comm.all_reduce(flat, op="mean", groups=groups, tag=f"{tag}_dense")
            for i, view in zip(dense, flat.split([tensors[i].numel() for i in dense]), strict=True):
                sent[i] = tensors[i]
                averaged[i] = view.view_as(tensors[i]).sign() if sign else view.view_as(tensors[i])
        return averaged, sent


class DCTCompressCommunicator(Communicator):
    """DeMo's decoupled momentum with DCT top-k, as a gradient-space module.

    Per parameter and step: ``delta = decay * delta + lr * grad``; send the top-``topk``
    coefficients per chunk of ``delta``'s chunked DCT; ``delta -= decode(own top-k)``; replace
    the gradient by ``sign(decode(mean over nodes))`` (or the mean itself with ``sign=False``).
    ``lr`` is read from the inner optimizer's parameter group each step, so LR schedules apply.

    Args:
        topk: coefficients kept per chunk (DeMo: 32).
        chunk: target chunk side (DeMo: 64).
        decay: momentum decay of ``delta`` (DeMo: 0.999).
        sign: return the sign of the decoded mean (sign-SGD).
    """

    space: ClassVar[str] = "grad"

    def __init__(self, topk: int = 32, chunk: int = 64, decay: float = 0.999, sign: bool = True) -> None:
        super().__init__(H=1)
        check_number("decay", decay, 0, 1, "the momentum decay of delta", upto=True)
        self.topk, self.chunk, self.decay, self.sign = topk, chunk, decay, sign

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.deltas = [torch.zeros_like(p) for p in self.params]
        self.exchange = DCTTopKExchange(self.params, self.topk, self.chunk)
        groups = {id(p): g for g in ctx.optimizer.param_groups for p in g["params"]}
        self.groups = [groups[id(p)] for p in self.params]

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        for p, delta, group in zip(self.params, self.deltas, self.groups, strict=True):
            delta.mul_(self.decay)
            if p.grad is not None:
                delta.add_(p.grad, alpha=group["lr"])
        averaged, sent = self.exchange.exchange(self.ctx.comm, self.deltas, sign=self.sign, tag="demo")
        for p, delta, avg, own in zip(self.params, self.deltas, averaged, sent, strict=True):
            delta.sub_(own)
            p.grad = avg.clone()

    def state_dict(self) -> dict[str, Any]:
        return {"deltas": list(self.deltas)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for d, t in zip(self.deltas, state["deltas"], strict=True):
            d.copy_(t)

    def describe(self) -> str:
        return f"DCTCompress(topk={self.topk}, chunk={self.chunk}, decay={self.decay}{', sign' if self.sign else ''})"


class DCTTopKReducer:
    """A pseudo-gradient reducer for [`DiLoCoCommunicator`][communicators.DiLoCoCommunicator]:
    averages the per-parameter pseudo-gradients by DCT top-k, keeping what was not sent for the next
    round (error feedback).

    Args:
        topk: coefficients kept per chunk.
        chunk: target chunk side.
        error_feedback: add the unsent remainder to the next round's pseudo-gradient.
    """

    def __init__(self, topk: int = 32, chunk: int = 64, error_feedback: bool = True) -> None:
        self.topk, self.chunk, self.error_feedback = topk, chunk, error_feedback
        self.residuals: list[torch.Tensor] | None = None
        self._exchange: DCTTopKExchange | None = None

    def reduce_(self, comm: Comm, tensors: list[torch.Tensor], groups: Groups | None) -> None:
        """Replace ``tensors`` by their compressed mean over ``groups``. Collective."""
        if self._exchange is None:
            self._exchange = DCTTopKExchange(tensors, self.topk, self.chunk)
        if self.residuals is None:  # a first round (residuals loaded from a checkpoint are kept)
            self.residuals = [torch.zeros_like(t) for t in tensors]
        if self.error_feedback:
            for t, r in zip(tensors, self.residuals, strict=True):
                t.add_(r)
        averaged, sent = self._exchange.exchange(comm, tensors, groups=groups, tag="diloco_dct")
        for t, r, avg, own in zip(tensors, self.residuals, averaged, sent, strict=True):
            if self.error_feedback:
                r.copy_(t - own)
            t.copy_(avg)

    def state_dict(self) -> dict[str, Any]:
        """The error-feedback residuals (``None`` before the first round)."""
        return {"residuals": self.residuals}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        residuals = state["residuals"]
        self.residuals = None if residuals is None else [r.clone() for r in residuals]

    def describe(self) -> str:
        return f"DCTTopK(topk={self.topk}, chunk={self.chunk}{', EF' if self.error_feedback else ''})"
