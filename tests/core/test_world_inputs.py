"""What a world accepts as input: plain numbers in strings, values inside physical ranges, and
world files and traces whose mistakes are named with the file, the key or row, and the fix."""

import json

import pytest

from exogym import Availability, Link, Network
from exogym.core.comm.links import parse_bandwidth, parse_latency
from exogym.core.comm.network import resolve_network
from exogym.core.comm.world_file import load_world, world_from_dict

MB = 1_000_000
LINKS = '"intra": {"bandwidth": "100Gbit/s", "latency": "10us"}, "inter": {"bandwidth": "1Gbit/s", "latency": "80ms"}'


def _file(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------- plain numbers in strings


def test_a_string_without_a_unit_is_bits_per_second_or_seconds() -> None:
    assert parse_bandwidth("1e9") == 1e9 and parse_bandwidth(" 500000000 ") == 5e8
    assert parse_latency("0.08") == 0.08 and parse_latency("0") == 0.0
    assert Link("1e9", "0.08") == Link(1e9, 0.08) == Link("1Gbit/s", "80ms")  # units still work
    assert Network("1e9", "0.001") == Network(1e9, 1e-3)


def test_a_trace_and_a_world_file_take_plain_numbers(tmp_path) -> None:
    trace = _file(tmp_path, "crossing.csv", "time,region_a,region_b,bandwidth\n0,us,eu,1e9\n10,us,eu,5e8\n")
    world = _file(
        tmp_path,
        "w.json",
        '{"regions": {"us": [0, 1], "eu": [2, 3]}, "intra": {"bandwidth": "1e11", "latency": "1e-5"},'
        ' "inter": {"bandwidth": "1e9", "latency": "0.08"}, "traces": "crossing.csv"}',
    )
    net = load_world(world)
    assert net.world.links[0][1] == Link("1Gbit/s", "80ms")
    # a ring all-reduce of 1 MB on 4 nodes: 6 steps of a 2e6-bit chunk over the crossing
    assert net.collective_seconds("all_reduce", MB, (0, 1, 2, 3), at=0) == pytest.approx(6 * (0.08 + 2e6 / 1e9))
    assert net.collective_seconds("all_reduce", MB, (0, 1, 2, 3), at=10) == pytest.approx(6 * (0.08 + 2e6 / 5e8))
    assert trace.endswith("crossing.csv")


# ---------------------------------------------------------------- values outside physical sense


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Link(1e-305, 0), r"Link bandwidth must be in \[1, 1e\+15\] bits/s .* got 1e-305"),
        (lambda: Link("1e-300bit/s", 0), r"Link bandwidth must be in \[1, 1e\+15\] bits/s"),
        (lambda: Link(1e16, 0), r"Link bandwidth must be in \[1, 1e\+15\]"),
        (lambda: Link(10**400, 0), r"Link bandwidth must be in .* got 100000000000\.\.\. \(401 characters\)"),
        (lambda: Link(1e9, upload=0.5), r"Link upload must be in \[1, 1e\+15\]"),
        (lambda: Link(1e9, 2e4), r"Link latency must be in \[0, 10000\] s, got 20000"),
        (lambda: Link(1e9, "3h"), r"Link latency: unknown unit 'h'"),
        (lambda: Network(1e-300, 0), r"Network bandwidth must be in \[1, 1e\+15\]"),
        (lambda: Network(1e9, float("inf")), r"Network latency must be in \[0, 10000\] s"),
        (lambda: Network(1e9, 0, compute_slowdown=(1.0, 1e300)), r"compute_slowdown factors must be in \[1e-06"),
        (lambda: Network(1e9, 0, compute_slowdown=(0.0,)), r"compute_slowdown factors must be in"),
        (lambda: Network(1e9, 0, compute=1e300), r"compute must be .* seconds per step in \[0, 1e\+06\] s"),
        (lambda: Network(1e9, 0, compute=float("nan")), r"compute must be .* seconds per step in \[0, 1e\+06\] s"),
        (lambda: Network(1e9, 0, flops_per_second=float("inf")), r"flops_per_second must be in \[1, 1e\+21\]"),
        (lambda: Network(1e9, 0, flops_per_second=1e-300), r"flops_per_second must be in \[1, 1e\+21\]"),
    ],
)
def test_values_outside_physical_sense_are_refused_naming_the_argument_and_the_range(make, match) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_an_infinite_bandwidth_is_a_network_of_free_links_but_no_link() -> None:
    assert Network(float("inf"), 0.01).collective_seconds("all_reduce", MB, group_size=4) == pytest.approx(6 * 0.01)
    with pytest.raises(ValueError, match=r"Link bandwidth must be in \[1, 1e\+15\]"):
        Link(float("inf"))


def test_a_world_file_or_trace_with_an_extreme_value_is_refused_naming_the_file_and_key(tmp_path) -> None:
    base = {"regions": {"us": [0, 1], "eu": [2, 3]}, **json.loads("{" + LINKS + "}")}
    cases = [
        ({"intra": {"bandwidth": 10**400}}, r"w.json: intra: Link bandwidth must be in \[1, 1e\+15\]"),
        ({"inter": {"bandwidth": 1e-305}}, r"w.json: inter: Link bandwidth must be in"),
        ({"compute": 1e300}, r"w.json: compute must be .* in \[0, 1e\+06\] s"),
        ({"compute_slowdown": [1, 1e300]}, r"w.json: compute_slowdown factors must be in"),
        ({"flops_per_second": 10**400}, r"w.json: flops_per_second must be in \[1, 1e\+21\]"),
    ]
    for change, match in cases:
        path = _file(tmp_path, "w.json", json.dumps({**base, **change}))
        with pytest.raises(ValueError, match=match):
            load_world(path)
    _file(tmp_path, "t.csv", "time,region_a,region_b,bandwidth\n0,us,eu,1e-305\n")
    path = _file(tmp_path, "w.json", json.dumps({**base, "traces": "t.csv"}))
    with pytest.raises(ValueError, match=r"w.json: trace .*t.csv row 1 .*bandwidth must be in \[1, 1e\+15\]"):
        load_world(path)


def test_node_speeds_drawn_out_of_range_are_refused_before_the_run() -> None:
    from torch.distributions import LogNormal

    with pytest.raises(ValueError, match=r"drew a node speed out of range: factors must be in \[1e-06, 1e\+06\]"):
        Network(1e9, 0, compute_slowdown=LogNormal(700.0, 0.1)).for_run(4, seed=0)


def test_the_bandwidth_search_stays_inside_the_range_a_link_may_have() -> None:
    from exogym.bandwidth import SEARCH_RANGE

    assert [Network(bw, 0).bandwidth for bw in SEARCH_RANGE] == list(SEARCH_RANGE)  # both ends are networks


# ---------------------------------------------------------------- world files


def test_a_malformed_json_or_toml_file_is_named_with_the_place_to_fix(tmp_path) -> None:
    path = _file(tmp_path, "broken.json", '{"regions": {"a": [0, 1]},\n "intra": {"bandwidth": 1e9},}')
    with pytest.raises(ValueError, match=r"broken.json: not valid JSON: .*line 2 column .*; fix it there"):
        load_world(path)
    pytest.importorskip("tomllib")  # TOML world files need Python 3.11
    path = _file(tmp_path, "broken.toml", 'regions = {a = [0, 1]\nintra = {bandwidth = "1Gbit/s"}\n')
    with pytest.raises(ValueError, match=r"broken.toml: not a valid TOML world file: .*line"):
        load_world(path)
    path = _file(tmp_path, "twice.toml", '[regions]\na = [0, 1]\na = [2, 3]\n[intra]\nbandwidth = "1Gbit/s"\n')
    with pytest.raises(ValueError, match=r"twice.toml: not a valid TOML world file: .*line 3"):
        load_world(path)


def test_a_key_given_twice_in_a_json_world_file_is_refused_naming_it(tmp_path) -> None:
    path = _file(tmp_path, "twice.json", '{"regions": {"us": [0, 1], "us": [2, 3]}, ' + LINKS + "}")
    with pytest.raises(ValueError, match=r"twice.json: key 'us' is given twice in one object .*give it once"):
        load_world(path)


def test_regions_that_are_not_an_object_of_lists_are_refused_naming_the_form(tmp_path) -> None:
    path = _file(tmp_path, "w.json", '{"regions": [[0, 1], [2, 3]], ' + LINKS + "}")
    with pytest.raises(ValueError, match=r"w.json: a world needs 'regions', an object of region name -> list of ranks"):
        load_world(path)
    with pytest.raises(ValueError, match=r"w.json: region 'us' must list its nodes \(ranks\), got 0"):
        world_from_dict({"regions": {"us": 0, "eu": [1]}, **json.loads("{" + LINKS + "}")}, "w.json")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"distribution": "Distribution"}, r"torch.distributions.Distribution with args \[\] cannot draw node speeds"),
        ({"distribution": "LogNormal"}, r"LogNormal with args \[\] cannot draw node speeds \(TypeError"),
        ({"distribution": "Dirichlet", "args": [1.0]}, r"cannot draw node speeds"),
    ],
)
def test_a_slowdown_distribution_that_cannot_draw_node_speeds_is_refused(spec, match) -> None:
    world = {"regions": {"us": [0, 1]}, "intra": {"bandwidth": 1e9}, "compute_slowdown": spec}
    with pytest.raises(ValueError, match=rf"w.json: compute_slowdown: .*{match}.*\"distribution\": \"LogNormal\""):
        world_from_dict(world, "w.json")


def test_two_rows_for_one_link_or_node_at_one_time_are_refused_naming_both(tmp_path) -> None:
    trace = _file(tmp_path, "t.csv", "time,region_a,region_b,bandwidth\n0,us,eu,1e9\n5,eu,us,2e9\n5,us,eu,5e8\n")
    with pytest.raises(ValueError, match=r"trace .*t.csv row 3 .*: row 2 sets the same link at time 5; keep one"):
        Network.regions({"us": [0], "eu": [1]}, inter=Link(1e9), traces=trace)
    online = _file(tmp_path, "online.csv", "time,node,available\n1,2,0\n1,2,1\n")
    with pytest.raises(ValueError, match=r"availability trace .*online.csv row 2 .*: row 1 sets node 2 at time 1"):
        Availability(online)
    world = _file(tmp_path, "w.json", '{"regions": {"us": [0], "eu": [1]}, ' + LINKS + ', "traces": "t.csv"}')
    with pytest.raises(ValueError, match=r"w.json: trace .*t.csv row 3"):
        load_world(world)


# ---------------------------------------------------------------- availability that takes every node


def test_a_trace_that_takes_every_node_away_is_refused_naming_it_and_the_fix(tmp_path) -> None:
    rows = "".join(f"0.5,{n},0\n" for n in range(4))
    _file(tmp_path, "away.csv", "time,node,available\n0.1,3,0\n" + rows + "0.9,1,1\n")
    world = _file(
        tmp_path, "w.json", '{"regions": {"us": [0, 1], "eu": [2, 3]}, ' + LINKS + ', "availability": "away.csv",'
        ' "compute": 0.01}',
    )  # fmt: skip
    match = r"w.json: availability trace .*away.csv takes every node \(0..3\) away at simulated second 0.5"
    with pytest.raises(ValueError, match=match + r".*keep a node present then"):
        resolve_network(world, num_nodes=4)
    net = Network(1e9, 0, compute=0.01, availability=str(tmp_path / "away.csv"))  # nodes known only in a run
    with pytest.raises(ValueError, match=r"availability trace .*away.csv takes every node \(0..3\) away at"):
        net.for_run(4, seed=0)
    net.for_run(5, seed=0)  # node 4 has no rows: it stays


def test_compare_refuses_a_trace_that_takes_every_node_away_before_anything_starts(tmp_path, capsys) -> None:
    from exogym.__main__ import main

    _file(tmp_path, "away.csv", "time,node,available\n" + "".join(f"0.05,{n},0\n" for n in range(4)))
    world = _file(
        tmp_path, "w.json", '{"regions": {"us": [0, 1], "eu": [2, 3]}, ' + LINKS + ', "availability": "away.csv",'
        ' "compute": 0.01}',
    )  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--strategies", "fedavg,diloco", "--network", world, "--nodes", "4"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert "argument --network: " in err and "away.csv takes every node (0..3) away at simulated second 0.05" in err
