"""PowerSGD: rank-r gradient compression by one power iteration per step, with error feedback
and warm start (Vogels, Karimireddy, Jaggi 2019, arXiv 1905.13727, Algorithms 1 and 2).

Per step, each matrix-shaped gradient ``G`` (a tensor of shape ``(n, ...)`` viewed as an
``n x m`` matrix) of every node:

    M = G + E                   error feedback (Algorithm 2): E is what earlier steps did not send
    P = M Q                     Q: last step's (warm start), orthogonalized; random at first
    P = sum over nodes of P     all-reduce
    P = orthogonalize(P)        Gram-Schmidt on the columns
    Q = M^T P
    Q = mean over nodes of Q    all-reduce
    M_hat = P Q^T               the gradient the inner optimizer applies (the same on every node)
    E = M - M_hat

The other tensors (vectors, biases, and matrices for which ``(n + m) * r * min_compression_rate
>= n * m``) are averaged uncompressed. ExoGym takes PyTorch's ``powerSGD_hook`` choices where
the paper leaves room: the matrix view ``(shape[0], -1)``; rank ``min(n, m, r)``; the
``min_compression_rate`` test; Q before the first compressed step drawn by ``torch.randn`` from
a generator seeded from the shared seed (one stream, the matrices in parameter order) and
orthogonalized; the warm-started Q orthogonalized again before use; P summed (it is normalized
anyway) and Q averaged. It differs from the hook in three places, none of which changes the
result beyond float rounding: Gram-Schmidt at every rank (the hook uses QR above rank 2; the two
differ only in column signs, which cancel in ``P Q^T``), no error kept for uncompressed tensors
(the hook keeps ``local - mean``, which sums to zero over the nodes), and a zero column stays
zero instead of becoming NaN.

Bytes per node and step (ledger): all-reduces of the uncompressed tensors, of ``sum n * r`` and
of ``sum m * r`` values, one of each per dtype: ``(n + m) * r`` values per compressed matrix
instead of ``n * m``. Every collective is a sum or mean all-reduce, so faults may drop nodes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from communicators.checks import check_int
from exogym.core.comm.flat import dtype_buckets, group_by_dtype
from exogym.core.pipeline import Communicator, NodeContext
from exogym.core.seeding import generator

_Q_SALT = 0x9505


def matrix_shape(shape: torch.Size) -> tuple[int, int]:
    """The ``n x m`` view of a tensor, as PyTorch's hook takes it: ``(shape[0], numel / shape[0])``."""
    if len(shape) == 0:
        return 1, 1
    n = shape[0]
    return n, (shape.numel() // n if n else 0)


def compresses(n: int, m: int, rank: int, min_compression_rate: float) -> bool:
    """Whether an ``n x m`` matrix is sent as rank ``min(n, m, rank)`` factors: when that is
    ``min_compression_rate`` times smaller than the matrix (PyTorch's ``_should_compress``)."""
    r = min(n, m, rank)
    return (n + m) * r * min_compression_rate < n * m


def orthogonalize_(matrix: torch.Tensor) -> torch.Tensor:
    """Gram-Schmidt on the columns of ``matrix`` (``rows x r``), in place: each column is
    normalized, then removed from the columns after it. A zero column stays zero."""
    for i in range(matrix.shape[1]):
        col = matrix[:, i : i + 1]
        norm = torch.linalg.vector_norm(col)
        col.div_(torch.where(norm > 0, norm, torch.ones_like(norm)))
        rest = matrix[:, i + 1 :]
        rest.sub_((col * rest).sum(dim=0, keepdim=True) * col)
    return matrix


class _Factors:
    """P and Q of the compressed matrices of one dtype: one flat buffer each, so a step costs
    one all-reduce of each per dtype."""

    def __init__(self, shapes: list[tuple[int, int, int]], like: torch.Tensor) -> None:
        p_sizes, q_sizes = [n * r for n, _, r in shapes], [m * r for _, m, r in shapes]
        self.p = torch.empty(sum(p_sizes), dtype=like.dtype, device=like.device)
        self.q = torch.empty(sum(q_sizes), dtype=like.dtype, device=like.device)
        self.ps = [v.view(n, r) for v, (n, _, r) in zip(self.p.split(p_sizes), shapes, strict=True)]
        self.qs = [v.view(m, r) for v, (_, m, r) in zip(self.q.split(q_sizes), shapes, strict=True)]


class PowerSGDCommunicator(Communicator):
    """Every step: replace each compressible gradient by its rank-``rank`` PowerSGD approximation
    of the nodes' mean, keeping the local error for the next step; average the other gradients.

    State: per compressed matrix the error ``E`` and the warm-start ``Q``.

    Args:
        rank: the approximation rank ``r`` (PyTorch's ``matrix_approximation_rank``).
        min_compression_rate: compress a matrix only when its factors are this many times
            smaller (PyTorch's default 2: vectors and biases are never compressed).
    """

    space: ClassVar[str] = "grad"
    #: Every payload holds the same entries every round.
    payloads: ClassVar[str] = "stable"
    #: Sum and mean all-reduces only: a round can go on without the dropped nodes.
    supports_dropout: ClassVar[bool] = True

    def __init__(self, rank: int = 1, min_compression_rate: float = 2.0) -> None:
        super().__init__(H=1)
        check_int("rank", rank, why="the approximation rank")
        if isinstance(min_compression_rate, bool) or not isinstance(min_compression_rate, (int, float)):
            raise TypeError(f"min_compression_rate must be a number >= 1, got {min_compression_rate!r}")
        if not min_compression_rate >= 1.0:
            raise ValueError(f"min_compression_rate must be >= 1, got {min_compression_rate!r}")
        self.rank, self.min_compression_rate = rank, float(min_compression_rate)

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        shapes = [matrix_shape(p.shape) for p in params]
        squeeze = [compresses(n, m, self.rank, self.min_compression_rate) for n, m in shapes]
        self.params = [p for p, c in zip(params, squeeze, strict=True) if c]
        self.dense = dtype_buckets([p for p, c in zip(params, squeeze, strict=True) if not c])
        self.shapes = [(n, m, min(n, m, self.rank)) for (n, m), c in zip(shapes, squeeze, strict=True) if c]
        self.errors = [
            torch.zeros(n, m, dtype=p.dtype, device=p.device)
            for p, (n, m, _) in zip(self.params, self.shapes, strict=True)
        ]
        self.groups = group_by_dtype(self.params)
        self.factors = [_Factors([self.shapes[i] for i in g], self.params[g[0]]) for g in self.groups]
        self.started = False  # whether Q holds a warm start

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        comm = self.ctx.comm
        for bucket in self.dense:
            for p in bucket.tensors:  # a parameter without a gradient contributes zeros and gets the mean
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            grads = [p.grad for p in bucket.tensors]
            comm.all_reduce(bucket.buffer.pack(grads), op="mean", tag="powersgd_dense")
            bucket.buffer.unpack(grads)
        if not self.params:
            return
        for p, e in zip(self.params, self.errors, strict=True):
            if p.grad is not None:
                e.add_(p.grad.reshape(e.shape))  # from here E holds M = G + E
        if not self.started:  # the first Q: standard normal from the shared seed, every matrix in parameter order
            gen = generator(self.ctx.seed, _Q_SALT)
            qs = {i: q for g, f in zip(self.groups, self.factors, strict=True) for i, q in zip(g, f.qs, strict=True)}
            for i in sorted(qs):
                qs[i].copy_(torch.randn(qs[i].shape, generator=gen, dtype=qs[i].dtype))
            self.started = True
        for group, f in zip(self.groups, self.factors, strict=True):
            for i, p_, q in zip(group, f.ps, f.qs, strict=True):
                orthogonalize_(q)
                torch.matmul(self.errors[i], q, out=p_)
            comm.all_reduce(f.p, op="sum", tag="powersgd_p")
            for i, p_, q in zip(group, f.ps, f.qs, strict=True):
                orthogonalize_(p_)
                torch.matmul(self.errors[i].T, p_, out=q)
            comm.all_reduce(f.q, op="mean", tag="powersgd_q")
            for i, p_, q in zip(group, f.ps, f.qs, strict=True):
                approx = p_ @ q.T
                self.errors[i].sub_(approx)  # E = M - M_hat
                self.params[i].grad = approx.view(self.params[i].shape)

    def state_dict(self) -> dict[str, Any]:
        return {"errors": list(self.errors), "qs": [f.q for f in self.factors] if self.started else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for e, t in zip(self.errors, state["errors"], strict=True):
            e.copy_(t)
        self.started = state["qs"] is not None
        if self.started:
            for f, q in zip(self.factors, state["qs"], strict=True):
                f.q.copy_(q)

    def describe(self) -> str:
        return f"PowerSGD(rank={self.rank})"


__all__ = ["PowerSGDCommunicator", "compresses", "matrix_shape", "orthogonalize_"]
