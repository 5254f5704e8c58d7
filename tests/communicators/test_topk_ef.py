"""Top-k sparsification with error feedback against a plain-PyTorch reference written from the
algorithm (Aji & Heafield 2017; DGC without its extra techniques), its bytes, and its refusal
of dropped nodes."""

from __future__ import annotations

import pytest
import torch

from communicators.averaging import AveragingCommunicator
from communicators.quantize import Quantize, QuantizeCommunicator
from communicators.topk import TopKCommunicator
from exogym import Faults, Trainer
from exogym.core.communicator import Wrapper
from exogym.core.pipeline import Pipeline
from exogym.strategy import CommunicateOptimizeStrategy, OptimSpec, SimpleReduceStrategy, TopKEFStrategy
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, node_batches, regression_data

STEPS = 12
SGD = OptimSpec(torch.optim.SGD, lr=0.05, momentum=0.9)


def topk_ef_reference(ds, k: int, steps: int, fraction: float) -> list[list[torch.Tensor]]:
    """K model copies with SGD (momentum 0.9). Per step and node: acc = residual + grad; the
    round(fraction * n) (at least 1) entries of largest |acc| of each tensor are sent; residual =
    acc with them zeroed; every node applies (1/K) * sum over nodes of the sent sparse tensors."""
    models = [TinyNet() for _ in range(k)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
    data = [node_batches(ds, k, r) for r in range(k)]
    residuals = [[torch.zeros_like(p) for p in m.parameters()] for m in models]
    for _ in range(steps):
        sparse = []
        for r in range(k):
            models[r].zero_grad()
            models[r](next(data[r])).backward()
            mine = []
            for p, res in zip(models[r].parameters(), residuals[r], strict=True):
                acc = (res + p.grad).flatten()
                keep = acc.abs().argsort(descending=True)[: max(1, round(fraction * acc.numel()))]
                s = torch.zeros_like(acc)
                s[keep] = acc[keep]
                res.copy_((acc - s).view_as(res))
                mine.append(s.view_as(p))
            sparse.append(mine)
        for r in range(k):
            for i, p in enumerate(models[r].parameters()):
                total = torch.zeros_like(p)
                for j in range(k):
                    total += sparse[j][i]
                p.grad = total / k
            opts[r].step()
    return [[p.detach().clone() for p in m.parameters()] for m in models]


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("fraction", [0.1, 0.3])
def test_topk_ef_matches_the_reference_on_every_node(k: int, fraction: float) -> None:
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(k, lambda: TopKEFStrategy(k=fraction, optim_spec=SGD), STEPS, dataset=ds)
    ref = topk_ef_reference(ds, k, STEPS, fraction)
    for rank in range(k):
        for a, b in zip(out[rank]["params"], ref[rank], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_k_of_one_sends_everything_and_equals_ddp() -> None:
    topk = train_ranks(4, lambda: TopKEFStrategy(k=1.0, optim_spec=SGD), STEPS)
    ddp = train_ranks(4, lambda: SimpleReduceStrategy(optim_spec=SGD), STEPS)
    for a, b in zip(topk[0]["params"], ddp[0]["params"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [2, 4])
def test_bytes_per_step_are_one_all_gather_of_k_int32_indices_and_float32_values_per_tensor(k: int) -> None:
    out = train_ranks(k, lambda: TopKEFStrategy(k=0.1, optim_spec=SGD), STEPS)
    counts = [max(1, round(0.1 * p.numel())) for p in TinyNet().parameters()]  # 13, 2, 2, 1
    payload = sum(c * (4 + 4) for c in counts)
    for o in out:
        for records in o["records"]:
            assert [(r.kind, r.group_size, r.payload) for r in records] == [("all_gather", k, payload)]
            assert records[0].sent == (k - 1) * payload


def test_virtual_nodes_end_as_nodes_on_their_own_threads() -> None:
    make = lambda: TopKEFStrategy(k=0.1, optim_spec=SGD)  # noqa: E731
    alone = train_ranks(4, make, STEPS)
    virtual = train_ranks(4, make, STEPS, workers=2)
    for a, b in zip(alone, virtual, strict=True):
        for p, q in zip(a["params"], b["params"], strict=True):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_state_holds_the_residuals_and_every_node_applies_the_same_update() -> None:
    out = train_ranks(2, lambda: TopKEFStrategy(k=0.1, optim_spec=SGD), 3)
    residuals = [o["strategy"].state_dict()["pipeline"]["0"]["residuals"] for o in out]
    assert any(not torch.equal(a, b) for a, b in zip(*residuals, strict=True))  # each node keeps its own
    assert all(bool(r.abs().sum() > 0) for r in residuals[0][:3])  # what was not sent stays
    for a, b in zip(out[0]["params"], out[1]["params"], strict=True):
        assert torch.equal(a, b)


def test_faults_that_drop_nodes_are_refused_naming_the_all_gather() -> None:
    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(ValueError, match=r"cannot leave a node out of a round \(TopK\(k=0.01.*all-gather"):
        trainer.fit(
            TopKEFStrategy(), num_nodes=4, max_steps=8, batch_size=8, faults=Faults(drop={1: [2]}), logger=False
        )


@pytest.mark.parametrize("k", [0, 1.5, True, "0.1"])
def test_a_fraction_outside_zero_to_one_is_refused(k) -> None:
    with pytest.raises(ValueError, match=r"k must be a number in \(0, 1\] \(the fraction of each tensor's entries"):
        TopKEFStrategy(k=k)


@pytest.mark.parametrize("error_feedback", [False, True], ids=["plain", "error_feedback"])
@pytest.mark.parametrize("fmt", ["int8", "fp8", "fp16"])
def test_a_quantizing_wire_is_refused_at_construction_naming_the_coded_payload_and_the_fix(
    fmt: str, error_feedback: bool
) -> None:
    """Top-k's all-gather payload is the bytes of its values and int32 indices, not a float
    tensor: a quantizing wire would pass it through unchanged (with error feedback its residuals
    would also land on the wrong entries), so the strategy and the wrapper refuse it when made,
    before any process starts."""
    match = r"acts on float payloads, but TopK\(k=0.1.*payloads=.coded.*leave the quantizing wire out"
    wire = Quantize(fmt, error_feedback=error_feedback)
    with pytest.raises(ValueError, match=match):
        CommunicateOptimizeStrategy([TopKCommunicator(0.1)], wire=wire)
    with pytest.raises(ValueError, match=match):
        CommunicateOptimizeStrategy([Pipeline([AveragingCommunicator(), TopKCommunicator(0.1)])], wire=wire)
    with pytest.raises(ValueError, match=match):
        QuantizeCommunicator(TopKCommunicator(0.1), fmt, error_feedback=error_feedback)
    assert TopKCommunicator(0.1).payloads == Wrapper(TopKCommunicator(0.1)).payloads == "coded"
    assert AveragingCommunicator().payloads == "stable"
