"""Asynchronous DiLoCo and FedBuff against event-driven references written from the papers
(``tests/references``: a heap of timed events driving K plain-torch models), on a world of 4
nodes with speeds 1, 1, 2, 4: final parameters, every node's step count, every update's receipt
time, sender and staleness, and the run's end."""

from __future__ import annotations

import pytest
import torch

from exogym.core.comm.network import Network
from exogym.strategy import AsyncDiLoCoStrategy, FedBuffStrategy, OptimSpec
from tests.fake_world import train_ranks
from tests.helpers import regression_data
from tests.references.async_diloco import reference_async_diloco
from tests.references.fedbuff import reference_fedbuff

SLOWDOWN = (1.0, 1.0, 0.5, 0.25)  # speeds 1, 1, 2, 4
STEPS = 24


def _net(latency: float, slowdown: tuple[float, ...] = SLOWDOWN) -> Network:
    return Network(1e8, latency, compute=1.0, compute_slowdown=slowdown)


def _same_run(out: list[dict], ref: dict) -> None:
    summary = out[0]["strategy"].run_summary()
    assert summary["steps"] == ref["steps"]
    ours = out[0]["strategy"].server.timeline.updates
    # simulated times are kept to the nanosecond; the reference sums floats
    assert [(r, s) for _, r, s in ours] == [(r, s) for _, r, s in ref["updates"]]
    assert [t for t, _, _ in ours] == pytest.approx([t for t, _, _ in ref["updates"]], abs=1e-9)
    assert summary["end_time"] == pytest.approx(ref["end_time"], abs=1e-9)
    for node in out:  # every node ends with the server's parameters
        for a, b in zip(node["params"], ref["params"], strict=True):
            # elementwise the same operations: equal up to the order of the outer mean's sum
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("dylu", "latency", "dn_c", "inner"),
    [
        (True, 0.0, 0.0, "sgd"),
        (True, 0.3, 0.0, "sgd"),  # pushes in flight while others train
        (False, 0.3, 0.125, "sgd"),  # DyLU off: fast nodes push more often; DN's c at 1/(2N)
        (True, 0.3, 0.0, "adamw"),  # the inner optimizer's state kept across segments
    ],
)
def test_async_diloco_equals_its_event_driven_reference(dylu: bool, latency: float, dn_c: float, inner: str) -> None:
    ds = regression_data(4 * 8 * STEPS)
    spec = (
        OptimSpec(torch.optim.SGD, lr=0.05) if inner == "sgd" else OptimSpec(torch.optim.AdamW, lr=0.01)
    )  # fmt: skip
    out = train_ranks(
        4,
        lambda: AsyncDiLoCoStrategy(H=4, outer_lr=0.7, outer_momentum=0.5, dn_c=dn_c, dylu=dylu, optim_spec=spec),
        STEPS,
        dataset=ds,
        network=_net(latency),
    )
    ref = reference_async_diloco(
        ds, 4, STEPS, slowdown=SLOWDOWN, step_seconds=1.0, bandwidth=1e8, latency=latency, H=4, outer_lr=0.7,
        outer_momentum=0.5, dn_c=dn_c, dylu=dylu,
        inner=("sgd", {"lr": 0.05}) if inner == "sgd" else ("adamw", {"lr": 0.01}),
    )  # fmt: skip
    _same_run(out, ref)
    if dylu:
        per_round = [s / h for s, h in zip(ref["steps"], (1, 1, 2, 4), strict=True)]
        assert len(set(per_round)) == 1  # every node takes as many segments


@pytest.mark.parametrize(
    ("latency", "slowdown"), [(0.0, SLOWDOWN), (0.3, SLOWDOWN), (0.3, (1.0, 2.0, 1.0, 0.5, 1.0, 3.0))]
)
def test_fedbuff_equals_its_event_driven_reference(latency: float, slowdown: tuple[float, ...]) -> None:
    k = len(slowdown)
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(
        k,
        lambda: FedBuffStrategy(
            local_steps=2, buffer_size=2, concurrency=2, server_lr=0.8, optim_spec=OptimSpec(torch.optim.SGD, lr=0.05)
        ),
        STEPS,
        dataset=ds,
        network=_net(latency, slowdown),
    )
    ref = reference_fedbuff(
        ds, k, STEPS, slowdown=slowdown, step_seconds=1.0, bandwidth=1e8, latency=latency, concurrency=2,
        buffer_size=2, local_steps=2, client_lr=0.05, server_lr=0.8,
    )  # fmt: skip
    assert len(ref["updates"]) >= 6 and max(s for _, _, s in ref["updates"]) >= 1  # stale updates happen
    _same_run(out, ref)
