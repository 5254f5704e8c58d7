"""Bandwidth traces: piecewise constant over simulated seconds, read where collectives start."""

import dataclasses

import pytest

from exogym.core.comm.links import Link
from exogym.core.comm.network import Network

MB = 1_000_000


def _world(traces, access=None) -> Network:
    return Network.regions(
        {"us": [0, 1], "eu": [2, 3]}, Link("100Gbit/s", 0), Link("1Gbit/s", 0), access=access, traces=traces
    )


def test_a_region_pair_trace_from_csv_is_piecewise_constant(tmp_path) -> None:
    csv = tmp_path / "trace.csv"
    csv.write_text("time,region_a,region_b,bandwidth\n10,eu,us,500Mbit/s\n20,us,eu,2Gbit/s\n")
    net = _world(str(csv))
    # all-reduce of 1 MB over the 4 nodes, no latency: 6 steps of 2e6 bits over the crossing
    at = {t: net.collective_seconds("all_reduce", MB, (0, 1, 2, 3), at=t) for t in (0, 9.99, 10, 15, 20, 1e6)}
    assert at[0] == at[9.99] == pytest.approx(6 * 2e6 / 1e9)  # before the first row: the world's own 1 Gbit/s
    assert at[10] == at[15] == pytest.approx(6 * 2e6 / 5e8)  # halved from 10 s on: twice the time
    assert at[20] == at[1e6] == pytest.approx(6 * 2e6 / 2e9)
    assert net.collective_seconds("all_reduce", MB, (0, 1), at=15) == pytest.approx(2 * 4e6 / 1e11)  # not traced


def test_a_node_trace_changes_its_access_link() -> None:
    rows = [{"time": 5, "node": 3, "bandwidth": 1e8}]
    net = _world(rows, access=Link("10Gbit/s", 0))
    assert net.collective_seconds("all_reduce", MB, (2, 3), at=4) == pytest.approx(2 * 4e6 / 1e10)
    assert net.collective_seconds("all_reduce", MB, (2, 3), at=5) == pytest.approx(2 * 4e6 / 1e8)


def test_bad_trace_rows_are_named() -> None:
    with pytest.raises(ValueError, match="give the world access links"):
        _world([{"time": 0, "node": 0, "bandwidth": 1e9}])
    with pytest.raises(ValueError, match="unknown region 'asia'"):
        _world([{"time": 0, "region_a": "us", "region_b": "asia", "bandwidth": 1e9}])
    with pytest.raises(ValueError, match="columns must be"):
        _world([{"time": 0, "link": "x", "bandwidth": 1e9}])
    with pytest.raises(ValueError, match="trace row 1 .*bandwidth: unknown unit"):
        _world([{"time": 0, "region_a": "us", "region_b": "eu", "bandwidth": "1Gbit"}])
    with pytest.raises(ValueError, match="time must be simulated seconds"):
        _world([{"time": -1, "region_a": "us", "region_b": "eu", "bandwidth": 1e9}])


def test_halving_the_crossing_at_simulated_second_t_doubles_later_ddp_transfers() -> None:
    from exogym.strategy import SimpleReduceStrategy
    from tests.fake_world import train_ranks

    # TinyNet's 644 bytes, all-reduced by 4 nodes in two regions with no latency: 6 steps of a
    # 161-byte chunk over the 1 Mbit/s crossing = 6 * 1288 / 1e6 = 0.007728 s per DDP step.
    # With 0.25 s of compute per step and no backward pass to overlap (backward_share=0: the
    # whole all-reduce after the compute), the steps' all-reduces start at 0.25, 0.507728,
    # 0.765456, ... simulated seconds; halving the crossing at T = 0.6 doubles those from the third on.
    c = 6 * 161 * 8 / 1e6
    trace = [{"time": 0.6, "region_a": "us", "region_b": "eu", "bandwidth": 5e5}]
    net = Network.regions({"us": [0, 1], "eu": [2, 3]}, Link("100Gbit/s", 0), Link(1e6, 0), traces=trace, compute=0.25)
    net = dataclasses.replace(net, backward_share=0.0)
    out = train_ranks(4, lambda: SimpleReduceStrategy(), 5, network=net)
    cumulative = [r["sim_comm_time"] for r in out[0]["node"].history if "sim_comm_time" in r]
    per_step = [b - a for a, b in zip([0.0, *cumulative[:-1]], cumulative, strict=True)]
    assert per_step == pytest.approx([c, c, 2 * c, 2 * c, 2 * c], rel=1e-9)


def test_a_ddp_step_s_all_reduce_is_priced_where_its_backward_pass_starts() -> None:
    from exogym.strategy import SimpleReduceStrategy
    from tests.fake_world import train_ranks

    # 0.003 s of compute per step, backward 2/3 * 0.003 = 0.002 s. The all-reduce (0.007728 s at
    # 1 Mbit/s, 0.015456 s at 0.5 Mbit/s) starts with the backward pass: step 0's at 0.001 s, before
    # the crossing halves at T = 0.002 s: it waits 0.007728 - 0.002 = 0.005728 s. The later steps'
    # start after T: 0.015456 - 0.002 = 0.013456 s each.
    c = 6 * 161 * 8 / 1e6
    trace = [{"time": 0.002, "region_a": "us", "region_b": "eu", "bandwidth": 5e5}]
    net = Network.regions({"us": [0, 1], "eu": [2, 3]}, Link("100Gbit/s", 0), Link(1e6, 0), traces=trace, compute=0.003)
    out = train_ranks(4, lambda: SimpleReduceStrategy(), 3, network=net)
    cumulative = [r["sim_comm_time"] for r in out[0]["node"].history if "sim_comm_time" in r]
    per_step = [b - a for a, b in zip([0.0, *cumulative[:-1]], cumulative, strict=True)]
    assert per_step == pytest.approx([c - 0.002, 2 * c - 0.002, 2 * c - 0.002], rel=1e-9)


def test_a_world_file_reads_its_trace_beside_it(tmp_path) -> None:
    from exogym.core.comm.world_file import load_world

    (tmp_path / "crossing.csv").write_text("time,region_a,region_b,bandwidth\n10,us,eu,500Mbit/s\n")
    (tmp_path / "w.json").write_text(
        '{"regions": {"us": [0, 1], "eu": [2, 3]}, "intra": {"bandwidth": "100Gbit/s"},'
        ' "inter": {"bandwidth": "1Gbit/s"}, "traces": "crossing.csv"}'
    )
    net = load_world(tmp_path / "w.json")
    assert net.collective_seconds("all_reduce", MB, (0, 1, 2, 3), at=10) == pytest.approx(6 * 2e6 / 5e8)
