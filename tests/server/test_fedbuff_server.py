"""FedBuff written as a server and tasks equals its event-driven reference written from the
paper (``tests/references/fedbuff.py``) on 1 and 2 workers: final parameters, every client's
steps, every update's receipt time, client and staleness, and the run's end."""

from __future__ import annotations

import pytest
import torch

from communicators.fedbuff import FedBuffServer
from exogym.core.comm.network import Network
from exogym.core.server import ServerStrategy
from exogym.strategy import OptimSpec
from tests.fake_world import train_server
from tests.helpers import regression_data
from tests.references.fedbuff import reference_fedbuff

SLOWDOWN = (1.0, 1.0, 0.5, 0.25)
STEPS = 24


def _net(latency: float, slowdown: tuple[float, ...]) -> Network:
    return Network(1e8, latency, compute=1.0, compute_slowdown=slowdown)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    ("latency", "slowdown"), [(0.0, SLOWDOWN), (0.3, SLOWDOWN), (0.3, (1.0, 2.0, 1.0, 0.5, 1.0, 3.0))]
)
def test_fedbuff_server_equals_its_event_driven_reference(latency, slowdown, workers) -> None:
    k = len(slowdown)
    ds = regression_data(k * 8 * STEPS)
    sgd = OptimSpec(torch.optim.SGD, lr=0.05)
    out = train_server(
        k, lambda: ServerStrategy(FedBuffServer(2, 2, 2, 0.8), optim_spec=sgd), STEPS, dataset=ds,
        network=_net(latency, slowdown), workers=workers,
    )  # fmt: skip
    ref = reference_fedbuff(
        ds, k, STEPS, slowdown=slowdown, step_seconds=1.0, bandwidth=1e8, latency=latency, concurrency=2,
        buffer_size=2, local_steps=2, client_lr=0.05, server_lr=0.8,
    )  # fmt: skip
    assert len(ref["updates"]) >= 6 and max(s for _, _, s in ref["updates"]) >= 1  # stale updates happen
    ours = out[0]["server"].updates
    assert [(r, s) for _, r, s in ours] == [(r, s) for _, r, s in ref["updates"]]
    assert [t for t, _, _ in ours] == pytest.approx([t for t, _, _ in ref["updates"]], abs=1e-9)
    summary = out[0]["summary"]
    assert summary["steps"] == ref["steps"]
    assert summary["updates"] == len(ref["updates"])
    assert summary["end_time"] == pytest.approx(ref["end_time"], abs=1e-9)
    for rank in out:
        for a, b in zip(rank["params"], ref["params"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_a_draw_among_a_million_clients_is_the_references_draw_among_the_free_ones() -> None:
    from communicators.fedbuff import draw_free_client
    from tests.references.fedbuff import draw_client

    rng = torch.Generator().manual_seed(0)
    for draw in range(40):
        k = int(torch.randint(2, 60, (1,), generator=rng))
        in_flight = sorted(set(torch.randint(0, k, (k // 2,), generator=rng).tolist()))
        free = [c for c in range(k) if c not in in_flight]
        assert draw_free_client(7, draw, k, in_flight) == draw_client(7, draw, free)
    busy = sorted(range(0, 10**6, 10**4))  # the cost follows the clients in flight, not the million
    assert draw_free_client(7, 0, 10**6, busy) not in busy
