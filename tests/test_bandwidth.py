"""``exogym.bandwidth``: a strategy's schedule at a scale priced with the clock, against the clock's
formula by hand (docs/user-guide/networks.md "What a step waits for"): a step of compute ``c``
whose blocking collectives take ``C`` seconds lasts ``c + max(0, C - backward_share * c)``."""

import math

import pytest

from exogym.bandwidth import SEARCH_RANGE, bandwidth_for, schedule
from exogym.core.comm.network import Network
from exogym.scale import Scale, transformer_shapes
from exogym.strategy import (
    DiLoCoStrategy,
    FedBuffStrategy,
    PowerSGDStrategy,
    SimpleReduceStrategy,
    StreamingDiLoCoStrategy,
)
from tests.test_projection import powersgd_bytes

C_STEP = 0.1  # seconds of compute per step
SCALE = Scale("1B", step_seconds=C_STEP)
#: bits of the 1B target's bf16 model (or gradient): 8 * 2e9
BITS = 8 * 2e9


def ring_seconds(bits: float, bandwidth: float, n: int = 2, latency: float = 0.0) -> float:
    """A ring all-reduce: ``2(n-1) a + 2(n-1)/n * 8b / B``."""
    return 2 * (n - 1) * latency + 2 * (n - 1) / n * bits / bandwidth


def excess(C: float, c: float = C_STEP, share: float = 2 / 3) -> float:
    return max(0.0, C - share * c)


@pytest.fixture(scope="module")
def ddp():
    return schedule(SimpleReduceStrategy(), SCALE, num_nodes=2)


@pytest.fixture(scope="module")
def diloco_2h():
    return schedule(DiLoCoStrategy(H=10), SCALE, num_nodes=2, steps=20, start=0)


@pytest.mark.parametrize("bandwidth", [1e9, 10e9, 100e9, 200e9])
def test_ddp_utilisation_is_compute_over_compute_plus_the_all_reduce_beyond_the_backward_pass(ddp, bandwidth) -> None:
    C = ring_seconds(BITS, bandwidth)  # 2 nodes: 8 * 2e9 / B
    assert ddp.utilisation(Network(bandwidth, 0.0, compute=C_STEP)) == pytest.approx(
        C_STEP / (C_STEP + excess(C)), rel=1e-12
    )


def test_ddp_utilisation_is_one_when_the_all_reduce_fits_in_the_backward_pass(ddp) -> None:
    # C = 8 * 2e9 / 400e9 = 0.04 s < 2/3 * 0.1
    assert ddp.utilisation(Network(400e9, 0.0, compute=C_STEP)) == pytest.approx(1.0, rel=1e-12)


def test_ddp_utilisation_on_four_nodes_with_latency_follows_the_ring_formula() -> None:
    s = schedule(SimpleReduceStrategy(), SCALE, num_nodes=4)
    # 2 * 3 * 0.005 + 2 * 3/4 * 1.6e10 / 50e9 = 0.03 + 0.48
    C = 0.03 + 0.48
    assert ring_seconds(BITS, 50e9, n=4, latency=0.005) == pytest.approx(C)
    assert s.utilisation(Network(50e9, 0.005, compute=C_STEP)) == pytest.approx(C_STEP / (C_STEP + excess(C)))


@pytest.mark.parametrize("level", [0.001, 0.5, 0.9])
def test_ddp_bandwidth_for_a_utilisation_is_the_bits_over_what_the_step_may_take(ddp, level) -> None:
    # c / (c + C - 2c/3) = u  <=>  C = 2c/3 + c(1-u)/u: at 50% C = 5c/3, at 90% C = 7c/9
    bandwidth = BITS / (2 * C_STEP / 3 + C_STEP * (1 - level) / level)
    found = bandwidth_for(ddp, Network(1e9, 0.0, compute=C_STEP), level)
    assert bandwidth * (1 - 1e-9) <= found <= bandwidth * (1 + 1e-3)


def test_ddp_bandwidth_for_fifty_percent_is_96_gbit_per_s(ddp) -> None:
    # 8 * 2e9 / (5 * 0.1 / 3) = 1.6e10 / 0.16667 = 9.6e10
    assert bandwidth_for(ddp, Network(1e9, 0.0, compute=C_STEP), 0.5) == pytest.approx(96e9, rel=1e-3)


def test_diloco_utilisation_over_two_rounds_is_hc_over_hc_plus_the_all_reduce_beyond_the_backward_pass(
    diloco_2h,
) -> None:
    H, B = 10, 10e9
    C = ring_seconds(BITS, B)  # 1.6 s
    assert diloco_2h.utilisation(Network(B, 0.0, compute=C_STEP)) == pytest.approx(
        H * C_STEP / (H * C_STEP + excess(C)), rel=1e-12
    )


def test_diloco_default_schedule_of_6h_steps_from_step_1000_holds_six_syncs() -> None:
    H, B = 10, 10e9
    s = schedule(DiLoCoStrategy(H=H), SCALE, num_nodes=2)
    steps = 6 * H
    assert len(s.steps) == steps
    # it starts at step 1000 (a multiple of H): syncs after its steps H-1, 2H-1, ..., 6H-1 (0-based)
    assert [i for i, step in enumerate(s.steps) if step.records] == [k * H - 1 for k in range(1, 7)]
    C = ring_seconds(BITS, B)
    assert s.utilisation(Network(B, 0.0, compute=C_STEP)) == pytest.approx(
        steps * C_STEP / (steps * C_STEP + 6 * excess(C)), rel=1e-12
    )
    assert s.seconds(Network(B, 0.0, compute=C_STEP)) == (
        pytest.approx(steps * C_STEP),
        pytest.approx(steps * C_STEP + 6 * excess(C)),
    )


def test_diloco_without_backward_overlap_waits_for_the_whole_all_reduce(diloco_2h) -> None:
    H, B = 10, 10e9
    C = ring_seconds(BITS, B)
    net = Network(B, 0.0, compute=C_STEP, backward_share=0.0)
    assert diloco_2h.utilisation(net) == pytest.approx(H * C_STEP / (H * C_STEP + C), rel=1e-12)


def test_diloco_bandwidth_for_fifty_percent_over_a_round(diloco_2h) -> None:
    # H c / (H c + C - 2c/3) = 1/2  <=>  C = H c + 2c/3 = 1.0667 s: B = 1.6e10 / 1.0667 = 15 Gbit/s
    H = 10
    bandwidth = BITS / (H * C_STEP + 2 * C_STEP / 3)
    found = bandwidth_for(diloco_2h, Network(1e9, 0.0, compute=C_STEP), 0.5)
    assert bandwidth * (1 - 1e-9) <= found <= bandwidth * (1 + 1e-3)


def _streaming(overlap_steps: int):
    return schedule(
        StreamingDiLoCoStrategy(H=10, num_fragments=2, overlap_steps=overlap_steps), SCALE, 2, steps=22, start=0
    )


def test_streaming_diloco_sends_four_fragments_in_22_steps() -> None:
    s = _streaming(1)
    # fragment f is sent after steps s with (s+1) % 10 == floor((f+1) * 10 / 2) % 10: 5 and 0,
    # i.e. steps 4, 14 (f = 0) and 9, 19 (f = 1) of 0..21; each half the 1B model.
    starts = [i for i, step in enumerate(s.steps) for is_start, _ in step.events if is_start]
    assert starts == [4, 9, 14, 19]
    assert [r.payload for h in s.handles for r in h] == [2 * 500_000_000] * 4


def test_streaming_diloco_with_overlap_one_hides_a_fragment_that_fits_in_backward_plus_a_step() -> None:
    s = _streaming(1)
    # a fragment's all-reduce (8 * 1e9 / B on 2 nodes) starts as its step's backward pass starts
    # and is waited for after the next step: hidden while 8e9 / B <= 2c/3 + c = 5c/3.
    hidden = 8e9 / (5 * C_STEP / 3)  # 48 Gbit/s
    assert s.utilisation(Network(hidden * 1.01, 0.0, compute=C_STEP)) == pytest.approx(1.0, rel=1e-12)
    assert s.utilisation(Network(hidden * 0.9, 0.0, compute=C_STEP)) < 1.0


@pytest.mark.parametrize(("overlap_steps", "window"), [(1, 5 * C_STEP / 3), (0, 2 * C_STEP / 3)])
def test_streaming_diloco_stalls_for_what_of_a_fragment_the_overlap_does_not_hide(overlap_steps, window) -> None:
    s = _streaming(overlap_steps)
    B = 24e9
    T = 8e9 / B  # 1/3 s
    compute = 22 * C_STEP
    # four fragments in the 22 steps, each stalls T - window: 1/3 - 1/6 with overlap 1, 1/3 - 1/15 without
    assert s.utilisation(Network(B, 0.0, compute=C_STEP)) == pytest.approx(
        compute / (compute + 4 * (T - window)), rel=1e-12
    )


def test_powersgd_schedule_prices_the_dense_warm_up_then_the_rank_r_factors() -> None:
    scale = Scale("1B", layers=4, step_seconds=C_STEP)
    s = schedule(PowerSGDStrategy(rank=4, start_iter=2), scale, num_nodes=2, steps=4, start=0)
    p, q, dense = powersgd_bytes([shape for _, shape in transformer_shapes(1_000_000_000, 4)], 4, 2.0, 2)
    assert [[r.payload for r in step.records] for step in s.steps] == [[2e9], [2e9], [dense, p, q], [dense, p, q]]
    B = 10e9
    # 2 nodes: each all-reduce 8b / B, one after the other; two dense steps, two compressed
    warm, compressed = ring_seconds(BITS, B), ring_seconds(8 * (dense + p + q), B)
    total = 4 * C_STEP + 2 * excess(warm) + 2 * excess(compressed)
    assert s.utilisation(Network(B, 0.0, compute=C_STEP)) == pytest.approx(4 * C_STEP / total, rel=1e-12)


def test_powersgd_default_schedule_reaches_its_compressed_steps() -> None:
    s = schedule(PowerSGDStrategy(rank=4, start_iter=20), Scale("1B", layers=4, step_seconds=C_STEP), num_nodes=2)
    assert any(r.tag == "powersgd_p" for step in s.steps for r in step.records)


def test_bandwidth_for_is_infinite_where_latency_alone_prevents_the_utilisation(ddp) -> None:
    # latency 1 s: C >= 2 * 1 s, so c / (c + C - 2c/3) < 0.05 at any bandwidth
    assert bandwidth_for(ddp, Network(1e9, 1.0, compute=C_STEP), 0.99) == math.inf


def test_bandwidth_for_is_the_search_floor_where_any_bandwidth_reaches_the_utilisation(ddp) -> None:
    # at the floor, 1 kbit/s: C = 1.6e10 / 1e3 = 1.6e7 s, utilisation 0.1 / (0.1 + 1.6e7 - 0.0667) = 6.25e-9
    assert bandwidth_for(ddp, Network(1e9, 0.0, compute=C_STEP), 5e-9) == SEARCH_RANGE[0]
    assert bandwidth_for(ddp, Network(1e9, 0.0, compute=C_STEP), 7e-9) > SEARCH_RANGE[0]


@pytest.mark.parametrize("level", [0.0, 1.5, -0.1])
def test_bandwidth_for_refuses_a_utilisation_outside_zero_to_one(ddp, level) -> None:
    with pytest.raises(ValueError, match=r"utilisation must be in \(0, 1\]"):
        bandwidth_for(ddp, Network(1e9, 0.0, compute=C_STEP), level)


def test_schedule_refuses_a_server_strategy() -> None:
    with pytest.raises(ValueError, match="FedBuffServer is a server algorithm: its timeline needs training"):
        schedule(FedBuffStrategy(), SCALE)


def test_schedule_refuses_overlap_auto_asking_for_a_number_of_steps() -> None:
    strategy = StreamingDiLoCoStrategy(H=10, num_fragments=2, overlap_steps="auto")
    with pytest.raises(ValueError, match="give the overlap as a number of steps"):
        schedule(strategy, SCALE)


def test_schedule_priced_on_a_network_without_modelled_compute_is_refused(ddp) -> None:
    with pytest.raises(ValueError, match="priced with modelled compute"):
        ddp.utilisation(Network(1e9, 0.0, compute="flops"))


def test_schedule_bytes_per_step_of_ddp_is_the_ring_share_of_the_targets_bytes(ddp) -> None:
    # 2 nodes: 2 (n-1)/n * 2e9 = 2e9 bytes sent per step
    assert ddp.bytes_per_step() == pytest.approx(2e9)
