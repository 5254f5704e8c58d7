"""HALoS's dynamic local updates, its summary of the servers' traffic against its event-driven
reference (``tests/references/halos.py``), and its errors (the values and the timeline against
the reference: ``tests/server/test_halos_server.py``)."""

from __future__ import annotations

import pytest
import torch

from communicators.halos import HALoSServer, halos_steps
from exogym.core.comm.links import Link
from exogym.core.comm.network import Network
from exogym.strategy import HALoSStrategy, OptimSpec
from tests.fake_world import train_server
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


def test_dylu_gives_each_node_steps_in_proportion_to_its_speed_rounded_up() -> None:
    assert halos_steps(4, [1.0, 1.0, 0.5, 0.25], True) == [1, 1, 2, 4]
    assert halos_steps(4, [1.0, 0.3], True) == [2, 4]  # 4 * 0.3 = 1.2 steps: 2
    assert halos_steps(4, [1.0, 0.3], False) == [4, 4]


def test_halos_summary_counts_the_servers_traffic() -> None:
    ds = regression_data(4 * 8 * STEPS)
    out = train_server(4, _strategy(), STEPS, dataset=ds, network=_world())
    summary = out[0]["summary"]
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
        HALoSServer(**{"H": 2, **kwargs})
