"""Where virtual nodes run: contiguous blocks, or balanced over each round's sampled clients."""

from __future__ import annotations

import pytest
import torch

from communicators.islands import draw_islands, draw_participants
from exogym.runtime.placement import PLANNED_ROUNDS, Placement, block_of, place_nodes
from exogym.strategy import DiLoCoStrategy, FedAvgStrategy, SimpleReduceStrategy
from tests import fake_world as fw
from tests.helpers import RecordsTrainedSteps, regression_data

SGD = "sgd"


def _sampled(k: int, island: int | None, frac: float, seed: int, rnd: int) -> list[int]:
    """The round's participants, drawn island by island as the paper's FedAvg samples them."""
    islands = draw_islands(k, island, seed, rnd) if island else [list(range(k))]
    return sorted(r for members in islands for r in draw_participants(members, frac, seed, rnd))


def _per_worker(placement: Placement, nodes: list[int]) -> list[int]:
    return [sum(placement.worker_of(r) == w for r in nodes) for w in range(placement.workers)]


@pytest.mark.parametrize("k,w,frac", [(1000, 2, 0.01), (1000, 4, 0.02), (100, 2, 0.1)])
def test_balanced_placement_halves_the_imbalance_of_every_rounds_sampled_clients(k: int, w: int, frac: float) -> None:
    rounds = [_sampled(k, None, frac, 42, r) for r in range(20)]
    blocks, balanced = Placement.blocks(k, w), Placement.balanced(k, w, rounds)
    # A round lasts as long as its busiest worker: the sum over rounds of the largest share.
    busiest = [max(_per_worker(p, nodes)) for p in (blocks, balanced) for nodes in rounds]
    ideal = sum(-(-len(nodes) // w) for nodes in rounds)
    assert sum(busiest[20:]) - ideal <= (sum(busiest[:20]) - ideal) / 2
    # Clients met for the first time are spread exactly: with 1% of 1,000, every round is.
    if k == 1000 and w == 2:
        assert sum(busiest[20:]) == ideal


def test_balanced_placement_keeps_the_block_sizes_rank_0_on_worker_0_and_every_rank_once() -> None:
    rounds = [_sampled(103, None, 0.1, 7, r) for r in range(30)]
    placement = Placement.balanced(103, 4, rounds)
    assert [len(h) for h in placement.hosts] == [len(block_of(103, 4, w)) for w in range(4)]
    assert sorted(r for h in placement.hosts for r in h) == list(range(103))
    assert placement.worker_of(0) == 0
    assert all(placement.hosts[w][placement.slot_of(r)] == r for w in range(4) for r in placement.hosts[w])


def test_a_placement_that_loses_duplicates_or_moves_rank_0_is_refused() -> None:
    with pytest.raises(ValueError, match="placed twice"):
        Placement([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="out of range"):
        Placement([[0, 1], [3]])
    with pytest.raises(ValueError, match="rank 0 must be hosted by worker 0"):
        Placement([[1], [0]])
    with pytest.raises(ValueError, match="worker 1 hosts no node"):
        Placement([[0, 1], []])


@pytest.mark.parametrize(
    "strategy,workers",
    [
        (SimpleReduceStrategy(), 2),  # every node trains every step
        (FedAvgStrategy(H=2), 2),  # no sampling
        (DiLoCoStrategy(H=2), 2),
        (FedAvgStrategy(H=2, client_sampling=0.1), 1),  # one worker
        (FedAvgStrategy(H=2, client_sampling=0.1), 16),  # one node per worker
        (FedAvgStrategy(local_epochs=1, client_sampling=0.1), 2),  # the round's length is not known yet
    ],
)
def test_strategies_without_a_known_sampling_keep_contiguous_blocks(strategy, workers: int) -> None:
    assert place_nodes(strategy, 16, workers, 0, 40) == Placement.blocks(16, workers)


class _RecordsTraining(RecordsTrainedSteps, FedAvgStrategy):
    """FedAvg whose nodes record the steps they train."""


def test_sampled_nodes_are_exactly_the_nodes_that_train_in_each_round() -> None:
    # What the runtime derives from the strategy before the run against what its nodes do in it.
    from exogym.runtime.schedule import sampled_nodes

    k, h, rounds, seed = 9, 2, 5, 4

    def make():
        return _RecordsTraining(H=h, island_size=4, client_sampling=0.5, optim_spec=SGD, lr=0.1)

    out = fw.train_ranks(k, make, h * rounds, seed=seed)
    unbound = make()
    for rnd in range(rounds):
        trained = sorted(r for r in range(k) if rnd * h in out[r]["strategy"].trained)
        assert sampled_nodes(unbound, k, seed, rnd * h) == trained == _sampled(k, 4, 0.5, seed, rnd)


def test_virtual_nodes_placed_by_the_sampling_end_as_one_process_per_node() -> None:
    def make():
        return FedAvgStrategy(H=2, island_size=3, client_sampling=0.5, optim_spec=SGD, lr=0.05)

    assert place_nodes(make(), 8, 2, 3, 12) != Placement.blocks(8, 2)  # not the blocks
    ds = regression_data(n=8 * 8 * 12)
    reference = fw.train_ranks(8, make, 12, seed=3, dataset=ds)
    placed = fw.train_ranks(8, make, 12, seed=3, dataset=ds, workers=2)
    for r in range(8):
        for a, b in zip(placed[r]["params"], reference[r]["params"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert placed[r]["records"] == reference[r]["records"]


def test_a_run_whose_length_is_not_known_yet_is_placed_by_its_first_rounds() -> None:
    # fit(num_epochs=...) over dataset factories: max_steps is known only inside the nodes.
    strategy = FedAvgStrategy(H=2, client_sampling=0.02)
    placement = place_nodes(strategy, 1000, 2, 5, None)
    assert placement != Placement.blocks(1000, 2)
    assert placement == Placement.balanced(1000, 2, [_sampled(1000, None, 0.02, 5, r) for r in range(PLANNED_ROUNDS)])


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_fit_by_epochs_over_dataset_factories_places_sampled_clients() -> None:
    from exogym import Trainer
    from tests.helpers import TinyNet, child_pids

    def data(rank: int, num_nodes: int, train: bool):
        return regression_data(n=32, seed=rank)

    trainer = Trainer(TinyNet(), data)
    trainer.fit(
        FedAvgStrategy(H=2, client_sampling=0.25, optim_spec=SGD, lr=0.05),
        num_nodes=8,
        workers=2,
        num_epochs=1,
        batch_size=8,
        progress=False,
        logger=False,
        val_size=0,
    )
    assert trainer.result["max_steps"] == 4  # one epoch of 4 batches
    assert child_pids() == []


def test_a_quantized_fedavg_with_sampling_is_placed_as_the_plain_one() -> None:
    from communicators import AveragingCommunicator, QuantizeCommunicator
    from exogym.core.pipeline import CommunicateOptimizeStrategy

    quantized = CommunicateOptimizeStrategy([QuantizeCommunicator(AveragingCommunicator(5, client_sampling=0.02))])
    plain = place_nodes(FedAvgStrategy(H=5, client_sampling=0.02), 400, 2, 9, 100)
    assert plain != Placement.blocks(400, 2)
    assert place_nodes(quantized, 400, 2, 9, 100) == plain
