"""CUDA kernels against the CPU kernels (run where a GPU and a CUDA build are present)."""

import pytest
import torch

from exogym import ops

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and ops.use_kernel("dct_encode", torch.device("cuda"))),
    reason="needs a CUDA device and the extension built with its CUDA kernels",
)


@pytest.mark.parametrize(("n", "k"), [(10**6, 5000), (50257, 251), (10, 10)])
def test_select_indices_cuda_equals_cpu(n, k) -> None:
    assert torch.equal(ops.select_indices(n, k, 3, 7, 1, "cuda").cpu(), ops.select_indices(n, k, 3, 7, 1, "cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gather_scatter_cuda_equals_cpu(dtype) -> None:
    srcs = [torch.randn(50257).to(dtype), torch.randn(33, 17).to(dtype)]
    idx = [ops.select_indices(t.numel(), t.numel() // 5, 0, 0, i) for i, t in enumerate(srcs)]
    g_cpu = ops.sparse_gather(srcs, idx)
    g_cuda = ops.sparse_gather([s.cuda() for s in srcs], [i.cuda() for i in idx])
    assert torch.equal(g_cuda.cpu(), g_cpu)
    a = [s.clone() for s in srcs]
    b = [s.cuda() for s in srcs]
    ops.sparse_scatter_(a, idx, g_cpu * 2, 0.5)
    ops.sparse_scatter_(b, [i.cuda() for i in idx], g_cuda * 2, 0.5)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y.cpu())


@pytest.mark.parametrize("shape", [(64, 128), (50257,), (33, 17), (8, 3, 3, 3), (4096, 4096)])
def test_dct_cuda_matches_cpu(shape) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    i_cpu, v_cpu = ops.dct_encode(x, 64, 32)
    i_gpu, v_gpu = ops.dct_encode(x.cuda(), 64, 32)
    same = (i_cpu == i_gpu.cpu()).all(dim=1)
    assert same.float().mean() > 0.99  # near-ties may pick differently within float noise
    torch.testing.assert_close(v_gpu.cpu()[same], v_cpu[same], atol=1e-4, rtol=1e-4)
    idx = torch.stack([i_cpu] * 4)
    vals = torch.stack([v_cpu * s for s in (1.0, 0.5, -1.0, 2.0)])
    d_cpu = ops.dct_decode(idx, vals, shape, 64)
    d_gpu = ops.dct_decode(idx.cuda(), vals.cuda(), shape, 64)
    torch.testing.assert_close(d_gpu.cpu(), d_cpu, atol=1e-4, rtol=1e-4)
    assert torch.equal(d_gpu, ops.dct_decode(idx.cuda(), vals.cuda(), shape, 64))  # deterministic
