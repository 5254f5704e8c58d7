"""HALoS written as servers and tasks equals its event-driven reference written from the paper
(``tests/references/halos.py``) on two regions of two clients with speeds 1, 1, 2, 4, and on
regions of one and three clients, on 1 and 2 workers."""

from __future__ import annotations

import pytest
import torch

from communicators.halos import HALoSServer
from exogym.core.comm.links import Link
from exogym.core.comm.network import Network
from exogym.core.server import ServerStrategy
from exogym.strategy import OptimSpec
from tests.fake_world import train_server
from tests.helpers import TinyNet, regression_data
from tests.references.halos import reference_halos

SLOWDOWN = (1.0, 1.0, 0.5, 0.25)
STEPS = 24
INTRA, INTER = Link(1e6, 0.05), Link(2e5, 0.4)
SETTINGS = dict(H=2, accumulation=2, merge_weight=0.5, lps_lr=0.8, lps_momentum=0.5, lps_period=1)
SETTINGS.update(gps_lr=0.9, gps_momentum=0.3, gps_period=2, dylu=True)


def _seconds(link: Link) -> float:
    nbytes = 4 * sum(p.numel() for p in TinyNet().parameters())
    return link.latency + 8 * nbytes / link.bandwidth


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    ("regions", "settings"),
    [
        ({"a": [0, 1], "b": [2, 3]}, {}),
        ({"a": [0, 1], "b": [2, 3]}, {"dylu": False, "accumulation": 3}),
        ({"a": [0, 1], "b": [2, 3]}, {"merge_weight": 1.0, "lps_momentum": 0.0, "gps_period": 1}),
        ({"a": [0], "b": [1, 2, 3]}, {"accumulation": None}),  # each LPS pushes after its region's count
    ],
)
def test_halos_server_equals_its_event_driven_reference(regions, settings, workers) -> None:
    ds = regression_data(4 * 8 * STEPS)
    world = Network.regions(regions, INTRA, INTER, compute=1.0, compute_slowdown=SLOWDOWN)
    kw = {**SETTINGS, **settings}
    sgd = OptimSpec(torch.optim.SGD, lr=0.05)
    out = train_server(
        4, lambda: ServerStrategy(HALoSServer(**kw), optim_spec=sgd), STEPS, dataset=ds, network=world, workers=workers
    )
    region = [0 if r in regions["a"] else 1 for r in range(4)]
    if kw["accumulation"] is None:
        kw["accumulation"] = [region.count(0), region.count(1)]
    ref = reference_halos(
        ds, 4, STEPS, slowdown=SLOWDOWN, step_seconds=1.0, region=region,
        worker_transfer=[_seconds(INTRA)] * 4, region_transfer=[_seconds(INTRA), _seconds(INTER)], **kw,
    )  # fmt: skip
    server = out[0]["server"]
    assert out[0]["summary"]["steps"] == ref["steps"]
    assert [(r, s) for _, r, s in server.updates] == [(r, s) for _, r, s in ref["updates"]]
    assert [t for t, _, _ in server.updates] == pytest.approx([t for t, _, _ in ref["updates"]], abs=1e-9)
    pushes, merges = server.records.get("region_updates", []), server.records.get("merges", [])
    assert len(ref["region_updates"]) >= 2  # the servers do talk
    assert [(q, s) for _, q, s in pushes] == [(q, s) for _, q, s in ref["region_updates"]]
    assert [t for t, _, _ in pushes] == pytest.approx([t for t, _, _ in ref["region_updates"]], abs=1e-9)
    assert [(q, v) for _, q, v in merges] == [(q, v) for _, q, v in ref["merges"]]
    assert out[0]["summary"]["end_time"] == pytest.approx(ref["end_time"], abs=1e-9)
    for rank in out:
        for a, b in zip(rank["params"], ref["params"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
