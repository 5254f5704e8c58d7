"""Virtual nodes: K nodes hosted by W < K worker processes behave as K processes do."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch import nn

from communicators.islands import draw_islands
from exogym import Trainer
from exogym.core.comm.network import Network
from exogym.core.communicator import Wrapper
from exogym.runtime.launch import NodeFailedError
from exogym.runtime.placement import Placement, block_of
from exogym.runtime.virtual import VirtualHub, VirtualNodeError
from exogym.strategy import (
    DeMoStrategy,
    DiLoCoStrategy,
    FedAvgStrategy,
    SimpleReduceStrategy,
    SPARTAStrategy,
)
from exogym.strategy.communicate import all_reduce
from tests.fake_world import train_ranks
from tests.helpers import FailOnRank, TinyNet, child_pids, regression_data

SGD = "sgd"


class DropoutNet(TinyNet):
    """TinyNet with dropout: each node's own random stream decides its masks."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.3)

    def forward(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self.fc2(self.drop(torch.tanh(self.fc1(x)))), y)


class InlineMeanStrategy(SimpleReduceStrategy):
    """A user strategy that calls ``all_reduce`` inline on every gradient (as in the original exo gym's examples)."""

    def step(self) -> None:
        for p in self.model.parameters():
            all_reduce(p.grad)
            p.grad /= self.num_nodes
        self.optim.step()
        self.scheduler is not None and self.scheduler.step()
        self.local_step += 1


STRATEGIES = {
    "ddp": lambda: SimpleReduceStrategy(optim_spec=SGD, lr=0.05),
    "fedavg_islands": lambda: FedAvgStrategy(H=2, island_size=3, optim_spec=SGD, lr=0.05),
    "diloco": lambda: DiLoCoStrategy(H=2),
    "sparta": lambda: SPARTAStrategy(p_sparta=0.3),
    "demo": lambda: DeMoStrategy(),
    "custom_inline_all_reduce": lambda: InlineMeanStrategy(optim_spec=SGD, lr=0.05),
}


def _final(strategy, workers: int, model: nn.Module) -> torch.Tensor:
    out = Trainer(model, regression_data(n=8 * 16 * 8)).fit(
        strategy,
        num_nodes=8,
        workers=workers,
        max_steps=8,
        batch_size=16,
        seed=3,
        logger=False,
        progress=False,
        val_size=0,
    )
    return torch.cat([p.detach().flatten() for p in out.parameters()])


@pytest.mark.procs
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_eight_virtual_nodes_on_1_2_4_workers_end_as_eight_processes(name: str) -> None:
    # Dropout in the model checks that every node keeps its own random stream.
    model = DropoutNet()
    reference = _final(STRATEGIES[name](), 8, model)
    for workers in (1, 2, 4):
        got = _final(STRATEGIES[name](), workers, model)
        # Only the order of float additions differs (local sums, then across workers).
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-6, msg=f"{name}, workers={workers}")
    assert child_pids() == []


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_metric_and_validation_rows_of_virtual_nodes_equal_those_of_one_process_per_node() -> None:
    # Virtual nodes other than rank 0 only contribute to the metrics and validation reductions
    # (they do not wait for the results): the rows must still be those of 6 processes. With a
    # constant compute model the simulated clocks are exact too.
    def rows(workers: int) -> list[dict]:
        trainer = Trainer(TinyNet(), regression_data(n=6 * 4 * 8), regression_data(n=48, seed=1))
        trainer.fit(
            FedAvgStrategy(H=2, island_size=3),
            num_nodes=6,
            workers=workers,
            max_steps=8,
            batch_size=4,
            val_interval=4,
            log_interval=2,
            seed=5,
            network=Network(1e9, 1e-3, compute=0.01),
            logger=False,
            progress=False,
        )
        return trainer.history

    exact = ("step", "examples", "bytes_sent", "bytes_received", "bytes_sent_per_step", "sim_comm_time", "sim_time")
    close = ("train_loss", "val_loss_local", "val_loss_global", "param_distance", "model_correlation")
    reference, virtual = rows(6), rows(2)
    assert [sorted(r) for r in virtual] == [sorted(r) for r in reference]
    assert sum("val_loss_global" in r for r in reference) == 3 and sum("train_loss" in r for r in reference) == 4
    for want, got in zip(reference, virtual, strict=True):
        assert {k: got[k] for k in exact if k in want} == {k: want[k] for k in exact if k in want}
        for k in close:
            if k in want:
                assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), k
    assert child_pids() == []


class _WatchIdleRounds(Wrapper):
    """Records, on a node idle in a round, its parameters around the round's communication and
    whether it sat that communication out (the runtime's sleep)."""

    def __init__(self, inner, owner: Recording) -> None:
        super().__init__(inner)
        self.owner = owner

    def communicate(self, step: int) -> None:
        owner, r = self.owner, step // self.inner.H
        idle = step not in owner.trained_steps
        if idle:
            owner.before_average[r] = owner._flat()
            if self.ctx.comm.is_sitting_out:
                owner.sat_out.add(r)
        super().communicate(step)
        if idle:
            owner.after_round[r] = owner._flat()


class Recording(FedAvgStrategy):
    """FedAvg that records, per round, whether the node trained, its parameters when the round
    starts and ends, and whether it sat the round's collective out."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.pipeline.modules[0] = _WatchIdleRounds(self.averaging, self)

    def _init_node(self, model, rank, num_nodes):
        super()._init_node(model, rank, num_nodes)
        self.trained_steps: list[int] = []
        self.at_start: dict[int, torch.Tensor] = {}
        self.before_average: dict[int, torch.Tensor] = {}
        self.after_round: dict[int, torch.Tensor] = {}
        self.sat_out: set[int] = set()

    def _flat(self) -> torch.Tensor:
        return torch.cat([p.detach().flatten() for p in self.model.parameters()]).clone()

    def step(self) -> None:
        self.trained_steps.append(self.local_step)
        step = self.local_step
        if step % self.averaging.H == 0:
            self.at_start[step // self.averaging.H] = self._flat()
        super().step()
        if (step + 1) % self.averaging.H == 0:
            self.after_round[step // self.averaging.H] = self._flat()


def _round_bytes_formula(k: int, island: int, seed: int, rnd: int, payload: int) -> dict[int, tuple]:
    """(sent, received) per node for one FedAvg round, from the ledger's formula: a ring
    all-reduce among each island's n members (2(n-1)/n * b each way)."""
    out = {}
    for members in draw_islands(k, island, seed, rnd):
        n = len(members)
        for r in members:
            out[r] = (2 * (n - 1) / n * payload,) * 2
    return out


def test_ledger_of_every_virtual_node_matches_the_ring_formula_for_islands_at_k100() -> None:
    k, island, seed, rounds = 100, 10, 2, 2
    out = train_ranks(
        k,
        lambda: FedAvgStrategy(H=1, island_size=island, optim_spec=SGD, lr=0.1),
        rounds,
        seed=seed,
        batch_size=2,
        workers=1,
    )
    payload = 4 * sum(p.numel() for p in TinyNet().parameters())
    for rnd in range(rounds):
        expected = _round_bytes_formula(k, island, seed, rnd, payload)
        for rank in range(k):
            records = out[rank]["records"][rnd]
            got = (sum(r.sent for r in records), sum(r.received for r in records))
            assert got == pytest.approx(expected[rank]), f"round {rnd}, node {rank}"


def test_virtual_nodes_calling_different_collectives_raise_naming_both() -> None:
    hub = VirtualHub(Placement(2, 1), 0, None, torch.device("cpu"), 0)

    def body(rank, transport):
        if rank == 0:
            transport.all_reduce(torch.ones(10), "sum")
        else:
            transport.all_gather(torch.ones(20))

    with pytest.raises(VirtualNodeError, match=r"node 0 called all_reduce\(10 .*node 1 called all_gather\(20") as info:
        hub.run(body)
    assert info.value.node_rank == 1 and info.value.error_type == "CollectiveMismatchError"


def test_a_virtual_node_that_finishes_while_another_waits_fails_the_run() -> None:
    hub = VirtualHub(Placement(3, 1), 0, None, torch.device("cpu"), 0)

    def body(rank, transport):
        if rank != 1:
            transport.barrier()

    with pytest.raises(
        VirtualNodeError, match=r"node\(s\) \[1\] finished the run while node\(s\) \[0, 2\] wait in barrier"
    ) as info:
        hub.run(body)
    assert info.value.error_type == "CollectiveMismatchError"


def test_the_last_virtual_node_finishing_while_others_wait_fails_instead_of_hanging() -> None:
    hub = VirtualHub(Placement(3, 1), 0, None, torch.device("cpu"), 0)

    def body(rank, transport):
        if rank != 2:
            transport.barrier()

    with pytest.raises(
        VirtualNodeError, match=r"node\(s\) \[2\] finished the run while node\(s\) \[0, 1\] wait in barrier"
    ):
        hub.run(body)


@pytest.mark.parametrize("groups", [None, [[0, 2], [1, 3]]])
def test_contributing_nodes_run_on_without_waiting_and_the_waiting_nodes_get_every_share(groups) -> None:
    # 4 nodes on 2 workers; node 0 waits for three sums, the others only contribute to them:
    # they never park at a collective (they hand the turn on only to let one through).
    # Expected: the plain sum of each group's values, written out.
    from exogym.core.comm.comm import NodeComm
    from tests.fake_world import run_ranks

    hubs = [VirtualHub(Placement(4, 2), w, None, torch.device("cpu"), 0) for w in range(2)]
    waited = _record_waits(hubs)
    events: list[tuple[str, int]] = []
    got: list[float] = []

    def node(rank, transport):
        comm = NodeComm(rank, 4, transport)
        for rnd in range(3):
            t = torch.full((2,), float(10**rank + rnd))
            if rank == 0:
                got.append(comm.all_reduce(t, "sum", groups=groups)[0].item())
                events.append(("result", rnd))
            else:
                comm.all_reduce_contribute(t, "sum", groups=groups)
        events.append(("done", rank))
        return rank

    def worker(w, outer):
        hubs[w].outer = outer.transport
        return hubs[w].run(node)

    run_ranks(2, worker)
    members = [0, 1, 2, 3] if groups is None else [0, 2]
    assert got == [sum(10**m + rnd for m in members) for rnd in range(3)]
    assert waited == {0}  # only node 0 ever waited for a result
    assert sorted(r for kind, r in events if kind == "done") == [0, 1, 2, 3]


@pytest.mark.timeout(60)
def test_hubs_sharing_a_process_swap_the_random_state_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two hubs of one process (workers on threads, as these tests run them) swapping torch's
    # process-wide random state at once can deadlock inside torch; each swap must run alone.
    import threading

    hubs = [VirtualHub(Placement(4, 2), w, None, torch.device("cpu"), 0) for w in range(2)]
    inside, most = [0], [0]
    count = threading.Lock()
    real_get, real_set = torch.get_rng_state, torch.set_rng_state

    def entered(real):
        def swap(*args):
            with count:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.002)  # (long enough for the other thread to enter too, unless kept out)
            try:
                return real(*args)
            finally:
                with count:
                    inside[0] -= 1

        return swap

    monkeypatch.setattr(torch, "get_rng_state", entered(real_get))
    monkeypatch.setattr(torch, "set_rng_state", entered(real_set))

    def swaps(hub: VirtualHub) -> None:
        for _ in range(20):
            hub._set_rng(hub._get_rng())

    threads = [threading.Thread(target=swaps, args=(h,)) for h in hubs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1


def _record_waits(hubs: list[VirtualHub]) -> set[int]:
    """The ranks that park at a collective of ``hubs`` (wait for it), filled as they run."""
    waited: set[int] = set()
    for hub in hubs:

        def parked(i: int, call: Any, hub: VirtualHub = hub, original: Any = hub.collective) -> Any:
            waited.add(hub.ranks[i])
            return original(i, call)

        hub.collective = parked  # type: ignore[method-assign]
    return waited


def test_all_reduce_contribute_outside_virtual_nodes_adds_the_share_and_rejects_mean() -> None:
    from tests.fake_world import run_ranks

    def body(rank, comm):
        t = torch.full((2,), float(rank + 1))
        if rank == 2:
            comm.all_reduce_contribute(t, "max")
            return None
        return comm.all_reduce(t, "max")[0].item()

    assert run_ranks(3, body)[:2] == [3.0, 3.0]
    with pytest.raises(ValueError, match="op must be one of sum, max, min, product"):
        run_ranks(1, lambda rank, comm: comm.all_reduce_contribute(torch.ones(1), "mean"))


@pytest.mark.parametrize("groups", [None, [[0, 1, 2], [3, 4, 5]], [[0, 3], [1, 4], [2, 5]]])
def test_gather_contributors_run_on_and_gathering_nodes_get_every_member_in_order_each_its_own_copy(groups) -> None:
    # 6 nodes on 2 workers (0-2, 3-5); nodes 0 and 1 gather each round, the others only
    # contribute and never park at a collective. Expected: each member's tensor in group order;
    # nodes 0 and 1 get tensors of their own (writing one leaves the other as it was).
    from exogym.core.comm.comm import NodeComm
    from tests.fake_world import run_ranks

    hubs = [VirtualHub(Placement(6, 2), w, None, torch.device("cpu"), 0) for w in range(2)]
    waited = _record_waits(hubs)
    events: list[tuple[str, int]] = []
    got: dict[tuple[int, int], torch.Tensor] = {}

    def node(rank, transport):
        comm = NodeComm(rank, 6, transport)
        for rnd in range(3):
            t = torch.tensor([float(rank), float(rnd)])
            if rank in (0, 1):
                got[(rank, rnd)] = comm.all_gather(t, groups=groups, charge=False)
                events.append(("result", rank))
            else:
                comm.all_gather_contribute(t, groups=groups)
        events.append(("done", rank))
        return rank

    def worker(w, outer):
        hubs[w].outer = outer.transport
        return hubs[w].run(node)

    run_ranks(2, worker)
    for rank in (0, 1):
        members = range(6) if groups is None else next(g for g in groups if rank in g)
        for rnd in range(3):
            assert got[(rank, rnd)].tolist() == [[float(m), float(rnd)] for m in members], (rank, rnd)
    assert waited == {0, 1}  # the contributors never waited for a result
    assert sorted(r for kind, r in events if kind == "done") == list(range(6))
    before = got[(1, 0)].clone()
    got[(0, 0)].zero_()
    assert torch.equal(got[(1, 0)], before)


def test_all_gather_contribute_outside_virtual_nodes_sends_the_share() -> None:
    from tests.fake_world import run_ranks

    def body(rank, comm):
        t = torch.full((2,), float(rank + 1))
        if rank == 2:
            comm.all_gather_contribute(t)
            return None
        return comm.all_gather(t, charge=False).tolist()

    assert run_ranks(3, body)[:2] == [[[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]] * 2


def test_a_node_that_contributes_to_many_collectives_waits_once_its_queue_is_full() -> None:
    # Node 1 contributes to 3 * MAX_QUEUED all-reduces that node 0 makes and node 2 contributes
    # to: node 1 runs while node 2 has not reached them, and its queue never holds more than
    # MAX_QUEUED calls (it parks when full); node 0 gets the three shares each time.
    from exogym.runtime.virtual import MAX_QUEUED

    hub = VirtualHub(Placement(3, 1), 0, None, torch.device("cpu"), 0)
    longest = [0]
    got = []

    def body(rank, transport):
        for i in range(3 * MAX_QUEUED):
            t = torch.full((1,), float(i))
            if rank == 0:
                transport.all_reduce(t, "sum")
                got.append(t.item())
            elif rank == 1:
                transport.all_reduce_contribute(t, "sum")
                longest[0] = max(longest[0], len(hub._queued[1]))
            else:
                transport.all_reduce_contribute(t, "sum")

    hub.run(body)
    assert got == [3.0 * i for i in range(3 * MAX_QUEUED)]
    assert longest[0] == MAX_QUEUED - 1  # parked at the MAX_QUEUED-th call instead of queueing it
    assert not any(hub._queued) and hub._empty == 3


def _sums_and_work(outer: Any = None) -> list[tuple[str, int]]:
    """Node 0 waits for each of 4 sums; node 1 contributes to each, then works locally (one
    worker, ``outer`` its transport to the others): the order of node 0's results (the sums)
    and node 1's work."""
    hub = VirtualHub(Placement(2, 1), 0, outer, torch.device("cpu"), 0)
    events: list[tuple[str, int]] = []

    def body(rank, transport):
        for k in range(4):
            t = torch.full((1,), float(k))
            if rank == 0:
                transport.all_reduce(t, "sum")
                events.append(("result", int(t.item())))
            else:
                transport.all_reduce_contribute(t, "sum")
                events.append(("work", k))

    hub.run(body)
    return events


def test_a_collective_runs_as_soon_as_its_last_call_is_queued_not_once_the_node_parks() -> None:
    # the sum runs when node 1 queues its call, so node 0 has its result before node 1's work
    # after that call (a node working through many steps between its own collectives lets the
    # others' through)
    assert _sums_and_work() == [e for k in range(4) for e in (("result", 2 * k), ("work", k))]


@pytest.mark.parametrize("waiting", [True, False])
def test_a_collective_no_other_worker_waits_for_yet_runs_once_the_node_that_completed_it_parks(
    waiting: bool,
) -> None:
    # as above, with a transport to other workers that says whether they wait for the next
    # collective: where they do, node 0 gets each sum as soon as node 1 queues its call; where
    # they do not, node 1 works on first and the sums run once it has finished
    from exogym.core.comm.transport import Transport

    class Peers(Transport):
        rank, world_size = 0, 1

        def peers_waiting(self) -> bool:
            return waiting

        def all_reduce(self, tensor, op, members=None) -> None:  # the only worker with a share
            pass

    events = _sums_and_work(Peers())
    if waiting:
        assert events == [e for k in range(4) for e in (("result", 2 * k), ("work", k))]
    else:
        assert events == [("work", k) for k in range(4)] + [("result", 2 * k) for k in range(4)]


@pytest.mark.procs
@pytest.mark.timeout(60)
def test_a_failing_virtual_node_is_named_and_ends_the_run() -> None:
    t0 = time.monotonic()
    with pytest.raises(
        NodeFailedError, match=r"node 3 of 4 \(worker 1 of 2\) failed: ValueError: boom on rank 3"
    ) as info:
        Trainer(FailOnRank(fail_rank=3, fail_call=2), regression_data()).fit(
            SimpleReduceStrategy(), num_nodes=4, workers=2, max_steps=20, batch_size=8, logger=False, progress=False
        )
    assert info.value.rank == 3 and info.value.error_type == "ValueError"
    assert "in forward" in str(info.value)
    assert time.monotonic() - t0 < 30
    assert child_pids() == []


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_sixty_four_virtual_nodes_train_validate_and_log_on_two_workers() -> None:
    trainer = Trainer(TinyNet(), regression_data(n=64 * 4 * 3), regression_data(n=128, seed=1))
    trainer.fit(
        FedAvgStrategy(H=2, island_size=8),
        num_nodes=64,
        workers=2,
        max_steps=3,
        batch_size=4,
        val_interval=2,
        log_interval=1,
        logger=False,
        progress=False,
    )
    assert trainer.result["config"].workers == 2
    train_rows = [r for r in trainer.history if "train_loss" in r]
    val_rows = [r for r in trainer.history if "val_loss_global" in r]
    assert [r["step"] for r in train_rows] == [1, 2, 3]
    assert [r["step"] for r in val_rows] == [0, 2, 3]  # before training, every val_interval, at the end
    # every node trains every step: 64 nodes x 4 examples per step.
    assert [r["examples"] for r in train_rows] == [256, 512, 768]
    assert child_pids() == []


def test_workers_default_to_the_cores_and_may_not_exceed_the_nodes() -> None:
    from exogym.trainer import _resolve_workers, usable_cpus

    assert _resolve_workers(None, 1000, "cpu", 1) == usable_cpus()
    assert _resolve_workers(None, 1, "cpu", 1) == 1
    assert _resolve_workers(None, 8, "cuda", 2) == 2
    assert _resolve_workers(3, 8, "cpu", 1) == 3
    with pytest.raises(ValueError, match="workers=9 is more than num_nodes=8"):
        _resolve_workers(9, 8, "cpu", 1)
    with pytest.raises((TypeError, ValueError), match="workers"):
        _resolve_workers(0, 8, "cpu", 1)


@pytest.mark.parametrize("k,w", [(8, 1), (8, 3), (7, 7), (1000, 2), (10, 4)])
def test_blocks_cover_every_rank_once_and_worker_of_inverts_them(k: int, w: int) -> None:
    ranks = [r for i in range(w) for r in block_of(k, w, i)]
    assert ranks == list(range(k))
    sizes = [len(block_of(k, w, i)) for i in range(w)]
    assert max(sizes) - min(sizes) <= 1
    placement = Placement(k, w)
    assert all(placement.worker_of(r) == i for i in range(w) for r in block_of(k, w, i))
    assert all(placement.slot_of(r) == j for i in range(w) for j, r in enumerate(block_of(k, w, i)))


def test_the_collector_is_off_while_a_worker_builds_its_nodes_and_as_it_was_after_the_run() -> None:
    import gc

    from exogym.runtime.worker import _AfterBuilding

    assert gc.isenabled()
    built = _AfterBuilding(3)
    try:
        for _ in range(2):
            assert not gc.isenabled()
            built.one_built()
        assert not gc.isenabled() and gc.get_freeze_count() == 0
        built.one_built()  # the last node: what was built is frozen, the collector back on
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        built.restore()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_finished_virtual_node_is_freed_without_the_cyclic_collector() -> None:
    # The worker's node body (worker._run_node) on 6 virtual nodes of one worker, the collector
    # off: once the run returns, no node's model copy or strategy is alive (a node's parts refer
    # back to it through bound methods; TrainNode.close breaks those cycles).
    import gc
    import weakref

    import torch._dynamo  # noqa: F401 - imported by the first optimizer otherwise, whose import frames hold node 0

    from exogym.runtime import worker as W
    from exogym.runtime.node import NodeJob
    from tests.fake_world import _config
    from tests.helpers import TinyNet

    cfg = _config(6, 4, 8, 0, 1, None, None, 2, None)
    job = NodeJob(
        TinyNet(),
        FedAvgStrategy(H=2, island_size=2, optim_spec=SGD, lr=0.1),
        regression_data(n=6 * 8 * 4),
        None,
        cfg,
        "t",
    )
    alive: list[weakref.ref] = []
    built = W.TrainNode.__init__

    def record(node, *args) -> None:
        built(node, *args)
        alive.extend([weakref.ref(node), weakref.ref(node.model), weakref.ref(node.strategy)])

    hub = VirtualHub(Placement(6, 1), 0, None, torch.device("cpu"), 0)
    enabled = gc.isenabled()
    gc.disable()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(W.TrainNode, "__init__", record)
            results = hub.run(lambda rank, transport: W._run_node(rank, job, transport, torch.device("cpu")))
        assert results[0]["history"] and len(alive) == 18
        del hub
        assert [r for r in alive if r() is not None] == []
    finally:
        if enabled:
            gc.enable()


def test_a_warm_worker_keeps_its_frozen_imports_frozen_and_leaves_the_nodes_to_the_collector() -> None:
    # A pooled worker froze what outlived its last run (launch._after_run): building does not
    # freeze the nodes (the collection after the run must reach them) nor unfreeze the imports.
    import gc

    from exogym.runtime.worker import _AfterBuilding

    gc.freeze()
    frozen = gc.get_freeze_count()
    try:
        built = _AfterBuilding(2)
        for _ in range(2):
            assert not gc.isenabled()
            built.one_built()
        assert gc.isenabled() and gc.get_freeze_count() == frozen
        built.restore()
        assert gc.isenabled() and gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_contributions_of_two_sizes_to_one_all_reduce_are_named_as_mismatched() -> None:
    hub = VirtualHub(Placement(3, 1), 0, None, torch.device("cpu"), 0)

    def body(rank, transport):
        if rank < 2:
            transport.all_reduce_contribute(torch.ones(3 + 2 * rank), "sum")
        else:
            transport.all_reduce(torch.ones(3), "sum")

    with pytest.raises(VirtualNodeError, match=r"node 1 called all_reduce\(5 x .* another node contributed 3 x"):
        hub.run(body)


def test_rows_of_a_worker_with_many_nodes_equal_those_of_workers_with_few(monkeypatch: pytest.MonkeyPatch) -> None:
    """130 clients on one worker flush every 128 steps, on three workers every 64: the metric
    rows (modelled columns) are the same (the loss up to the summation order of the averages)."""
    from exogym.core.comm.network import Network

    def rows(workers: int) -> list[dict]:
        out = train_ranks(
            130,
            lambda: FedAvgStrategy(H=4, island_size=8, optim_spec=SGD, lr=0.1),
            150,
            seed=1,
            dataset=regression_data(n=130 * 8 * 8),
            workers=workers,
            network=Network(1e8, 0.03, compute=0.01),
        )
        clock = ("wall_time", "comm_time", "peak_memory")
        return [{k: v for k, v in r.items() if k not in clock} for r in out[0]["node"].history]

    one, three = rows(1), rows(3)
    assert [r["step"] for r in one] == list(range(1, 151))
    assert one == [{**r, "train_loss": pytest.approx(r["train_loss"], rel=1e-5)} for r in three]


@pytest.mark.parametrize("workers", [None, 2])
def test_nodes_of_unequal_factory_datasets_are_built_for_the_fewest_steps_per_epoch(workers: int | None) -> None:
    # Node r holds r + 2 batches: each is built for its own count, then rebuilt for the fewest
    # (2), so FedAvg(local_epochs=1) averages every 2 steps on every node.
    def data(rank: int, num_nodes: int, train: bool):
        return regression_data(n=8 * (rank + 2), seed=rank)

    out = train_ranks(
        4, lambda: FedAvgStrategy(local_epochs=1, optim_spec=SGD, lr=0.1), 4, dataset=data, workers=workers
    )
    assert [o["node"].steps_per_epoch for o in out] == [2, 2, 2, 2]
    assert [o["strategy"].averaging.H for o in out] == [2, 2, 2, 2]
    for o in out[1:]:  # every node holds the last round's average
        torch.testing.assert_close(o["params"], out[0]["params"], rtol=0, atol=0)


def test_a_factory_that_gives_a_node_less_than_a_batch_fails_the_run_naming_the_fix() -> None:
    def data(rank: int, num_nodes: int, train: bool):
        return regression_data(n=4 if rank == 1 else 16, seed=rank)

    with pytest.raises(VirtualNodeError, match="fewer than batch_size=8 examples") as err:
        train_ranks(3, lambda: FedAvgStrategy(H=1, optim_spec=SGD, lr=0.1), 2, dataset=data, workers=1)
    assert err.value.node_rank == 1


def test_contributions_are_folded_on_arrival_into_one_tensor_per_collective_and_group() -> None:
    # 6 nodes, node 5 waits (it runs last): when it arrives, the five others' contributions to
    # each of three collectives are already folded (one tensor per collective and group; the
    # queued calls keep a shape-only stand-in), and the results are the plain reductions.
    from exogym.core.comm.comm import NodeComm

    hub = VirtualHub(Placement(6, 1), 0, None, torch.device("cpu"), 0)
    seen: dict[str, object] = {}
    got: list[list[float]] = []
    groups = [[0, 1, 2], [3, 4, 5]]

    def node(rank, transport):
        comm = NodeComm(rank, 6, transport)
        values = [torch.full((3,), float(rank + 1)), torch.full((3,), float(10 - rank)), torch.full((3,), rank + 0.5)]
        ops = ["sum", "max", "sum"]
        kwargs = [{}, {}, {"groups": groups}]
        if rank < 5:
            for v, op, kw in zip(values, ops, kwargs, strict=True):
                comm.all_reduce_contribute(v, op, **kw)
            return rank
        seen["folded"] = {k: v.clone() for k, v in hub._folded.items()}
        seen["devices"] = {c.tensor.device.type for q in hub._queued[:5] for c in q}
        for v, op, kw in zip(values, ops, kwargs, strict=True):
            got.append(comm.all_reduce(v, op, **kw).tolist())
        return rank

    hub.run(node)
    assert sorted(seen["folded"]) == [(0, None), (1, None), (2, (0, 1, 2)), (2, (3, 4, 5))]
    assert seen["devices"] == {"meta"}
    assert got == [[21.0] * 3, [10.0] * 3, [3.5 + 4.5 + 5.5] * 3]  # 1+..+6; max(10-r); node 5 and its group
    assert hub._folded == {}
