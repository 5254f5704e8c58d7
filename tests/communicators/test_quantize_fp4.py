"""The fp4 wire (OCP e2m1), against a plain-torch reference written from the format's definition.

e2m1: bit 3 the sign, bits 2-1 the exponent ``e`` (bias 1), bit 0 the mantissa ``m``; a code
is ``(-1)^s * m * 0.5`` for ``e = 0`` (zero and the one subnormal) and
``(-1)^s * 2^(e-1) * (1 + m / 2)`` otherwise. Rounding: to the nearest value, ties to the code
whose mantissa bit is 0 (round-to-nearest-even); a negative value that rounds to zero keeps its
sign bit.
"""

import math

import pytest
import torch

from communicators import FP4, AveragingCommunicator, DiLoCoCommunicator, QuantizeCommunicator
from communicators.fp4 import E2M1_MAGNITUDES, decode_e2m1, encode_e2m1
from communicators.quantize import FORMATS, QuantizedComm, dequantize, quantize, quantized_bytes
from exogym.strategy import CommunicateOptimizeStrategy, OptimSpec
from tests.fake_world import run_ranks, train_ranks
from tests.helpers import TinyNet

SGD = OptimSpec(torch.optim.SGD, lr=0.05)


def table() -> list[float]:
    """The value of each of the 16 codes, from the definition."""
    values = []
    for code in range(16):
        s, e, m = code >> 3, (code >> 1) & 3, code & 1
        magnitude = m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
        values.append(-magnitude if s else magnitude)
    return values


def reference_code(v: float) -> int:
    """The nearest code to ``v`` (ties to the even mantissa; the sign bit of ``v``'s sign)."""
    magnitudes = [abs(t) for t in table()[:8]]
    best = min(range(8), key=lambda c: (abs(abs(v) - magnitudes[c]), c & 1))
    return best | (8 if math.copysign(1.0, v) < 0 else 0)


def reference_quantize(x: torch.Tensor, chunk: int) -> tuple[list[int], torch.Tensor]:
    """``(codes, scales)``: each chunk's absmax over 6, every entry's code after scaling."""
    scales = torch.stack([c.abs().max() / 6.0 for c in x.split(chunk)])
    codes = []
    for i, v in enumerate(x.tolist()):
        scale = scales[i // chunk]
        scaled = torch.tensor(v, dtype=torch.float32) / scale.clamp_min(1e-30)
        codes.append(reference_code(float(scaled)))
    return codes, scales


def reference_decode(codes: list[int], scales: torch.Tensor, chunk: int) -> torch.Tensor:
    values = table()
    return torch.tensor([values[c] for c in codes], dtype=torch.float32) * scales.repeat_interleave(chunk)[: len(codes)]


def unpacked(packed: torch.Tensor, n: int) -> list[int]:
    """The codes of ``packed`` bytes, the low nibble first."""
    return [c for b in packed.tolist() for c in (b & 15, b >> 4)][:n]


def test_the_16_codes_are_the_e2m1_values() -> None:
    assert table()[:8] == list(E2M1_MAGNITUDES) == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert decode_e2m1(torch.arange(16, dtype=torch.uint8)).tolist() == table()
    assert "fp4" in FORMATS


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (0.25, 0),  # midpoints: ties to the even code
        (0.75, 2),
        (1.25, 2),
        (1.75, 4),
        (2.5, 4),
        (3.5, 6),
        (5.0, 6),
        (0.2500001, 1),  # just above a midpoint: up
        (4.9999995, 6),  # just below: down
        (5.0000005, 7),
        (6.0, 7),
        (7.5, 7),  # saturates
        (0.0, 0),
        (-0.0, 8),
        (-0.1, 8),  # rounds to zero, keeps its sign
        (-0.75, 10),
        (-5.0, 14),
        (-6.0, 15),
    ],
)
def test_rounding_to_nearest_with_ties_to_even(value: float, code: int) -> None:
    assert reference_code(value) == code
    assert encode_e2m1(torch.tensor([value], dtype=torch.float32)).item() == code


def test_random_values_round_as_the_reference() -> None:
    x = torch.randn(2000, generator=torch.Generator().manual_seed(0)) * 2.5
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    x = torch.cat([x, midpoints, -midpoints, torch.tensor(E2M1_MAGNITUDES)])
    assert encode_e2m1(x).tolist() == [reference_code(v) for v in x.tolist()]


@pytest.mark.parametrize(("n", "chunk"), [(1001, 128), (5, 4), (7, 7), (1, 256), (256, 256)])
def test_quantize_packs_two_codes_a_byte_with_one_scale_per_chunk(n: int, chunk: int) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * torch.linspace(0.01, 3.0, n)
    packed, scales = quantize(x, "fp4", chunk)
    codes, ref_scales = reference_quantize(x, chunk)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(n / 2)
    assert torch.equal(scales, ref_scales) and scales.numel() == math.ceil(n / chunk)
    assert unpacked(packed, n) == codes
    if n % 2:
        assert packed[-1].item() >> 4 == 0  # the padding nibble
    assert torch.equal(dequantize(packed, scales, "fp4", chunk, n), reference_decode(codes, scales, chunk))
    assert quantized_bytes(n, "fp4", chunk) == math.ceil(n / 2) + 4 * math.ceil(n / chunk)


def test_a_chunk_padded_with_zeros_and_a_chunk_of_zeros() -> None:
    # chunk 4: [1, -2, 3, -6] (scale 1: codes 2, 12, 5, 15), [0, 0, 0, 0] (scale 0: codes 0),
    # [-0.5] padded to a chunk of 4 (scale 0.5 / 6; -0.5 is -6 of it: code 15)
    x = torch.tensor([1.0, -2.0, 3.0, -6.0, 0.0, 0.0, 0.0, 0.0, -0.5])
    packed, scales = quantize(x, "fp4", 4)
    assert scales.tolist() == pytest.approx([1.0, 0.0, 0.5 / 6])
    assert unpacked(packed, 9) == [2, 12, 5, 15, 0, 0, 0, 0, 15] and packed.numel() == 5
    assert torch.equal(dequantize(packed, scales, "fp4", 4, 9), x)


def test_decoding_is_the_exact_inverse_on_representable_values() -> None:
    # a chunk whose absmax is 6 * 0.125: every code's value times 0.125 is exact in float32
    x = torch.tensor(table()) * 0.125
    packed, scales = quantize(x, "fp4", 16)
    assert scales.tolist() == [0.125]
    assert unpacked(packed, 16) == list(range(16))
    assert torch.equal(dequantize(packed, scales, "fp4", 16, 16), x)


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_an_fp4_all_reduce_is_the_reduction_of_every_ranks_decoded_payload(op: str) -> None:
    k, n = 3, 701
    xs = [torch.randn(n, generator=torch.Generator().manual_seed(r)) * (r + 1) for r in range(k)]
    decoded = [reference_decode(*reference_quantize(x, 64), 64) for x in xs]
    expected = sum(decoded) / (k if op == "mean" else 1)

    def fn(rank, comm):
        return QuantizedComm(comm, "fp4", chunk=64, error_feedback=False).all_reduce(xs[rank].clone(), op=op)

    out = run_ranks(k, fn)
    torch.testing.assert_close(out[0], expected, rtol=1e-6, atol=1e-6)
    assert all(torch.equal(o, out[0]) for o in out[1:])


def test_an_fp4_all_gather_decodes_every_ranks_payload() -> None:
    k, n = 2, 9
    xs = [torch.randn(n, generator=torch.Generator().manual_seed(10 + r)) for r in range(k)]

    def fn(rank, comm):
        return QuantizedComm(comm, "fp4", chunk=4, error_feedback=False).all_gather(xs[rank].clone())

    out = run_ranks(k, fn)
    expected = torch.stack([reference_decode(*reference_quantize(x, 4), 4) for x in xs])
    assert torch.equal(out[0], expected) and torch.equal(out[1], expected)


def test_error_feedback_carries_the_fp4_residual() -> None:
    rounds = 50
    xs = [torch.randn(300, generator=torch.Generator().manual_seed(i)) * 0.01 for i in range(rounds)]

    def run(error_feedback: bool) -> torch.Tensor:
        def fn(rank, comm):
            qc = QuantizedComm(comm, "fp4", chunk=300, error_feedback=error_feedback)
            total = torch.zeros(300)
            for x in xs:
                qc.begin_phase()
                t = x.clone() + (1.0 if rank == 0 else 0.0)  # a large offset makes plain fp4 coarse
                total += qc.all_reduce(t, op="mean", tag="t")
            return total

        return run_ranks(2, fn)[0]

    exact = torch.stack(xs).sum(0) + 0.5 * rounds
    # with error feedback the accumulated error is the last residuals' mean: each at most half
    # the widest gap (4 to 6) of a scale of about 1.04 / 6
    ef = (run(True) - exact).abs().max()
    plain = (run(False) - exact).abs().max()
    assert ef <= 1.1 / 6 and plain > 5 * ef


def test_the_fp4_wire_charges_half_a_byte_an_entry_and_keeps_ranks_identical() -> None:
    n = sum(p.numel() for p in TinyNet().parameters())
    out = train_ranks(2, lambda: CommunicateOptimizeStrategy([AveragingCommunicator()], optim_spec=SGD, wire=FP4()), 2)
    record = out[0]["records"][0][0]
    assert record.payload == math.ceil(n / 2) + 4 * math.ceil(n / 256) and record.tag.endswith("+fp4")
    for a, b in zip(out[0]["params"], out[1]["params"], strict=True):
        assert torch.equal(a, b)

    # error feedback, as with int8: the wire equals the module wrapped, and ranks stay identical
    def wired():
        return CommunicateOptimizeStrategy([DiLoCoCommunicator(H=2)], optim_spec=SGD, wire=FP4(64, error_feedback=True))

    def wrapped():
        return CommunicateOptimizeStrategy(
            [QuantizeCommunicator(DiLoCoCommunicator(H=2), "fp4", 64, error_feedback=True)], optim_spec=SGD
        )

    a, b = train_ranks(3, wired, 8), train_ranks(3, wrapped, 8)
    for x, y in zip(a, b, strict=True):
        for p, q in zip(x["params"], y["params"], strict=True):
            assert torch.equal(p, q)
        assert x["records"] == y["records"]
    assert all(torch.equal(p, q) for p, q in zip(a[0]["params"], a[1]["params"], strict=True))
