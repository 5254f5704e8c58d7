"""Chunked DCT top-k ops: the reference against the DCT formula, the kernels against the
reference, across shapes, dtypes and layouts."""

import math

import pytest
import torch

from exogym import ops
from exogym.ops.dct import (
    as_2d_shape,
    chunk_shape,
    dct_decode,
    dct_decode_reference,
    dct_encode,
    dct_encode_reference,
    dct_matrix,
    largest_divisor_at_most,
)

needs_ext = pytest.mark.skipif(not ops.extension_loaded(), reason=f"extension not in use: {ops.backend()}")
SHAPES = [(64, 128), (50257,), (33, 17), (12, 48), (8, 3, 3, 3), (4096,), (7,), (96, 40)]
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def test_largest_divisor_matches_brute_force() -> None:
    for n in [1, 7, 64, 96, 50257, 4096, 1000, 97]:
        for limit in [1, 5, 29, 64]:
            assert largest_divisor_at_most(n, limit) == max(d for d in range(1, min(n, limit) + 1) if n % d == 0)
    assert chunk_shape((50257,), 64) == (1, 29) and as_2d_shape((8, 3, 3, 3)) == (8, 27)


def test_dct_matrix_is_the_orthonormal_dct2() -> None:
    n = 12
    d = dct_matrix(n).double()
    for k in range(n):
        for i in range(n):
            c = math.sqrt(1 / n) if k == 0 else math.sqrt(2 / n)
            assert d[k, i].item() == pytest.approx(c * math.cos(math.pi * (2 * i + 1) * k / (2 * n)), abs=1e-6)
    torch.testing.assert_close(d @ d.T, torch.eye(n, dtype=torch.float64), atol=1e-6, rtol=0)


def _dense_chunk_dct(x: torch.Tensor, cr: int, cc: int) -> torch.Tensor:
    """Coefficients [chunks, cr*cc] from the DCT-II double sum, written out (float64)."""
    rows, cols = as_2d_shape(x.shape)
    x2 = x.reshape(rows, cols).double()
    out = []
    for a in range(rows // cr):
        for b in range(cols // cc):
            blk = x2[a * cr : (a + 1) * cr, b * cc : (b + 1) * cc]
            coef = torch.zeros(cr, cc, dtype=torch.float64)
            for u in range(cr):
                for v in range(cc):
                    cu = math.sqrt((1 if u == 0 else 2) / cr)
                    cv = math.sqrt((1 if v == 0 else 2) / cc)
                    iu = torch.cos(math.pi * (2 * torch.arange(cr) + 1) * u / (2 * cr)).double()
                    jv = torch.cos(math.pi * (2 * torch.arange(cc) + 1) * v / (2 * cc)).double()
                    coef[u, v] = cu * cv * (iu[:, None] * blk * jv[None, :]).sum()
            out.append(coef.reshape(-1))
    return torch.stack(out)


def test_reference_encode_agrees_with_the_formula() -> None:
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(0))
    cr, cc = chunk_shape(x.shape, 5)
    idx, vals = dct_encode_reference(x, 5, 4)
    dense = _dense_chunk_dct(x, cr, cc)
    for c in range(dense.shape[0]):
        want = dense[c].abs().topk(4).indices.sort().values
        assert torch.equal(idx[c].long(), want)
        torch.testing.assert_close(vals[c].double(), dense[c][want], atol=1e-5, rtol=0)


def _selection_agrees(idx_a, idx_b, coef_ref, k) -> None:
    """Chunks pick the same indices, except where the k-th and (k+1)-th magnitudes are within
    float noise of each other (then either choice is a correct top-k)."""
    mags = coef_ref.abs().sort(dim=1, descending=True).values
    gap = (mags[:, k - 1] - mags[:, k]) if k < mags.shape[1] else torch.full((mags.shape[0],), float("inf"))
    clear = gap > 1e-4 * mags[:, 0].clamp_min(1e-12)
    assert clear.float().mean() > 0.9
    assert torch.equal(idx_a[clear].long(), idx_b[clear].long())


@needs_ext
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("contiguous", [True, False])
def test_kernel_encode_equals_reference(shape, dtype, contiguous) -> None:
    g = torch.Generator().manual_seed(1)
    if contiguous or len(shape) < 2:
        x = torch.randn(shape, generator=g).to(dtype)
    else:
        x = torch.randn(tuple(reversed(shape)), generator=g).to(dtype).permute(*reversed(range(len(shape))))
    k = 8
    i1, v1 = dct_encode(x, 64, k)
    i2, v2 = dct_encode_reference(x, 64, k)
    assert i1.dtype == i2.dtype == torch.int16 and v1.dtype == v2.dtype == dtype and i1.shape == i2.shape
    cr, cc = chunk_shape(shape, 64)
    full_idx, full_vals = dct_encode_reference(x.float(), 64, cr * cc)
    coef = torch.zeros(full_idx.shape[0], cr * cc).scatter_(1, full_idx.long(), full_vals)
    _selection_agrees(i1, i2, coef, min(k, cr * cc))
    same = (i1 == i2).all(dim=1)
    torch.testing.assert_close(v1[same].float(), v2[same].float(), atol=TOL[dtype] * 10, rtol=TOL[dtype])


@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_with_k_equal_to_chunk(shape) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    cr, cc = chunk_shape(shape, 64)
    for enc, dec in ((dct_encode, dct_decode), (dct_encode_reference, dct_decode_reference)):
        idx, vals = enc(x, 64, cr * cc)
        torch.testing.assert_close(dec(idx[None], vals[None], shape, 64), x, atol=2e-5, rtol=1e-5)


def _gathered(shape, ranks, k, dtype=torch.float32):
    cr, cc = chunk_shape(shape, 64)
    rows, cols = as_2d_shape(shape)
    n = (rows // cr) * (cols // cc)
    g = torch.Generator().manual_seed(3)
    idx = torch.stack(
        [torch.stack([torch.randperm(cr * cc, generator=g)[:k].sort().values for _ in range(n)]) for _ in range(ranks)]
    )
    vals = torch.randn(ranks, n, k, generator=g).to(dtype)
    return idx.to(torch.int16), vals


def test_reference_decode_takes_the_mean_over_choosing_ranks() -> None:
    shape = (4, 6)
    idx = torch.tensor([[[0, 5]], [[5, 7]]], dtype=torch.int16)
    vals = torch.tensor([[[2.0, 4.0]], [[8.0, -1.0]]])
    out = dct_decode_reference(idx, vals, shape, 64)
    coef = torch.zeros(24, dtype=torch.float64)
    coef[0], coef[5], coef[7] = 2.0, 6.0, -1.0  # index 5 chosen by both ranks: mean of 4 and 8
    d4, d6 = dct_matrix(4).double(), dct_matrix(6).double()
    torch.testing.assert_close(out.double(), d4.T @ coef.view(4, 6) @ d6, atol=1e-6, rtol=0)


@needs_ext
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("sign", [False, True])
def test_kernel_decode_equals_reference(shape, ranks, sign) -> None:
    cr, cc = chunk_shape(shape, 64)
    idx, vals = _gathered(shape, ranks, min(8, cr * cc))
    a = dct_decode(idx, vals, shape, 64, sign=sign)
    b = dct_decode_reference(idx, vals, shape, 64, sign=sign)
    if sign:
        ref = dct_decode_reference(idx, vals, shape, 64)
        clear = ref.abs() > 1e-5  # the sign of a near-zero value is float noise
        assert torch.equal(a[clear], b[clear])
    else:
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
    assert torch.equal(a, dct_decode(idx, vals, shape, 64, sign=sign))  # deterministic


@needs_ext
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernel_decode_low_precision(dtype) -> None:
    idx, vals = _gathered((64, 128), 4, 16, dtype)
    a = dct_decode(idx, vals, (64, 128), 64)
    b = dct_decode_reference(idx, vals, (64, 128), 64)
    assert a.dtype == dtype
    torch.testing.assert_close(a.float(), b.float(), atol=TOL[dtype] * 10, rtol=TOL[dtype])


def test_a_chunk_over_the_shared_maximum_area_is_rejected_on_every_path() -> None:
    from exogym.ops.dct import MAX_CHUNK_AREA

    x = torch.randn(200, 200)
    with pytest.raises(ValueError, match=f"at most {MAX_CHUNK_AREA} entries.*chunk=200"):
        dct_encode(x, 200, 4)
    if ops.extension_loaded():
        with pytest.raises(RuntimeError, match=f"at most {MAX_CHUNK_AREA}"):
            torch.ops.exogym.dct_encode.default(x, 200, 200, 4)


def test_ties_go_to_the_lowest_index_on_the_kernel_and_the_reference() -> None:
    """Every coefficient of a zero chunk ties at 0: both paths must pick the lowest indices."""
    x = torch.zeros(8, 8)
    ref = dct_encode_reference(x, 8, 5)
    assert ref[0].tolist() == [[0, 1, 2, 3, 4]]
    if ops.extension_loaded():
        got = dct_encode(x, 8, 5)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@needs_ext
def test_opcheck_dct_ops() -> None:
    x = torch.randn(16, 24)
    torch.library.opcheck(torch.ops.exogym.dct_encode.default, (x, 8, 8, 4))
    idx, vals = _gathered((16, 24), 2, 4)
    torch.library.opcheck(torch.ops.exogym.dct_decode.default, (idx, vals, 16, 24, 16, 24, False))


def test_bad_arguments() -> None:
    with pytest.raises(TypeError, match="floating-point"):
        dct_encode(torch.zeros(4, dtype=torch.int64), 4, 2)
    with pytest.raises(ValueError, match="ranks, chunks, k"):
        dct_decode(torch.zeros(2, 3, dtype=torch.int16), torch.zeros(2, 3), (4,), 4)
