"""A simulated clock per node: the replay of the nodes' events against hand computations, and
real runs whose islands and speeds give the nodes different clocks, and whose sampled clients
are charged only the rounds that draw them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from communicators.fedavg import drawn_clients
from exogym import Trainer
from exogym.clocks import NodeClocks, events, format_table, meeting_keys
from exogym.core.comm.flat import dtype_buckets
from exogym.core.comm.ledger import CollectiveRecord
from exogym.core.comm.network import Network
from exogym.core.pipeline import CommunicateOptimizeStrategy, Communicator, NodeContext
from exogym.strategy import FedAvgStrategy, SimpleReduceStrategy
from tests.helpers import FIT_DEFAULTS, TinyNet, regression_data


def _ev(step: int, compute: float, key: float = 0.0, comm: float = 0.0) -> list[float]:
    return [float(step), compute, key, comm]


def _table(per_node: list[list[list[float]]]) -> np.ndarray:
    """Nodes' event lists, padded with zero rows as the gather pads them."""
    longest = max(len(e) for e in per_node)
    out = np.zeros((len(per_node), longest, 4))
    for r, evs in enumerate(per_node):
        out[r, : len(evs)] = evs
    return out


def test_two_islands_of_unequal_speed_keep_their_own_clocks_and_the_run_takes_the_slower_ones() -> None:
    # Islands {0, 1} (1 s of compute a step) and {2, 3} (2 s), each meeting alone for 0.5 s, 3 steps.
    A, B = 11.0, 22.0
    clocks = NodeClocks(4)
    table = _table([[_ev(s, c, k, 0.5) for s in (1, 2, 3)] for c, k in ((1, A), (1, A), (2, B), (2, B))])
    times = clocks.replay(table)
    assert clocks.clock.tolist() == [4.5, 4.5, 7.5, 7.5]  # 3 * (1 + 0.5), 3 * (2 + 0.5)
    assert clocks.wait.tolist() == [0.0] * 4
    assert times[3] == (7.5, 1.5)  # the latest clock, and that node's 3 * 0.5 s of communication
    assert times[1] == (2.5, 0.5)


@pytest.mark.parametrize("seed", range(6))
def test_steps_where_no_one_meets_move_each_clock_by_its_own_compute_then_communication(seed: int) -> None:
    # An asynchronous run's ticks: nodes compute and transfer alone (no meeting keys). Reference:
    # per node, step by step, clock += compute, then += communication; after each step the
    # latest clock and the communication of the first node (by rank) that holds it.
    rng = np.random.default_rng(seed)
    nodes, steps = 5, 30
    per_node = []
    for _ in range(nodes):
        at = sorted(rng.choice(np.arange(1, steps + 1), size=int(rng.integers(1, 12)), replace=False).tolist())
        per_node.append([_ev(s, float(rng.choice([0.0, 0.3, 0.7])), 0.0, float(rng.choice([0.0, 0.125]))) for s in at])
    clocks = NodeClocks(nodes)
    times = clocks.replay(_table(per_node))
    clock, compute, comm = [0.0] * nodes, [0.0] * nodes, [0.0] * nodes
    expected = {}
    for s in range(1, steps + 1):
        named = False
        for r, evs in enumerate(per_node):
            for step, c, _, m in evs:
                if step == s:
                    clock[r] = (clock[r] + c) + m
                    compute[r] += c
                    comm[r] += m
                    named = True
        if named:
            last = max(range(nodes), key=lambda r: (clock[r], -r))
            expected[s] = (clock[last], comm[last])
    assert clocks.clock.tolist() == clock and clocks.compute.tolist() == compute and clocks.comm.tolist() == comm
    assert clocks.wait.tolist() == [0.0] * nodes
    assert times == expected


def test_a_meeting_waits_for_its_last_participant() -> None:
    # Nodes 0 and 1 meet every step; node 0 computes 1 s, node 1 3 s; communication 0.5 s.
    clocks = NodeClocks(2)
    clocks.replay(_table([[_ev(s, 1.0, 5.0, 0.5) for s in (1, 2)], [_ev(s, 3.0, 5.0, 0.5) for s in (1, 2)]]))
    assert clocks.clock.tolist() == [7.0, 7.0]  # 2 * (3 + 0.5)
    assert clocks.wait.tolist() == [4.0, 0.0]  # node 0 waits 2 s a step
    table = clocks.table()
    assert table[0]["utilisation"] == pytest.approx(2 / 7) and table[1]["utilisation"] == pytest.approx(6 / 7)
    assert "node" in format_table(table)


def test_a_node_in_two_groups_joins_them_into_one_meeting() -> None:
    # A FedAvg round: node 0 sends with node 1 (key 1) and broadcasts to node 2 (key 2), which
    # trained nothing: all three meet; node 3 meets no one and runs on.
    clocks = NodeClocks(4)
    table = _table(
        [
            [_ev(1, 1.0, 1.0, 0.25), _ev(1, 0.0, 2.0, 0.0)],
            [_ev(1, 2.0, 1.0, 0.25)],
            [_ev(1, 0.0, 2.0, 0.25)],
            [_ev(1, 0.5)],
        ]
    )
    clocks.replay(table)
    assert clocks.clock.tolist() == [2.25, 2.25, 2.25, 0.5]
    assert clocks.wait.tolist() == [1.0, 0.0, 2.0, 0.0]


def test_events_mark_compute_meetings_row_ends_and_the_last_step_only() -> None:
    compute = np.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    comm = np.array([0.0, 0.0, 0.0, 0.0, 0.3, 0.0])
    keys = np.array([0.0, 0.0, 0.0, 0.0, 9.0, 0.0])
    # steps done 11..16, a train row every 4 steps (12, 16), the run ends at 100
    got = events(11, compute, comm, keys, 4, 100, {4: (7.0,)})
    assert got.tolist() == [
        [12.0, 0.0, 0.0, 0.0],  # row end
        [13.0, 1.0, 0.0, 0.0],  # compute
        [15.0, 0.0, 9.0, 0.3],  # meeting
        [16.0, 0.0, 0.0, 0.0],  # row end and last pending step
        [15.0, 0.0, 7.0, 0.0],  # the step's second group
    ]


def test_meeting_keys_name_each_group_of_two_or_more_once_and_agree_across_nodes() -> None:
    def rec(members: tuple[int, ...] | None, size: int) -> CollectiveRecord:
        return CollectiveRecord("all_reduce", size, 8, 0.0, 0.0, members=members)

    pair, trio = (0, 1), (0, 1, 2)
    assert meeting_keys([]) == () and meeting_keys([rec((3,), 1)]) == ()
    one = meeting_keys([rec(pair, 2), rec(pair, 2)])
    assert len(one) == 1 and one == meeting_keys([rec((0, 1), 2)])  # equal tuples, not only one object
    assert len(meeting_keys([rec(pair, 2), rec(trio, 3)])) == 2
    assert meeting_keys([rec(None, 3)]) == meeting_keys([rec(None, 3)]) != meeting_keys([rec(None, 4)])
    assert all(k == float(int(k)) and 0 < k < 2**53 for k in meeting_keys([rec(trio, 3)]))  # exact in a float64


class FixedIslands(Communicator):
    """Test module: every step, average the parameters within fixed islands."""

    space = "param"

    def __init__(self, islands: list[list[int]]) -> None:
        super().__init__()
        self.islands = islands

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        self.buckets = dtype_buckets([p for p in ctx.model.parameters() if p.requires_grad])

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        for bucket in self.buckets:
            flat = bucket.buffer.pack(bucket.tensors)
            self.ctx.comm.all_reduce(flat, op="mean", groups=self.islands, tag="island")
            bucket.buffer.unpack(bucket.tensors)


def _fit(strategy, network: Network, nodes: int = 4, steps: int = 6, **kw) -> Trainer:
    trainer = Trainer(TinyNet(), regression_data(n=nodes * steps * 4 * 2))
    trainer.fit(strategy, num_nodes=nodes, max_steps=steps, batch_size=4, network=network, log_interval=3, **kw)
    return trainer


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_islands_of_unequal_speed_finish_at_their_own_times_in_a_real_run() -> None:
    # backward_share=0: each step waits for its whole all-reduce after its compute
    net = Network(1e9, 1e-3, compute=0.01, compute_slowdown=(1, 1, 2, 2), backward_share=0.0)
    islands = [[0, 1], [2, 3]]
    trainer = _fit(CommunicateOptimizeStrategy([FixedIslands(islands)], optim_spec="sgd"), net, **FIT_DEFAULTS)
    payload = sum(p.numel() * 4 for p in TinyNet().parameters())
    per_step = net.collective_time("all_reduce", 2, payload)
    fast, slow = 6 * (0.01 + per_step), 6 * (0.02 + per_step)
    clocks = [n["clock"] for n in trainer.result["nodes"]]
    assert clocks == pytest.approx([fast, fast, slow, slow], rel=1e-12)
    assert [n["wait"] for n in trainer.result["nodes"]] == [0.0] * 4
    last = trainer.history[-1]
    assert last["sim_time"] == pytest.approx(slow, rel=1e-12)
    assert last["sim_comm_time"] == pytest.approx(6 * per_step, rel=1e-12)
    assert last["compute_time"] == pytest.approx(6 * 0.02, rel=1e-9)


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_ddp_on_nodes_of_unequal_speed_waits_for_the_slowest_every_step() -> None:
    # backward_share=0: each step waits for its whole all-reduce after the slowest compute
    net = Network(1e9, 1e-3, compute=0.01, compute_slowdown=(1, 3), backward_share=0.0)
    trainer = _fit(SimpleReduceStrategy(optim_spec="sgd"), net, nodes=2, **FIT_DEFAULTS)
    payload = sum(p.numel() * 4 for p in TinyNet().parameters())
    step = 0.03 + net.collective_time("all_reduce", 2, payload)
    fast, slow = trainer.result["nodes"]
    assert fast["clock"] == pytest.approx(6 * step) and slow["clock"] == pytest.approx(6 * step)
    assert fast["wait"] == pytest.approx(6 * 0.02) and slow["wait"] == 0.0
    assert fast["utilisation"] == pytest.approx(0.06 / (6 * step))
    assert trainer.history[-1]["sim_time"] == pytest.approx(6 * step)


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_a_client_never_sampled_has_no_clock_and_the_drawn_are_charged_their_rounds_compute() -> None:
    # Sampled FedAvg runs as a server: a round's drawn clients train H steps each and a client no
    # round draws is never built (no row in the per-node table, no steps). A drawn client's own
    # compute counts only in rounds it took part in; every clock ends at the run's end.
    net = Network(1e9, 1e-3, compute=0.01)
    trainer = _fit(FedAvgStrategy(H=3, client_sampling=0.5, optim_spec="sgd"), net, steps=6, **FIT_DEFAULTS)
    summary, nodes = trainer.result["summary"], trainer.result["nodes"]
    seed = trainer.result["config"].seed
    drawn = [drawn_clients(4, 0.5, seed, r) for r in range(2)]
    assert summary["rounds"] == 2
    assert [n["rank"] for n in nodes] == sorted({c for d in drawn for c in d})
    for client, steps in enumerate(summary["steps"]):
        assert steps == 3 * sum(client in d for d in drawn)  # whole rounds only; 0 if never drawn
    for n in nodes:
        assert n["compute"] == pytest.approx(0.01 * summary["steps"][n["rank"]])
        assert n["compute"] + n["comm"] + n["wait"] == pytest.approx(n["clock"])
        assert n["clock"] == summary["end_time"]
    assert sum(n["compute"] for n in nodes) == pytest.approx(2 * 2 * 0.03)  # 2 rounds x 2 drawn clients
    assert trainer.history[-1]["sim_time"] == pytest.approx(summary["end_time"])


def test_checkpointed_clocks_round_trip() -> None:
    clocks = NodeClocks(3)
    clocks.replay(_table([[_ev(1, 1.0, 3.0, 0.5)], [_ev(1, 2.0, 3.0, 0.5)], [_ev(1, 0.25)]]))
    again = NodeClocks(3)
    again.load_state_dict(clocks.state_dict())
    assert again.table() == clocks.table()
    assert torch.equal(torch.tensor(again.clock), torch.tensor([2.5, 2.5, 0.25], dtype=torch.float64))


def test_a_meeting_pays_the_bandwidth_of_the_trace_epoch_it_starts_in() -> None:
    # A trace halves the bandwidth at t = 2 s: the step's transfer takes 0.5 s before, 1 s after.
    # Node 0 arrives at 1 s, node 1 at 3 s: they meet at 3 s, in the second epoch, both paying 1 s.
    clocks = NodeClocks(2, changes=[2.0])
    table = np.array([[[1.0, 1.0, 4.0, 0.5, 1.0]], [[1.0, 3.0, 4.0, 0.5, 1.0]]])
    clocks.replay(table)
    assert clocks.clock.tolist() == [4.0, 4.0] and clocks.comm.tolist() == [1.0, 1.0]
    # Alone, node 0 would have started at 1 s and paid the first epoch's 0.5 s.
    alone = NodeClocks(2, changes=[2.0])
    alone.replay(np.array([[[1.0, 1.0, 0.0, 0.5, 1.0]], [[1.0, 3.0, 0.0, 0.5, 1.0]]]))
    assert alone.clock.tolist() == [1.5, 4.0]


def test_the_summary_line_gives_a_long_per_node_list_as_its_length_mean_and_range() -> None:
    from exogym.clocks import format_summary

    line = format_summary({"steps": [0] * 999 + [10], "utilisation": [0.5, 0.25], "updates": 3})
    assert line == "steps=[1000 values: mean 0.01, min 0, max 10], utilisation=[0.5, 0.25], updates=3"
