"""SparseLoCo (Sarfi et al. 2025, arXiv 2508.15706): DiLoCo whose pseudo-gradients travel as
chunk-wise top-k with few-bit values, through an error-feedback buffer that takes the place of
the outer momentum.

Every ``H`` steps each node ``r`` computes its pseudo-gradient ``delta_r = theta - theta_r``
(the last synchronised parameters minus its own) and

    e_r <- beta * e_r + delta_r                 (error feedback with decay: the outer momentum)
    s_r  = Q(TopK(e_r))                         (per chunk of each tensor, the k entries of largest |e_r|)
    e_r <- e_r - s_r                            (what was not sent, and the quantization error, stay)
    theta <- theta - outer_lr * (1/K) sum_r s_r (every node decodes every node's payload)
    theta_r <- theta

``Q`` is :mod:`communicators.codebook` at ``bits`` bits. Chunks: each trainable tensor of ``n``
entries, flattened, is cut into ``ceil(n / c)`` chunks of ``c = min(chunk, n)`` entries (the
last one padded; padding is never chosen over an entry); ``k_t = min(k, c)`` entries per chunk.

Coding (one all-gather of a byte buffer per round): per tensor, each sent entry is one code of
``ceil(log2 c) + bits`` bits (its index within its chunk, then its value's code; the chunk is
its position in the stream), all tensors' codes packed back to back
(:mod:`communicators.bitpack`); then per tensor its codebook, ``2**bits`` float32. Bytes of a
node's payload per round:

    ceil(sum_t chunks_t * k_t * (ceil(log2 c_t) + bits) / 8) + T * 4 * 2**bits

(``T`` trainable tensors), of which an all-gather sends ``K - 1`` per node. With ``chunk = 64``
and ``bits = 2`` each entry is one byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from communicators.bitpack import pack, packed_bytes, unpack
from communicators.codebook import dequantize, quantize
from exogym.core.pipeline import Communicator, NodeContext


@dataclass(frozen=True)
class ChunkPlan:
    """How one tensor of ``numel`` entries is chunked and coded.

    Attributes:
        numel: the tensor's entries.
        chunk: entries per chunk, ``min(chunk, numel)``.
        chunks: ``ceil(numel / chunk)``.
        k: entries sent per chunk, ``min(k, chunk)``.
        index_bits: ``ceil(log2(chunk))`` (0 for a chunk of one entry).
    """

    numel: int
    chunk: int
    chunks: int
    k: int
    index_bits: int

    @classmethod
    def of(cls, numel: int, chunk: int, k: int) -> ChunkPlan:
        """The plan of a tensor of ``numel`` entries for the settings ``chunk`` and ``k``."""
        c = min(chunk, numel)
        return cls(numel, c, -(-numel // c), min(k, c), (c - 1).bit_length())

    @property
    def sent(self) -> int:
        """Entries sent per round: ``chunks * k``."""
        return self.chunks * self.k


def _check_int(name: str, value: Any, low: int, high: int | None, why: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an int {bound} ({why}), got {value!r}")


class SparseLoCoCommunicator(Communicator):
    """Every ``H`` steps: error feedback with decay ``beta``, chunk-wise top-``k`` at ``bits``
    bits all-gathered, and an outer SGD step of ``outer_lr`` on the mean of the decoded payloads.

    State: the last synchronised parameters and each node's error buffer (they differ per node).
    The payload is an all-gather, which cannot leave a node out of a round: faults that drop
    nodes are refused with this module. The payload is coded bytes (:attr:`coded_payloads`; its
    values' precision is ``bits``), so a quantizing wire transform is refused with it too.

    Args:
        H: inner steps between synchronisations.
        chunk: entries per chunk (a tensor smaller than that is one chunk).
        k: entries sent per chunk (``k / chunk`` is the density; the paper sends 1-3%).
        beta: decay of the error-feedback buffer, in ``[0, 1]``.
        bits: bits per sent value, 1 to 8.
        outer_lr: the outer step's learning rate (``> 0``).
    """

    space: ClassVar[str] = "param"
    #: Few-bit codes packed into bytes (``bits`` sets the values' precision): a quantizing wire is refused.
    coded_payloads: ClassVar[bool] = True

    def __init__(
        self, H: int = 100, chunk: int = 64, k: int = 1, beta: float = 0.95, bits: int = 2, outer_lr: float = 1.0
    ) -> None:
        super().__init__(H)
        _check_int("chunk", chunk, 1, None, "entries per chunk")
        _check_int("k", k, 1, chunk, "entries sent per chunk, at most chunk")
        _check_int("bits", bits, 1, 8, "bits per sent value")
        for name, value in (("beta", beta), ("outer_lr", outer_lr)):
            number = not isinstance(value, bool) and isinstance(value, (int, float))
            if not number or not (0.0 <= value <= 1.0 if name == "beta" else value > 0.0):
                bound = "in [0, 1]" if name == "beta" else "> 0"
                raise ValueError(f"{name} must be a number {bound}, got {value!r}")
        self.chunk, self.k, self.beta, self.bits, self.outer_lr = chunk, k, float(beta), bits, float(outer_lr)

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.global_params = [p.detach().clone() for p in self.params]
        self.errors = [torch.zeros(p.numel(), dtype=p.dtype, device=p.device) for p in self.params]
        self.plans = [ChunkPlan.of(p.numel(), self.chunk, self.k) for p in self.params]

    @property
    def payload_bytes(self) -> int:
        """Bytes of this node's all-gather payload per round (the formula of the module docstring)."""
        bits = sum(pl.sent * (pl.index_bits + self.bits) for pl in self.plans)
        return packed_bytes(bits) + len(self.plans) * 4 * (1 << self.bits)

    def _select(self, e: torch.Tensor, pl: ChunkPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """(``[chunks, k]`` indices within each chunk, ascending; their values) of ``e``."""
        magnitude = torch.full((pl.chunks * pl.chunk,), -1.0, dtype=e.dtype, device=e.device)
        magnitude[: pl.numel] = e.abs()
        idx = magnitude.view(pl.chunks, pl.chunk).topk(pl.k, dim=1).indices.sort(dim=1).values
        padded = torch.zeros(pl.chunks * pl.chunk, dtype=e.dtype, device=e.device)
        padded[: pl.numel] = e
        return idx, padded.view(pl.chunks, pl.chunk).gather(1, idx)

    def _decode(self, pl: ChunkPlan, idx: torch.Tensor, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The dense ``[numel]`` tensor holding ``values`` at chunk-local indices ``idx``."""
        dense = torch.zeros(pl.chunks, pl.chunk, dtype=dtype, device=values.device)
        dense.scatter_(1, idx.view(pl.chunks, pl.k), values.view(pl.chunks, pl.k).to(dtype))
        return dense.view(-1)[: pl.numel]

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        codes, widths, books = [], [], []
        for p, g, e, pl in zip(self.params, self.global_params, self.errors, self.plans, strict=True):
            e.mul_(self.beta).add_((g - p).view(-1))
            idx, values = self._select(e, pl)
            q, book = quantize(values.reshape(-1), self.bits)
            e.sub_(self._decode(pl, idx, dequantize(q, book), e.dtype))
            codes.append((idx.reshape(-1) << self.bits) | q)
            widths.append(pl.index_bits + self.bits)
            books.append(book)
        stream = pack(codes, widths)
        payload = torch.cat([stream, torch.cat(books).view(torch.uint8)])
        gathered = self.ctx.comm.all_gather(payload, tag="sparseloco")  # [K, payload bytes]
        nodes = gathered.shape[0]
        total = [torch.zeros(p.numel(), dtype=p.dtype, device=p.device) for p in self.params]
        levels = 1 << self.bits
        for row in gathered:
            sent = unpack(row[: stream.numel()], [pl.sent for pl in self.plans], widths)
            # a copy: the codebooks' bytes start at any offset, and a float32 view needs 4-byte alignment
            all_books = row[stream.numel() :].clone().view(torch.float32).view(len(self.plans), levels)
            for t, (pl, sym) in enumerate(zip(self.plans, sent, strict=True)):
                values = dequantize(sym & (levels - 1), all_books[t])
                total[t].add_(self._decode(pl, sym >> self.bits, values, total[t].dtype))
        for p, g, s in zip(self.params, self.global_params, total, strict=True):
            g.sub_(s.view_as(g), alpha=self.outer_lr / nodes)
            p.copy_(g)

    def state_dict(self) -> dict[str, Any]:
        return {"global_params": list(self.global_params), "errors": list(self.errors)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for mine, saved in ((self.global_params, state["global_params"]), (self.errors, state["errors"])):
            for t, s in zip(mine, saved, strict=True):
                t.copy_(s)

    def describe(self) -> str:
        return (
            f"SparseLoCo(H={self.H}, chunk={self.chunk}, k={self.k}, beta={self.beta}, bits={self.bits}, "
            f"outer_lr={self.outer_lr})"
        )


__all__ = ["ChunkPlan", "SparseLoCoCommunicator"]
