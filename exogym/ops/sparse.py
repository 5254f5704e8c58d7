"""Sparse index ops: shared-seed index selection, gather into one buffer, scatter back.

SPARTA-style sparse averaging needs every rank to pick the same parameter indices without ever
sending them. [`select_indices`][exogym.ops.select_indices] derives them from
``(seed, step, tensor_id)`` with a counter-based hash (no torch RNG state), identically on every
rank and on CPU and CUDA.

Selection is *stratified*: the ``n`` positions are cut into ``k`` strata
``[j*n//k, (j+1)*n//k)`` and one index is drawn from each, so exactly ``k`` distinct indices come
back, sorted, and every position is chosen with probability ``1/|stratum|`` (``k/n`` when ``k``
divides ``n``). ``k = n`` selects everything.

The hash is mirrored in ``csrc/hash.h``; the reference below computes it with int64 torch ops
(32-bit products split into 16-bit halves so nothing overflows).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from exogym import ops as _ops

_M32 = 0xFFFFFFFF


def _mix32_int(x: int) -> int:
    """lowbias32 on a Python int (for the per-stream key)."""
    x &= _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    x ^= x >> 16
    return x


def _stream_key(seed: int, step: int, tensor_id: int) -> int:
    m64 = (1 << 64) - 1
    seed, step, tensor_id = seed & m64, step & m64, tensor_id & m64
    h = _mix32_int((seed & _M32) ^ 0x9E3779B9)
    h = _mix32_int(h ^ (seed >> 32))
    h = _mix32_int(h ^ (step & _M32))
    h = _mix32_int(h ^ (step >> 32))
    return _mix32_int(h ^ (tensor_id & _M32))


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 tensors holding uint32 values, without int64 overflow."""
    hi = ((x >> 16) * c) & 0xFFFF
    return ((hi << 16) + (x & 0xFFFF) * c) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def select_indices_reference(
    n: int, k: int, seed: int, step: int, tensor_id: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Pure-torch reference of [`select_indices`][exogym.ops.select_indices] (same contract, same
    result)."""
    _check_select(n, k)
    j = torch.arange(k, dtype=torch.int64, device=device)
    key = _stream_key(seed, step, tensor_id)
    a = _mix32(key ^ (j & _M32))
    a = _mix32(a ^ (j >> 32))
    b = _mix32(a ^ 0x85EBCA6B)
    r = ((a & 0x7FFFFFFF) << 31) | (b & 0x7FFFFFFF)
    start = (j * n) // k
    stop = ((j + 1) * n) // k
    return start + torch.remainder(r, stop - start)


def _check_select(n: int, k: int) -> None:
    if not 0 <= k <= n:
        raise ValueError(f"select_indices: need 0 <= k <= n, got k={k}, n={n}")


def select_indices(
    n: int, k: int, seed: int, step: int, tensor_id: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Return ``k`` distinct sorted int64 indices out of ``range(n)`` for ``(seed, step, tensor_id)``.

    Deterministic: every process and every device gets the same indices for the same arguments.
    Different ``step`` or ``tensor_id`` give independent draws. Raises ``ValueError`` unless
    ``0 <= k <= n``.
    """
    device = torch.device(device)
    if device.type == "meta":  # indices without values: their number is all there is
        _check_select(n, k)
        return torch.empty(k, dtype=torch.int64, device=device)
    if not _ops.use_kernel("select_indices", device):
        return select_indices_reference(n, k, seed, step, tensor_id, device)
    _check_select(n, k)
    out = torch.empty(k, dtype=torch.int64, device=device)
    torch.ops.exogym.select_indices.default(n, _signed64(seed), _signed64(step), _signed64(tensor_id), out)
    return out


def _signed64(x: int) -> int:
    """Reinterpret ``x mod 2**64`` as a signed int64 (the op schema's ``int``)."""
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def sparse_gather_reference(srcs: Sequence[torch.Tensor], indices: Sequence[torch.Tensor]) -> torch.Tensor:
    """Pure-torch reference of [`sparse_gather`][exogym.ops.sparse_gather]."""
    return torch.cat([s.reshape(-1)[i] for s, i in zip(srcs, indices, strict=True)])


def sparse_gather(srcs: Sequence[torch.Tensor], indices: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate ``srcs[i].flatten()[indices[i]]`` for every ``i`` into one new 1-D tensor.

    All ``srcs`` share one dtype and device; ``indices`` are 1-D int64 on the same device.
    The result is the payload of one collective for all tensors of a step.
    """
    if not srcs:
        raise ValueError("sparse_gather: srcs must not be empty")
    if not _ops.use_kernel("sparse_gather", srcs[0].device):
        return sparse_gather_reference(srcs, indices)
    return torch.ops.exogym.sparse_gather.default(list(srcs), list(indices))


def sparse_scatter_reference_(
    dsts: Sequence[torch.Tensor],
    indices: Sequence[torch.Tensor],
    values: torch.Tensor,
    scale: float = 1.0,
) -> None:
    """Pure-torch reference of [`sparse_scatter_`][exogym.ops.sparse_scatter_] (mutates ``dsts`` in
    place)."""
    total = sum(i.numel() for i in indices)
    if values.dim() != 1 or values.numel() != total:
        raise ValueError(
            f"sparse_scatter_: values must be 1-D with {total} elements (the sum of the index lengths), "
            f"got {tuple(values.shape)}"
        )
    offset = 0
    for dst, idx in zip(dsts, indices, strict=True):
        part = values[offset : offset + idx.numel()]
        flat = dst.view(-1) if dst.is_contiguous() else dst.reshape(-1).clone()
        flat[idx] = (part.to(torch.float32) * scale).to(dst.dtype) if scale != 1.0 else part
        if not dst.is_contiguous():
            dst.copy_(flat.view_as(dst))
        offset += idx.numel()


def sparse_scatter_(
    dsts: Sequence[torch.Tensor],
    indices: Sequence[torch.Tensor],
    values: torch.Tensor,
    scale: float = 1.0,
) -> None:
    """In place: ``dsts[i].flatten()[indices[i]] = values[off_i : off_i + len_i] * scale``.

    ``values`` is the 1-D buffer [`sparse_gather`][exogym.ops.sparse_gather] produced (typically
    after an all-reduce sum); ``scale = 1/K`` fuses the average. ``values`` must have exactly
    ``sum(len(indices[i]))`` elements and the destinations' dtype.
    """
    if not dsts:
        return
    if not _ops.use_kernel("sparse_scatter_", dsts[0].device):
        return sparse_scatter_reference_(dsts, indices, values, scale)
    torch.ops.exogym.sparse_scatter_.default(list(dsts), list(indices), values, float(scale))


def _register_fakes() -> None:
    """Fake (meta) implementations so the ops trace under ``torch.compile``."""

    @torch.library.register_fake("exogym::select_indices")
    def _(n, seed, step, tensor_id, out):  # noqa: ANN001 - signature fixed by the schema
        torch._check(out.dtype == torch.int64 and out.dim() == 1, lambda: "select_indices: out must be 1-D int64")
        torch._check(out.shape[0] <= n, lambda: f"select_indices: need k <= n, got k={out.shape[0]}, n={n}")
        return None

    def check_pairs(tensors, indices, op):  # noqa: ANN001, ANN202
        torch._check(len(tensors) == len(indices), lambda: f"{op}: need one index tensor per tensor")
        for t, i in zip(tensors, indices, strict=True):
            torch._check(i.dtype == torch.int64 and i.dim() == 1, lambda: f"{op}: indices must be 1-D int64")
            torch._check(t.dtype == tensors[0].dtype, lambda: f"{op}: all tensors must share one dtype")

    @torch.library.register_fake("exogym::sparse_gather")
    def _(srcs, indices):  # noqa: ANN001
        torch._check(len(srcs) > 0, lambda: "sparse_gather: srcs must not be empty")
        check_pairs(srcs, indices, "sparse_gather")
        total = sum(i.shape[0] for i in indices)
        return srcs[0].new_empty(total)

    @torch.library.register_fake("exogym::sparse_scatter_")
    def _(dsts, indices, values, scale):  # noqa: ANN001
        check_pairs(dsts, indices, "sparse_scatter_")
        total = sum(i.shape[0] for i in indices)
        torch._check(
            values.dim() == 1 and values.shape[0] == total, lambda: f"sparse_scatter_: values must be [{total}]"
        )
        return None


if _ops.extension_loaded():
    _register_fakes()
