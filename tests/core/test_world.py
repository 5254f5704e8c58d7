"""Worlds (regions, access links, node speeds) and collectives priced on their links, against
hand computations."""

import dataclasses
import pickle

import pytest
import torch
from torch.distributions import LogNormal

from exogym.core.comm.ledger import Ledger
from exogym.core.comm.links import Link
from exogym.core.comm.network import PRESETS, Network, resolve_network

INTRA = Link("100Gbit/s", "10us")  # 1e11 bit/s, 1e-5 s
INTER = Link("1Gbit/s", "80ms")  # 1e9 bit/s, 0.08 s
MB = 1_000_000


def two_regions() -> Network:
    return Network.regions({"us": [0, 1], "eu": [2, 3]}, intra=INTRA, inter=INTER)


def test_ring_all_reduce_of_1mb_over_two_regions_of_two_is_bounded_by_the_inter_region_link() -> None:
    # Ring 0 -> 1 -> 2 -> 3 -> 0 crosses between regions twice (1 -> 2, 3 -> 0). Each of the
    # 2(n-1) = 6 steps moves a chunk of 1 MB / 4 = 250,000 bytes = 2e6 bits over every hop:
    # inside a region 1e-5 + 2e6 / 1e11 = 3e-5 s, between regions 0.08 + 2e6 / 1e9 = 0.082 s.
    # The slowest hop sets the pace: 6 * 0.082 = 0.492 s.
    net = two_regions()
    assert net.collective_seconds("all_reduce", MB, (0, 1, 2, 3)) == pytest.approx(0.492, rel=1e-12)
    # all-gather of 1 MB each: 3 steps of a 1 MB block, 0.08 + 8e6 / 1e9 = 0.088 s -> 0.264 s
    assert net.collective_seconds("all_gather", MB, (0, 1, 2, 3)) == pytest.approx(0.264, rel=1e-12)
    # reduce-scatter: 3 steps of 0.082 s
    assert net.collective_seconds("reduce_scatter", MB, (0, 1, 2, 3)) == pytest.approx(0.246, rel=1e-12)
    # binomial broadcast over the ring order: round 0 is 0 -> 1 (1e-5 + 8e6 / 1e11 = 9e-5 s),
    # round 1 is 0 -> 2 and 1 -> 3, between regions (0.088 s)
    assert net.collective_seconds("broadcast", MB, (0, 1, 2, 3)) == pytest.approx(9e-5 + 0.088, rel=1e-12)
    # barrier: the broadcast's rounds without bytes, 1e-5 + 0.08
    assert net.collective_seconds("barrier", 0, (0, 1, 2, 3)) == pytest.approx(0.08001, rel=1e-12)


def test_an_island_inside_one_region_pays_the_intra_region_price() -> None:
    # n = 2, one step each way of 500,000 bytes = 4e6 bits: 2 * (1e-5 + 4e6 / 1e11) = 1e-4 s
    net = two_regions()
    assert net.collective_seconds("all_reduce", MB, (2, 3)) == pytest.approx(1e-4, rel=1e-12)
    # an island across the regions pays the inter-region link: 2 * (0.08 + 4e6 / 1e9) = 0.168 s
    assert net.collective_seconds("all_reduce", MB, (1, 2)) == pytest.approx(0.168, rel=1e-12)


def test_the_ring_groups_regions_so_interleaved_ranks_cross_as_few_times_as_possible() -> None:
    net = Network.regions({"us": [0, 2], "eu": [1, 3]}, intra=INTRA, inter=INTER)
    assert net.world is not None and net.world.ring([0, 1, 2, 3]) == [0, 2, 1, 3]
    # broadcast tree over [0, 2, 1, 3]: round 0 is 0 -> 2 inside us (9e-5 s), round 1 crosses
    # (0.088 s); in rank order both rounds would cross (0.176 s)
    assert net.collective_seconds("broadcast", MB, (0, 1, 2, 3)) == pytest.approx(9e-5 + 0.088, rel=1e-12)


def test_region_matrix_orders_regions_to_avoid_the_slow_links() -> None:
    # Four regions of one node; a-b and c-d are slow (100 Mbit/s, 50 ms), the rest fast
    # (1 Gbit/s, 10 ms). The ring a, c, b, d uses fast links only: 2 * 3 steps of a 1e6-byte
    # chunk (4 MB / 4) at 0.01 + 8e6 / 1e9 = 0.018 s -> 0.108 s.
    slow = Link("100Mbit/s", "50ms")
    net = Network.regions(
        {"a": [0], "b": [1], "c": [2], "d": [3]},
        inter=Link("1Gbit/s", "10ms"),
        links={("a", "b"): slow, ("d", "c"): slow},
    )
    assert net.world is not None and net.world.ring([3, 2, 1, 0]) == [0, 2, 1, 3]
    assert net.collective_seconds("all_reduce", 4 * MB, (0, 1, 2, 3)) == pytest.approx(0.108, rel=1e-12)
    # three regions a, b, c: every cyclic order uses a-b, so it bounds the ring:
    # 2 * 2 steps of 1e6 bytes at 0.05 + 8e6 / 1e8 = 0.13 s -> 0.52 s
    assert net.collective_seconds("all_reduce", 3 * MB, (0, 1, 2)) == pytest.approx(0.52, rel=1e-12)


def test_a_missing_link_between_regions_is_named() -> None:
    with pytest.raises(ValueError, match="no link between regions 'us' and 'eu': give inter"):
        Network.regions({"us": [0], "eu": [1]}, intra=INTRA)
    with pytest.raises(ValueError, match="node 1 is in regions 'us' and 'eu'"):
        Network.regions({"us": [0, 1], "eu": [1]}, intra=INTRA, inter=INTER)
    with pytest.raises(ValueError, match=r"without gaps; missing \[1\]"):
        Network.regions({"us": [0], "eu": [2]}, intra=INTRA, inter=INTER)
    with pytest.raises(ValueError, match="links names region 'asia'"):
        Network.regions({"us": [0]}, intra=INTRA, links={("us", "asia"): INTER})


def test_access_links_cap_every_hop_into_and_out_of_a_node() -> None:
    # Backbone 100 Gbit/s, no latency; node 0 on 10 Mbit/s, 20 ms, nodes 1 and 2 on 100 Mbit/s,
    # 30 ms. All-reduce of 3 MB: chunks of 1e6 bytes = 8e6 bits; the hops 0 -> 1 and 2 -> 0
    # take 0.02 + 0.03 + 8e6 / 1e7 = 0.85 s (1 -> 2: 0.06 + 0.08 = 0.14 s); 2 * 2 * 0.85 = 3.4 s.
    slow, home = Link("10Mbit/s", "20ms"), Link("100Mbit/s", "30ms")
    net = Network.regions({"net": [0, 1, 2]}, intra=Link("100Gbit/s", 0), access=[slow, home, home])
    assert net.collective_seconds("all_reduce", 3 * MB, (0, 1, 2)) == pytest.approx(3.4, rel=1e-12)
    # without node 0: 2 * (0.06 + 1.5e6 * 8 / 1e8) = 0.36 s
    assert net.collective_seconds("all_reduce", 3 * MB, (1, 2)) == pytest.approx(0.36, rel=1e-12)


def test_one_region_without_access_links_gives_the_homogeneous_figures() -> None:
    flat = Network(1e9, 1e-3)
    world = Network.regions({"all": range(5)}, intra=Link(1e9, 1e-3))
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"):
        for n in (2, 3, 5):
            got = world.collective_seconds(kind, MB, tuple(range(n)))
            assert got == pytest.approx(flat.collective_time(kind, n, MB), rel=1e-12), (kind, n)


def test_charges_without_participants_are_priced_on_the_slowest_hop() -> None:
    # group of 2, participants unknown: 2 * (0.08 + 4e6 / 1e9) = 0.168 s
    assert two_regions().collective_seconds("all_reduce", MB, group_size=2) == pytest.approx(0.168, rel=1e-12)


def test_ledger_records_carry_their_members_and_are_priced_by_them() -> None:
    net, ledger = two_regions(), Ledger()
    island = (2, 3)
    ledger.record("all_reduce", 2, MB, members=island)
    ledger.record("all_reduce", 4, MB, members=(0, 1, 2, 3))
    recs = ledger.end_step()
    assert recs[0].members is island
    assert net.records_time(recs) == pytest.approx(1e-4 + 0.492, rel=1e-12)
    with pytest.raises(ValueError, match="members names 3 ranks for a group of 2"):
        ledger.record("all_reduce", 2, MB, members=(0, 1, 2))


def test_node_speeds_from_a_distribution_are_drawn_once_per_node_from_the_seed() -> None:
    net = Network.regions({"a": [0, 1], "b": [2]}, INTRA, INTER, compute_slowdown=LogNormal(0.0, 0.5))
    with pytest.raises(RuntimeError, match="draw it with for_run"):
        net.slowdown(0)
    a, b, c = net.for_run(3, seed=1), net.for_run(3, seed=1), net.for_run(3, seed=2)
    assert a.compute_slowdown == b.compute_slowdown != c.compute_slowdown
    assert len(a.compute_slowdown) == 3 and all(f > 0 for f in a.compute_slowdown)
    assert [a.slowdown(r) for r in range(3)] == list(a.compute_slowdown)
    state = torch.random.get_rng_state()
    net.for_run(3, seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is untouched
    with pytest.raises(ValueError, match="describes 3 nodes but the run has 4"):
        net.for_run(4, seed=1)


def test_compute_slowdown_list_is_the_same_concept_as_before() -> None:
    net = Network(1e9, 1e-3, compute_slowdown=[1, 2.5])
    assert net.compute_slowdown == (1.0, 2.5) and net.slowdown(3) == 2.5
    assert net.for_run(4, seed=0) is net


def test_two_datacenters_preset() -> None:
    net = Network.preset("two-datacenters", num_nodes=4)
    assert net.world is not None and net.world.region_of == (0, 0, 1, 1)
    assert net.collective_seconds("all_reduce", MB, (0, 1, 2, 3)) == pytest.approx(0.492, rel=1e-12)
    assert resolve_network("two-datacenters", num_nodes=4, seed=3) == net
    with pytest.raises(ValueError, match="give num_nodes"):
        Network.preset("two-datacenters")
    assert Network.preset("internet", num_nodes=4) is PRESETS["internet"]


def test_volunteers_preset_is_drawn_from_the_seed() -> None:
    net = Network.preset("volunteers", num_nodes=6, seed=0)
    w = net.world
    assert w is not None and len(w.access) == 6
    assert all(a.bandwidth == 100e6 and 0.02 <= a.latency <= 0.06 for a in w.access)
    assert Network.preset("volunteers", num_nodes=6, seed=0).world == w
    assert Network.preset("volunteers", num_nodes=6, seed=1).world != w
    ran = resolve_network("volunteers", num_nodes=6, seed=5)
    assert isinstance(ran.compute_slowdown, tuple) and len(ran.compute_slowdown) == 6


def test_worlds_pickle_and_price_alike_after() -> None:
    net = two_regions()
    net.collective_seconds("all_reduce", MB, (0, 1, 2, 3))  # fills the cache
    back = pickle.loads(pickle.dumps(net))
    assert back == net
    assert back.collective_seconds("all_reduce", MB, (0, 1, 2, 3)) == pytest.approx(0.492, rel=1e-12)


def test_ddp_step_on_two_regions_costs_the_hand_computed_ring_time() -> None:
    from exogym.strategy import SimpleReduceStrategy
    from tests.fake_world import train_ranks
    from tests.helpers import TinyNet

    # TinyNet: fc1 8x16 + 16, fc2 16 + 1 = 161 float32 parameters, 644 bytes. A DDP step is a
    # ring all-reduce of 644 bytes over 4 nodes in two regions: 6 steps of a 161-byte chunk, the
    # inter-region hop the slowest: 0.08 + 1288 / 1e9 s -> 6 * 0.080001288 = 0.480007728 s.
    assert sum(p.numel() * 4 for p in TinyNet().parameters()) == 644
    per_step = 6 * (0.08 + 161 * 8 / 1e9)
    assert per_step == pytest.approx(0.480007728, rel=1e-12)
    # backward_share=0: no backward pass to overlap, the step waits for the whole ring
    net = Network.regions({"us": [0, 1], "eu": [2, 3]}, INTRA, INTER, compute=0.25)
    net = dataclasses.replace(net, backward_share=0.0)
    steps = 3
    out = train_ranks(4, lambda: SimpleReduceStrategy(), steps, network=net)
    rows = [r for r in out[0]["node"].history if "sim_comm_time" in r]
    assert [r["sim_comm_time"] for r in rows] == pytest.approx([per_step * r["step"] for r in rows], rel=1e-12)
    assert all(rec.members == (0, 1, 2, 3) for o in out for step in o["records"] for rec in step)


def test_islands_inside_regions_are_charged_and_priced_at_intra_region_prices() -> None:
    from tests.fake_world import run_ranks

    net, islands = two_regions(), [[0, 1], [2, 3]]

    def body(rank: int, comm) -> list:
        for _ in range(2):
            comm.all_reduce(torch.ones(MB // 4), op="mean", groups=islands)  # 1 MB of float32
        return comm.ledger.end_step()

    out = run_ranks(4, body)
    assert [[rec.members for rec in recs] for recs in out] == [[(0, 1)] * 2] * 2 + [[(2, 3)] * 2] * 2
    assert all(recs[0].members is recs[1].members for recs in out)  # one tuple per island, not per call
    # two all-reduces of 2 * (1e-5 + 4e6 / 1e11) = 1e-4 s, as in the hand computation above
    assert [net.records_time(recs) for recs in out] == pytest.approx([2e-4] * 4, rel=1e-12)


NETWORKS_PAGE = ("docs", "user-guide", "networks.md")


def test_the_docs_world_block_runs_as_written() -> None:
    import os
    import re

    with open(os.path.join(os.path.dirname(__file__), "..", "..", *NETWORKS_PAGE)) as f:
        section = f.read().split("## Worlds", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    namespace: dict = {}
    exec(compile(code, "networks.md", "exec"), namespace)  # noqa: S102 - the docs' own code
    world, three = namespace["world"].for_run(8, seed=0), namespace["three"]
    assert world.world.num_nodes == 8 and len(world.compute_slowdown) == 8
    # us -> eu -> asia -> us: the eu-asia crossing (500 Mbit/s, 200 ms) bounds a 6 MB all-reduce:
    # 10 steps of 1e6 bytes at 0.2 + 8e6 / 5e8 = 0.216 s -> 2.16 s
    assert three.collective_seconds("all_reduce", 6 * MB, tuple(range(6))) == pytest.approx(2.16, rel=1e-12)


def _example(name: str) -> str:
    import os

    return os.path.join(os.path.dirname(__file__), "..", "..", "exogym", "examples", "worlds", name)


def test_the_shipped_world_files_equal_the_named_worlds() -> None:
    from exogym.core.comm.world_file import load_world

    pytest.importorskip("tomllib")  # TOML world files need Python 3.11
    two = load_world(_example("two-datacenters.json"))
    assert two.world == Network.preset("two-datacenters", num_nodes=8).world
    assert two.collective_seconds("all_reduce", MB, tuple(range(8))) == pytest.approx(
        14 * (0.08 + 8e6 / 8 / 1e9), rel=1e-12
    )  # 2(8-1) steps of a 1e6/8-byte chunk over the 1 Gbit/s, 80 ms crossing
    vol = load_world(_example("volunteers.toml"))
    assert vol.world is not None and [round(a.latency, 3) for a in vol.world.access][:3] == [0.023, 0.041, 0.058]
    assert isinstance(vol.compute_slowdown, LogNormal)
    assert resolve_network(_example("volunteers.toml"), num_nodes=8, seed=0).compute_slowdown == (
        vol.for_run(8, seed=0).compute_slowdown
    )


def test_world_files_name_what_is_wrong(tmp_path) -> None:
    from exogym.core.comm.world_file import load_world

    bad = tmp_path / "w.json"
    bad.write_text('{"regions": {"a": [0, 1]}, "intra": {"bandwidth": "1Gbit"}}')
    with pytest.raises(ValueError, match=r"w.json: intra: Link bandwidth: unknown unit 'Gbit'"):
        load_world(bad)
    bad.write_text('{"regions": {"a": [0, 1]}, "intra": {"bandwidth": 1e9}, "speed": [1]}')
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['speed'\]"):
        load_world(bad)
    bad.write_text('{"regions": {"a": [0], "b": [1]}}')
    with pytest.raises(ValueError, match="no link between regions 'a' and 'b'"):
        load_world(bad)
    with pytest.raises(ValueError, match="describes 8 nodes but the run has 4"):
        resolve_network(_example("two-datacenters.json"), num_nodes=4)


def test_the_docs_world_file_example_loads() -> None:
    import json
    import os
    import re

    from exogym.core.comm.world_file import world_from_dict

    with open(os.path.join(os.path.dirname(__file__), "..", "..", *NETWORKS_PAGE)) as f:
        section = f.read().split("**World files.**", 1)[1]
    net = world_from_dict(json.loads(re.search(r"```json\n(.*?)```", section, re.DOTALL).group(1)), "networks.md")
    assert net.name == "three-regions" and net.compute == 0.05 and isinstance(net.compute_slowdown, LogNormal)
    # 1 MB all-reduce over us (0, 1) only: 2 * (10 us + 2 ms of access latency + 4e6 bits / 1e9) = 0.01202 s
    assert net.collective_seconds("all_reduce", MB, (0, 1)) == pytest.approx(2 * (1e-5 + 2e-3 + 4e-3), rel=1e-12)


def test_the_command_lines_network_names_are_the_presets_and_worlds() -> None:
    from exogym.core.comm.names import PRESET_NAMES, WORLD_NAMES
    from exogym.core.comm.network import PRESETS
    from exogym.core.comm.world_presets import WORLD_PRESETS

    assert set(PRESET_NAMES) == set(PRESETS) and set(WORLD_NAMES) == set(WORLD_PRESETS)
