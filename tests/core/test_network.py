"""The network model against hand-computed cases."""

import pytest

from exogym.core.comm.ledger import CollectiveRecord
from exogym.core.comm.network import PRESETS, Network, resolve_network


def test_hand_computed_costs() -> None:
    net = Network(bandwidth=1e9, latency=1e-3)  # 1 Gbit/s, 1 ms
    mb = 1_000_000
    # ring all-reduce of 1 MB over 4 nodes: 6 latencies + 1.5 * 8e6 bits / 1e9
    assert net.collective_time("all_reduce", 4, mb) == pytest.approx(6e-3 + 0.012)
    # all-gather of 1 MB per node over 4 nodes: 3 latencies + 3/4 * 32e6 bits / 1e9
    assert net.collective_time("all_gather", 4, mb) == pytest.approx(3e-3 + 0.024)
    assert net.collective_time("reduce_scatter", 4, mb) == pytest.approx(3e-3 + 0.006)
    # binomial broadcast over 5 nodes: 3 rounds of (1 ms + 8 ms)
    assert net.collective_time("broadcast", 5, mb) == pytest.approx(3 * (1e-3 + 8e-3))
    assert net.collective_time("barrier", 8, 0) == pytest.approx(3e-3)
    assert net.collective_time("all_reduce", 1, mb) == 0.0


def test_presets() -> None:
    assert (PRESETS["datacenter"].bandwidth, PRESETS["datacenter"].latency) == (100e9, 10e-6)
    assert (PRESETS["ethernet"].bandwidth, PRESETS["ethernet"].latency) == (1e9, 1e-3)
    assert (PRESETS["internet"].bandwidth, PRESETS["internet"].latency) == (100e6, 30e-3)
    assert resolve_network(None) is PRESETS["ethernet"] and resolve_network("internet") is PRESETS["internet"]
    with pytest.raises(ValueError, match="network must be"):
        resolve_network("wifi")
    with pytest.raises(ValueError, match="bandwidth"):
        Network(0, 1e-3)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
def test_monotone_in_bytes_and_latency(kind: str) -> None:
    sizes = [0, 1, 10**3, 10**6, 10**8]
    for n in (2, 3, 8):
        times = [Network(1e9, 1e-3).collective_time(kind, n, b) for b in sizes]
        assert times == sorted(times) and times[-1] > times[0]
        lat = [Network(1e9, a).collective_time(kind, n, 10**4) for a in (0, 1e-5, 1e-3, 1e-1)]
        assert lat == sorted(lat) and lat[-1] > lat[0]


def test_step_time_is_slowest_compute_plus_slowest_comm() -> None:
    net = Network(1e9, 1e-3, compute_slowdown=(1.0, 3.0))
    assert net.step_time([0.1, 0.05, 0.1, 0.02], [0.2, 0.3, 0.1, 0.1]) == pytest.approx(0.15 + 0.3)
    recs = [CollectiveRecord("all_reduce", 4, 10**6, 0, 0), CollectiveRecord("all_gather", 2, 10**3, 0, 0)]
    assert net.records_time(recs) == pytest.approx(
        net.collective_time("all_reduce", 4, 10**6) + net.collective_time("all_gather", 2, 10**3)
    )


def test_overlapped_transfers_wait_only_for_what_the_backward_pass_and_the_overlapped_compute_cannot_hide() -> None:
    net = Network(1e8, 0.03)
    t = net.collective_time("all_reduce", 4, 10**6)  # 2*3*0.03 + 1.5 * 8e6 / 1e8 = 0.3 s
    blocking = CollectiveRecord("all_reduce", 4, 10**6, 0, 0)
    overlapped = CollectiveRecord("all_reduce", 4, 10**6, 0, 0, overlap_steps=2)
    assert t == pytest.approx(0.3)
    # compute 0.1 s, backward 2/3 * 0.1 = 0.0667 s, then 2 steps of 0.1 s: waits 0.3 - 0.0667 - 0.2
    assert net.records_time([overlapped], compute=0.1) == pytest.approx(t - 0.2 / 3 - 2 * 0.1)
    assert net.records_time([overlapped], compute=0.5) == 0.0  # fully hidden behind 0.333 s + 2 steps
    assert net.records_time([overlapped]) == pytest.approx(t)  # nothing to hide behind
    # the blocking one first: 0.3 - 0.0667 s; the overlapped one after it ends 0.2 s later:
    # max(0.3 - 0.0667, 0.3 + 0.3 - 0.0667 - 0.2) = 0.3333 s
    assert net.records_time([blocking, overlapped], compute=0.1) == pytest.approx(t + t - 0.2 / 3 - 0.2)
    assert net.records_time([blocking], compute=0.1) == pytest.approx(t - 0.2 / 3)


def test_a_step_s_collectives_stream_through_its_backward_pass() -> None:
    net = Network(1e8, 0.03)
    assert net.backward_share == pytest.approx(2 / 3)  # the default: the forward pass is the other third
    t = net.collective_time("all_reduce", 4, 10**6)  # 0.3 s
    blocking = CollectiveRecord("all_reduce", 4, 10**6, 0, 0)
    assert net.records_time([blocking], compute=0.45) == 0.0  # backward 2/3 * 0.45 = 0.3 s: hidden whole
    assert net.records_time([blocking], compute=0.9) == 0.0
    assert net.records_time([blocking], compute=0.3) == pytest.approx(t - 0.2)  # backward 0.2 s: waits 0.1 s
    assert net.records_time([blocking, blocking], compute=0.3) == pytest.approx(2 * t - 0.2)  # one after the other
    half = Network(1e8, 0.03, backward_share=0.5)
    assert half.records_time([blocking], compute=0.3) == pytest.approx(t - 0.15)
    with pytest.raises(ValueError, match=r"backward_share must be in \[0, 1\]"):
        Network(1e8, 0.03, backward_share=1.5)


def test_with_backward_share_0_collectives_start_when_compute_ends() -> None:
    """The previous rule: a step waits for all of its blocking collectives, and its overlapped
    ones may end ``overlap_steps * compute`` later."""
    net = Network(1e8, 0.03, backward_share=0.0)
    t = net.collective_time("all_reduce", 4, 10**6)  # 0.3 s
    blocking = CollectiveRecord("all_reduce", 4, 10**6, 0, 0)
    overlapped = CollectiveRecord("all_reduce", 4, 10**6, 0, 0, overlap_steps=2)
    assert net.records_time([blocking], compute=10.0) == pytest.approx(t)  # compute hides none of it
    assert net.records_time([overlapped], compute=0.1) == pytest.approx(t - 2 * 0.1)
    assert net.records_time([overlapped], compute=0.5) == 0.0  # fully hidden behind 2 steps
    assert net.records_time([overlapped]) == pytest.approx(t)
    assert net.records_time([blocking, overlapped], compute=0.1) == pytest.approx(t + t - 0.2)


def _ddp_rows(net: Network, steps: int = 4) -> list[dict]:
    from exogym.strategy import SimpleReduceStrategy
    from tests.fake_world import train_ranks

    out = train_ranks(2, lambda: SimpleReduceStrategy(), steps, network=net)
    return [r for r in out[0]["node"].history if "train_loss" in r]


@pytest.mark.parametrize(
    ("bandwidth", "excess"),
    [
        # TinyNet's 644 bytes all-reduced by 2 nodes: 2 * 0.01 + 8 * 644 / B s; backward 2/3 * 0.1 s
        (1e6, 0.0),  # 0.02 + 0.005152 = 0.025152 s, under 0.0667 s: the step costs its compute
        (1e5, 0.02 + 0.05152 - 0.2 / 3),  # 0.07152 s: 0.004853 s past the backward pass
    ],
)
def test_ddp_s_step_costs_its_compute_while_the_all_reduce_fits_in_the_backward_pass_and_the_excess_after(
    bandwidth: float, excess: float
) -> None:
    from tests.helpers import TinyNet

    assert sum(p.numel() * 4 for p in TinyNet().parameters()) == 644
    rows = _ddp_rows(Network(bandwidth, 0.01, compute=0.1))
    assert [r["sim_comm_time"] for r in rows] == pytest.approx([r["step"] * excess for r in rows], abs=1e-12)
    assert [r["sim_time"] for r in rows] == pytest.approx([r["step"] * (0.1 + excess) for r in rows], abs=1e-12)


@pytest.mark.parametrize("bandwidth", [1e6, 1e5])
def test_with_backward_share_0_ddp_s_step_costs_its_compute_plus_its_all_reduce(bandwidth: float) -> None:
    per_step = 2 * 0.01 + 8 * 644 / bandwidth  # the whole all-reduce, after the compute
    rows = _ddp_rows(Network(bandwidth, 0.01, compute=0.1, backward_share=0.0))
    assert [r["sim_comm_time"] for r in rows] == pytest.approx([r["step"] * per_step for r in rows], abs=1e-12)
    assert [r["sim_time"] for r in rows] == pytest.approx([r["step"] * (0.1 + per_step) for r in rows], abs=1e-12)


def test_compute_model_is_checked_and_named_in_the_error() -> None:
    for bad in ("fast", -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="compute must be 'measured', 'flops' or seconds per step"):
            Network(1e9, 1e-3, compute=bad)
    with pytest.raises(ValueError, match="flops_per_second"):
        Network(1e9, 1e-3, compute="flops", flops_per_second=0)
    assert resolve_network("internet", compute=0.5).compute == 0.5
    assert resolve_network("internet", compute=0.5).bandwidth == PRESETS["internet"].bandwidth


def test_compute_seconds_per_model() -> None:
    assert Network(1e9, 0, compute="measured").compute_seconds(0.3, 1e12) == 0.3  # measured ignores the FLOPs
    assert Network(1e9, 0).compute_seconds(0.3, 1e12) == 0.1  # the default: FLOPs at 1e13 per second
    assert Network(1e9, 0, compute=0.02).compute_seconds(0.3, 1e12) == 0.02
    assert Network(1e9, 0, compute="flops", flops_per_second=4e12).compute_seconds(0.3, 1e12) == 0.25


def _tinynet_flops_per_step(batch: int, d: int = 8, hidden: int = 16) -> int:
    """FLOPs of a TinyNet step from the matrix products autograd runs (2 FLOPs per
    multiply-add): forward fc1 and fc2; backward the weight gradients of both and the input
    gradient of fc2 only (the data needs no gradient)."""
    fc1, fc2 = 2 * batch * d * hidden, 2 * batch * hidden * 1
    return 2 * fc1 + 3 * fc2


@pytest.mark.parametrize("compute", ["flops", 0.25])
def test_deterministic_compute_models_price_every_trained_step_alike(compute: str | float) -> None:
    from exogym.strategy import SimpleReduceStrategy
    from tests.fake_world import train_ranks

    steps, batch, fps = 6, 8, 1e6
    net = Network(1e9, 1e-3, compute=compute, flops_per_second=fps)
    out = train_ranks(2, lambda: SimpleReduceStrategy(), steps, batch_size=batch, network=net)
    rows = [r for r in out[0]["node"].history if "compute_time" in r]
    per_step = _tinynet_flops_per_step(batch) / fps if compute == "flops" else compute
    assert [r["compute_time"] for r in rows] == pytest.approx([per_step * r["step"] for r in rows], rel=1e-12)


def test_ddp_on_nodes_of_unequal_speed_starts_the_all_reduce_when_the_slowest_backward_pass_starts() -> None:
    # 2 nodes, 0.01 s of compute at speeds 1 and 3: node 0 computes 0.01 s (backward from 0.00333 s),
    # node 1 0.03 s (backward from 0.01 s). The all-reduce of 644 bytes, 0.02 + 8 * 644 / 1e6 =
    # 0.025152 s, starts when both are in their backward pass, at 0.01 s, and ends at 0.035152 s:
    # node 1 waits 0.025152 - 2/3 * 0.03 = 0.005152 s past its compute, and the step lasts 0.035152 s.
    rows = _ddp_rows(Network(1e6, 0.01, compute=0.01, compute_slowdown=(1, 3)), steps=3)
    step = 0.03 + 0.025152 - 0.02
    assert [r["sim_time"] for r in rows] == pytest.approx([r["step"] * step for r in rows], abs=1e-12)
