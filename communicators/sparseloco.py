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

``Q`` is ``communicators.codebook`` at ``bits`` bits. Chunks (``ChunkPlan``), by
``chunking``:

- ``"blocks"`` (the paper's, as DeMo chunks, arXiv 2411.19870): a tensor is viewed as a matrix
  ``[rows, cols]`` (a vector as ``[1, n]``, more dimensions as ``[shape[0], prod(shape[1:])]``)
  and cut into blocks of ``b_r x b_c``, each side the largest divisor of its dimension not above
  ``chunk``: a 64x64 block of a large matrix at ``chunk = 64``, runs of at most ``chunk``
  entries of a vector.
- ``"flat"``: each tensor of ``n`` entries, flattened, is cut into ``ceil(n / c)`` runs of
  ``c = min(chunk, n)`` entries (the last one padded; padding is never chosen over an entry).

A chunk of ``c_t`` entries sends ``k_t = min(k, c_t)`` of them.

Coding (one all-gather of a byte buffer per round): per tensor, each sent entry is one code of
``ceil(log2 c_t) + bits`` bits (its index within its chunk, then its value's code; the chunk is
its position in the stream), all tensors' codes packed back to back
(``communicators.bitpack``); then per tensor its codebook, ``2**bits`` float32. Bytes of a
node's payload per round:

    ceil(sum_t chunks_t * k_t * (ceil(log2 c_t) + bits) / 8) + T * 4 * 2**bits

(``T`` trainable tensors), of which an all-gather sends ``K - 1`` per node. With 64x64 blocks
and ``bits = 2`` each entry is 14 bits (the paper's 12-bit index within a chunk of 4096).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from communicators.bitpack import all_gather_bytes, pack, unpack
from communicators.checks import check_int, check_number
from communicators.codebook import dequantize, quantize
from exogym.core.pipeline import Communicator, NodeContext
from exogym.ops.dct import as_2d_shape, largest_divisor_at_most

#: The ways to cut a tensor into chunks (see the module docstring).
CHUNKINGS = ("blocks", "flat")
#: Without ``k``, a chunk sends ``1 / DENSITY_DIVISOR`` of its entries (1.6%, the paper's lower density).
DENSITY_DIVISOR = 64


@dataclass(frozen=True)
class ChunkPlan:
    """How one tensor is chunked and coded: viewed as ``[rows, cols]``, cut into a grid of
    ``block_rows x block_cols`` chunks (the last column of chunks padded where ``block_cols``
    does not divide ``cols``, which only ``"flat"`` chunking does; padding is never chosen over
    an entry), ``k`` entries sent per chunk.
    """

    rows: int
    cols: int
    block_rows: int
    block_cols: int
    k: int

    @classmethod
    def of(cls, shape: tuple[int, ...], chunk: int, k: int, chunking: str) -> ChunkPlan:
        """The plan of a tensor of ``shape`` for the settings ``chunk``, ``k`` and ``chunking``."""
        if chunking == "flat":
            n = math.prod(shape)
            c = min(chunk, n)
            return cls(1, n, 1, c, min(k, c))
        rows, cols = as_2d_shape(shape)
        br, bc = largest_divisor_at_most(rows, chunk), largest_divisor_at_most(cols, chunk)
        return cls(rows, cols, br, bc, min(k, br * bc))

    @property
    def chunk(self) -> int:
        """Entries per chunk."""
        return self.block_rows * self.block_cols

    @property
    def grid(self) -> tuple[int, int]:
        """Chunks down and across."""
        return -(-self.rows // self.block_rows), -(-self.cols // self.block_cols)

    @property
    def chunks(self) -> int:
        """Chunks of the tensor."""
        return self.grid[0] * self.grid[1]

    @property
    def index_bits(self) -> int:
        """Bits of an index within a chunk: ``ceil(log2(chunk))`` (0 for a chunk of one entry)."""
        return (self.chunk - 1).bit_length()

    @property
    def sent(self) -> int:
        """Entries sent per round: ``chunks * k``."""
        return self.chunks * self.k

    def to_chunks(self, x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """``[chunks, chunk]``: the flat ``x`` (``rows * cols`` entries) one chunk per row, in
        row-major order of the grid and within each chunk; padding holds ``fill``."""
        (gr, gc), br, bc = self.grid, self.block_rows, self.block_cols
        m = x.new_full((gr * br, gc * bc), fill)
        m[: self.rows, : self.cols] = x.view(self.rows, self.cols)
        return m.view(gr, br, gc, bc).permute(0, 2, 1, 3).reshape(self.chunks, self.chunk)

    def from_chunks(self, chunks: torch.Tensor) -> torch.Tensor:
        """The flat tensor of ``to_chunks``'s ``[chunks, chunk]`` (padding dropped)."""
        (gr, gc), br, bc = self.grid, self.block_rows, self.block_cols
        m = chunks.view(gr, gc, br, bc).permute(0, 2, 1, 3).reshape(gr * br, gc * bc)
        return m[: self.rows, : self.cols].reshape(-1)


class SparseLoCoCommunicator(Communicator):
    """Every ``H`` steps: error feedback with decay ``beta``, chunk-wise top-``k`` at ``bits``
    bits all-gathered, and an outer SGD step of ``outer_lr`` on the mean of the decoded payloads.

    State: the last synchronised parameters and each node's error buffer (they differ per node).
    The payload is an all-gather, which cannot leave a node out of a round: faults that drop
    nodes are refused with this module. The payload is coded bytes (``payloads = "coded"``; its
    values' precision is ``bits``), so a quantizing wire transform is refused with it too.

    Args:
        H: inner steps between synchronisations.
        chunk: a chunk's side: with ``chunking="blocks"`` a matrix is cut into blocks of at most
            ``chunk x chunk`` entries and a vector into runs of at most ``chunk``; with
            ``"flat"`` every tensor into runs of ``chunk`` entries.
        k: entries sent per chunk, at most a full chunk's entries (``chunk * chunk`` with
            ``"blocks"``, ``chunk`` with ``"flat"``); ``None``: 1/64 of them (1.6% density, the
            paper sends 1-3%): 64 of a 64x64 block, 1 of a 64-entry run.
        beta: decay of the error-feedback buffer, in ``[0, 1]``.
        bits: bits per sent value, 1 to 8.
        outer_lr: the outer step's learning rate (``> 0``).
        chunking: ``"blocks"`` (the paper's: 2-D blocks of each matrix, as DeMo chunks) or
            ``"flat"`` (contiguous runs of each flattened tensor); see the module docstring.
    """

    space: ClassVar[str] = "param"
    #: Few-bit codes packed into bytes (``bits`` sets the values' precision): a quantizing wire is refused.
    payloads: ClassVar[str] = "coded"

    def __init__(
        self,
        H: int = 100,
        chunk: int = 64,
        k: int | None = None,
        beta: float = 0.95,
        bits: int = 2,
        outer_lr: float = 1.0,
        chunking: Literal["blocks", "flat"] = "blocks",
    ) -> None:
        super().__init__(H)
        if chunking not in CHUNKINGS:
            raise ValueError(
                f"chunking must be 'blocks' (each matrix in blocks of chunk x chunk, the paper's) or 'flat' "
                f"(each tensor flattened into runs of chunk entries), got {chunking!r}"
            )
        check_int("chunk", chunk, why="a chunk's side")
        full = chunk * chunk if chunking == "blocks" else chunk
        if k is None:
            k = max(1, full // DENSITY_DIVISOR)
        check_int("k", k, 1, full, f"entries sent per chunk, at most a chunk's {full} with chunking={chunking!r}")
        check_int("bits", bits, 1, 8, "bits per sent value")
        check_number("beta", beta, 0, 1, upto=True)
        check_number("outer_lr", outer_lr, 0, above=True)
        self.chunk, self.k, self.beta, self.bits, self.outer_lr = chunk, k, float(beta), bits, float(outer_lr)
        self.chunking = chunking

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.global_params = [p.detach().clone() for p in self.params]
        self.errors = [torch.zeros(p.numel(), dtype=p.dtype, device=p.device) for p in self.params]
        self.plans = [ChunkPlan.of(tuple(p.shape), self.chunk, self.k, self.chunking) for p in self.params]

    def _decode(self, pl: ChunkPlan, idx: torch.Tensor, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The dense flat tensor holding ``values`` at chunk-local indices ``idx``."""
        dense = torch.zeros(pl.chunks, pl.chunk, dtype=dtype, device=values.device)
        dense.scatter_(1, idx.view(pl.chunks, pl.k), values.view(pl.chunks, pl.k).to(dtype))
        return pl.from_chunks(dense)

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        codes, widths, books = [], [], []
        for p, g, e, pl in zip(self.params, self.global_params, self.errors, self.plans, strict=True):
            e.mul_(self.beta).add_((g - p).view(-1))
            # per chunk, the indices of its k largest |e| (ascending), and their values
            idx = pl.to_chunks(e.abs(), fill=-1.0).topk(pl.k, dim=1).indices.sort(dim=1).values
            values = pl.to_chunks(e).gather(1, idx)
            q, book = quantize(values.reshape(-1), self.bits)
            e.sub_(self._decode(pl, idx, dequantize(q, book), e.dtype))
            codes.append((idx.reshape(-1) << self.bits) | q)
            widths.append(pl.index_bits + self.bits)
            books.append(book)
        payload = [pack(codes, widths), torch.cat(books)]
        streams, all_books = all_gather_bytes(self.ctx.comm, payload, tag="sparseloco")  # one row per node
        total = [torch.zeros(p.numel(), dtype=p.dtype, device=p.device) for p in self.params]
        levels = 1 << self.bits
        for stream, node_books in zip(streams, all_books.view(-1, len(self.plans), levels), strict=True):
            sent = unpack(stream, [pl.sent for pl in self.plans], widths)
            for t, (pl, sym) in enumerate(zip(self.plans, sent, strict=True)):
                values = dequantize(sym & (levels - 1), node_books[t])
                total[t].add_(self._decode(pl, sym >> self.bits, values, total[t].dtype))
        for p, g, s in zip(self.params, self.global_params, total, strict=True):
            g.sub_(s.view_as(g), alpha=self.outer_lr / streams.shape[0])
            p.copy_(g)

    def state_dict(self) -> dict[str, Any]:
        return {"global_params": list(self.global_params), "errors": list(self.errors)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for t, s in zip(self.global_params + self.errors, state["global_params"] + state["errors"], strict=True):
            t.copy_(s)

    def describe(self) -> str:
        return (
            f"SparseLoCo(H={self.H}, chunk={self.chunk}, k={self.k}, beta={self.beta}, bits={self.bits}, "
            f"outer_lr={self.outer_lr}, chunking={self.chunking!r})"
        )


__all__ = ["ChunkPlan", "SparseLoCoCommunicator"]
