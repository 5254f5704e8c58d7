"""Non-blocking collectives (``async_op=True``): what a handle delivers and when, on the node's
own simulated clock. Expected times are worked out here from the ring all-reduce formula
``2(n-1) a + 2(n-1)/n * 8b / B``; a transfer starts when its step's backward pass starts
(``Network.backward_share``, 2/3 of the step's compute by default, before the compute ends)."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
import torch

from exogym.core.comm.handles import CollectiveHandle, LocalClock
from exogym.core.comm.network import Network
from exogym.core.pipeline import CommunicateOptimizeStrategy, Communicator
from exogym.strategy import OptimSpec
from tests.fake_world import run_ranks, train_ranks

SGD = OptimSpec(torch.optim.SGD, lr=0.05)
BACKWARD = 2 / 3  # Network's default backward_share: the backward pass's share of a step's compute


def ring_seconds(n: int, latency: float, bandwidth: float, payload: int) -> float:
    """A ring all-reduce of ``payload`` bytes among ``n`` nodes (alpha-beta)."""
    return 2 * (n - 1) * latency + 2 * (n - 1) / n * 8 * payload / bandwidth


def test_an_all_reduce_sends_the_values_held_at_the_start_and_writes_the_result_at_wait() -> None:
    def body(rank, comm):
        t = torch.full((3,), float(rank + 1))
        handle = comm.all_reduce(t, op="sum", async_op=True)
        t.mul_(100)  # the node goes on changing it: not what was sent, and kept until wait
        held = t.clone()
        records = list(comm.ledger.step_records)
        out = handle.wait()
        return held, out is t, t.clone(), handle.wait() is t, records

    for rank, (held, same, result, again, records) in enumerate(run_ranks(2, body)):
        assert torch.equal(held, torch.full((3,), 100.0 * (rank + 1)))
        assert same and again
        assert torch.equal(result, torch.full((3,), 3.0))  # 1 + 2, the values at the start
        assert [(r.kind, r.payload, r.blocking) for r in records] == [("all_reduce", 12, False)]  # charged once


def test_an_all_gather_handle_returns_the_gathered_tensor_and_a_broadcast_writes_the_root_s() -> None:
    def body(rank, comm):
        mine = torch.tensor([float(rank)])
        gathered = comm.all_gather(mine, async_op=True)
        b = torch.tensor([10.0 + rank])
        cast = comm.broadcast(b, src=1, async_op=True)
        before = b.clone()
        return gathered.wait(), before, cast.wait().clone(), len(comm.ledger.step_records)

    for rank, (gathered, before, cast, charged) in enumerate(run_ranks(3, body)):
        assert torch.equal(gathered, torch.tensor([[0.0], [1.0], [2.0]]))
        assert torch.equal(before, torch.tensor([10.0 + rank])) and torch.equal(cast, torch.tensor([11.0]))
        assert charged == 2


def test_a_handle_waits_until_the_transfer_arrives_on_the_clock_and_stalls_only_when_ahead() -> None:
    net = Network(1e6, 0.01, compute=0.02)
    t = ring_seconds(2, 0.01, 1e6, 4000)  # 0.052 s: 2.6 steps of 0.02 s
    clock = LocalClock()
    clock.attach(net, lambda: 0.02)

    def body(rank, comm):
        comm.clock = clock if rank == 0 else LocalClock()
        return comm.all_reduce(torch.ones(1000), async_op=True)

    handle = run_ranks(2, body)[0]
    assert isinstance(handle, CollectiveHandle) and not handle.is_completed()
    assert clock.close_step(0.02, 0.0) == 0.0  # step 0: it starts as the backward pass starts
    # compute 0.02 s, backward 2/3 * 0.02 = 0.01333 s: it starts at 0.00667 s, arrives 0.05867 s
    arrival = 0.02 - BACKWARD * 0.02 + t
    assert handle.arrival == pytest.approx(arrival, abs=1e-12)
    assert not handle.is_completed()  # step 1 at 0.04 s
    handle.wait()
    assert clock.close_step(0.02, 0.0) == pytest.approx(arrival - 0.04, abs=1e-12)  # stalled to its arrival
    assert clock.seconds == pytest.approx(arrival, abs=1e-12)
    assert handle.is_completed()


def _stall_of_a_wait(net: Network, tau: int) -> tuple[float, float, float]:
    """A 4000-byte all-reduce of 2 nodes started in step 0 of 0.02 s steps on ``net`` and waited
    for in step ``tau``: (its arrival, the stall of step ``tau``, the clock after it)."""
    clock = LocalClock()
    clock.attach(net, lambda: 0.02)

    def body(rank, comm):
        comm.clock = clock if rank == 0 else LocalClock()
        return comm.all_reduce(torch.ones(1000), async_op=True)

    handle = run_ranks(2, body)[0]
    for _ in range(tau):
        assert clock.close_step(0.02, 0.0) == 0.0
    handle.wait()
    stall = clock.close_step(0.02, 0.0)
    assert handle.arrival is not None
    return handle.arrival, stall, clock.seconds


@pytest.mark.parametrize(
    ("tau", "stall"),
    [
        (0, 0.05867 - 0.02),  # waited in its own step, which ends at 0.02 s: 0.03867 s left
        (1, 0.05867 - 0.04),  # step 1 ends at 0.04 s: 0.01867 s left
        (2, 0.0),  # step 2 ends at 0.06 s, after the arrival
        (3, 0.0),
    ],
)
def test_a_handle_waited_for_tau_steps_later_stalls_only_past_the_start_of_the_backward_pass_plus_its_transfer(
    tau: int, stall: float
) -> None:
    # compute 0.02 s, backward 2/3 * 0.02 = 0.01333 s: the transfer (0.052 s) starts at 0.00667 s
    # and arrives at 0.05867 s; step tau's compute ends at (tau + 1) * 0.02 s
    t = ring_seconds(2, 0.01, 1e6, 4000)
    assert t == pytest.approx(0.052, abs=1e-12)
    arrival, stalled, seconds = _stall_of_a_wait(Network(1e6, 0.01, compute=0.02), tau)
    assert arrival == pytest.approx(0.02 - BACKWARD * 0.02 + t, abs=1e-12)
    assert stalled == pytest.approx(stall, abs=1e-5)
    assert stalled == pytest.approx(max(0.0, arrival - (tau + 1) * 0.02), abs=1e-12)
    assert seconds == pytest.approx((tau + 1) * 0.02 + stalled, abs=1e-12)


@pytest.mark.parametrize(
    ("tau", "stall"),
    [
        (0, 0.052),  # the whole transfer, started when step 0's compute ends
        (1, 0.072 - 0.04),
        (2, 0.072 - 0.06),
        (3, 0.0),  # step 3 ends at 0.08 s, after the arrival
    ],
)
def test_without_a_backward_pass_a_handle_starts_when_its_step_s_compute_ends(tau: int, stall: float) -> None:
    # backward_share=0: the previous rule, arrival = end of step 0's compute + transfer = 0.02 + 0.052 s
    net = Network(1e6, 0.01, compute=0.02, backward_share=0.0)
    arrival, stalled, seconds = _stall_of_a_wait(net, tau)
    assert arrival == pytest.approx(0.02 + ring_seconds(2, 0.01, 1e6, 4000), abs=1e-12)
    assert stalled == pytest.approx(stall, abs=1e-12)
    assert seconds == pytest.approx((tau + 1) * 0.02 + stall, abs=1e-12)


def test_is_completed_needs_modelled_compute() -> None:
    clock = LocalClock()
    clock.attach(Network(1e9, 1e-3), None)  # measured compute
    handle = CollectiveHandle(clock, "all_reduce", torch.zeros(1), None, [])
    clock.started(handle)
    with pytest.raises(RuntimeError, match=r"is_completed\(\) .* compute=<seconds per step>.* handle.wait\(\)"):
        handle.is_completed()
    handle.wait()  # works with any compute model
    assert clock.close_step(0.5, 0.0) == 0.0


class Probe(Communicator):
    """Starts an all-reduce of ``n`` floats after step 0, asks is_completed() after every step and
    waits after step ``wait_at``."""

    space: ClassVar[str] = "param"

    def __init__(self, n: int, wait_at: int) -> None:
        super().__init__(1)
        self.n, self.wait_at = n, wait_at

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self.completed: list[bool] = []
        self.handle: CollectiveHandle | None = None
        self.result: torch.Tensor | None = None

    def communicate(self, step: int) -> None:
        if step == 0:
            self.handle = self.ctx.comm.all_reduce(torch.ones(self.n), async_op=True)
        if self.result is None:
            assert self.handle is not None
            self.completed.append(self.handle.is_completed())
        if step == self.wait_at:
            self.result = self.handle.wait().clone()


def _probe(wait_at: int, steps: int = 6) -> tuple[Probe, list[dict]]:
    net = Network(1e6, 0.01, compute=0.02)
    out = train_ranks(
        2, lambda: CommunicateOptimizeStrategy([Probe(1000, wait_at)], optim_spec=SGD), steps, network=net
    )
    probe = out[0]["strategy"].pipeline.modules[0]
    return probe, [r for r in out[0]["node"].history if "train_loss" in r]


def test_is_completed_turns_true_at_the_step_the_formula_gives() -> None:
    probe, rows = _probe(wait_at=5)
    t = ring_seconds(2, 0.01, 1e6, 4000)
    # after step j the node's clock reads (j + 1) * 0.02 s; the transfer starts with step 0's
    # backward pass, 0.02 - 2/3 * 0.02 = 0.00667 s, and arrives at 0.00667 + 0.052 = 0.05867 s:
    # (j + 1) * 0.02 >= 0.05867 from j = 2 (2.93 - 1 rounded up)
    first = math.ceil((0.02 - BACKWARD * 0.02 + t) / 0.02) - 1
    assert first == 2
    assert probe.completed == [j >= first for j in range(6)]
    assert torch.equal(probe.result, torch.full((1000,), 2.0))
    assert [r["sim_comm_time"] for r in rows] == [0.0] * 6  # waited for after it arrived: no stall


def test_a_wait_before_the_arrival_stalls_the_clock_by_what_is_left() -> None:
    probe, rows = _probe(wait_at=1)
    t = ring_seconds(2, 0.01, 1e6, 4000)
    arrival = 0.02 - BACKWARD * 0.02 + t  # started with step 0's backward pass: 0.00667 + 0.052 s
    stall = arrival - 2 * 0.02  # arrival less the clock after step 1's compute: 0.01867 s
    assert probe.completed == [False, False]
    assert [r["sim_comm_time"] for r in rows][:3] == [0.0, pytest.approx(stall, abs=1e-12), pytest.approx(stall)]
    assert rows[1]["sim_time"] == pytest.approx(arrival, abs=1e-12)
    assert rows[-1]["sim_time"] == pytest.approx(6 * 0.02 + stall, abs=1e-12)


def test_a_handle_still_in_flight_when_the_run_ends_lands_in_its_tensor() -> None:
    class Late(Communicator):
        space: ClassVar[str] = "param"

        def setup(self, ctx) -> None:
            super().setup(ctx)
            self.t = torch.full((4,), float(ctx.rank + 1))

        def communicate(self, step: int) -> None:
            if step == 2:
                self.ctx.comm.all_reduce(self.t, async_op=True)

    out = train_ranks(2, lambda: CommunicateOptimizeStrategy([Late()], optim_spec=SGD), 3)
    for o in out:
        assert torch.equal(o["strategy"].pipeline.modules[0].t, torch.full((4,), 3.0))
        assert o["node"].comm.clock.in_flight == 0


def test_a_saved_handle_resumes_with_its_result_and_arrival() -> None:
    clock = LocalClock()
    clock.attach(Network(1e6, 0.01, compute=0.02), lambda: 0.02)
    handle = CollectiveHandle(clock, "all_reduce", torch.arange(4.0), torch.zeros(4), [])
    clock.started(handle)
    clock.close_step(0.02, 0.0)
    state = handle.state_dict()
    again = LocalClock()
    again.load_state_dict(clock.state_dict())
    again.attach(clock.network, lambda: 0.02)
    target = torch.zeros(4)
    resumed = again.resume(state, target)
    assert (resumed.kind, resumed.arrival, again.in_flight) == ("all_reduce", handle.arrival, 1)
    assert resumed.wait() is target and torch.equal(target, torch.arange(4.0))
    with pytest.raises(RuntimeError, match="only a handle in flight"):
        resumed.state_dict()


def test_the_non_blocking_example_of_the_docs_applies_the_average_when_it_arrives() -> None:
    """The LateAverage block of docs/user-guide/asynchrony.md on 2 nodes, 5 steps of 0.1 s, an
    average sent after step 3: its transfers start with step 3's backward pass, at 0.4 - 2/3 *
    0.1 = 0.3333 s, the largest (fc1's 128 floats) taking 0.02 + 8 * 512 / B s. At 1 Mbit/s
    (0.0241 s) it arrives at 0.3574 s, within step 3: applied there, and step 4 trains the nodes
    apart again. At 50 kbit/s (0.1019 s) it arrives at 0.4353 s, within step 4, the last: the
    nodes end equal. At 1 kbit/s (4.1 s) it is still in flight when the run ends."""
    import os
    import re

    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "user-guide", "asynchrony.md")
    with open(path) as f:
        code = next(b for b in re.findall(r"```python\n(.*?)```", f.read(), re.DOTALL) if "class LateAverage" in b)
    namespace: dict = {}
    exec(compile(code, path, "exec"), namespace)  # noqa: S102 - the docs' own code
    make = lambda: CommunicateOptimizeStrategy([namespace["LateAverage"](H=4)], optim_spec=SGD)  # noqa: E731
    for bandwidth, in_flight, equal in [(1e6, 0, False), (5e4, 0, True), (1e3, 1, False)]:
        out = train_ranks(2, make, 5, network=Network(bandwidth, 0.01, compute=0.1))
        assert [len(o["strategy"].pipeline.modules[0].in_flight) for o in out] == [in_flight] * 2
        same = all(torch.equal(p, q) for p, q in zip(out[0]["params"], out[1]["params"], strict=True))
        assert same == equal
        started = [sum(not r.blocking for r in recs) for recs in out[0]["records"]]
        assert started == [0, 0, 0, len(out[0]["params"]), 0]


def test_the_torch_distributed_style_helpers_take_async_op() -> None:
    from exogym.core.comm.comm import set_current
    from exogym.strategy.communicate import all_reduce, broadcast

    def body(rank, comm):
        set_current(comm)
        try:
            t, b = torch.tensor([float(rank + 1)]), torch.tensor([float(rank)])
            reduced, cast = all_reduce(t, async_op=True), broadcast(b, src=1, async_op=True)
            held = (t.item(), b.item())
            return held, reduced.wait().item(), cast.wait().item()
        finally:
            set_current(None)

    assert run_ranks(2, body) == [((1.0, 0.0), 3.0, 1.0), ((2.0, 1.0), 3.0, 1.0)]
