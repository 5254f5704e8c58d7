"""Averaging: rounds leave ranks identical, islands, client sampling, and their bytes."""

import pytest
import torch

from communicators import AveragingCommunicator, draw_islands, draw_participants
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.strategy import FedAvgStrategy, OptimSpec, SimpleReduceStrategy
from tests.fake_world import train_ranks
from tests.helpers import TinyNet

SGD = OptimSpec(torch.optim.SGD, lr=0.05)
PARAM_BYTES = sum(p.numel() * 4 for p in TinyNet().parameters())


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("steps", [6, 7])
def test_ranks_identical_after_each_round_and_only_then(steps: int) -> None:
    out = train_ranks(3, lambda: FedAvgStrategy(H=3, optim_spec=SGD), steps)
    same = all(_equal(out[0]["params"], o["params"]) for o in out[1:])
    assert same == (steps % 3 == 0)


def test_fedavg_bytes_are_ddp_bytes_once_per_h() -> None:
    k, h, steps = 4, 5, 20
    fed = train_ranks(k, lambda: FedAvgStrategy(H=h, optim_spec=SGD), steps)
    ddp = train_ranks(k, lambda: SimpleReduceStrategy(optim_spec=SGD), steps)
    fed_sent = sum(r.sent for recs in fed[0]["records"] for r in recs)
    ddp_sent = sum(r.sent for recs in ddp[0]["records"] for r in recs)
    assert fed_sent == pytest.approx(ddp_sent / h)
    assert fed_sent == pytest.approx(steps // h * 2 * (k - 1) / k * PARAM_BYTES)
    assert [bool(recs) for recs in fed[0]["records"]] == [(s + 1) % h == 0 for s in range(steps)]


def test_island_size_k_equals_plain_averaging() -> None:
    plain = train_ranks(4, lambda: FedAvgStrategy(H=2, optim_spec=SGD), 6)
    island = train_ranks(4, lambda: FedAvgStrategy(H=2, island_size=4, optim_spec=SGD), 6)
    for a, b in zip(plain, island, strict=True):
        assert _equal(a["params"], b["params"])


def test_islands_average_within_and_are_charged_at_island_size() -> None:
    k, size, seed, steps = 4, 2, 0, 2
    out = train_ranks(k, lambda: FedAvgStrategy(H=steps, island_size=size, optim_spec=SGD), steps, seed=seed)
    islands = draw_islands(k, size, seed, round_=0)
    for isl in islands:
        assert _equal(out[isl[0]]["params"], out[isl[1]]["params"])
    assert not _equal(out[islands[0][0]]["params"], out[islands[1][0]]["params"])
    rec = out[0]["records"][-1][0]
    assert (
        rec.kind == "all_reduce"
        and rec.group_size == size
        and rec.sent == pytest.approx(2 * (size - 1) / size * PARAM_BYTES)
    )


def test_draws_are_shared_and_vary_by_round() -> None:
    a = [draw_islands(8, 3, seed=5, round_=r) for r in range(6)]
    assert a == [draw_islands(8, 3, seed=5, round_=r) for r in range(6)]
    assert len({str(x) for x in a}) > 1
    for islands in a:
        assert sorted(sum(islands, [])) == list(range(8)) and [len(i) for i in islands] == [3, 3, 2]
    assert draw_islands(4, 9, 0, 0) == [[0, 1, 2, 3]]
    p = draw_participants(list(range(10)), 0.3, seed=1, round_=2)
    assert len(p) == 3 and p == draw_participants(list(range(10)), 0.3, seed=1, round_=2)


class SetToRank(CommunicateOptimizeStrategy):
    """No training effect: the test sets parameters to the rank before averaging."""

    def step(self):
        with torch.no_grad():
            for p in self.model.parameters():
                p.fill_(float(self.rank))
        super().step()


def test_client_sampling_gives_everyone_the_participants_mean() -> None:
    k, seed = 5, 3
    frozen = OptimSpec(torch.optim.SGD, lr=0.0)
    out = train_ranks(
        k, lambda: SetToRank([AveragingCommunicator(client_sampling=0.4)], optim_spec=frozen), 1, seed=seed
    )
    chosen = draw_participants(list(range(k)), 0.4, seed, 0)
    assert len(chosen) == 2
    for o in out:
        assert torch.allclose(o["params"][0], torch.full_like(o["params"][0], sum(chosen) / 2))
    for rank, o in enumerate(out):
        kinds = [(r.kind, r.group_size, r.sent > 0) for r in o["records"][0]]
        if rank == chosen[0]:  # a participant, and the root of the result's broadcast
            assert kinds == [("all_reduce", 2, True), ("broadcast", 4, True)]
        elif rank in chosen:
            assert kinds == [("all_reduce", 2, True)]
        else:
            assert kinds == [("broadcast", 4, False)] and o["records"][0][0].received == PARAM_BYTES


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="target"):
        AveragingCommunicator(target="weights")
    with pytest.raises(ValueError, match="client_sampling"):
        AveragingCommunicator(client_sampling=0)
    with pytest.raises(TypeError, match="H"):
        FedAvgStrategy(H=2, local_epochs=1)
    with pytest.raises(TypeError, match="unexpected keyword"):
        FedAvgStrategy(H=2, island=3)


def test_rounds_without_islands_share_their_lists_and_a_client_keeps_few_draws() -> None:
    # Memory of long sampled runs: a round without islands adds only its participants, and a
    # client that sleeps far ahead (here 60 rounds of H=1) keeps a bounded number of draws.
    from communicators.averaging import KEPT_ROUNDS
    from communicators.islands import draw_round

    a, b = draw_round(500, None, 0.02, 3, 0), draw_round(500, None, 0.02, 3, 1)
    assert a.groups[0] is b.groups[0] and a.island_of is b.island_of
    assert a.groups[0] == list(range(500)) and a.island_of == [0] * 500
    assert a.participants == [draw_participants(list(range(500)), 0.02, 3, 0)]
    out = train_ranks(20, lambda: FedAvgStrategy(H=1, client_sampling=0.1, optim_spec="sgd", lr=0.1), 60, workers=2)
    assert max(len(o["strategy"].averaging._drawn) for o in out) <= KEPT_ROUNDS


def _sampled_in(k: int, island: int | None, frac: float, seed: int, round_: int) -> set[int]:
    """The ranks that train in a round, from the draws themselves (islands, then each island's
    participants)."""
    islands = draw_islands(k, island, seed, round_) if island else [list(range(k))]
    return {r for g in islands for r in draw_participants(g, frac, seed, round_)}


def _reference_sleep(rank, k, island, frac, seed, h, max_steps, step, stop, read_at) -> list[int]:
    """The ends of the idle spans in a row from ``step`` a FedAvg client may sleep through, from
    the definition: a span runs from ``s`` to its round's end when the client is not sampled in
    that round; it counts if it ends before ``stop`` and the next round (not sampled either,
    ending before the run does) replaces its mean before ``read_at``."""
    ends, s = [], step
    while s < stop:
        r = s // h
        if rank in _sampled_in(k, island, frac, seed, r):
            break
        end = (r + 1) * h - 1
        if end + 1 > stop or end + h >= max_steps or end + h >= read_at:
            break
        if rank in _sampled_in(k, island, frac, seed, r + 1):
            break
        ends.append(end)
        s = end + 1
    return ends


@pytest.mark.parametrize(
    "island,frac,h,max_steps", [(None, 0.1, 3, 90), (5, 0.4, 2, 41), (None, 0.5, 1, 30), (4, 1.0, 2, 20)]
)
def test_planned_sleep_of_a_sampled_client_follows_the_draws(island, frac, h, max_steps) -> None:
    """The runtime's plan of a sleep (``NodeSchedule.idle_span_ends``, derived from the
    module's participation statement) equals the rounds a client may sleep through by the
    definition (not sampled in a round nor in the next, which ends before the run and before
    validation reads it), for every rank, start step, stop and validation step, for the module
    alone and inside a pipeline."""
    from exogym.core.comm.comm import NodeComm
    from exogym.core.comm.transport import Transport
    from exogym.core.pipeline import CommunicateOptimizeStrategy, NodeContext, Pipeline
    from exogym.runtime.schedule import NodeSchedule

    k, seed = 12, 7
    gen = torch.Generator().manual_seed(h)
    longest = 0  # rounds in the longest planned sleep
    for rank in range(k):
        plans = []
        for modules in (
            [AveragingCommunicator(H=h, island_size=island, client_sampling=frac)],
            [Pipeline([AveragingCommunicator(H=h, island_size=island, client_sampling=frac)])],
        ):
            strategy = CommunicateOptimizeStrategy(modules)
            ctx = NodeContext(TinyNet(), rank, k, NodeComm(rank, k, Transport()), None, seed, max_steps, None)
            strategy.pipeline.bind(ctx)
            plans.append(NodeSchedule(strategy, rank, k, seed, max_steps))
        for step in range(max_steps):
            stop = int(torch.randint(step + 1, max_steps + 1, (), generator=gen))
            read_at = int(torch.randint(step, max_steps + 2, (), generator=gen)) if step % 3 else 2**62
            expected = _reference_sleep(rank, k, island, frac, seed, h, max_steps, step, stop, read_at)
            for plan in plans:
                assert plan.idle_span_ends(step, stop, read_at) == expected, (rank, step, stop, read_at)
            longest = max(longest, len(plans[0].idle_span_ends(step, max_steps, 2**62)))
    assert (longest > 1) == (frac < 1.0)  # not vacuous: clients sleep several rounds (unless all train)


@pytest.mark.parametrize("island", [None, 3])
def test_sampled_averaging_names_the_ranks_of_its_charged_all_reduce_and_broadcast(island) -> None:
    """Each round's charges say who takes part (a world of regions prices them on those links):
    the participants' all-reduce among the island's sampled clients, the mean's broadcast from
    the first of them to the island's other members; drawn here from the draws themselves."""
    k, h, rounds, frac, seed = 6, 2, 4, 0.34, 5
    out = train_ranks(
        k,
        lambda: FedAvgStrategy(H=h, island_size=island, client_sampling=frac, optim_spec="sgd"),
        h * rounds,
        seed=seed,
    )
    expected: dict[int, set] = {rank: set() for rank in range(k)}
    for rnd in range(rounds):
        islands = draw_islands(k, island, seed, rnd) if island else [list(range(k))]
        for members in islands:
            sampled = draw_participants(members, frac, seed, rnd)
            others = [r for r in members if r not in sampled]
            for rank in members:
                if rank in sampled:
                    expected[rank].add(("all_reduce", tuple(sampled)))
                if rank not in sampled or rank == sampled[0]:
                    expected[rank].add(("broadcast", (sampled[0], *others)))
    for rank in range(k):
        charged = {(r.kind, r.members) for step in out[rank]["records"] for r in step}
        assert charged == expected[rank], rank
