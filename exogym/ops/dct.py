"""Chunked DCT-II with per-chunk top-k (DeMo's compression), and the decode of gathered top-k.

A tensor is viewed as 2-D ``[rows, cols]`` (1-D ``[n]`` as ``[1, n]``; more dimensions as
``[shape[0], prod(shape[1:])]``) and cut into chunks of ``cr x cc`` where each chunk side is the
largest divisor of that dimension not above ``chunk`` (DeMo, Peng et al. 2024, arXiv 2411.19870).
Each chunk gets the orthonormal 2-D DCT-II ``D_cr @ X @ D_cc^T``; the ``topk`` coefficients of
largest magnitude per chunk are kept as (index within the chunk, value).

Decoding takes the top-k of ``R`` ranks, ``[R, chunks, k]``: each coefficient becomes the mean over
the ranks that chose it (zero where none did), summed in rank order (deterministic), then the
inverse DCT rebuilds the tensor; ``sign=True`` returns its sign instead.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from exogym import ops as _ops

#: Largest chunk (entries) the kernels accept on any device (csrc/dct_limits.h).
MAX_CHUNK_AREA = 5632


def largest_divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is ``<= limit`` (1 when only 1 qualifies)."""
    if n <= limit:
        return n
    best = 1
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            for c in (d, n // d):
                if best < c <= limit:
                    best = c
    return best


def as_2d_shape(shape: torch.Size | tuple[int, ...]) -> tuple[int, int]:
    """The ``[rows, cols]`` view of a tensor shape (see the module docstring)."""
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return 1, int(shape[0])
    return int(shape[0]), int(math.prod(shape[1:]))


def chunk_shape(shape: torch.Size | tuple[int, ...], chunk: int) -> tuple[int, int]:
    """``(cr, cc)``, the chunk sides for a tensor of ``shape`` and target ``chunk``."""
    rows, cols = as_2d_shape(shape)
    return largest_divisor_at_most(rows, chunk), largest_divisor_at_most(cols, chunk)


def index_dtype(cr: int, cc: int) -> torch.dtype:
    """int16 when every index within a chunk fits, else int32."""
    return torch.int16 if cr * cc <= 2**15 else torch.int32


@lru_cache(maxsize=64)
def _dct_matrix_cpu(n: int) -> torch.Tensor:
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    d = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    d[0] /= math.sqrt(2.0)
    return d.to(torch.float32)


def dct_matrix(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The orthonormal DCT-II matrix ``D`` of size ``n`` (rows are frequencies): ``D @ D.T = I``."""
    return _dct_matrix_cpu(n).to(device)


def _blocks(x2d: torch.Tensor, cr: int, cc: int) -> torch.Tensor:
    rows, cols = x2d.shape
    return x2d.reshape(rows // cr, cr, cols // cc, cc).permute(0, 2, 1, 3)  # [R/cr, C/cc, cr, cc]


def dct_encode_reference(x: torch.Tensor, chunk: int, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-torch reference of [`dct_encode`][exogym.ops.dct_encode] (einsum DCT, a stable sort for
    the top-k)."""
    cr, cc = chunk_shape(x.shape, chunk)
    rows, cols = as_2d_shape(x.shape)
    k = min(topk, cr * cc)
    blocks = _blocks(x.detach().reshape(rows, cols).to(torch.float32), cr, cc)
    coeffs = torch.einsum("ij,abjl,kl->abik", dct_matrix(cr, x.device), blocks, dct_matrix(cc, x.device))
    flat = coeffs.reshape(-1, cr * cc)
    # Ties go to the lower index, as in the kernels: a stable descending sort keeps index order
    # among equal magnitudes (torch.topk breaks ties arbitrarily).
    idx = flat.abs().sort(dim=1, descending=True, stable=True).indices[:, :k]
    idx = idx.sort(dim=1).values
    vals = flat.gather(1, idx)
    return idx.to(index_dtype(cr, cc)), vals.to(x.dtype)


def dct_decode_reference(
    indices: torch.Tensor, values: torch.Tensor, shape: tuple[int, ...], chunk: int, sign: bool = False
) -> torch.Tensor:
    """Pure-torch reference of [`dct_decode`][exogym.ops.dct_decode] (``scatter_reduce`` mean,
    einsum inverse DCT)."""
    cr, cc = chunk_shape(shape, chunk)
    rows, cols = as_2d_shape(shape)
    r, nchunks, _ = indices.shape
    dense = torch.zeros(nchunks, cr * cc, dtype=torch.float32, device=values.device)
    count = torch.zeros_like(dense)
    idx = indices.to(torch.int64).permute(1, 0, 2).reshape(nchunks, -1)
    val = values.to(torch.float32).permute(1, 0, 2).reshape(nchunks, -1)
    dense.scatter_add_(1, idx, val)
    count.scatter_add_(1, idx, torch.ones_like(val))
    dense = dense / count.clamp_min(1.0)
    coeffs = dense.reshape(rows // cr, cols // cc, cr, cc)
    blocks = torch.einsum("ji,abjl,lk->abik", dct_matrix(cr, values.device), coeffs, dct_matrix(cc, values.device))
    out = blocks.permute(0, 2, 1, 3).reshape(shape)
    if sign:
        out = out.sign()
    return out.to(values.dtype)


def dct_encode(x: torch.Tensor, chunk: int, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked 2-D DCT-II of ``x`` and its top-``topk`` coefficients by magnitude per chunk.

    Returns ``(indices, values)`` of shape ``[chunks, min(topk, cr*cc)]``: indices within the
    chunk (row-major over ``cr x cc``), sorted ascending per chunk, int16 where the chunk allows
    (int32 otherwise); values in ``x``'s dtype (computed in float32). Chunks are ordered
    row-major over the ``[rows/cr, cols/cc]`` grid. ``x`` may be non-contiguous.
    """
    _check(x, chunk, topk)
    if not _ops.use_kernel("dct_encode", x.device):
        return dct_encode_reference(x, chunk, topk)
    cr, cc = chunk_shape(x.shape, chunk)
    rows, cols = as_2d_shape(x.shape)
    return torch.ops.exogym.dct_encode.default(x.reshape(rows, cols), cr, cc, min(topk, cr * cc))


def dct_decode(
    indices: torch.Tensor, values: torch.Tensor, shape: tuple[int, ...], chunk: int, sign: bool = False
) -> torch.Tensor:
    """Rebuild a tensor of ``shape`` from ``R`` ranks' top-k: ``indices``/``values`` ``[R, chunks, k]``.

    Per coefficient, the mean over the ranks that chose it; then the inverse chunked DCT. With
    ``sign=True`` the result's sign (DeMo's update direction). Deterministic. Output dtype is
    ``values``' dtype.
    """
    if indices.dim() != 3 or indices.shape != values.shape:
        raise ValueError(
            "dct_decode: indices and values must both be [ranks, chunks, k], "
            f"got {tuple(indices.shape)} and {tuple(values.shape)}"
        )
    if not _ops.use_kernel("dct_decode", values.device):
        return dct_decode_reference(indices, values, tuple(shape), chunk, sign)
    cr, cc = chunk_shape(shape, chunk)
    rows, cols = as_2d_shape(shape)
    return torch.ops.exogym.dct_decode.default(indices, values, rows, cols, cr, cc, sign).reshape(shape)


def _check(x: torch.Tensor, chunk: int, topk: int) -> None:
    if not x.is_floating_point():
        raise TypeError(f"dct_encode: x must be a floating-point tensor, got {x.dtype}")
    if chunk < 1 or topk < 1:
        raise ValueError(f"dct_encode: chunk and topk must be >= 1, got chunk={chunk}, topk={topk}")
    cr, cc = chunk_shape(x.shape, chunk)
    if cr * cc > MAX_CHUNK_AREA:
        raise ValueError(
            f"dct_encode: chunks hold at most {MAX_CHUNK_AREA} entries on every device, got {cr}x{cc} "
            f"for shape {tuple(x.shape)} and chunk={chunk}; use a smaller chunk"
        )


def _register_fakes() -> None:
    @torch.library.register_fake("exogym::dct_encode")
    def _(x, cr, cc, k):  # noqa: ANN001
        torch._check(x.dim() == 2, lambda: f"dct_encode: x must be 2-D, got {x.dim()} dims")
        torch._check(x.is_floating_point(), lambda: f"dct_encode: x must be floating point, got {x.dtype}")
        rows, cols = x.shape
        torch._check(
            rows % cr == 0 and cols % cc == 0, lambda: f"dct_encode: chunk {cr}x{cc} must divide {rows}x{cols}"
        )
        torch._check(1 <= k <= cr * cc, lambda: f"dct_encode: topk must be in [1, {cr * cc}], got {k}")
        n = (rows // cr) * (cols // cc)
        return x.new_empty(n, k, dtype=index_dtype(cr, cc)), x.new_empty(n, k)

    @torch.library.register_fake("exogym::dct_decode")
    def _(indices, values, rows, cols, cr, cc, sign):  # noqa: ANN001
        torch._check(
            indices.dim() == 3 and indices.shape == values.shape,
            lambda: "dct_decode: indices and values must both be [ranks, chunks, k]",
        )
        torch._check(indices.dtype in (torch.int16, torch.int32), lambda: "dct_decode: indices must be int16 or int32")
        torch._check(
            indices.shape[1] == (rows // cr) * (cols // cc), lambda: "dct_decode: wrong number of chunks for the shape"
        )
        return values.new_empty(rows, cols)


if _ops.extension_loaded():
    _register_fakes()
