"""Asymmetric access links and shared links between regions, against hand computations.

A hop from node ``i`` to node ``j`` runs at ``min(link / m, upload_i, download_j)``: ``i``'s
upload, ``j``'s download, and ``m`` the transfers of one ring step or tree round that cross the
same shared link in the same direction (full-duplex: each direction its own bandwidth).
"""

import json

import pytest
import torch

from exogym import Server, Train
from exogym.core.comm.links import Link
from exogym.core.comm.network import Network
from exogym.core.comm.world_file import world_from_dict
from exogym.core.events import ServerLoop
from exogym.runtime.server_run import server_context, transfer_seconds

BACKBONE = Link("100Gbit/s", 0.0)  # never the bottleneck, no latency: the access links decide
MB = 1_000_000


def home(upload_0: str = "10Mbit/s") -> Network:
    """One region; node 0 downloads at 100 Mbit/s and uploads at ``upload_0``, node 1 is
    symmetric at 100 Mbit/s; no latency anywhere."""
    access = [Link("100Mbit/s", upload=upload_0), Link("100Mbit/s")]
    return Network.regions({"internet": [0, 1]}, BACKBONE, access=access, compute=1.0)


def test_a_push_runs_at_the_clients_upload_and_a_pull_at_its_download() -> None:
    net = home()
    # 1 MB = 8e6 bits: up at 10 Mbit/s 0.8 s, down at 100 Mbit/s 0.08 s (the link to the
    # server's region, 100 Gbit/s, is faster than either)
    assert transfer_seconds(net, 0, MB, "up") == pytest.approx(0.8, rel=1e-12)
    assert transfer_seconds(net, 0, MB, "down") == pytest.approx(0.08, rel=1e-12)
    # a symmetric client: both ways the same, as on a link without direction
    assert transfer_seconds(net, 1, MB, "up") == transfer_seconds(net, 1, MB, "down")
    flat = Network(1e8, 0.01)
    assert transfer_seconds(flat, 0, MB, "up") == transfer_seconds(flat, 0, MB, "down") == pytest.approx(0.09)
    with pytest.raises(ValueError, match="direction must be 'up'"):
        transfer_seconds(net, 0, MB, "sideways")


class _OneTask(Server):
    """Sends client 0 one task of one step, transfers both ways; keeps its result's arrival."""

    def start(self) -> None:
        self.send(0, Train(1))

    def on_result(self, result) -> None:
        self.arrived = result.time


def _execute(tasks) -> None:
    for task in tasks:
        task.local, task.losses = task.start.clone(), [0.0] * len(task.ticks)


def test_a_server_sends_the_model_at_the_download_and_receives_the_result_at_the_upload() -> None:
    params = torch.zeros(250_000)  # float32: 1 MB
    ctx = server_context(home(), 2, 0, params, steps_per_epoch=1)
    server = _OneTask()
    loop = ServerLoop(server, ctx, max_ticks=1, execute=_execute)
    loop.run()
    # down 0.08 s, one step of 1 s, up 0.8 s
    assert server.arrived == pytest.approx(0.08 + 1.0 + 0.8, abs=1e-6)
    assert loop.clients[0].comm == pytest.approx(0.08 + 0.8, abs=1e-6)


def test_a_ring_step_waits_for_its_slowest_directed_hop() -> None:
    # Ring 0 -> 1 -> 0. Hop 0 -> 1: node 0's upload, 10 Mbit/s; hop 1 -> 0: node 1's upload and
    # node 0's download, 100 Mbit/s. An all-reduce of 2 MB: 2 steps of a 1 MB chunk (8e6 bits)
    # at the slower hop, 0.8 s each.
    net = home()
    assert net.collective_seconds("all_reduce", 2 * MB, (0, 1)) == pytest.approx(1.6, rel=1e-12)
    # Node 0 uploading at 1 Gbit/s (above its download): hop 1 -> 0 is the slowest, at node 0's
    # download of 100 Mbit/s: 2 * 0.08 s.
    assert home("1Gbit/s").collective_seconds("all_reduce", 2 * MB, (0, 1)) == pytest.approx(0.16, rel=1e-12)


def test_a_broadcast_round_uses_the_senders_upload() -> None:
    # Three nodes, node 0 uploads at 10 Mbit/s, the others symmetric at 100 Mbit/s; ring 0, 1, 2.
    access = [Link("100Mbit/s", upload="10Mbit/s"), Link("100Mbit/s"), Link("100Mbit/s")]
    net = Network.regions({"internet": [0, 1, 2]}, BACKBONE, access=access)
    # round 0: 0 -> 1 at 10 Mbit/s (0.8 s for 1 MB); round 1: 0 -> 2 at 10 Mbit/s (0.8 s)
    assert net.collective_seconds("broadcast", MB, (0, 1, 2)) == pytest.approx(1.6, rel=1e-12)
    # among nodes 1 and 2, node 0 sends nothing: 1 -> 2 at 100 Mbit/s, 0.08 s
    assert net.collective_seconds("broadcast", MB, (1, 2)) == pytest.approx(0.08, rel=1e-12)


def test_symmetric_links_price_as_links_without_direction() -> None:
    sym = Network.regions({"internet": [0, 1, 2]}, BACKBONE, access=Link("100Mbit/s", "20ms"))
    explicit = Network.regions({"internet": [0, 1, 2]}, BACKBONE, access=Link("100Mbit/s", "20ms", upload="100Mbit/s"))
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier"):
        a = sym.collective_seconds(kind, 3 * MB, (0, 1, 2))
        assert a == explicit.collective_seconds(kind, 3 * MB, (0, 1, 2))
    # 2 * 2 steps of a 1 MB chunk at 100 Mbit/s, 40 ms a hop
    assert sym.collective_seconds("all_reduce", 3 * MB, (0, 1, 2)) == pytest.approx(4 * (0.04 + 0.08), rel=1e-12)


def test_the_slowest_hop_of_a_world_is_the_slower_direction_of_its_access_links() -> None:
    net = home()
    assert net.bandwidth == 10e6
    # a charge without participants prices every hop at it: 2 steps of 1 MB at 10 Mbit/s
    assert net.collective_seconds("all_reduce", 2 * MB, group_size=2) == pytest.approx(1.6, rel=1e-12)


def shared_regions(shared: bool = True) -> Network:
    return Network.regions(
        {"us": [0, 1], "eu": [2, 3]},
        intra=Link("100Gbit/s", "10us"),
        inter=Link("1Gbit/s", "80ms", shared=shared),
    )


def test_two_transfers_sharing_a_link_each_take_twice_as_long_as_one_alone() -> None:
    # Broadcast of 1 MB over the ring 0, 1, 2, 3: round 0 is 0 -> 1 inside us
    # (1e-5 + 8e6 / 1e11 = 9e-5 s); round 1 is 0 -> 2 and 1 -> 3, both from us to eu.
    alone = shared_regions(False).collective_seconds("broadcast", MB, (0, 1, 2, 3))
    shared = shared_regions(True).collective_seconds("broadcast", MB, (0, 1, 2, 3))
    assert alone == pytest.approx(9e-5 + 0.08 + 8e6 / 1e9, rel=1e-12)
    assert shared == pytest.approx(9e-5 + 0.08 + 2 * 8e6 / 1e9, rel=1e-12)  # each at 500 Mbit/s
    # one crossing alone on the shared link takes what it takes on its own link: 0 -> 2
    assert shared_regions(True).collective_seconds("broadcast", MB, (0, 2)) == pytest.approx(0.088, rel=1e-12)


def test_a_ring_over_two_regions_crosses_a_shared_link_once_each_way_and_is_not_slowed() -> None:
    # Ring 0 -> 1 -> 2 -> 3 -> 0 crosses us -> eu (1 -> 2) and eu -> us (3 -> 0): opposite
    # directions of a full-duplex link, each with the whole 1 Gbit/s. 6 steps of a 250 kB chunk
    # at 0.08 + 2e6 / 1e9 = 0.082 s: 0.492 s, as unshared.
    for kind, seconds in (("all_reduce", 0.492), ("all_gather", 0.264), ("reduce_scatter", 0.246)):
        assert shared_regions(True).collective_seconds(kind, MB, (0, 1, 2, 3)) == pytest.approx(seconds, rel=1e-12)


def test_a_shared_link_divides_only_among_the_transfers_that_cross_it() -> None:
    # Three regions, a -> b shared; a broadcast of 1 MB over ring a0, a1, b0, c0: round 1 is
    # a0 -> b0 and a1 -> c0: one transfer on each link, none divided (0.088 s).
    links = {("a", "b"): Link("1Gbit/s", "80ms", shared=True), ("a", "c"): Link("1Gbit/s", "80ms")}
    net = Network.regions(
        {"a": [0, 1], "b": [2], "c": [3]}, Link("100Gbit/s", "10us"), Link("1Gbit/s", "80ms"), links=links
    )
    assert net.world is not None and net.world.ring([0, 1, 2, 3]) == [0, 1, 2, 3]
    assert net.collective_seconds("broadcast", MB, (0, 1, 2, 3)) == pytest.approx(9e-5 + 0.088, rel=1e-12)


def test_bandwidth_traces_keep_the_upload_ratio_and_the_shared_flag() -> None:
    traced = Network.regions(
        {"us": [0, 1], "eu": [2, 3]},
        intra=Link("100Gbit/s", "10us"),
        inter=Link("1Gbit/s", "80ms", shared=True),
        access=Link("1Gbit/s", upload="100Mbit/s"),
        traces=[
            {"time": 5, "node": 0, "bandwidth": "500Mbit/s"},
            {"time": 5, "region_a": "us", "region_b": "eu", "bandwidth": "2Gbit/s"},
        ],
    )
    assert traced.world is not None
    later = traced.world.at(6.0)
    assert later.access[0] == Link("500Mbit/s", upload="50Mbit/s")
    assert later.links[0][1] == Link("2Gbit/s", "80ms", shared=True)


def test_bad_uploads_and_misplaced_properties_are_refused_naming_the_argument_and_the_fix() -> None:
    for bad in (0, -1, "-5Mbit/s", "0Mbit/s"):
        with pytest.raises(ValueError, match=r"Link upload must be in \[1, 1e\+15\] bits/s"):
            Link("100Mbit/s", upload=bad)
    with pytest.raises(ValueError, match="Link upload: unknown unit"):
        Link("100Mbit/s", upload="10 parsecs")
    with pytest.raises(TypeError, match="Link shared must be True or False"):
        Link("1Gbit/s", shared="yes")  # type: ignore[arg-type]
    regions = {"us": [0, 1], "eu": [2, 3]}
    with pytest.raises(ValueError, match="inter: .*upload= is for a node's access link.*leave upload out of inter"):
        Network.regions(regions, Link(1e9), Link(1e9, upload=1e8))
    with pytest.raises(ValueError, match="intra: shared=True divides a link between two regions"):
        Network.regions(regions, Link(1e9, shared=True), Link(1e9))
    with pytest.raises(ValueError, match=r"access\[1\]: shared=True .* leave it out of access\[1\]"):
        Network.regions(regions, Link(1e9), Link(1e9), access=[Link(1e8), Link(1e8, shared=True), Link(1e8), Link(1e8)])


def test_world_files_take_upload_and_shared_and_refuse_unknown_link_keys() -> None:
    spec = {
        "regions": {"us": [0, 1], "eu": [2, 3]},
        "intra": {"bandwidth": "100Gbit/s", "latency": "10us"},
        "inter": {"bandwidth": "1Gbit/s", "latency": "80ms", "shared": True},
        "access": {"bandwidth": "500Mbit/s", "upload": "110Mbit/s", "latency": "20ms"},
    }
    net = world_from_dict(json.loads(json.dumps(spec)), "w.json")
    assert net.world.access[0] == Link("500Mbit/s", "20ms", upload="110Mbit/s")
    assert net.world.links[0][1].shared and not net.world.links[0][0].shared
    bad = dict(spec, access={"bandwidth": "500Mbit/s", "uplaod": "110Mbit/s"})
    with pytest.raises(ValueError, match=r"w.json: access: unknown key\(s\) \['uplaod'\]; a link has"):
        world_from_dict(bad, "w.json")
    bad = dict(spec, access={"bandwidth": "500Mbit/s", "upload": 0})
    with pytest.raises(ValueError, match=r"w.json: access: Link upload must be in \[1, 1e\+15\] bits/s"):
        world_from_dict(bad, "w.json")
    bad = dict(spec, intra={"bandwidth": "1Gbit/s", "shared": True})
    with pytest.raises(ValueError, match="w.json: intra: shared=True"):
        world_from_dict(bad, "w.json")
    bad = dict(spec, links=[{"between": ["us", "eu"], "bandwidth": "1Gbit/s", "upload": "1Mbit/s"}])
    with pytest.raises(ValueError, match="w.json: links.*upload= is for a node's access link"):
        world_from_dict(bad, "w.json")
