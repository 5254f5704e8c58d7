"""DeMo as a pipeline against a plain-torch DeMo written here from the paper's algorithm."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from communicators import DCTCompressCommunicator, DCTTopKReducer, DiLoCoCommunicator
from communicators.dct import DCTTopKExchange
from exogym.strategy import CommunicateOptimizeStrategy, DeMoStrategy, OptimSpec
from tests.fake_world import train_ranks
from tests.helpers import regression_data

pytestmark = pytest.mark.usefixtures("op_path")


class ConvMLP(nn.Module):
    """Has 2-D weights, a 4-D conv weight, 1-D biases and a scalar, to exercise every layout."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(8, 96)
        self.conv = nn.Conv2d(1, 16, (2, 2))
        self.fc2 = nn.Linear(96 + 48, 1)
        self.gain = nn.Parameter(torch.tensor(1.0))

    def forward(self, batch):
        x, y = batch
        h = torch.tanh(self.fc1(x))
        c = torch.tanh(self.conv(x.view(-1, 1, 2, 4))).flatten(1)
        return F.mse_loss(self.gain * self.fc2(torch.cat([h, c], 1)), y)


# ---- the reference: DeMo in plain torch, dense DCT by basis matrices ----------------------------
def ref_divisor(n: int, c: int) -> int:
    return max(d for d in range(1, min(n, c) + 1) if n % d == 0)


def ref_dct(n: int) -> torch.Tensor:
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    return (
        torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * torch.where(k == 0, math.sqrt(1 / n), math.sqrt(2 / n))
    ).float()


def ref_layout(shape, chunk):
    rows, cols = (1, 1) if len(shape) == 0 else (1, shape[0]) if len(shape) == 1 else (shape[0], math.prod(shape[1:]))
    return rows, cols, ref_divisor(rows, chunk), ref_divisor(cols, chunk)


def ref_encode(t, chunk, topk):
    rows, cols, cr, cc = ref_layout(tuple(t.shape), chunk)
    blocks = t.reshape(rows // cr, cr, cols // cc, cc).permute(0, 2, 1, 3)
    coef = (ref_dct(cr) @ blocks @ ref_dct(cc).T).reshape(-1, cr * cc)
    idx = coef.abs().topk(min(topk, cr * cc), dim=1).indices
    return idx, coef.gather(1, idx)


def ref_decode(msgs, shape, chunk):
    rows, cols, cr, cc = ref_layout(shape, chunk)
    n = (rows // cr) * (cols // cc)
    idx = torch.cat([m[0] for m in msgs], dim=1)
    vals = torch.cat([m[1] for m in msgs], dim=1)
    dense = torch.zeros(n, cr * cc).scatter_reduce(1, idx, vals, reduce="mean", include_self=False)
    blocks = ref_dct(cr).T @ dense.reshape(rows // cr, cols // cc, cr, cc) @ ref_dct(cc)
    return blocks.permute(0, 2, 1, 3).reshape(shape)


def reference_demo(k, steps, lr, decay, topk, chunk, wd, make_model, ds, batch=8, seed=0):
    base = make_model()
    models = [base] + [ConvMLP() for _ in range(k - 1)]
    for m in models[1:]:
        m.load_state_dict(base.state_dict())
    loaders = [
        iter(
            DataLoader(
                ds, batch_size=batch, sampler=DistributedSampler(ds, k, r, shuffle=True, seed=seed), drop_last=True
            )
        )
        for r in range(k)
    ]
    deltas = [[torch.zeros_like(p) for p in m.parameters()] for m in models]
    for _ in range(steps):
        grads = []
        for m, it in zip(models, loaders, strict=True):
            m.zero_grad()
            m(next(it)).backward()
            grads.append([p.grad.clone() for p in m.parameters()])
        params = [list(m.parameters()) for m in models]
        for i, p0 in enumerate(params[0]):
            shape = tuple(p0.shape)
            msgs = []
            # DeMo (arXiv 2411.19870, Algorithm 1) sends every tensor as its DCT top-k, small
            # biases included: what is not sent stays in the residual delta.
            for r in range(k):
                d = deltas[r][i]
                d.mul_(decay).add_(grads[r][i], alpha=lr)
                msg = ref_encode(d, chunk, topk)
                d.sub_(ref_decode([msg], shape, chunk))
                msgs.append(msg)
            update = ref_decode(msgs, shape, chunk)
            with torch.no_grad():
                for r in range(k):
                    params[r][i].mul_(1 - lr * wd).sub_(lr * update.sign())
    return [[p.detach() for p in m.parameters()] for m in models]


@pytest.mark.parametrize("k", [2, 4])
def test_demo_strategy_matches_the_reference_after_20_steps(k: int) -> None:
    """ConvMLP has 96-entry biases, which DeMo compresses like every other tensor."""
    steps, lr, decay, topk, chunk, wd = 20, 0.01, 0.999, 32, 64, 0.01
    ds = regression_data(n=k * 8 * steps)
    ours = train_ranks(
        k,
        lambda: DeMoStrategy(OptimSpec(torch.optim.SGD, lr=lr), decay, topk, chunk, weight_decay=wd),
        steps,
        make_model=ConvMLP,
        dataset=ds,
    )
    ref = reference_demo(k, steps, lr, decay, topk, chunk, wd, ConvMLP, ds)
    for r in range(k):
        for a, b in zip(ours[r]["params"], ref[r], strict=True):
            # float32 rounding differs (fast DCT vs matrices; SGD's decay vs multiply): 1e-5
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_every_tensor_layout_is_planned_and_bytes_match_the_formula() -> None:
    model = ConvMLP()
    ex = DCTTopKExchange(list(model.parameters()), topk=32, chunk=64)
    plans = {n: p for (n, _), p in zip(model.named_parameters(), ex.plans, strict=True)}
    assert plans["fc1.weight"].compressed and plans["conv.weight"].compressed  # [96, 8] and [16, 1, 2, 2]
    # fc1.bias [96]: 2 chunks of 48, 32 kept (384 bytes, as many as dense): still compressed, as
    # DeMo does; only a tensor whose chunks are kept whole (the scalar gain) goes dense, losslessly
    assert plans["fc1.bias"].compressed and plans["fc1.bias"].payload == 2 * 32 * (2 + 4)
    assert not plans["gain"].compressed
    # fc1.weight [96, 8]: chunks of 48x8 (48 = the largest divisor of 96 <= 64), 32 kept of each,
    # an int16 index and an fp32 value per kept coefficient
    assert plans["fc1.weight"].payload == 2 * 32 * (2 + 4)
    assert plans["conv.weight"].payload == 1 * 32 * (2 + 4)
    out = train_ranks(2, lambda: DeMoStrategy(OptimSpec(torch.optim.SGD, lr=0.01)), 2, make_model=ConvMLP)
    recs = out[0]["records"][0]
    assert [(r.kind, r.payload) for r in recs] == [
        ("all_gather", ex.compressed_payload),
        ("all_reduce", ex.dense_payload),
    ]


def test_a_2d_fp32_weight_is_sent_at_least_40x_smaller() -> None:
    w = torch.zeros(1024, 768)
    plan = DCTTopKExchange([w], 32, 64).plans[0]
    assert plan.compressed and w.numel() * 4 / plan.payload >= 40


def test_decay_0_and_full_k_is_sign_sgd_on_the_averaged_gradient() -> None:
    k, lr = 3, 0.01
    chunk = 64
    make = lambda: CommunicateOptimizeStrategy(
        [DCTCompressCommunicator(topk=64 * 64, chunk=chunk, decay=0.0)], OptimSpec(torch.optim.SGD, lr=lr)
    )
    ours = train_ranks(k, make, 1, make_model=ConvMLP)
    # sign-SGD on the mean gradient, computed directly
    ds = regression_data(n=k * 8)
    base = ConvMLP()
    grads = []
    for r in range(k):
        m = ConvMLP()
        m.load_state_dict(base.state_dict())
        batch = next(iter(DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds, k, r, shuffle=True, seed=0))))
        m(batch).backward()
        grads.append([p.grad for p in m.parameters()])
    for i, p in enumerate(base.parameters()):
        mean = torch.stack([g[i] for g in grads]).mean(0)
        want = p.detach() - lr * mean.sign()
        got = ours[0]["params"][i]
        clear = mean.abs() > 1e-6  # the sign of a near-zero mean is float noise
        torch.testing.assert_close(got[clear], want[clear], rtol=0, atol=1e-6)


def test_dct_reducer_composes_with_diloco_and_keeps_ranks_identical() -> None:
    make = lambda: CommunicateOptimizeStrategy(
        [DiLoCoCommunicator(H=2, reducer=DCTTopKReducer(topk=8, chunk=64))], OptimSpec(torch.optim.SGD, lr=0.05)
    )
    out = train_ranks(2, make, 4, make_model=ConvMLP)
    for a, b in zip(out[0]["params"], out[1]["params"], strict=True):
        assert torch.equal(a, b)
    kinds = [r.kind for r in out[0]["records"][1]]
    assert kinds == ["all_gather", "all_reduce"]


def test_demo_accepts_the_seed_spellings() -> None:
    with pytest.warns(UserWarning, match="sign-SGD"):
        s = DeMoStrategy(
            optim_spec=OptimSpec(torch.optim.AdamW, lr=0.001),
            compression_decay=0.999,
            compression_topk=32,
            compression_chunk=64,
        )
    assert s.optim_spec == OptimSpec(torch.optim.SGD, lr=0.001, weight_decay=0.0)
    s = DeMoStrategy(compression_decay=0.999, compression_topk=32, compression_chunk=64, weight_decay=1e-4)
    assert s.optim_spec.kwargs["weight_decay"] == 1e-4


def test_dct_reducer_keeps_loaded_residuals_in_its_first_round() -> None:
    """A fresh reducer that loaded a checkpoint's residuals reduces exactly as the original
    reducer does in its next round (the residuals are not reset to zero)."""
    from tests.fake_world import run_ranks

    def fn(rank, comm):
        g = torch.Generator().manual_seed(rank)
        first, second = [torch.randn(64, 64, generator=g)], [torch.randn(64, 64, generator=g)]
        original = DCTTopKReducer(topk=4, chunk=64)
        original.reduce_(comm, [t.clone() for t in first], None)
        resumed = DCTTopKReducer(topk=4, chunk=64)
        resumed.load_state_dict(original.state_dict())
        a, b = [t.clone() for t in second], [t.clone() for t in second]
        original.reduce_(comm, a, None)
        resumed.reduce_(comm, b, None)
        return a[0], b[0], original.residuals[0]

    for a, b, residual in run_ranks(2, fn):
        assert residual.abs().sum() > 0  # the first round left something unsent
        assert torch.equal(a, b)
