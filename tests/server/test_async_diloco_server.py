"""Asynchronous DiLoCo written as a server and tasks equals its event-driven reference written
from the paper (``tests/references/async_diloco.py``) on 1 and 2 workers."""

from __future__ import annotations

import pytest
import torch

from communicators.async_diloco import AsyncDiLoCoServer
from exogym.core.comm.network import Network
from exogym.core.server import ServerStrategy
from exogym.strategy import OptimSpec
from tests.fake_world import train_server
from tests.helpers import regression_data
from tests.references.async_diloco import reference_async_diloco

SLOWDOWN = (1.0, 1.0, 0.5, 0.25)  # speeds 1, 1, 2, 4
STEPS = 24


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(
    ("dylu", "latency", "dn_c", "inner"),
    [
        (True, 0.0, 0.0, "sgd"),
        (True, 0.3, 0.0, "sgd"),  # pushes in flight while others train
        (False, 0.3, 0.125, "sgd"),  # DyLU off: fast clients push more often; DN's c at 1/(2N)
        (True, 0.3, 0.0, "adamw"),  # the inner optimizer's state kept across segments
    ],
)
def test_async_diloco_server_equals_its_event_driven_reference(dylu, latency, dn_c, inner, workers) -> None:
    ds = regression_data(4 * 8 * STEPS)
    spec = OptimSpec(torch.optim.SGD, lr=0.05) if inner == "sgd" else OptimSpec(torch.optim.AdamW, lr=0.01)
    server = lambda: AsyncDiLoCoServer(H=4, outer_lr=0.7, outer_momentum=0.5, dn_c=dn_c, dylu=dylu)  # noqa: E731
    out = train_server(
        4, lambda: ServerStrategy(server(), optim_spec=spec), STEPS, dataset=ds,
        network=Network(1e8, latency, compute=1.0, compute_slowdown=SLOWDOWN), workers=workers,
    )  # fmt: skip
    ref = reference_async_diloco(
        ds, 4, STEPS, slowdown=SLOWDOWN, step_seconds=1.0, bandwidth=1e8, latency=latency, H=4, outer_lr=0.7,
        outer_momentum=0.5, dn_c=dn_c, dylu=dylu,
        inner=("sgd", {"lr": 0.05}) if inner == "sgd" else ("adamw", {"lr": 0.01}),
    )  # fmt: skip
    ours = out[0]["server"].updates
    assert [(r, s) for _, r, s in ours] == [(r, s) for _, r, s in ref["updates"]]
    assert [t for t, _, _ in ours] == pytest.approx([t for t, _, _ in ref["updates"]], abs=1e-9)
    summary = out[0]["summary"]
    assert summary["steps"] == ref["steps"]
    assert summary["end_time"] == pytest.approx(ref["end_time"], abs=1e-9)
    for rank in out:
        for a, b in zip(rank["params"], ref["params"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
