"""Quantized payloads: codec error, bytes charged at the quantized size, error feedback."""

import math

import pytest
import torch

from communicators import AveragingCommunicator, DiLoCoCommunicator, QuantizeCommunicator
from communicators.quantize import QuantizedComm, dequantize, quantize, quantized_bytes
from exogym.strategy import CommunicateOptimizeStrategy, OptimSpec
from tests.fake_world import run_ranks, train_ranks
from tests.helpers import TinyNet

SGD = OptimSpec(torch.optim.SGD, lr=0.05)


def test_int8_codec_error_is_at_most_half_a_step_per_chunk() -> None:
    x = torch.randn(1000) * torch.linspace(0.01, 10, 1000)
    codes, scales = quantize(x, "int8", chunk=128)
    assert codes.dtype == torch.int8 and scales.numel() == math.ceil(1000 / 128)
    err = (dequantize(codes, scales, "int8", 128) - x).abs()
    step = scales[torch.arange(1000) // 128]
    assert bool((err <= step / 2 + 1e-6).all())
    assert quantized_bytes(1000, "int8", 128) == 1000 + 4 * 8 and quantized_bytes(10, "fp16") == 20


def test_fp8_scales_each_chunk_to_448_and_rounds_to_3_mantissa_bits() -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 1, 1000)
    codes, scales = quantize(x, "fp8", 128)
    assert codes.dtype == torch.uint8 and codes.numel() == 1000 and scales.numel() == math.ceil(1000 / 128)
    chunk_max = torch.nn.functional.pad(x.abs(), (0, 24)).view(8, 128).amax(1)
    torch.testing.assert_close(scales, chunk_max / 448.0)
    out = dequantize(codes, scales, "fp8", 128)
    # e4m3 keeps 3 mantissa bits: relative error <= 2**-4 for normal values; below the smallest
    # normal (2**-6 of the scale unit) the absolute error is at most half a subnormal step.
    step = scales[torch.arange(1000) // 128]
    bound = torch.maximum(x.abs() * 2.0**-4, step * 2.0**-10)
    assert bool(((out - x).abs() <= bound + 1e-12).all())
    assert quantized_bytes(1000, "fp8", 128) == 1000 + 4 * 8


@pytest.mark.parametrize(("fmt", "ratio"), [("int8", None), ("fp16", 0.5), ("bf16", 0.5), ("fp8", None)])
def test_quantized_averaging_is_charged_at_the_quantized_size(fmt, ratio) -> None:
    k = 2
    plain = train_ranks(k, lambda: CommunicateOptimizeStrategy([AveragingCommunicator()], optim_spec=SGD), 2)
    quant = train_ranks(
        k, lambda: CommunicateOptimizeStrategy([QuantizeCommunicator(AveragingCommunicator(), fmt)], optim_spec=SGD), 2
    )
    n = sum(p.numel() for p in TinyNet().parameters())
    dense = plain[0]["records"][0][0]
    q = quant[0]["records"][0][0]
    expected = n + 4 * math.ceil(n / 256) if fmt in ("int8", "fp8") else ratio * dense.payload
    assert q.payload == expected and q.kind == "all_reduce"
    assert q.sent == pytest.approx(dense.sent * expected / dense.payload)
    for a, b in zip(quant[0]["params"], quant[1]["params"], strict=True):
        assert torch.equal(a, b)  # every rank decodes the same codes


@pytest.mark.parametrize("fmt", ["int8", "fp8", "bf16"])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_a_quantized_all_reduce_is_the_reduction_of_every_ranks_decoded_payload(fmt, op) -> None:
    # Reference from the definition: each rank's payload quantized and decoded with the codec,
    # then summed (or averaged) over the ranks; the same result, bit for bit, on every rank.
    k, n = 3, 700
    xs = [torch.randn(n, generator=torch.Generator().manual_seed(r)) * (r + 1) for r in range(k)]
    decoded = [dequantize(*quantize(x, fmt, 64), fmt, 64) for x in xs]
    expected = sum(decoded) / (k if op == "mean" else 1)

    def fn(rank, comm):
        return QuantizedComm(comm, fmt, chunk=64, error_feedback=False).all_reduce(xs[rank].clone(), op=op)

    out = run_ranks(k, fn)
    torch.testing.assert_close(out[0], expected, rtol=1e-6, atol=1e-6)
    assert all(torch.equal(o, out[0]) for o in out[1:])
    assert not torch.allclose(out[0], sum(xs) / (k if op == "mean" else 1), rtol=0, atol=1e-4)  # not the dense sum


def test_error_feedback_carries_the_residual() -> None:
    rounds = 50
    xs = [torch.randn(300, generator=torch.Generator().manual_seed(i)) * 0.01 for i in range(rounds)]

    def fn(rank, comm):
        qc = QuantizedComm(comm, "int8", chunk=300, error_feedback=True)
        total = torch.zeros(300)
        for x in xs:
            qc.begin_phase()
            t = x.clone() + (1.0 if rank == 0 else 0.0)  # a large offset makes plain int8 coarse
            total += qc.all_reduce(t, op="mean", tag="t")
        return total

    out = run_ranks(2, fn)
    exact = torch.stack(xs).sum(0) + 0.5 * rounds
    scale = 1.01 / 127
    # with error feedback the accumulated error stays within one quantization step per rank
    assert (out[0] - exact).abs().max() <= scale


def _identical_ranks(out: list) -> list[list[int]]:
    """For each rank, the ranks whose parameters equal its own exactly."""
    n = len(out)
    return [
        [s for s in range(n) if all(torch.equal(a, b) for a, b in zip(out[r]["params"], out[s]["params"], strict=True))]
        for r in range(n)
    ]


def test_quantized_diloco_hybrid_keeps_ranks_identical() -> None:
    make = lambda island: CommunicateOptimizeStrategy(
        [QuantizeCommunicator(DiLoCoCommunicator(H=2, island_size=island), "int8", error_feedback=True)],
        optim_spec=SGD,
    )
    out = train_ranks(4, lambda: make(None), 4)
    rec = next(r for recs in out[0]["records"] for r in recs)
    assert rec.group_size == 4 and rec.tag.endswith("+int8")
    assert _identical_ranks(out) == [[0, 1, 2, 3]] * 4  # every rank decodes the same codes
    # islands of 2: after the first outer step each rank equals exactly its island partner (later
    # rounds mix islands whose global copies differ, so only the first round is comparable)
    out = train_ranks(4, lambda: make(2), 2)
    assert out[0]["records"][1][0].group_size == 2
    assert all(len(group) == 2 and r in group for r, group in enumerate(_identical_ranks(out)))


def test_two_payload_sites_of_one_size_keep_separate_residuals() -> None:
    """Two same-sized payloads per round, one large and one small: with error feedback each
    site's accumulated error stays within one quantization step of its own scale."""
    rounds = 30
    xs = [torch.randn(300, generator=torch.Generator().manual_seed(i)) * 0.01 for i in range(rounds)]

    def fn(rank, comm):
        qc = QuantizedComm(comm, "int8", chunk=300, error_feedback=True)
        big, small = torch.zeros(300), torch.zeros(300)
        for x in xs:
            qc.begin_phase()
            big += qc.all_reduce(x.clone() + 100.0 * (rank == 0), op="mean", tag="t")
            small += qc.all_reduce(x.clone(), op="mean", tag="t")
        return big, small

    out = run_ranks(2, fn)
    exact = torch.stack(xs).sum(0)
    small_scale = torch.stack(xs).abs().max().item() / 127
    # a residual shared with the large site (scale ~100/127) would swamp the small one
    assert (out[0][1] - exact).abs().max() <= 2 * small_scale
    assert len(out[0]) == 2


class _Unlocated(AveragingCommunicator):
    """A module whose payloads change entries every round without saying which."""

    payloads = "varying"


def test_error_feedback_is_refused_for_payloads_whose_entries_change_unless_they_are_located() -> None:
    from communicators.sparse import SparseCommunicator

    with pytest.raises(ValueError, match="error_feedback"):
        QuantizeCommunicator(_Unlocated(), "int8", error_feedback=True)
    located = QuantizeCommunicator(SparseCommunicator(p=0.1), "int8", error_feedback=True)  # SPARTA says where
    assert located.payloads == "located"


@pytest.mark.parametrize("error_feedback", [False, True])
def test_the_int8_wire_on_a_pipeline_equals_quantizing_its_module(error_feedback) -> None:
    """``wire=Int8(...)`` transforms what every module sends: a pipeline of one module with the
    wire gives the parameters and ledger records of that module wrapped in
    ``QuantizeCommunicator`` (the same codec, chunks and residual sites)."""
    from communicators import Int8

    def wired():
        return CommunicateOptimizeStrategy(
            [DiLoCoCommunicator(H=2)], optim_spec=SGD, wire=Int8(chunk=64, error_feedback=error_feedback)
        )

    def wrapped():
        return CommunicateOptimizeStrategy(
            [QuantizeCommunicator(DiLoCoCommunicator(H=2), "int8", 64, error_feedback)], optim_spec=SGD
        )

    a, b = train_ranks(3, wired, 8), train_ranks(3, wrapped, 8)
    for x, y in zip(a, b, strict=True):
        for p, q in zip(x["params"], y["params"], strict=True):
            assert torch.equal(p, q)
        assert x["records"] == y["records"]
    assert any(r.tag.endswith("+int8") for step in a[0]["records"] for r in step)


def test_error_feedback_on_payloads_whose_entries_change_is_refused_by_the_wire_too() -> None:
    from communicators import Int8, SparseCommunicator

    with pytest.raises(ValueError, match="error_feedback=True needs payloads that hold the same entries"):
        CommunicateOptimizeStrategy([SparseCommunicator(0.1), _Unlocated()], wire=Int8(error_feedback=True))
    with pytest.raises(TypeError, match="wire must be a Wire"):
        CommunicateOptimizeStrategy([SparseCommunicator(0.1)], wire="int8")


def _int8_ef_reference(k: int, steps: int, lr: float, p: float, chunk: int, ds, seed: int) -> list[list[torch.Tensor]]:
    """SPARTA whose payloads travel as int8 with error feedback kept in parameter space, in
    plain torch: K model copies, an SGD step each on its DistributedSampler shard, then the
    step's shared indices; each node sends ``Q(p[idx] + e[idx])`` (per-chunk absmax int8 of the
    payload), keeps ``e[idx] = p[idx] + e[idx] - Q(...)`` and leaves ``e`` elsewhere as it is;
    every node writes the mean of the decoded payloads into ``p[idx]``. Every node's parameters."""
    from torch.utils.data import DataLoader, DistributedSampler

    from communicators.sparse import SharedSelector

    torch.manual_seed(0)
    base = TinyNet()
    models = [TinyNet() for _ in range(k)]
    for m in models:
        m.load_state_dict(base.state_dict())
    residual = [[torch.zeros(q.numel()) for q in m.parameters()] for m in models]
    loaders = [
        iter(
            DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds, k, r, shuffle=True, seed=seed), drop_last=True)
        )
        for r in range(k)
    ]
    selector = SharedSelector("random", p, seed, [q.numel() for q in base.parameters()], torch.device("cpu"))

    def int8(x: torch.Tensor) -> torch.Tensor:
        rows = torch.nn.functional.pad(x, (0, -x.numel() % chunk)).view(-1, chunk)
        scale = rows.abs().amax(1, keepdim=True) / 127.0
        codes = torch.round(rows / scale.clamp_min(1e-30)).clamp(-127, 127)
        return (codes * scale).reshape(-1)[: x.numel()]

    for step in range(steps):
        for m, it in zip(models, loaders, strict=True):
            m.zero_grad()
            m(next(it)).backward()
            with torch.no_grad():
                for q in m.parameters():
                    q -= lr * q.grad
        idx = selector.select(step)
        decoded = []
        with torch.no_grad():
            for m, res in zip(models, residual, strict=True):
                x = torch.cat([q.reshape(-1)[i] + e[i] for q, e, i in zip(m.parameters(), res, idx, strict=True)])
                sent = int8(x)
                err, offset = x - sent, 0
                for e, i in zip(res, idx, strict=True):
                    e[i] = err[offset : offset + i.numel()]
                    offset += i.numel()
                decoded.append(sent)
            mean = sum(decoded) / k
            for m in models:
                offset = 0
                for q, i in zip(m.parameters(), idx, strict=True):
                    q.view(-1)[i] = mean[offset : offset + i.numel()]
                    offset += i.numel()
    return [[q.detach() for q in m.parameters()] for m in models]


@pytest.mark.parametrize("k", [2, 3])
def test_int8_error_feedback_on_sparta_keeps_the_residual_per_parameter_entry(k) -> None:
    from communicators import SparseCommunicator

    steps, lr, p, chunk, seed = 6, 0.1, 0.3, 16, 0

    from tests.helpers import regression_data

    ds = regression_data(n=k * 8 * steps)

    def make(error_feedback: bool):
        return lambda: CommunicateOptimizeStrategy(
            [QuantizeCommunicator(SparseCommunicator(p), "int8", chunk, error_feedback)],
            optim_spec=OptimSpec(torch.optim.SGD, lr=lr),
        )

    torch.manual_seed(0)
    with_ef = train_ranks(k, make(True), steps, dataset=ds, seed=seed)
    want = _int8_ef_reference(k, steps, lr, p, chunk, ds, seed)
    for rank in range(k):
        for got, ref in zip(with_ef[rank]["params"], want[rank], strict=True):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    torch.manual_seed(0)
    without = train_ranks(k, make(False), steps, dataset=ds, seed=seed)
    assert any(not torch.allclose(a, b) for a, b in zip(with_ef[0]["params"], without[0]["params"], strict=True))
