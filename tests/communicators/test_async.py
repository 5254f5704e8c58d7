"""Asynchronous DiLoCo, FedBuff and HALoS on the runtime: the synchronous limit, node speeds, the
same schedule and values in every layout, resumes with updates in flight, clear errors."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import exogym
from exogym import Trainer
from exogym.core.comm.links import Link
from exogym.core.comm.network import Network
from exogym.strategy import (
    AsyncDiLoCoStrategy,
    DecoupledDiLoCoStrategy,
    DiLoCoStrategy,
    FedBuffStrategy,
    HALoSStrategy,
    OptimSpec,
)
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, regression_data

SGD = OptimSpec(torch.optim.SGD, lr=0.05)
#: Speeds 1, 1, 2, 4 (a step of 1 s on the slowest nodes), 10 ms each way to the server.
SPEEDS = Network(1e9, 0.01, compute=1.0, compute_slowdown=(1.0, 1.0, 0.5, 0.25))
#: The same speeds on two regions of two nodes (HALoS's servers: one per region and a global one).
REGIONS = Network.regions(
    {"a": [0, 1], "b": [2, 3]}, Link(1e9, 0.01), Link(1e8, 0.3), compute=1.0, compute_slowdown=(1.0, 1.0, 0.5, 0.25)
)


@pytest.mark.parametrize("k", [2, 4])
def test_with_equal_speeds_and_dylu_off_async_diloco_equals_synchronous_diloco(k: int) -> None:
    # every node's update arrives at one instant; DN with N = K and c = 0 takes one Nesterov
    # step on their mean, which every node then pulls
    steps, ds = 12, regression_data(k * 8 * 12)
    net = Network(1e9, 0.01, compute=1.0)
    a = train_ranks(
        k,
        lambda: AsyncDiLoCoStrategy(H=3, outer_lr=0.7, outer_momentum=0.5, dylu=False, optim_spec=SGD),
        steps,
        dataset=ds,
        network=net,
    )
    b = train_ranks(
        k, lambda: DiLoCoStrategy(H=3, outer_lr=0.7, outer_momentum=0.5, optim_spec=SGD), steps, dataset=ds, network=net
    )
    for rank in range(k):
        for x, y in zip(a[rank]["params"], b[rank]["params"], strict=True):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)  # the mean summed in another order
    assert a[0]["strategy"].run_summary()["steps"] == [steps] * k


def test_with_dylu_the_fastest_node_takes_four_times_the_steps_of_the_slowest() -> None:
    out = train_ranks(4, lambda: AsyncDiLoCoStrategy(H=4, optim_spec=SGD), 12, network=SPEEDS)
    summary = out[0]["strategy"].run_summary()
    assert summary["steps"] == [3, 3, 6, 12]
    # every node ends with the server's parameters
    for rank in range(1, 4):
        for x, y in zip(out[0]["params"], out[rank]["params"], strict=True):
            assert torch.equal(x, y)


def test_async_runs_refuse_measured_compute_before_any_process_starts() -> None:
    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(ValueError, match="modelled compute.*compute='measured'"):
        trainer.fit(AsyncDiLoCoStrategy(H=2), num_nodes=2, max_steps=4, network=Network(1e9, 0.01, compute="measured"))


def test_fedbuff_refuses_more_concurrent_clients_than_nodes_naming_both() -> None:
    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(ValueError, match="concurrency=5 is more than num_nodes=3"):
        trainer.fit(FedBuffStrategy(concurrency=5), num_nodes=3, max_steps=4, network=SPEEDS)


@pytest.mark.parametrize("bad", [{"H": 0}, {"outer_momentum": 1.0}, {"dn_period": 0}, {"dn_c": -1.0}])
def test_async_diloco_names_a_bad_argument(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        AsyncDiLoCoStrategy(**bad)


#: Columns measured on this machine; every other column is simulated and must match exactly.
MEASURED = ("wall_time", "comm_time", "peak_memory")

LAYOUT_STRATEGIES = {
    "async_diloco": lambda: AsyncDiLoCoStrategy(H=4, outer_momentum=0.5, optim_spec=SGD),
    "fedbuff": lambda: FedBuffStrategy(local_steps=2, buffer_size=2, concurrency=3, optim_spec=SGD),
    "halos": lambda: HALoSStrategy(H=4, accumulation=2, lps_momentum=0.5, optim_spec=SGD),
    "decoupled_diloco": lambda: DecoupledDiLoCoStrategy(H=4, fragments=2, quorum=2, optim_spec=SGD),
}
#: The same speeds, node 1 away from 3 s to 6 s (Decoupled DiLoCo follows the trace).
AWAY = Network(
    1e9, 0.01, compute=1.0, compute_slowdown=(1.0, 1.0, 0.5, 0.25),
    availability=[{"time": 3.0, "node": 1, "available": 0}, {"time": 6.0, "node": 1, "available": 1}],
)  # fmt: skip
#: The network of each strategy's layout and resume runs.
NETWORKS = {"halos": REGIONS, "decoupled_diloco": AWAY}


def _params_rows_summary(
    strategy: Any, num_nodes: int, examples: int, network: Network, steps: int, **kw: Any
) -> tuple[list[torch.Tensor], list[dict[str, Any]], dict[str, Any]]:
    """A run of ``strategy`` (TinyNet, regression data, batch 8, no validation): its final
    parameters, its metric rows less the measured columns, and its summary."""
    trainer = Trainer(TinyNet(), regression_data(examples))
    model = trainer.fit(
        strategy,
        num_nodes=num_nodes,
        max_steps=steps,
        batch_size=8,
        network=network,
        logger=False,
        progress=False,
        val_size=0,
        **kw,
    )
    rows = [{c: v for c, v in r.items() if c not in MEASURED} for r in trainer.history]
    return [p.detach().clone() for p in model.parameters()], rows, trainer.result["summary"]


def _fit(name: str, workers: int) -> tuple[list[torch.Tensor], list[dict[str, Any]], dict[str, Any]]:
    network = NETWORKS.get(name, SPEEDS)
    return _params_rows_summary(LAYOUT_STRATEGIES[name](), 4, 4 * 8 * 40, network, 24, workers=workers, log_interval=4)


@pytest.mark.procs
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(LAYOUT_STRATEGIES))
def test_processes_and_virtual_nodes_on_one_and_two_workers_run_the_same_schedule_and_values(name: str) -> None:
    try:
        runs = {w: _fit(name, w) for w in (4, 1, 2)}  # one process per node; virtual nodes
    finally:
        exogym.shutdown()
    params, rows, summary = runs[4]
    assert summary["updates"] > 0 and rows
    losses = ("train_loss", "val_loss", "val_loss_local", "val_loss_global")
    for w in (1, 2):
        assert runs[w][2] == summary  # every node's steps, the staleness of every update
        # bytes and simulated times: equal in every row; losses up to float summation order (a
        # merge of several learners sums in the layout's order)
        assert [{c: v for c, v in r.items() if c not in losses} for r in runs[w][1]] == [
            {c: v for c, v in r.items() if c not in losses} for r in rows
        ]
        for got, want in zip(runs[w][1], rows, strict=True):
            assert {c: got[c] for c in losses if c in got} == pytest.approx(
                {c: want[c] for c in losses if c in want}, rel=1e-6
            )
        for x, y in zip(runs[w][0], params, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


def _pending_updates(state: Any, key: str = "pending") -> int:
    """Updates in flight held in a node file's state (the server module's ``pending``; HALoS's
    pushes between its servers: ``region_push``; Decoupled DiLoCo's contributions: ``outbox``)."""
    if isinstance(state, dict):
        own = len(state[key]) if isinstance(state.get(key), dict) else 0
        return own + sum(_pending_updates(v, key) for k, v in state.items() if k != key)
    if isinstance(state, (list, tuple)):
        return sum(_pending_updates(v, key) for v in state)
    return 0


#: Nodes at different paces (no DyLU): pushes are in flight across the checkpoint at step 8.
RESUMED = {
    "async_diloco": lambda: AsyncDiLoCoStrategy(H=4, outer_momentum=0.5, dylu=False, optim_spec=SGD),
    "fedbuff": LAYOUT_STRATEGIES["fedbuff"],
    "halos": lambda: HALoSStrategy(H=4, accumulation=1, lps_momentum=0.5, dylu=False, optim_spec=SGD),
    "decoupled_diloco": LAYOUT_STRATEGIES["decoupled_diloco"],
    "decoupled_diloco_cgad": lambda: DecoupledDiLoCoStrategy(
        H=4, fragments=2, quorum=2, outer="cgad", outer_lr=0.05, optim_spec=SGD
    ),
}


@pytest.mark.procs
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(RESUMED))
def test_a_run_checkpointed_with_updates_in_flight_resumes_bit_identically(name: str, tmp_path) -> None:
    # 0.4 s each way to the server, steps of 0.25-1 s: pushes are in flight across step 8
    net = Network(1e9, 0.4, compute=1.0, compute_slowdown=(1.0, 1.0, 0.5, 0.25))
    if name == "halos":  # 0.4 s to the regional servers, 1.2 s more between them and the global one
        links = {("a", "a"): Link(1e9, 0.4), ("b", "b"): Link(1e9, 0.4), ("a", "b"): Link(1e9, 1.6)}
        net = Network.regions(
            {"a": [0, 1], "b": [2, 3]}, links=links, compute=1.0, compute_slowdown=(1.0, 1.0, 0.5, 0.25)
        )

    def fit(steps: int, **kw: Any) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
        return _params_rows_summary(RESUMED[name](), 4, 1024, net, steps, log_interval=2, **kw)[:2]

    try:
        whole, whole_rows = fit(16)
        fit(8, checkpoint_dir=str(tmp_path))  # ends with a checkpoint at 8, then drains its own run
        files = sorted((tmp_path / "step-00000008").glob("node-*.pt"))
        key = "outbox" if name.startswith("decoupled_diloco") else "pending"  # a learner's contributions not merged yet
        assert sum(_pending_updates(torch.load(f, weights_only=True), key) for f in files) > 0
        if name == "halos":  # a regional server's push to the global one is in flight too
            assert sum(_pending_updates(torch.load(f, weights_only=True), "region_push") for f in files) > 0
        resumed, resumed_rows = fit(16, resume_from=str(tmp_path))
    finally:
        exogym.shutdown()
    assert all(torch.equal(x, y) for x, y in zip(whole, resumed, strict=True))
    assert resumed_rows == whole_rows


@pytest.mark.timeout(240)
@pytest.mark.parametrize("at", [40, 73])
def test_sleeping_fedbuff_clients_resumed_mid_run_make_every_call_they_sat_out_and_end_bit_identically(
    at: int, tmp_path
) -> None:
    # 12 clients, 3 at a time, on one worker: most of them sleep across the checkpoint, through
    # ticks where they only sit others' transfers out (calls a sleep makes at its next tick)
    def fit(steps: int, **kw: Any) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
        strategy = FedBuffStrategy(local_steps=3, buffer_size=2, concurrency=3, optim_spec=SGD)
        run = _params_rows_summary(strategy, 12, 12 * 8 * 60, SEVEN_SPEEDS, steps, log_interval=1, workers=1, **kw)
        return run[:2]

    try:
        whole, whole_rows = fit(150)
        fit(at, checkpoint_dir=str(tmp_path))
        resumed, resumed_rows = fit(150, resume_from=str(tmp_path))
    finally:
        exogym.shutdown()
    assert all(torch.equal(x, y) for x, y in zip(whole, resumed, strict=True))
    assert resumed_rows == whole_rows and len(whole_rows) == 150


def _clients(rank: int, num_nodes: int, train: bool) -> Any:
    """Client ``rank``'s 16 examples (drawn with its own seed): 1,000 clients share 2,048."""
    data = regression_data(2048)
    idx = torch.randint(0, len(data), (16,), generator=torch.Generator().manual_seed(rank))
    return torch.utils.data.Subset(data, idx.tolist())


@pytest.mark.procs
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fedbuff_on_1000_virtual_clients_runs_the_same_schedule_and_values_on_one_and_two_workers() -> None:
    net = Network(1e9, 0.01, compute=0.01, compute_slowdown=tuple(1.0 + (r % 7) * 0.37 for r in range(1000)))

    def run(workers: int) -> tuple[list[torch.Tensor], dict[str, Any]]:
        trainer = Trainer(TinyNet(), _clients)
        model = trainer.fit(
            FedBuffStrategy(local_steps=2, buffer_size=4, concurrency=20, optim_spec=SGD),
            num_nodes=1000,
            workers=workers,
            max_steps=30,
            batch_size=8,
            network=net,
            logger=False,
            progress=False,
            val_size=0,
            log_interval=10,
        )
        return [p.detach().clone() for p in model.parameters()], trainer.result["summary"]

    try:
        one, two = run(1), run(2)
    finally:
        exogym.shutdown()
    assert one[1] == two[1] and one[1]["updates"] >= 20  # the schedule: exactly the same
    assert sum(s > 0 for s in one[1]["steps"]) > 20  # more clients than the concurrency took part
    # one worker computes with two intra-op threads, two workers with one each: the values agree
    # up to float summation order, as a synchronous run's do
    for x, y in zip(one[0], two[0], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


@pytest.mark.procs
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_compare_of_the_four_asynchronous_presets_runs_one_schedule_on_processes_and_one_or_two_workers(
    tmp_path,
) -> None:
    from exogym.cli.compare import compare

    def run(workers: int):
        return compare(
            "digits", ["async_diloco", "fedbuff", "halos", "decoupled_diloco"], nodes=4, steps=24, batch_size=8,
            H=4, network=REGIONS, compute=0.05, out_dir=str(tmp_path / f"w{workers}"), progress=False, val_size=64,
            workers=workers, raise_on_failure=True,
        )  # fmt: skip

    try:
        runs = {w: run(w) for w in (4, 1, 2)}  # one process per node; virtual nodes on 1 and 2 workers
    finally:
        exogym.shutdown()
    schedule = ("strategy", "sim_time", "bytes_sent_per_node", "utilisation", "steps", "staleness", "staleness_max")
    want = [{c: row.get(c) for c in schedule} for row in runs[4].summary]
    assert [row["strategy"] for row in want] == ["async_diloco", "fedbuff", "halos", "decoupled_diloco"]
    for w in (1, 2):
        assert [{c: row.get(c) for c in schedule} for row in runs[w].summary] == want
        for got, ref in zip(runs[w].summary, runs[4].summary, strict=True):
            assert got["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-5)  # up to float summation order


def test_a_fedbuff_client_served_before_the_first_step_and_reached_after_it_starts_from_the_initial_state() -> None:
    # region b is 0.3 s away from the server: its clients' first state arrives after region a's
    # clients took their first steps
    out = train_ranks(
        4, lambda: FedBuffStrategy(local_steps=2, buffer_size=1, concurrency=4, optim_spec=SGD), 12,
        dataset=regression_data(4 * 8 * 12), network=REGIONS,
    )  # fmt: skip
    tl = out[0]["strategy"].server.timeline
    late = [ev for ev in tl.after[0] if ev.kind == "deliver"]
    assert late and all(ev.rank in (2, 3) for ev in late)
    assert tl.steps[2] > 0 and tl.steps[3] > 0


#: Twelve clients of seven speeds (most ticks are some group's step end and concern few clients).
SEVEN_SPEEDS = Network(1e9, 0.01, compute=0.01, compute_slowdown=tuple(1.0 + (r % 7) * 0.37 for r in range(12)))


def _fedbuff_12(workers: int | None = None, **strategy_kwargs: Any) -> dict[int, dict[str, Any]]:
    return train_ranks(
        12,
        lambda: FedBuffStrategy(local_steps=3, buffer_size=2, concurrency=3, optim_spec=SGD, **strategy_kwargs),
        150,
        dataset=regression_data(12 * 8 * 60),
        network=SEVEN_SPEEDS,
        workers=workers,
    )


def test_a_server_module_is_due_for_a_node_exactly_at_the_ticks_whose_events_concern_it() -> None:
    # from the timeline by hand: the first tick; ticks with a receive (every replica applies the
    # update) or a serve from a node that holds the server; ticks with the node's own capture,
    # deliver or serve
    out = _fedbuff_12()
    tl = out[0]["strategy"].server.timeline
    due = []
    for rank in range(12):
        module = out[rank]["strategy"].server
        expected = {0} | {
            t
            for t, events in enumerate(tl.after)
            for ev in events
            if ev.kind == "receive" or (ev.kind == "serve" and ev.source >= 0) or ev.rank == rank
        }
        due.append({t for t in range(150) if module.is_due(t)})
        assert due[-1] == expected, rank
    assert len({frozenset(s) for s in due}) > 1 and all(len(s) < 100 for s in due)  # not vacuous


WARMUP = {"lr_scheduler": "cosine", "warmup_steps": 20}


@pytest.mark.parametrize(("workers", "schedule"), [(None, {}), (2, {}), (2, WARMUP)])
def test_idle_fedbuff_clients_change_no_parameter_charge_or_row_whether_they_sit_ticks_out_at_once_or_one_by_one(
    monkeypatch: pytest.MonkeyPatch, workers: int | None, schedule: dict[str, Any]
) -> None:
    # the plan from the statements' wake-up ticks, the plan asking tick by tick (statements
    # without them), no sleep through several ticks at all, and neither the sleeps nor the
    # idle spans of a client that follows the server reaching past one tick: the same run
    from communicators.server import ServerCommunicator
    from exogym.runtime.schedule import NodeSchedule

    sleeps: list[int] = []
    original = NodeSchedule.idle_span_ends

    def counted(self: NodeSchedule, step: int, stop: int, read_at: int) -> list[int]:
        ends = original(self, step, stop, read_at)
        sleeps.append(len(ends))
        return ends

    monkeypatch.setattr(NodeSchedule, "idle_span_ends", counted)
    at_once = _fedbuff_12(workers, **schedule)
    assert max(sleeps) > 30  # some client slept through more than 30 ticks in one call
    stated = ServerCommunicator.participation
    monkeypatch.setattr(
        ServerCommunicator,
        "participation",
        lambda self, *a: None if (st := stated(self, *a)) is None else dataclasses.replace(st, wakes=None, due=None),
    )
    sleeps.clear()
    tick_by_tick = _fedbuff_12(workers, **schedule)
    assert max(sleeps) > 30
    monkeypatch.setattr(NodeSchedule, "idle_span_ends", lambda self, step, stop, read_at: [])
    no_sleep = _fedbuff_12(workers, **schedule)
    spans: list[int] = []
    quiet = NodeSchedule.quiet_through

    def quiet_counted(self: NodeSchedule, step: int, n: int, stop: int) -> int:
        spans.append(quiet(self, step, n, stop))
        return spans[-1]

    monkeypatch.setattr(NodeSchedule, "quiet_through", quiet_counted)
    quiet_spans = _fedbuff_12(workers, **schedule)
    if schedule:  # the rows give each tick's learning rate: a span is not extended
        assert not spans
    else:  # a following client sat several ticks out in one span
        assert max(spans) > 3
    monkeypatch.setattr(NodeSchedule, "quiet_through", lambda self, step, n, stop: n)
    tick_by_tick_idle = _fedbuff_12(workers, **schedule)
    clock = ("wall_time", "comm_time", "peak_memory")  # measured, not modelled
    for other in (tick_by_tick, no_sleep, quiet_spans, tick_by_tick_idle):
        for rank in range(12):
            a, b = at_once[rank], other[rank]
            assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"], strict=True))
            # the same charges in the same order (a span closes one sample for all its steps;
            # the rows below say which step each charge belongs to)
            assert [r for s in a["records"] for r in s] == [r for s in b["records"] for r in s]
        rows = [
            [{k: v for k, v in r.items() if k not in clock} for r in o[0]["node"].history] for o in (at_once, other)
        ]
        assert rows[0] == rows[1] and rows[0]


def _only_sits_out(module, rank: int, tick: int) -> bool:
    """Whether ``rank`` (not holding the server) only sits out others' transfers at ``tick``:
    some receive or served-by-a-holder event, no other event every node acts at, none naming it."""
    events = module.timeline.after[tick] if tick < len(module.timeline.after) else []
    shared = [e for e in events if e.kind == "receive" or (e.kind == "serve" and e.source >= 0)]
    others = [e for e in events if e.kind not in ("receive", "serve", "capture", "deliver")]
    names = any(rank in (e.rank, e.source) for e in events)
    return tick > 0 and not module.holding and bool(shared) and not others and not names


def test_the_due_ticks_a_statement_gives_are_the_is_due_ticks_but_those_only_sat_out_before_the_last() -> None:
    # every rank and random ranges of ticks (past the run's end too): Participation.due(rank,
    # start, stop) lists the ticks in [start, stop) at which that rank's module says is_due, less
    # those where a node that does not hold the server only sits out others' transfers (the
    # module makes those calls at the next tick listed), the last of the range always listed
    out = _fedbuff_12()
    gen = torch.Generator().manual_seed(1)
    seen = skipped = 0
    for rank in range(12):
        module = out[rank]["strategy"].server
        st = module.participation(5, 12, 0)
        assert st is not None and st.due is not None
        for _ in range(40):
            start = int(torch.randint(0, 150, (), generator=gen))
            stop = int(torch.randint(start, 153, (), generator=gen))
            is_due = [t for t in range(start, stop) if module.is_due(t)]
            expected = [t for t in is_due[:-1] if not _only_sits_out(module, rank, t)] + is_due[-1:]
            assert list(st.due(rank, start, stop)) == expected, (rank, start, stop)
            seen += len(expected)
            skipped += len(is_due) - len(expected)
    assert seen > 500 and skipped > 100  # not vacuous


def test_a_sleep_and_a_quiet_span_planned_from_the_wake_up_ticks_equal_those_asked_tick_by_tick() -> None:
    # every rank, start tick, stop and validation step: NodeSchedule's plan of a sleep and its
    # quiet span from statements that say when the node wakes equal those from the same
    # statements without
    from communicators.server import ServerCommunicator
    from exogym.runtime.schedule import NodeSchedule

    out = _fedbuff_12()
    gen = torch.Generator().manual_seed(0)
    longest = quietest = 0
    for rank in range(12):
        strategy = out[rank]["strategy"]
        module = strategy.server
        stated = NodeSchedule(strategy, rank, 12, 42, 150)
        asked = NodeSchedule(strategy, rank, 12, 42, 150)
        asked.leaves = [_WithoutWakes(module)]
        assert isinstance(module, ServerCommunicator)
        for step in range(150):
            if stated.idle_steps(step) == 0:
                continue
            for _ in range(3):
                stop = int(torch.randint(step + 1, 152, (), generator=gen))
                read_at = int(torch.randint(step, 152, (), generator=gen)) if step % 2 else 2**62
                plan = stated.idle_span_ends(step, stop, read_at)
                assert plan == asked.idle_span_ends(step, stop, read_at), (rank, step, stop, read_at)
                longest = max(longest, len(plan))
                quiet = stated.quiet_through(step, stated.idle_steps(step), stop)
                assert quiet == asked.quiet_through(step, asked.idle_steps(step), stop), (rank, step, stop)
                quietest = max(quietest, quiet)
    assert longest > 30 and quietest > 4  # not vacuous


class _WithoutWakes:
    """A server module's statements without their wake-up ticks (otherwise the module itself)."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def participation(self, step: int, num_nodes: int, seed: int) -> Any:
        st = self.module.participation(step, num_nodes, seed)
        return None if st is None else dataclasses.replace(st, wakes=None, due=None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)


def test_fedbuff_only_the_first_client_drawn_keeps_a_copy_of_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    # at the end of the run, before the final state is handed out: the first client drawn (the
    # keeper) holds the server's state and buffer; every other client holds the one shared
    # stand-in, not a copy
    from communicators.fedbuff import draw_client
    from communicators.server import ServerCommunicator, is_unheld

    kept: dict[int, bool] = {}  # rank -> holds a copy of its own
    finish = ServerCommunicator.finish

    def recorded(self: ServerCommunicator) -> None:
        kept[self.ctx.rank] = not is_unheld(self.server) and not is_unheld(self.buffer)
        finish(self)

    monkeypatch.setattr(ServerCommunicator, "finish", recorded)
    out = _fedbuff_12()
    first = draw_client(0, 0, list(range(12)))  # the run's seed, its first draw among all clients
    assert kept == {r: r == first for r in range(12)}
    for rank in range(12):  # the run's result: every node ends with the server's state
        assert all(torch.equal(x, y) for x, y in zip(out[0]["params"], out[rank]["params"], strict=True))


def test_fedbuff_timeline_serves_every_later_draw_from_the_keeper_and_wakes_only_named_nodes() -> None:
    # by hand from the events: the clients drawn at the start start from the initial state (no
    # source); every later draw is served from the keeper (unless it is the keeper); the nodes
    # taking part after a tick are the keeper and those its events name
    out = _fedbuff_12()
    tl = out[0]["strategy"].server.timeline
    (keeper,) = tl.holders
    assert all(ev.source == -1 for ev in tl.before)
    serves = [ev for events in tl.after for ev in events if ev.kind == "serve"]
    assert len(serves) > 10
    assert all(ev.source == (-1 if ev.rank == keeper else keeper) for ev in serves)
    for t, events in enumerate(tl.after):
        named = {keeper} | {ev.rank for ev in events} | {ev.source for ev in events if ev.source >= 0}
        if t == 0:
            named |= {ev.rank for ev in tl.before}
        assert tl.following[t] == named, t
    assert sum(len(f) == 1 for f in tl.following) > 50  # most ticks concern the keeper alone


def test_consecutive_serves_from_one_holder_are_handled_as_one_collective() -> None:
    from communicators.server import _handled_together
    from exogym.core.timeline import Event

    r1, r2 = Event(1.0, "receive", 3), Event(1.0, "receive", 4)
    s1, s2, s3 = Event(1.0, "serve", 5, source=0), Event(1.0, "serve", 6, source=0), Event(1.0, "serve", 7, source=0)
    own, other = Event(1.0, "serve", 8), Event(1.0, "serve", 9, source=1)
    d = Event(1.0, "deliver", 2)
    events = [r1, r2, s1, s2, d, s3, own, other]
    assert _handled_together(events, True) == [[r1], [r2], [s1, s2], [d], [s3], [own], [other]]
    assert _handled_together(events, False) == [[e] for e in events]
    # FedBuff's timeline of 200 clients of seven speeds, 20 at a time: a tick of k receives then
    # k serves is k + 1 collectives for a client that sits them out (the values of such runs are
    # those of the references, tests above)
    from communicators.fedbuff import FedBuffCommunicator, FedBuffTiming
    from communicators.server import _Index

    seconds = [0.01 * (1.0 + (r % 7) * 0.37) for r in range(200)]
    tl = FedBuffTiming(seconds, [0.01] * 200, 600, 20, 10, 10, 42).run()
    module = FedBuffCommunicator.__new__(FedBuffCommunicator)
    ix = _Index(tl, module.concerns_all, True, True)
    merged = 0
    for t, evs in enumerate(tl.after):
        kinds = [e.kind for e in evs if e.kind in ("receive", "serve")]
        k = len(kinds) // 2
        if k and kinds == ["receive"] * k + ["serve"] * k and all(e.source >= 0 for e in evs if e.kind == "serve"):
            assert ix.absent[t] == k + 1, t
            merged += k > 1
    assert merged > 3  # not vacuous
