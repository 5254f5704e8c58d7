"""SparseLoCo against a plain-PyTorch reference written from its update (Sarfi et al. 2025, arXiv
2508.15706) with the paper's chunking (2-D blocks of each matrix, as DeMo chunks), ExoGym's flat
chunking and 2-bit quantizer; its bytes against the formula by hand; its refusal of dropped nodes."""

from __future__ import annotations

import math

import pytest
import torch

from communicators.bitpack import pack, unpack
from communicators.quantize import FP16, Int8, QuantizeCommunicator
from communicators.sparseloco import ChunkPlan, SparseLoCoCommunicator
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


def chunk_indices(shape: tuple[int, ...], chunk: int, chunking: str) -> list[torch.Tensor]:
    """The flat indices of each chunk of a tensor of ``shape``. ``"blocks"`` (the paper's): the
    tensor as a matrix (a vector as one row, more dimensions as ``[shape[0], the rest]``) cut into
    blocks whose sides are the largest divisors of its dimensions not above ``chunk``, block after
    block along the rows, then down. ``"flat"``: runs of ``min(chunk, n)`` entries of the
    flattened tensor, the last one shorter."""
    n = math.prod(shape)
    if chunking == "flat":
        c = min(chunk, n)
        return [torch.arange(start, min(start + c, n)) for start in range(0, n, c)]
    rows = shape[0] if len(shape) >= 2 else 1
    cols = n // rows
    br, bc = (max(d for d in range(1, min(size, chunk) + 1) if size % d == 0) for size in (rows, cols))
    return [
        ((r0 + torch.arange(br))[:, None] * cols + (c0 + torch.arange(bc))[None, :]).flatten()
        for r0 in range(0, rows, br)
        for c0 in range(0, cols, bc)
    ]


def compress_reference(e: torch.Tensor, chunk: int, k: int, bits: int, chunking: str) -> torch.Tensor:
    """Q(TopK(e)) as a dense tensor: the k entries of largest |e| of each chunk
    (``chunk_indices``; all of a chunk of fewer), their values quantized together."""
    flat = e.flatten()
    chosen = []
    for idx in chunk_indices(tuple(e.shape), chunk, chunking):
        order = flat[idx].abs().argsort(descending=True)[:k]
        chosen.append(idx[order].sort().values)
    idx = torch.cat(chosen)
    out = torch.zeros_like(flat)
    out[idx] = quantize_reference(flat[idx], bits)
    return out.view_as(e)


def sparseloco_reference(
    ds, k: int, steps: int, chunk: int, topk: int, bits: int, chunking: str = "blocks", make_model=TinyNet
) -> list[list[torch.Tensor]]:
    """K model copies with inner SGD; every H steps each node r: e_r = beta e_r + (theta -
    theta_r); s_r = Q(TopK(e_r)); e_r -= s_r; then theta -= outer_lr * mean_r s_r and theta_r = theta."""
    models = [make_model() for _ in range(k)]
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
                    s_rt = compress_reference(errors[r][t], chunk, topk, bits, chunking)
                    errors[r][t] = errors[r][t] - s_rt
                    mine.append(s_rt)
                sent.append(mine)
            for t in range(len(theta)):
                theta[t] = theta[t] - OUTER_LR * sum(sent[r][t] for r in range(k)) / k
            for m in models:
                for p, g in zip(m.parameters(), theta, strict=True):
                    p.copy_(g)
    return [[p.detach().clone() for p in m.parameters()] for m in models]


def _make(chunk: int, topk: int, bits: int, chunking: str = "blocks"):
    return lambda: SparseLoCoStrategy(
        H=H, chunk=chunk, k=topk, beta=BETA, bits=bits, outer_lr=OUTER_LR, chunking=chunking, optim_spec=SGD
    )


class WideNet(torch.nn.Module):
    """An MLP with a 192x128 matrix (six 64x64 blocks), returning the batch-mean MSE."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(8, 128), torch.nn.Linear(128, 192), torch.nn.Linear(192, 1)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x))))), y)


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize(
    ("chunk", "topk", "bits", "chunking"),
    [(4, 3, 2, "blocks"), (8, 5, 3, "blocks"), (16, 2, 1, "blocks"), (16, 2, 2, "flat"), (48, 3, 3, "flat")],
    ids=["blocks4_top3_2bit", "blocks8_top5_3bit", "blocks16_top2_1bit", "flat16_top2_2bit", "flat48_top3_padded"],
)
def test_sparseloco_matches_the_reference_on_every_node(
    k: int, chunk: int, topk: int, bits: int, chunking: str
) -> None:
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(k, _make(chunk, topk, bits, chunking), STEPS, dataset=ds)
    ref = sparseloco_reference(ds, k, STEPS, chunk, topk, bits, chunking)
    for rank in range(k):
        for a, b in zip(out[rank]["params"], ref[rank], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(16, 8), (192, 128), (12, 5), (8, 3, 3, 3), (16,), (127,), (1, 16), ()], ids=str)
@pytest.mark.parametrize("chunking", ["blocks", "flat"])
def test_each_chunk_holds_the_entries_the_paper_s_description_puts_in_it(shape: tuple, chunking: str) -> None:
    """Chunk ``i`` of the module's plan holds the entries of chunk ``i`` of the reference's
    ``chunk_indices`` (chunk side 4 and 64; a flat plan pads its last chunk)."""
    x = torch.randn(shape).flatten()
    for chunk in (4, 64):
        plan = ChunkPlan.of(shape, chunk, 1, chunking)
        rows = plan.to_chunks(x, fill=float("nan"))
        expected = chunk_indices(shape, chunk, chunking)
        assert rows.shape[0] == len(expected)
        for row, idx in zip(rows, expected, strict=True):
            assert torch.equal(row[: idx.numel()], x[idx]) and row[idx.numel() :].isnan().all()
        assert torch.equal(plan.from_chunks(rows), x)


def _payload(shapes: list[tuple], chunk: int, k: int, bits: int, chunking: str) -> int:
    """The formula: ceil(sum_t chunks_t * k_t * (ceil(log2 c_t) + bits) / 8) + T * 4 * 2**bits
    bytes, chunks from the reference's ``chunk_indices`` (c_t the full chunk's entries)."""
    code_bits = 0
    for shape in shapes:
        chunks = chunk_indices(shape, chunk, chunking)
        c = chunks[0].numel()
        code_bits += len(chunks) * min(k, c) * (math.ceil(math.log2(c)) + bits)
    return math.ceil(code_bits / 8) + len(shapes) * 4 * 2**bits


def _rounds(out: list[dict], k: int) -> list[list]:
    for o in out:
        rounds = [records for records in o["records"] if records]
        assert all([r.kind for r in records] == ["all_gather"] for records in rounds)
        assert all(records[0].group_size == k and records[0].sent == (k - 1) * records[0].payload for records in rounds)
    return [records for records in out[0]["records"] if records]


TINY = [(16, 8), (16,), (1, 16), (1,)]


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize(
    ("chunking", "payload"),
    [
        # 4x4 blocks of fc1.weight (8 chunks of 16: 4 index bits), runs of 4 of fc1.bias and of
        # fc2.weight's row (4 chunks of 4 each: 2 bits), fc2.bias one chunk of one (0 bits), 3 sent
        # per chunk (1 of a chunk of one) at 4 + 2, 2 + 2, 2 + 2, 0 + 2 bits:
        # 8*3*6 + 4*3*4 + 4*3*4 + 1*1*2 = 242 bits -> 31 bytes, and a 4-level float32 codebook per tensor
        ("blocks", 31 + 4 * 4 * 4),
        # runs of 4 of every flattened tensor: 32 + 4 + 4 + 1 chunks at 2 + 2 bits (0 + 2 for fc2.bias)
        # = 32*3*4 + 4*3*4 + 4*3*4 + 1*1*2 = 482 bits -> 61 bytes, and the codebooks
        ("flat", 61 + 4 * 4 * 4),
    ],
)
def test_bytes_per_round_are_chunks_times_k_times_index_and_value_bits_plus_the_codebooks(
    k: int, chunking: str, payload: int
) -> None:
    assert payload == _payload(TINY, 4, 3, 2, chunking)
    rounds = _rounds(train_ranks(k, _make(4, 3, 2, chunking), STEPS), k)
    assert len(rounds) == STEPS // H and all(records[0].payload == payload for records in rounds)


def test_the_defaults_send_64_entries_of_14_bits_per_64x64_block_of_a_matrix_and_short_vectors_whole() -> None:
    """Defaults ``chunk=64``, ``k=None`` (64 per chunk), ``bits=2``, ``chunking="blocks"``: fc2's
    192x128 weight is six 64x64 blocks, 64 entries each at 12 + 2 bits; fc1's 128x8 weight two
    64x8 blocks (9 + 2 bits); the vectors (128, 192 and 192 entries: fc3's weight is one row) runs
    of 64, each sent whole (6 + 2 bits); fc3's bias one entry (0 + 2 bits)."""
    code_bits = 6 * 64 * 14 + 2 * 64 * 11 + (2 + 3 + 3) * 64 * 8 + 2
    payload = math.ceil(code_bits / 8) + 6 * 4 * 4
    shapes = [tuple(p.shape) for p in WideNet().parameters()]
    assert payload == _payload(shapes, 64, 64, 2, "blocks") == 1457
    rounds = _rounds(train_ranks(2, lambda: SparseLoCoStrategy(H=H, optim_spec=SGD), H, make_model=WideNet), 2)
    assert [records[0].payload for records in rounds] == [payload]


def test_with_flat_chunking_of_64_and_2_bits_an_entry_of_a_full_chunk_is_one_byte() -> None:
    make = lambda: SparseLoCoStrategy(H=H, chunk=64, k=1, chunking="flat", optim_spec=SGD)  # noqa: E731
    out = train_ranks(2, make, H)
    # 128 entries: 2 chunks of 64, (6 + 2) bits each; 16 entries: one chunk of 16, (4 + 2) bits;
    # 1 entry: one chunk of one, (0 + 2) bits
    payload = math.ceil((2 * 8 + 6 + 6 + 2) / 8) + 4 * 16
    assert [r.payload for r in out[0]["records"][H - 1]] == [payload] == [_payload(TINY, 64, 1, 2, "flat")]


def test_4x4_blocks_and_runs_of_16_end_apart_by_about_as_much_as_training_moved_the_parameters() -> None:
    """Chunks of 16 entries either way, 2 sent per chunk: which 16 entries share a chunk moves
    the run (TinyNet, 2 nodes, 4 rounds: apart by 0.7 of how far training moved them)."""
    ds = regression_data(2 * 8 * STEPS)
    start = torch.cat([p.detach().flatten() for p in TinyNet().parameters()])
    blocks, flat = (
        torch.cat([p.flatten() for p in train_ranks(2, _make(chunk, 2, 2, c), STEPS, dataset=ds)[0]["params"]])
        for chunk, c in ((4, "blocks"), (16, "flat"))
    )
    moved, apart = (blocks - start).norm(), (blocks - flat).norm()
    assert apart > 0.5 * moved, (float(apart), float(moved))


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
        (
            {"chunk": 8, "k": 65},
            r"k must be an int in \[1, 64\] \(entries sent per chunk, at most a chunk's 64 with chunking='blocks'\)",
        ),
        ({"chunk": 8, "k": 9, "chunking": "flat"}, r"k must be an int in \[1, 8\] .*chunking='flat'"),
        (
            {"chunking": "2d"},
            r"chunking must be 'blocks' \(each matrix in blocks of chunk x chunk, the paper's\) or 'flat'.*got '2d'",
        ),
        ({"chunking": None}, r"chunking must be 'blocks' .* or 'flat' .*got None"),
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
    match = r"acts on float payloads, but SparseLoCo\(H=4.*bits=2.*payloads=.coded.*leave the quantizing wire out"
    with pytest.raises(ValueError, match=match):
        CommunicateOptimizeStrategy([SparseLoCoCommunicator(H=4)], wire=wire)
    with pytest.raises(ValueError, match=match):
        QuantizeCommunicator(SparseLoCoCommunicator(H=4), wire.fmt, error_feedback=wire.error_feedback)
