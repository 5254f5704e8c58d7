"""Sparse index ops: the extension against the pure-torch reference, and the selection's contract."""

import subprocess
import sys

import pytest
import torch

from exogym import ops

needs_ext = pytest.mark.skipif(not ops.extension_loaded(), reason=f"extension not in use: {ops.backend()}")


def _independent_hash_indices(n: int, k: int, seed: int, step: int, tid: int) -> list[int]:
    """The selection rule written with Python ints (no torch): lowbias32 chain, stratified pick."""
    m32 = 0xFFFFFFFF

    def mix(x):
        x &= m32
        x ^= x >> 16
        x = (x * 0x7FEB352D) & m32
        x ^= x >> 15
        x = (x * 0x846CA68B) & m32
        return x ^ (x >> 16)

    key = mix(seed ^ 0x9E3779B9)
    for word in (seed >> 32, step, step >> 32, tid):
        key = mix(key ^ (word & m32))
    out = []
    for j in range(k):
        a = mix(mix(key ^ (j & m32)) ^ (j >> 32))
        b = mix(a ^ 0x85EBCA6B)
        r = ((a & 0x7FFFFFFF) << 31) | (b & 0x7FFFFFFF)
        lo, hi = j * n // k, (j + 1) * n // k
        out.append(lo + r % (hi - lo))
    return out


@pytest.mark.parametrize(("n", "k"), [(10, 10), (1000, 5), (50257, 251), (7, 3), (1, 1), (5, 0)])
def test_reference_matches_the_rule_written_in_python(n: int, k: int) -> None:
    got = ops.select_indices_reference(n, k, seed=11, step=3, tensor_id=2).tolist()
    assert got == _independent_hash_indices(n, k, 11, 3, 2)


@needs_ext
@pytest.mark.parametrize(
    ("n", "k", "seed", "step", "tid"),
    [(10**7, 50000, 0, 0, 0), (50257, 100, -5, 2**40, 9), (10**10, 64, 2**63 - 1, 7, 3)],
)
def test_kernel_equals_reference(n, k, seed, step, tid) -> None:
    assert torch.equal(ops.select_indices(n, k, seed, step, tid), ops.select_indices_reference(n, k, seed, step, tid))


def test_selection_is_exact_sorted_distinct_and_step_dependent() -> None:
    a = ops.select_indices(1000, 37, seed=1, step=5, tensor_id=0)
    assert a.numel() == 37 and a.unique().numel() == 37
    assert torch.equal(a, a.sort().values) and int(a.min()) >= 0 and int(a.max()) < 1000
    assert torch.equal(a, ops.select_indices(1000, 37, seed=1, step=5, tensor_id=0))
    assert not torch.equal(a, ops.select_indices(1000, 37, seed=1, step=6, tensor_id=0))
    assert not torch.equal(a, ops.select_indices(1000, 37, seed=1, step=5, tensor_id=1))
    assert torch.equal(ops.select_indices(20, 20, 0, 0, 0), torch.arange(20))


def test_selection_covers_positions_uniformly() -> None:
    n, k, draws = 100, 10, 3000
    counts = torch.zeros(n)
    for step in range(draws):
        counts[ops.select_indices(n, k, 0, step, 0)] += 1
    expected = draws * k / n
    assert (counts - expected).abs().max() < 5 * expected**0.5  # 5 sigma of a binomial


def test_same_indices_in_another_process() -> None:
    code = "from exogym import ops; print(ops.select_indices(123457, 99, 4, 8, 15).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert eval(out) == ops.select_indices(123457, 99, 4, 8, 15).tolist()


def test_bad_k_is_rejected() -> None:
    with pytest.raises(ValueError, match="0 <= k <= n"):
        ops.select_indices(5, 6, 0, 0, 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("contiguous", [True, False])
def test_gather_and_scatter_equal_reference(dtype, contiguous) -> None:
    g = torch.Generator().manual_seed(0)
    shapes = [(50257,), (33, 17), (4, 3, 5, 5)]
    srcs = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    if not contiguous:
        srcs[1] = torch.randn(17, 33, generator=g).to(dtype).t()
    idx = [ops.select_indices(t.numel(), max(1, t.numel() // 7), 3, 1, i) for i, t in enumerate(srcs)]
    gathered = ops.sparse_gather(srcs, idx)
    assert torch.equal(gathered, ops.sparse_gather_reference(srcs, idx))
    assert torch.equal(gathered, torch.cat([s.reshape(-1)[i] for s, i in zip(srcs, idx, strict=True)]))
    values = gathered * 3
    a = [s.clone() for s in srcs]
    b = [s.clone() for s in srcs]
    if not contiguous:
        a[1] = srcs[1].t().clone().t()
        b[1] = srcs[1].t().clone().t()
    ops.sparse_scatter_(a, idx, values, 0.25)
    ops.sparse_scatter_reference_(b, idx, values, 0.25)
    for x, y, s, i in zip(a, b, srcs, idx, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
        torch.testing.assert_close(x.reshape(-1)[i].float(), s.reshape(-1)[i].float() * 0.75, rtol=1e-2, atol=1e-2)
        untouched = torch.ones(s.numel(), dtype=torch.bool)
        untouched[i] = False
        assert torch.equal(x.reshape(-1)[untouched], s.reshape(-1)[untouched])


@needs_ext
def test_opcheck_sparse_ops() -> None:
    srcs = [torch.randn(100), torch.randn(10, 10)]
    idx = [ops.select_indices(100, 10, 0, 0, i) for i in range(2)]
    torch.library.opcheck(torch.ops.exogym.sparse_gather.default, (srcs, idx))
    torch.library.opcheck(
        torch.ops.exogym.sparse_scatter_.default, ([s.clone() for s in srcs], idx, torch.randn(20), 0.5)
    )
    torch.library.opcheck(torch.ops.exogym.select_indices.default, (100, 1, 2, 3, torch.empty(10, dtype=torch.int64)))


def test_scatter_rejects_wrong_length() -> None:
    dst = [torch.zeros(10)]
    idx = [torch.tensor([1, 2])]
    with pytest.raises((RuntimeError, IndexError, ValueError)):
        ops.sparse_scatter_(dst, idx, torch.ones(3), 1.0)
