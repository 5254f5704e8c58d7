"""Asynchronous SPARTA (``async_sparta_delay=d``: a round's average lands d rounds later) and
SPARTA every k steps (``sparta_interval``), against a plain-PyTorch reference."""

from __future__ import annotations

import math

import pytest
import torch

from communicators.sparse import SharedSelector, SparseCommunicator
from exogym.core.comm.network import Network
from exogym.strategy import FedAvgStrategy, OptimSpec, SPARTAStrategy
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, node_batches, regression_data

SGD = OptimSpec(torch.optim.SGD, lr=0.05)
STEPS = 9


def delayed_sparta_reference(ds, k: int, steps: int, p: float, delay: int, interval: int) -> list[list[torch.Tensor]]:
    """K copies with inner SGD. After steps s with (s+1) % interval == 0, the selected entries of
    every parameter are averaged over the copies; that average is written into every copy
    ``delay`` rounds later. With p=1 every entry is selected; otherwise the indices are those
    ExoGym's shared-seed selector draws (the indices are the selector's; the averaging, the
    queue and the writes are this reference's own)."""
    models = [TinyNet() for _ in range(k)]
    inner = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    data = [node_batches(ds, k, r) for r in range(k)]
    numels = [q.numel() for q in models[0].parameters()]
    selector = SharedSelector("random", p, 0, numels, torch.device("cpu"))
    queue: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    for s in range(steps):
        for r in range(k):
            inner[r].zero_grad()
            models[r](next(data[r])).backward()
            inner[r].step()
        if (s + 1) % interval:
            continue
        with torch.no_grad():
            idx = [torch.arange(n) for n in numels] if p == 1.0 else selector.select(s)
            means = []
            for i, ix in enumerate(idx):
                values = [list(m.parameters())[i].reshape(-1)[ix] for m in models]
                means.append((ix, sum(values) / k))
            queue.append(means)
            if len(queue) > delay:
                arrived = queue.pop(0)
                for m in models:
                    for q, (ix, mean) in zip(m.parameters(), arrived, strict=True):
                        q.view(-1)[ix] = mean
    return [[q.detach().clone() for q in m.parameters()] for m in models]


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("delay", [0, 1, 2])
@pytest.mark.parametrize("p", [1.0, 0.3])
def test_delayed_sparta_matches_the_reference(k: int, delay: int, p: float) -> None:
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(
        k, lambda: SPARTAStrategy(p_sparta=p, async_sparta_delay=delay, optim_spec=SGD), STEPS, dataset=ds
    )
    ref = delayed_sparta_reference(ds, k, STEPS, p, delay, interval=1)
    for rank in range(k):
        for a, b in zip(out[rank]["params"], ref[rank], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    if delay:  # the delay changes the result
        assert not torch.allclose(ref[0][0], delayed_sparta_reference(ds, k, STEPS, p, 0, interval=1)[0][0])


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("delay", [0, 1])
def test_sparta_every_k_steps_matches_the_reference(delay: int, k: int) -> None:
    ds = regression_data(k * 8 * STEPS)
    make = lambda: SPARTAStrategy(p_sparta=0.3, sparta_interval=3, async_sparta_delay=delay, optim_spec=SGD)  # noqa: E731
    out = train_ranks(k, make, STEPS, dataset=ds)
    ref = delayed_sparta_reference(ds, k, STEPS, 0.3, delay, interval=3)
    for rank in range(k):
        for a, b in zip(out[rank]["params"], ref[rank], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_sparta_of_everything_every_k_steps_is_fedavg() -> None:
    sparta = train_ranks(3, lambda: SPARTAStrategy(p_sparta=1.0, sparta_interval=3, optim_spec=SGD), STEPS)
    fedavg = train_ranks(3, lambda: FedAvgStrategy(H=3, optim_spec=SGD), STEPS)
    for a, b in zip(sparta, fedavg, strict=True):
        for x, y in zip(a["params"], b["params"], strict=True):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


def test_a_delay_sends_the_same_bytes_in_the_same_steps() -> None:
    now = train_ranks(2, lambda: SPARTAStrategy(p_sparta=0.3, optim_spec=SGD), STEPS)
    later = train_ranks(2, lambda: SPARTAStrategy(p_sparta=0.3, async_sparta_delay=2, optim_spec=SGD), STEPS)
    per_step = [[sum(r.sent for r in recs) for recs in o[0]["records"]] for o in (now, later)]
    assert per_step[0] == per_step[1] and all(per_step[0])


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: SPARTAStrategy(async_sparta_delay=-1),
            r"async_sparta_delay .* must be an int >= 0 or 'auto' .*, got -1",
        ),
        (lambda: SPARTAStrategy(sparta_interval=0), r"sparta_interval .* must be an int >= 1, got 0"),
        (lambda: SparseCommunicator(0.1, "topk", delay=1), "delay is not available with selector='topk'"),
    ],
)
def test_bad_delay_and_interval_name_the_argument(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def _rows(out) -> list[dict]:
    measured = ("wall_time", "comm_time", "peak_memory")
    return [{k: v for k, v in r.items() if k not in measured} for r in out[0]["node"].history]


@pytest.mark.parametrize(("bandwidth", "latency"), [(1e9, 1e-4), (1e5, 0.01)])
def test_auto_delay_lands_each_round_at_the_step_its_transfer_arrives(bandwidth: float, latency: float) -> None:
    """async_sparta_delay="auto" writes each round's average after as many steps as its
    all-reduce (ring: 2(k-1) a + 2(k-1)/k * 8 bytes / B), started with its step's backward pass
    (2/3 of the step's 0.01 s before the end), takes past that step: the same parameters and rows
    as that many rounds of delay, which hide it whole. On the fast link (about 0.0002 s, under the
    0.00667 s backward pass) it lands in its own step, as without delay; on the slow one (payloads
    of 184 to 200 bytes: 0.0347 to 0.036 s) 3 steps later: 0.036 - 0.00667 = 0.0293 s = 2.9 steps."""
    k, compute, steps = 2, 0.01, 12
    net = Network(bandwidth, latency, compute=compute)
    make = lambda d: lambda: SPARTAStrategy(p_sparta=0.3, async_sparta_delay=d, optim_spec=SGD)  # noqa: E731
    auto = train_ranks(k, make("auto"), steps, network=net)
    payloads = [r.payload for recs in auto[0]["records"] for r in recs]
    delays = {
        max(0, math.ceil((2 * (k - 1) * latency + 2 * (k - 1) / k * 8 * b / bandwidth - 2 / 3 * compute) / compute))
        for b in payloads
    }
    assert len(payloads) == steps and len(delays) == 1
    (delay,) = delays
    fixed = train_ranks(k, make(delay), steps, network=net)
    for a, b in zip(auto, fixed, strict=True):
        for p, q in zip(a["params"], b["params"], strict=True):
            assert torch.equal(p, q)
    assert _rows(auto) == _rows(fixed)
    assert delay == (0 if bandwidth == 1e9 else 3)
    trained = [r for r in fixed[0]["node"].history if "train_loss" in r]
    assert [r["sim_comm_time"] for r in trained] == [0.0] * len(trained)  # hidden whole: the node never waits
    assert [r["sim_time"] for r in trained] == [
        pytest.approx(r["step"] * compute, abs=1e-12) for r in trained
    ]  # the slow link delays each average by 3 more rounds


def test_auto_delay_refuses_measured_compute_and_topk() -> None:
    with pytest.raises(ValueError, match=r"delay='auto' .* compute='measured'"):
        measured = Network(1e9, 0.01, compute="measured")
        train_ranks(
            2, lambda: SPARTAStrategy(p_sparta=0.3, async_sparta_delay="auto", optim_spec=SGD), 2, network=measured
        )
    with pytest.raises(ValueError, match="delay is not available with selector='topk'"):
        SparseCommunicator(0.1, "topk", delay="auto")


@pytest.mark.parametrize("delay", [1, "auto"])
def test_averages_in_flight_travel_with_the_state_of_a_node_that_rejoins(delay) -> None:
    """Nodes dropped and rejoining mid-run take a survivor's averages in flight (handles started
    in the step of the rejoin included); the run is deterministic, and virtual nodes on 2
    workers give the same simulated times."""
    from exogym import Faults

    net = Network(1e5, 0.01, compute=0.01, compute_slowdown=(1, 1, 2, 4))
    faults = Faults(drop_probability=0.3)
    make = lambda: SPARTAStrategy(p_sparta=0.3, async_sparta_delay=delay, optim_spec=SGD)  # noqa: E731
    runs = [train_ranks(4, make, 20, network=net, faults=faults, workers=w) for w in (None, None, 2)]
    assert any(r.get("nodes_alive", 4) < 4 for r in runs[0][0]["node"].history)  # someone did drop out
    assert _rows(runs[0]) == _rows(runs[1])
    for a, b in zip(runs[0], runs[1], strict=True):
        assert all(torch.equal(p, q) for p, q in zip(a["params"], b["params"], strict=True))
    times = [[(r["step"], r.get("sim_time"), r.get("sim_comm_time")) for r in _rows(run)] for run in (runs[0], runs[2])]
    assert times[0] == times[1]
