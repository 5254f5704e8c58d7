"""One deterministic compute model by default in ``fit`` and ``compare``; a world file's
``compute`` holds unless the caller gives one, and the caption says which won."""

from __future__ import annotations

import inspect
import json
import os

import pytest

from exogym.cli.compare import compare, compute_source
from exogym.core.comm.links import Link
from exogym.core.comm.network import Network, resolve_network

WORLD = {
    "regions": {"us": [0, 1], "eu": [2, 3]},
    "intra": {"bandwidth": "100Gbit/s", "latency": "1ms"},
    "inter": {"bandwidth": "100Mbit/s", "latency": "100ms"},
}


@pytest.fixture
def world_file(tmp_path):
    def write(**extra) -> str:
        path = tmp_path / "world.json"
        path.write_text(json.dumps({**WORLD, **extra}))
        return str(path)

    return write


def test_fit_and_compare_default_to_the_same_deterministic_compute_model() -> None:
    assert Network(1e9, 0.01).compute == "flops"
    assert Network.regions({"a": [0], "b": [1]}, Link(1e9), Link(1e8)).compute == "flops"
    assert resolve_network(None).compute == "flops"  # what fit(network=None) runs on
    assert inspect.signature(compare).parameters["compute"].default is None  # the network's own
    assert resolve_network("internet", inspect.signature(compare).parameters["compute"].default).compute == "flops"


def test_a_world_files_compute_holds_where_none_is_given(world_file) -> None:
    path = world_file(compute=0.02)
    assert resolve_network(path, None, num_nodes=4).compute == 0.02
    assert compute_source(path, None) == " (world.json)"


def test_a_given_compute_replaces_the_world_files_and_the_caption_says_so(world_file) -> None:
    path = world_file(compute=0.02)
    assert resolve_network(path, 0.1, num_nodes=4).compute == 0.1
    assert compute_source(path, 0.1) == " (given, over world.json's 0.02)"
    assert compute_source(path, 0.02) == " (world.json)"


def test_the_caption_adds_nothing_where_no_world_file_sets_compute(world_file) -> None:
    assert compute_source("internet", None) == ""
    assert compute_source(world_file(), 0.1) == ""


def test_the_command_leaves_compute_and_flops_per_second_to_the_network_unless_given() -> None:
    from exogym.__main__ import _parser

    _, parser = _parser()
    args = parser.parse_args([])
    assert args.compute is None and args.flops_per_second is None
    args = parser.parse_args(["--compute", "0.5", "--flops-per-second", "1e12"])
    assert args.compute == 0.5 and args.flops_per_second == 1e12


@pytest.mark.procs
@pytest.mark.timeout(180)
def test_compare_on_a_world_file_prices_compute_at_the_files_seconds_per_step(world_file, tmp_path) -> None:
    path = world_file(compute=0.25)
    result = compare(
        "digits", ["fedavg"], nodes=4, workers=2, steps=4, batch_size=8, H=2, network=path,
        out_dir=str(tmp_path / "out"), progress=False, val_size=64,
    )  # fmt: skip
    assert "compute 0.25 s/step (world.json)" in result.caption
    clocks = result.nodes["fedavg"]
    assert all(node["compute"] == pytest.approx(4 * 0.25) for node in clocks)
    assert os.path.isfile(tmp_path / "out" / "latest" / "summary.csv")
