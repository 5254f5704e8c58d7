"""The simulated timeline of asynchronous algorithms: ticks, the drain, staleness, deadlocks."""

from __future__ import annotations

import pytest

from communicators.async_diloco import AsyncDiLoCoTiming, dylu_steps
from communicators.fedbuff import FedBuffTiming
from exogym.core.timeline import DeadlockError, Event, Simulation, format_summary


def test_dylu_gives_each_node_local_steps_in_proportion_to_its_speed() -> None:
    # speeds 1, 1, 2, 4: steps of 1, 1, 0.5 and 0.25 s
    assert dylu_steps(8, [1.0, 1.0, 0.5, 0.25]) == [2, 2, 4, 8]
    assert dylu_steps(3, [1.0, 0.25]) == [1, 3]  # floor(3 / 4) = 0, at least one step
    assert dylu_steps(5, [0.0, 0.0]) == [5, 5]  # steps that take no time: every node takes H


def test_ticks_are_the_distinct_instants_at_which_steps_start() -> None:
    tl = AsyncDiLoCoTiming([1.0, 1.0, 0.5, 0.25], [0.0] * 4, 8, [1, 1, 2, 4]).run()
    assert tl.ticks == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
    assert [sorted(t) for t in tl.trains[:4]] == [[0, 1, 2, 3], [3], [2, 3], [3]]
    # per round of 1 s the fastest node takes 4 steps and the slowest 1
    assert tl.steps == [2, 2, 4, 8]


def test_a_round_trip_through_the_server_delays_the_next_segment_by_both_transfers() -> None:
    # one node, 2 steps of 1 s a segment, 0.5 s each way: segments start at 0, 3, 6
    tl = AsyncDiLoCoTiming([1.0], [0.5], 6, [2]).run()
    assert tl.ticks == [0.0, 1.0, 3.0, 4.0, 6.0, 7.0]
    assert [(t, r, s) for t, r, s in tl.updates] == [(2.5, 0, 0), (5.5, 0, 0), (8.5, 0, 0)]
    # what happens before the first step the run does not take (at 9 s) belongs to the last tick
    assert [(e.kind, e.time) for e in tl.after[-1]] == [
        ("capture", 8.0),
        ("receive", 8.5),
        ("serve", 8.5),
        ("deliver", 9.0),
    ]
    assert tl.drain == [] and tl.end_time == 8.5  # the last receipt; the unused reply does not count


def test_pushes_of_segments_done_by_the_last_tick_are_drained_after_it() -> None:
    # node 0 pushes every 1 s; node 1's one step lasts 10 s: the run's 3 ticks are at 0, 1, 2
    tl = AsyncDiLoCoTiming([1.0, 10.0], [0.0, 0.0], 3, [1, 1]).run()
    assert tl.ticks == [0.0, 1.0, 2.0] and tl.steps == [3, 1]
    assert [(e.kind, e.rank, e.time) for e in tl.drain] == [("capture", 1, 10.0), ("receive", 1, 10.0)]
    # node 1 pulled version 0; node 0's three updates came first
    assert tl.updates[-1] == (10.0, 1, 3) and tl.end_time == 10.0


def test_utilisation_is_each_nodes_compute_over_the_simulated_run() -> None:
    # node 0: 3 steps of 1 s; node 1: one step of 10 s; the run ends at 10 s (node 1's receipt)
    summary = AsyncDiLoCoTiming([1.0, 10.0], [0.0, 0.0], 3, [1, 1]).run().summary()
    assert summary["utilisation"] == [0.3, 1.0]


def test_staleness_counts_the_server_versions_applied_since_the_node_pulled() -> None:
    # two equal nodes pushing at one instant: node 0's update is applied first (staleness 0),
    # node 1's on top of it (staleness 1); both then pull the state after both
    tl = AsyncDiLoCoTiming([1.0, 1.0], [0.0, 0.0], 4, [1, 1]).run()
    assert [(r, s) for _, r, s in tl.updates] == [(0, 0), (1, 1)] * 4
    summary = tl.summary()
    assert summary["staleness"] == {0: 4, 1: 4} and summary["staleness_max"] == 1
    assert summary["staleness_mean"] == 0.5 and summary["updates"] == 8


def test_fedbuff_keeps_its_concurrency_and_steps_the_server_every_buffer_of_updates() -> None:
    tl = FedBuffTiming([1.0] * 6, [0.5] * 6, 12, concurrency=2, buffer_size=2, local_steps=2, seed=0).run()
    # two clients in flight at every instant: each tick trains exactly two
    assert all(len(t) == 2 for t in tl.trains)
    # staleness: the first two updates were pulled at version 0 and are applied before any step
    assert [s for _, _, s in tl.updates[:2]] == [0, 0]
    assert sum(tl.steps) == 24


def test_fedbuff_refuses_more_concurrent_clients_than_nodes() -> None:
    with pytest.raises(ValueError, match="concurrency=3 is more than the 2 nodes"):
        FedBuffTiming([1.0] * 2, [0.0] * 2, 4, concurrency=3, buffer_size=1, local_steps=1, seed=0)


class _Quorum(Simulation):
    """Two nodes step once and then wait for a quorum of three pushes that never comes."""

    def begin(self) -> None:
        for r in range(self.num_nodes):
            self.schedule(0.0, "start", r)

    def on_start(self, ev: Event) -> None:
        self.step_end(ev.rank, ev.time)
        self.waiting[ev.rank] = "a quorum of 3 pushes (2 will come)"


def test_a_deadlock_is_reported_in_simulated_time_naming_each_node_and_what_it_waits_for() -> None:
    with pytest.raises(DeadlockError) as err:
        _Quorum([1.0, 2.0], max_ticks=5).run()
    msg = str(err.value)
    assert "after 1 of 5 steps" in msg
    assert "node 0 waits for a quorum of 3 pushes (2 will come)" in msg
    assert "node 1 waits for a quorum of 3 pushes" in msg
    assert err.value.waiting.keys() == {0, 1}


def test_the_summary_line_gives_floats_in_lists_to_four_significant_digits() -> None:
    line = format_summary({"steps": [1, 2], "utilisation": [0.98365684, 1.0], "end_time": 10.123456})
    assert line == "steps=[1, 2], utilisation=[0.9837, 1], end_time=10.12"
