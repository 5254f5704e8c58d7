"""HALoS against its event-driven reference written from the paper (``tests/references/halos.py``)
on a world of two regions of two nodes with speeds 1, 1, 2, 4: every node's steps, every worker
update's receipt time, sender and staleness, every LPS push's and merge's time and region, the
run's end and the final (GPS) parameters; plus the preset's errors, its summary and a resume
with pushes in flight at both levels."""

from __future__ import annotations

import pytest
import torch

from communicators.halos import HALoSCommunicator, halos_steps
from exogym.core.comm.links import Link
from exogym.core.comm.network import Network
from exogym.strategy import HALoSStrategy, OptimSpec
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, regression_data
from tests.references.halos import reference_halos

SLOWDOWN = (1.0, 1.0, 0.5, 0.25)  # speeds 1, 1, 2, 4
STEPS = 24
INTRA, INTER = Link(1e6, 0.05), Link(2e5, 0.4)


def _world(slowdown: tuple[float, ...] = SLOWDOWN) -> Network:
    regions = {"a": [0, 1], "b": [2, 3]}
    return Network.regions(regions, INTRA, INTER, compute=1.0, compute_slowdown=slowdown)


def _seconds(link: Link) -> float:
    """One transfer of TinyNet's parameters in float32 over ``link``."""
    nbytes = 4 * sum(p.numel() for p in TinyNet().parameters())
    return link.latency + 8 * nbytes / link.bandwidth


def _strategy(**kw):
    settings = dict(H=2, accumulation=2, merge_weight=0.5, lps_lr=0.8, lps_momentum=0.5, lps_period=1)
    settings.update(gps_lr=0.9, gps_momentum=0.3, gps_period=2, dylu=True)
    settings.update(kw)
    return lambda: HALoSStrategy(**settings, optim_spec=OptimSpec(torch.optim.SGD, lr=0.05))


def _reference(ds, **kw):
    settings = dict(H=2, accumulation=2, merge_weight=0.5, lps_lr=0.8, lps_momentum=0.5, lps_period=1)
    settings.update(gps_lr=0.9, gps_momentum=0.3, gps_period=2, dylu=True)
    settings.update(kw)
    # the LPS of the first region talks to the GPS over that region's link, the other's over the
    # link between the regions; a worker's transfer crosses its region's link
    return reference_halos(
        ds, 4, STEPS, slowdown=SLOWDOWN, step_seconds=1.0, region=[0, 0, 1, 1],
        worker_transfer=[_seconds(INTRA)] * 4, region_transfer=[_seconds(INTRA), _seconds(INTER)], **settings,
    )  # fmt: skip


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"dylu": False, "accumulation": 3},  # fast nodes push more often; pushes pile up at an LPS
        {"merge_weight": 1.0, "lps_momentum": 0.0, "gps_period": 1},
    ],
)
def test_halos_equals_its_event_driven_reference(settings: dict) -> None:
    ds = regression_data(4 * 8 * STEPS)
    out = train_ranks(4, _strategy(**settings), STEPS, dataset=ds, network=_world())
    ref = _reference(ds, **settings)
    comm = out[0]["strategy"].server
    tl = comm.timeline
    assert tl.steps == ref["steps"]
    assert [(r, s) for _, r, s in tl.updates] == [(r, s) for _, r, s in ref["updates"]]
    assert [t for t, _, _ in tl.updates] == pytest.approx([t for t, _, _ in ref["updates"]], abs=1e-9)
    pushes, merges = tl.records.get("region_updates", []), tl.records.get("merges", [])
    assert len(ref["region_updates"]) >= 2  # the servers do talk
    assert [(q, s) for _, q, s in pushes] == [(q, s) for _, q, s in ref["region_updates"]]
    assert [t for t, _, _ in pushes] == pytest.approx([t for t, _, _ in ref["region_updates"]], abs=1e-9)
    assert [(q, v) for _, q, v in merges] == [(q, v) for _, q, v in ref["merges"]]
    assert [t for t, _, _ in merges] == pytest.approx([t for t, _, _ in ref["merges"]], abs=1e-9)
    assert tl.end_time == pytest.approx(ref["end_time"], abs=1e-9)
    for node in out:  # every node ends with the GPS's parameters
        for a, b in zip(node["params"], ref["params"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    for q in range(2):  # and holds the same LPS replicas
        flat = torch.cat([p.reshape(-1) for p in ref["lps_params"][q]])
        torch.testing.assert_close(comm.lps[q], flat, rtol=1e-6, atol=1e-7)


def test_by_default_each_lps_of_unequal_regions_pushes_after_as_many_updates_as_its_region_has_workers() -> None:
    # regions {0} and {1, 2, 3}: the lone worker's LPS pushes after each of its updates, the
    # other's after three (not after three each, the largest region's count)
    ds = regression_data(4 * 8 * STEPS)
    world = Network.regions({"a": [0], "b": [1, 2, 3]}, INTRA, INTER, compute=1.0, compute_slowdown=SLOWDOWN)
    settings = dict(H=2, accumulation=None, merge_weight=0.5, lps_lr=0.8, lps_momentum=0.5, lps_period=1)
    settings.update(gps_lr=0.9, gps_momentum=0.3, gps_period=2, dylu=True)
    out = train_ranks(4, lambda: HALoSStrategy(**settings, optim_spec=OptimSpec(torch.optim.SGD, lr=0.05)), STEPS,
                      dataset=ds, network=world)  # fmt: skip
    settings["accumulation"] = [1, 3]
    ref = reference_halos(
        ds, 4, STEPS, slowdown=SLOWDOWN, step_seconds=1.0, region=[0, 1, 1, 1],
        worker_transfer=[_seconds(INTRA)] * 4, region_transfer=[_seconds(INTRA), _seconds(INTER)], **settings,
    )  # fmt: skip
    tl = out[0]["strategy"].server.timeline
    pushes = tl.records.get("region_updates", [])
    assert [(q, s) for _, q, s in pushes] == [(q, s) for _, q, s in ref["region_updates"]]
    region_a = sum(1 for _, r, _ in ref["updates"] if r == 0)
    assert sum(1 for _, q, _ in pushes if q == 0) == region_a  # one push per update of the lone worker
    for a, b in zip(out[0]["params"], ref["params"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_dylu_gives_each_node_steps_in_proportion_to_its_speed_rounded_up() -> None:
    assert halos_steps(4, [1.0, 1.0, 0.5, 0.25], True) == [1, 1, 2, 4]
    assert halos_steps(4, [1.0, 0.3], True) == [2, 4]  # 4 * 0.3 = 1.2 steps: 2
    assert halos_steps(4, [1.0, 0.3], False) == [4, 4]


def test_halos_summary_counts_the_servers_traffic() -> None:
    ds = regression_data(4 * 8 * STEPS)
    out = train_ranks(4, _strategy(), STEPS, dataset=ds, network=_world())
    summary = out[0]["strategy"].run_summary()
    ref = _reference(ds)
    nbytes = 4 * sum(p.numel() for p in TinyNet().parameters())
    assert summary["steps"] == ref["steps"]
    assert summary["region_updates"] == len(ref["region_updates"])
    assert summary["merges"] == len(ref["merges"])
    # every push to the GPS and every reply to an LPS carries the model
    assert summary["region_bytes"] == (len(ref["region_updates"]) + len(ref["merges"])) * nbytes
    assert len(summary["utilisation"]) == 4 and all(0 < u <= 1 for u in summary["utilisation"])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"H": 0}, "H must be an int >= 1"),
        ({"accumulation": 0}, "accumulation must be an int >= 1 or None"),
        ({"merge_weight": 1.5}, r"merge_weight must be a number in \[0, 1\]"),
        ({"lps_lr": -1.0}, "lps_lr must be a number > 0"),
        ({"gps_momentum": 1.0}, r"gps_momentum must be a number in \[0, 1\)"),
        ({"gps_period": "2"}, "gps_period must be an int >= 1 or None"),
        ({"dylu": "yes"}, "dylu must be True or False"),
    ],
)
def test_halos_refuses_bad_settings_naming_them(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HALoSCommunicator(**{"H": 2, **kwargs})
