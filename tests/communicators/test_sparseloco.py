"""SparseLoCo against a plain-PyTorch reference written from its update (Sarfi et al. 2025, arXiv
2508.15706) with ExoGym's documented chunking and 2-bit quantizer; its bytes against the formula
by hand; its refusal of dropped nodes."""

from __future__ import annotations

import math

import pytest
import torch

from communicators.bitpack import pack, unpack
from communicators.quantize import FP16, Int8, QuantizeCommunicator
from communicators.sparseloco import SparseLoCoCommunicator
from exogym import Faults, Trainer
from exogym.strategy import CommunicateOptimizeStrategy, OptimSpec, SparseLoCoStrategy
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, node_batches, regression_data

H, STEPS = 3, 12
SGD = OptimSpec(torch.optim.SGD, lr=0.05)
BETA, OUTER_LR = 0.9, 0.8


def quantize_reference(v: torch.Tensor, bits: int) -> torch.Tensor:
    """The documented quantizer, value by value: shift by the mean, codes of width 6 sigma / L
    around level L // 2 (clamped to [0, L)), each code decoded to the mean of its values."""
    levels = 2**bits
    shift = v.mean()
    c = v - shift
    sigma = (c.pow(2).sum() / (c.numel() - 1)).sqrt() if c.numel() > 1 else torch.tensor(0.0)
    scale = 6.0 * sigma / levels
    if scale == 0 or not math.isfinite(float(scale)):
        scale = torch.tensor(1.0)
    codes = torch.clamp(torch.round(c / scale + levels // 2), 0, levels - 1)
    out = torch.empty_like(v)
    for level in range(levels):
        sel = codes == level
        if sel.any():
            out[sel] = c[sel].mean() + shift
    return out


def compress_reference(e: torch.Tensor, chunk: int, k: int, bits: int) -> torch.Tensor:
    """Q(TopK(e)) as a dense tensor: e flattened into chunks of min(chunk, n) entries (the last
    padded, padding never chosen), the k of largest |e| per chunk, quantized together."""
    flat = e.flatten()
    n = flat.numel()
    c = min(chunk, n)
    chunks = -(-n // c)
    kk = min(k, c)
    chosen = []
    for j in range(chunks):
        part = flat[j * c : min((j + 1) * c, n)]
        order = part.abs().argsort(descending=True)[:kk]
        chosen.append(j * c + order.sort().values)
    idx = torch.cat(chosen)
    idx = idx[idx < n]
    values = quantize_reference(flat[idx], bits)
    out = torch.zeros_like(flat)
    out[idx] = values
    return out.view_as(e)


def sparseloco_reference(ds, k: int, steps: int, chunk: int, topk: int, bits: int) -> list[list[torch.Tensor]]:
    """K model copies with inner SGD; every H steps each node r: e_r = beta e_r + (theta -
    theta_r); s_r = Q(TopK(e_r)); e_r -= s_r; then theta -= outer_lr * mean_r s_r and theta_r = theta."""
    models = [TinyNet() for _ in range(k)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    data = [node_batches(ds, k, r) for r in range(k)]
    theta = [p.detach().clone() for p in models[0].parameters()]
    errors = [[torch.zeros_like(p) for p in theta] for _ in range(k)]
    for s in range(steps):
        for r in range(k):
            opts[r].zero_grad()
            models[r](next(data[r])).backward()
            opts[r].step()
        if (s + 1) % H:
            continue
        with torch.no_grad():
            sent = []
            for r in range(k):
                mine = []
                for t, p in enumerate(models[r].parameters()):
                    errors[r][t] = BETA * errors[r][t] + (theta[t] - p)
                    s_rt = compress_reference(errors[r][t], chunk, topk, bits)
                    errors[r][t] = errors[r][t] - s_rt
                    mine.append(s_rt)
                sent.append(mine)
            for t in range(len(theta)):
                theta[t] = theta[t] - OUTER_LR * sum(sent[r][t] for r in range(k)) / k
            for m in models:
                for p, g in zip(m.parameters(), theta, strict=True):
                    p.copy_(g)
    return [[p.detach().clone() for p in m.parameters()] for m in models]


def _make(chunk: int, topk: int, bits: int):
    return lambda: SparseLoCoStrategy(H=H, chunk=chunk, k=topk, beta=BETA, bits=bits, outer_lr=OUTER_LR, optim_spec=SGD)


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize(
    ("chunk", "topk", "bits"),
    [(16, 2, 2), (48, 3, 3), (16, 1, 1)],
    ids=["chunk16_top2_2bit", "chunk48_top3_3bit_padded", "chunk16_top1_1bit_7_bytes_of_codes"],
)
def test_sparseloco_matches_the_reference_on_every_node(k: int, chunk: int, topk: int, bits: int) -> None:
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(k, _make(chunk, topk, bits), STEPS, dataset=ds)
    ref = sparseloco_reference(ds, k, STEPS, chunk, topk, bits)
    for rank in range(k):
        for a, b in zip(out[rank]["params"], ref[rank], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [2, 4])
def test_bytes_per_round_are_chunks_times_k_times_index_and_value_bits_plus_the_codebooks(k: int) -> None:
    out = train_ranks(k, _make(16, 2, 2), STEPS)
    # TinyNet's tensors (128, 16, 16, 1 entries) with chunk 16, k 2, 2-bit values:
    # chunks * k * (log2(chunk) + 2) bits = 8*2*(4+2) + 1*2*(4+2) + 1*2*(4+2) + 1*1*(0+2) = 122 bits
    payload = math.ceil(122 / 8) + 4 * 4 * 2**2  # 16 bytes of codes, a 4-level float32 codebook per tensor
    for o in out:
        rounds = [records for records in o["records"] if records]
        assert len(rounds) == STEPS // H
        for records in rounds:
            assert [(r.kind, r.group_size, r.payload) for r in records] == [("all_gather", k, payload)]
            assert records[0].sent == (k - 1) * payload


def test_with_chunk_64_and_2_bits_an_entry_of_a_full_chunk_is_one_byte_and_a_smaller_tensor_is_one_chunk() -> None:
    make = lambda: SparseLoCoStrategy(H=H, chunk=64, k=1, optim_spec=SGD)  # noqa: E731
    out = train_ranks(2, make, H)
    # 128 entries: 2 chunks of 64, (6 + 2) bits each; 16 entries: one chunk of 16, (4 + 2) bits;
    # 1 entry: one chunk of one, (0 + 2) bits
    payload = math.ceil((2 * 8 + 6 + 6 + 2) / 8) + 4 * 16
    assert [r.payload for r in out[0]["records"][H - 1]] == [payload]


def test_packed_codes_of_mixed_widths_round_trip() -> None:
    g = torch.Generator().manual_seed(0)
    codes = [torch.randint(0, 2**w, (n,), generator=g) for n, w in ((37, 8), (5, 2), (11, 13))]
    data = pack(codes, [8, 2, 13])
    assert data.dtype == torch.uint8 and data.numel() == math.ceil((37 * 8 + 5 * 2 + 11 * 13) / 8)
    for a, b in zip(unpack(data, [37, 5, 11], [8, 2, 13]), codes, strict=True):
        assert torch.equal(a, b)


def test_each_node_keeps_its_own_error_buffer_and_all_nodes_end_a_round_equal() -> None:
    out = train_ranks(2, _make(16, 2, 2), H)
    errors = [o["strategy"].state_dict()["pipeline"]["0"]["errors"] for o in out]
    assert any(not torch.equal(a, b) for a, b in zip(*errors, strict=True))
    assert all(bool(e.abs().sum() > 0) for e in errors[0][:3])  # what was not sent stays
    for a, b in zip(out[0]["params"], out[1]["params"], strict=True):
        assert torch.equal(a, b)


def test_virtual_nodes_end_as_nodes_on_their_own_threads() -> None:
    alone = train_ranks(4, _make(16, 2, 2), STEPS)
    virtual = train_ranks(4, _make(16, 2, 2), STEPS, workers=2)
    for a, b in zip(alone, virtual, strict=True):
        for p, q in zip(a["params"], b["params"], strict=True):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_faults_that_drop_nodes_are_refused_naming_the_all_gather() -> None:
    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(ValueError, match=r"cannot leave a node out of a round \(SparseLoCo\(H=4.*all-gather"):
        trainer.fit(
            SparseLoCoStrategy(H=4), num_nodes=4, max_steps=8, batch_size=8, faults=Faults(drop={1: [2]}), logger=False
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk": 0}, r"chunk must be an int >= 1"),
        ({"chunk": 8, "k": 9}, r"k must be an int in \[1, 8\]"),
        ({"bits": 0}, r"bits must be an int in \[1, 8\]"),
        ({"beta": 1.5}, r"beta must be a number in \[0, 1\]"),
        ({"outer_lr": 0.0}, r"outer_lr must be a number > 0"),
    ],
)
def test_settings_out_of_range_are_refused_naming_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SparseLoCoStrategy(**kwargs)


@pytest.mark.parametrize("wire", [Int8(), Int8(error_feedback=True), FP16()], ids=["int8", "int8_ef", "fp16"])
def test_a_quantizing_wire_is_refused_at_construction_since_bits_already_sets_the_values_precision(wire) -> None:
    """SparseLoCo's payload is packed few-bit codes (``bits`` per value), not a float tensor: a
    quantizing wire would pass it through unchanged, so it is refused when the strategy is made."""
    match = r"acts on float payloads, but SparseLoCo\(H=4.*bits=2.*coded_payloads.*leave the quantizing wire out"
    with pytest.raises(ValueError, match=match):
        CommunicateOptimizeStrategy([SparseLoCoCommunicator(H=4)], wire=wire)
    with pytest.raises(ValueError, match=match):
        QuantizeCommunicator(SparseLoCoCommunicator(H=4), wire.fmt, error_feedback=wire.error_feedback)
