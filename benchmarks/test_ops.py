"""Microbenchmarks of the custom ops against their baselines (pytest-benchmark).

    .venv/bin/python -m pytest benchmarks/test_ops.py --benchmark-columns=median,min,rounds

Sparse: one SPARTA round on a flat fp32 parameter at p = 0.005 (select, gather, scale and
scatter back; the all-reduce between them is left out). Baseline: a Bernoulli mask,
``masked_select`` and ``masked_scatter_``. DCT: encode with top-32 of chunk 64, then the decode
of four ranks' top-k. Baseline: the einsum / topk / scatter_add reference of ``exogym.ops.dct``.
"""

from __future__ import annotations

import pytest
import torch

from exogym import ops

pytestmark = pytest.mark.skipif(not ops.extension_loaded(), reason=f"benchmarks compare the extension: {ops.backend()}")

P, K_NODES = 0.005, 4


def _device() -> str:
    return "cuda" if torch.cuda.is_available() and ops.use_kernel("sparse_gather", torch.device("cuda")) else "cpu"


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def sparse_round_extension(param: torch.Tensor, step: int) -> None:
    k = round(P * param.numel())
    idx = ops.select_indices(param.numel(), k, 0, step, 0, param.device)
    buf = ops.sparse_gather([param], [idx])
    ops.sparse_scatter_([param], [idx], buf, 1.0 / K_NODES)
    _sync()


def sparse_round_reference(param: torch.Tensor, step: int) -> None:
    k = round(P * param.numel())
    idx = ops.select_indices_reference(param.numel(), k, 0, step, 0, param.device)
    buf = ops.sparse_gather_reference([param], [idx])
    ops.sparse_scatter_reference_([param], [idx], buf, 1.0 / K_NODES)
    _sync()


def sparse_round_masked(param: torch.Tensor, step: int, gen: torch.Generator) -> None:
    mask = torch.bernoulli(torch.full_like(param, P), generator=gen).bool()
    vals = param.masked_select(mask)
    param.masked_scatter_(mask, vals / K_NODES)
    _sync()


@pytest.mark.parametrize("n", [10**6, 10**7])
@pytest.mark.parametrize("path", ["extension", "reference", "masked"])
def test_sparse_round(benchmark, record, n: int, path: str) -> None:
    dev = _device()
    param = torch.randn(n, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    steps = iter(range(10**9))
    if path == "extension":
        benchmark(lambda: sparse_round_extension(param, next(steps)))
    elif path == "reference":
        benchmark(lambda: sparse_round_reference(param, next(steps)))
    else:
        benchmark(lambda: sparse_round_masked(param, next(steps), gen))
    record(f"sparse p=0.005 n={n:.0e} ({dev})", path)


def dct_round(x: torch.Tensor, encode, decode) -> None:
    idx, vals = encode(x, 64, 32)
    decode(torch.stack([idx] * 4), torch.stack([vals] * 4), tuple(x.shape), 64)
    _sync()


@pytest.mark.parametrize("size", [1024, 4096])
@pytest.mark.parametrize("path", ["extension", "reference"])
def test_dct_round(benchmark, record, size: int, path: str) -> None:
    dev = _device()
    x = torch.randn(size, size, device=dev)
    if path == "extension":
        benchmark(lambda: dct_round(x, ops.dct_encode, ops.dct_decode))
    else:
        benchmark(lambda: dct_round(x, ops.dct_encode_reference, ops.dct_decode_reference))
    record(f"dct encode+top32+4-rank decode {size}x{size} ({dev})", path)
