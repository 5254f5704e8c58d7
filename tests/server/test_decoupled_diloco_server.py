"""Decoupled DiLoCo written as a synchronizer and learners equals its event-driven reference
written from the paper (``tests/references/decoupled_diloco.py``) on 4 learners with speeds
1, 1, 2, 4: quorum and grace windows, fragments on a slow link, learners absent from an
availability trace, and the staleness-aware outer optimizer, on 1 and 2 workers."""

from __future__ import annotations

import math

import pytest
import torch

from communicators.decoupled_diloco import DecoupledDiLoCoServer
from exogym.core.comm.network import Network
from exogym.core.server import ServerStrategy
from exogym.strategy import OptimSpec
from tests.communicators.test_decoupled_diloco import _trace
from tests.fake_world import train_server
from tests.helpers import regression_data
from tests.references.decoupled_diloco import reference_decoupled_diloco

SLOWDOWN = (1.0, 1.0, 0.5, 0.25)
STEPS = 24
SGD = OptimSpec(torch.optim.SGD, lr=0.05)


CASES = [
    ({"H": 4, "quorum": 1, "grace": 0.5, "tau": 8}, {}),
    ({"H": 4, "quorum": 2, "grace": 0.5, "tau": 4}, {}),
    ({"H": 4, "quorum": 4, "grace": 0.0, "outer_momentum": 0.5}, {}),
    ({"H": 4, "fragments": 2, "quorum": 2, "grace": 0.3}, {}),
    ({"H": 4, "fragments": 2, "quorum": 2, "grace": 0.5}, {"bandwidth": 2e4, "latency": 0.2}),
    (
        {"H": 2, "quorum": 2, "grace": 0.0},
        {"slowdown": (1.0, 1.0, 1.0, 1.0), "latency": 0.1, "down": {2: [(1.5, 4.5)], 3: [(9.0, math.inf)]}},
    ),
    ({"H": 2, "quorum": 1, "grace": 0.0, "outer": "cgad", "outer_lr": 0.05}, {"bandwidth": 2e4, "latency": 0.2}),
]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(("settings", "world"), CASES)
def test_decoupled_diloco_server_equals_its_event_driven_reference(settings, world, workers) -> None:
    slowdown, down = world.get("slowdown", SLOWDOWN), world.get("down")
    bandwidth, latency = world.get("bandwidth", 1e8), world.get("latency", 0.0)
    k = len(slowdown)
    ds = regression_data(k * 8 * STEPS)
    net = Network(
        bandwidth, latency, compute=1.0, compute_slowdown=slowdown, availability=_trace(down) if down else None
    )
    out = train_server(
        k, lambda: ServerStrategy(DecoupledDiLoCoServer(**settings), optim_spec=SGD), STEPS, dataset=ds, network=net,
        workers=workers,
    )  # fmt: skip
    ref = reference_decoupled_diloco(
        ds, k, STEPS, slowdown=slowdown, step_seconds=1.0, bandwidth=bandwidth, latency=latency, down=down,
        **{"fragments": 1, "grace": 0.5, "tau": 2, "outer_lr": 0.7, "outer_momentum": 0.9, **settings},
    )  # fmt: skip
    server = out[0]["server"]
    assert out[0]["summary"]["steps"] == ref["steps"]
    assert [(r, s) for _, r, s in server.updates] == [(r, s) for _, r, s in ref["updates"]]
    assert [t for t, _, _ in server.updates] == pytest.approx([t for t, _, _ in ref["updates"]], abs=1e-9)
    merges = server.records.get("merges", [])
    assert ref["merges"]
    assert [(p, ranks) for _, p, ranks, _ in merges] == [(p, tuple(ranks)) for _, p, ranks, _ in ref["merges"]]
    assert [t for t, _, _, _ in merges] == pytest.approx([t for t, _, _, _ in ref["merges"]], abs=1e-9)
    for (_, _, _, w), (_, _, _, w_ref) in zip(merges, ref["merges"], strict=True):
        assert list(w) == pytest.approx(list(w_ref), abs=1e-12)
    assert out[0]["summary"]["end_time"] == pytest.approx(ref["end_time"], abs=1e-9)
    for rank in out:
        for a, b in zip(rank["params"], ref["params"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_learner_is_charged_its_fragments_the_merges_it_receives_and_its_pulls_not_its_steps() -> None:
    ds = regression_data(4 * 8 * STEPS)
    down = {2: [(1.5, 4.5)]}  # learner 2 away, then it pulls the whole model
    net = Network(1e8, 0.1, compute=1.0, compute_slowdown=SLOWDOWN, availability=_trace(down))
    make = lambda: ServerStrategy(DecoupledDiLoCoServer(H=2, quorum=2, grace=0.0), optim_spec=SGD)  # noqa: E731
    out = train_server(4, make, STEPS, dataset=ds, network=net)
    server, loop = out[0]["server"], out[0]["loop"]
    nbytes = loop.nbytes
    pull = 0.1 + 8 * nbytes / 1e8
    for r, clock in loop.clients.items():
        assert clock.sent == server.sends[r] * nbytes  # one fragment (the model) per send, no step's upload
        assert clock.received > 0 and clock.received % nbytes == 0  # merged fragments (and a pull)
        assert clock.comm == pytest.approx(pull if r == 2 else 0.0)  # only the pull is waited for
    assert loop.clients[2].received >= nbytes  # the pull
    for row in out[0]["nodes"]:
        assert row["compute"] + row["comm"] + row["wait"] == pytest.approx(row["clock"], abs=1e-9)
