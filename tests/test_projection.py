"""``exogym.projection``: the target's payloads for the proxy's, and the ledger that records them."""

import logging

import pytest
import torch

from exogym.core.comm.ledger import Ledger
from exogym.core.pipeline import CommunicateOptimizeStrategy, Communicator
from exogym.projection import Projection, probe
from exogym.scale import Scale, transformer_shapes
from exogym.strategy import DiLoCoStrategy, PowerSGDStrategy, SimpleReduceStrategy, StreamingDiLoCoStrategy
from tests.helpers import TinyNet

#: Scale("1B")'s target: 1e9 parameters of 2 bytes (bf16) each.
TARGET_BYTES = 2 * 1_000_000_000
#: TinyNet: fc1 8 x 16 + 16, fc2 16 x 1 + 1 = 161 float32 parameters.
PROXY_BYTES = 4 * (8 * 16 + 16 + 16 + 1)


def test_ddp_projects_its_gradient_all_reduce_onto_the_targets_parameter_bytes() -> None:
    proj = probe(SimpleReduceStrategy(), TinyNet(), Scale("1B"), num_nodes=2, max_steps=20, seed=0)
    assert proj.payload("average_grads", "all_reduce", PROXY_BYTES) == TARGET_BYTES


def test_diloco_projects_its_pseudo_gradient_all_reduce_onto_the_targets_parameter_bytes() -> None:
    proj = probe(DiLoCoStrategy(H=5), TinyNet(), Scale("1B"), num_nodes=2, max_steps=20, seed=0)
    assert proj.payload("diloco_pseudo_grad", "all_reduce", PROXY_BYTES) == TARGET_BYTES


def test_ddp_projection_in_fp32_wire_is_four_bytes_a_parameter() -> None:
    proj = probe(SimpleReduceStrategy(), TinyNet(), Scale("1B", wire="fp32"), num_nodes=2, max_steps=10, seed=0)
    assert proj.payload("average_grads", "all_reduce", PROXY_BYTES) == 4 * 1_000_000_000


def powersgd_bytes(shapes, rank, rate, element_size):
    """Bytes of PowerSGD's P, Q and dense all-reduces for tensors of ``shapes``: a tensor viewed
    as an ``n x m`` matrix M ~ P Q^T (P ``n x r``, Q ``m x r``, r = min(n, m, rank), Vogels et
    al. 2019) where its factors are ``rate`` times smaller than M; every other tensor dense."""
    p = q = dense = 0
    for shape in shapes:
        numel = 1
        for s in shape:
            numel *= s
        if len(shape) == 2:
            n, m = shape
            r = min(n, m, rank)
            if (n + m) * r * rate < n * m:
                p, q = p + n * r, q + m * r
                continue
        dense += numel
    return p * element_size, q * element_size, dense * element_size


def test_powersgd_projects_p_and_q_onto_the_rank_r_factors_of_the_targets_matrices() -> None:
    rank, rate = 4, 2.0
    proxy = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 32))
    # The proxy's factors: [64, 64] -> P 64 x 4, Q 64 x 4; [32, 64] -> P 32 x 4, Q 64 x 4 (float32);
    # its biases (64 + 32) dense; its dense warm-up all 64*64 + 64 + 32*64 + 32 = 6240 values.
    proxy_p, proxy_q, proxy_dense = 4 * (64 + 32) * 4, 4 * (64 + 64) * 4, 4 * (64 + 32)
    assert powersgd_bytes([(64, 64), (64,), (32, 64), (32,)], rank, rate, 4) == (proxy_p, proxy_q, proxy_dense)
    target_p, target_q, target_dense = powersgd_bytes(
        [shape for _, shape in transformer_shapes(1_000_000_000, 4)], rank, rate, 2
    )
    strategy = PowerSGDStrategy(rank=rank, start_iter=2, min_compression_rate=rate)
    proj = probe(strategy, proxy, Scale("1B", layers=4), num_nodes=2, max_steps=12, seed=0)
    assert proj.payload("powersgd_p", "all_reduce", proxy_p) == target_p
    assert proj.payload("powersgd_q", "all_reduce", proxy_q) == target_q
    assert proj.payload("powersgd_dense", "all_reduce", proxy_dense) == target_dense
    assert proj.payload("average_grads", "all_reduce", 4 * 6240) == TARGET_BYTES


def test_powersgd_on_a_proxy_too_small_to_compress_takes_the_targets_whole_step() -> None:
    rank, rate = 4, 2.0
    # TinyNet's [16, 8] weight: (16 + 8) * 4 * 2 = 192 >= 128 values, and [1, 16]: not compressed, so
    # the proxy sends its 161 values dense where the target sends its dense vectors, P and Q.
    target_p, target_q, target_dense = powersgd_bytes(
        [shape for _, shape in transformer_shapes(1_000_000_000, 4)], rank, rate, 2
    )
    strategy = PowerSGDStrategy(rank=rank, start_iter=2, min_compression_rate=rate)
    proj = probe(strategy, TinyNet(), Scale("1B", layers=4), num_nodes=2, max_steps=12, seed=0)
    ledger = Ledger(projection=proj)
    ledger.record("all_reduce", 2, PROXY_BYTES, tag="powersgd_dense")
    records = ledger.end_step()
    assert [(r.tag, r.payload) for r in records] == [
        ("powersgd_dense", target_dense),
        ("powersgd_p", target_p),
        ("powersgd_q", target_q),
    ]
    # 2 nodes: a ring all-reduce sends 2 (n-1)/n b = b
    assert ledger.total_sent == pytest.approx(target_dense + target_p + target_q)
    assert ledger.total_collectives == 3


def test_streaming_diloco_projects_each_of_two_fragments_onto_half_the_targets_bytes() -> None:
    proj = probe(StreamingDiLoCoStrategy(H=10, num_fragments=2), TinyNet(), Scale("1B"), 2, 40, 0)
    # The proxy's 161 values cut at round(161 / 2) = 80 (half to even): fragments of 80 and 81.
    for values in (80, 81):
        assert proj.payload("streaming_diloco", "all_reduce", 4 * values) == TARGET_BYTES // 2


def test_streaming_diloco_projects_each_of_three_fragments_onto_a_third_of_the_targets_bytes() -> None:
    proj = probe(StreamingDiLoCoStrategy(H=12, num_fragments=3), TinyNet(), Scale("1B"), 2, 48, 0)
    # The proxy's 161 values cut at round(161/3) = 54 and round(322/3) = 107: fragments of 54, 53, 54.
    # The target's 1e9 values likewise: a fragment is 1e9/3 values to within one at each bound.
    for values in (54, 53):
        assert abs(proj.payload("streaming_diloco", "all_reduce", 4 * values) - TARGET_BYTES / 3) <= 2 * 1


class ItemReading(Communicator):
    """Averages every gradient that is not all zeros: reads a value (``.item()``)."""

    space = "grad"

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        if flat.abs().sum().item() >= 0:
            self.ctx.comm.all_reduce(flat, op="mean", tag="item_reading")


def test_a_communicator_that_reads_values_warns_and_takes_the_ratio_of_parameter_bytes(caplog) -> None:
    strategy = CommunicateOptimizeStrategy([ItemReading(H=1)])
    with caplog.at_level(logging.WARNING, logger="exogym"):
        proj = probe(strategy, TinyNet(), Scale("1B"), num_nodes=2, max_steps=10, seed=0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "could not run on the target's meta tensors" in warnings[0]
    assert "CommunicateOptimizeStrategy" in warnings[0]
    assert proj.pairs == {}
    assert proj.ratio == pytest.approx(TARGET_BYTES / PROXY_BYTES)
    assert proj.payload("item_reading", "all_reduce", PROXY_BYTES) == TARGET_BYTES


def test_probe_leaves_the_given_strategy_unbound() -> None:
    strategy = DiLoCoStrategy(H=5)
    probe(strategy, TinyNet(), Scale("1B"), num_nodes=2, max_steps=10, seed=0)
    assert getattr(strategy, "model", None) is None


@pytest.mark.parametrize("n", [2, 4])
def test_ledger_with_a_projection_records_the_targets_payload_and_its_ring_bytes(n) -> None:
    proj = probe(SimpleReduceStrategy(), TinyNet(), Scale("1B"), num_nodes=n, max_steps=10, seed=0)
    ledger = Ledger(projection=proj)
    for _ in range(3):
        rec = ledger.record("all_reduce", n, PROXY_BYTES, tag="average_grads")
        ledger.end_step()
    # ring all-reduce: sent = received = 2 (n-1)/n * b
    ring = 2 * (n - 1) / n * TARGET_BYTES
    assert rec.payload == TARGET_BYTES
    assert (rec.sent, rec.received) == (pytest.approx(ring), pytest.approx(ring))
    assert ledger.total_sent == pytest.approx(3 * ring)
    assert ledger.total_received == pytest.approx(3 * ring)
    assert ledger.total_payload == 3 * TARGET_BYTES


def test_ledger_with_a_projection_of_other_collectives_replaces_the_step_and_its_totals() -> None:
    proxy_calls = (("t", "all_reduce", 100),)
    target_calls = (("t", "all_reduce", 1000), ("t", "all_gather", 50))
    ledger = Ledger(projection=Projection(steps={proxy_calls: target_calls}))
    ledger.record("all_reduce", 4, 100, tag="t")
    records = ledger.end_step()
    assert [(r.kind, r.payload) for r in records] == [("all_reduce", 1000), ("all_gather", 50)]
    # 4 nodes: all_reduce 2 * 3/4 * 1000 = 1500; all_gather 3 * 50 = 150
    assert [r.sent for r in records] == [pytest.approx(1500), pytest.approx(150)]
    assert ledger.total_sent == pytest.approx(1650)
    assert ledger.total_received == pytest.approx(1650)
    assert ledger.total_payload == 1050
    assert ledger.total_collectives == 2


def test_projection_payload_not_met_takes_its_tags_ratio_else_the_parameter_ratio() -> None:
    proj = Projection(pairs={("a", "all_reduce", 10): 70}, tag_ratio={"a": 5.0}, ratio=3.0)
    assert proj.payload("a", "all_reduce", 10) == 70
    assert proj.payload("a", "all_reduce", 12) == 60  # 12 * 5
    assert proj.payload("b", "all_reduce", 12) == 36  # 12 * 3
