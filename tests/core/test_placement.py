"""Where virtual nodes run: contiguous blocks of ranks, rank 0 on worker 0."""

from __future__ import annotations

import pytest

from exogym.runtime.placement import Placement, block_of


@pytest.mark.parametrize("k,w", [(10, 3), (16, 4), (5, 5), (7, 1)])
def test_blocks_are_contiguous_one_larger_first_and_cover_every_rank_once(k: int, w: int) -> None:
    placement = Placement.blocks(k, w)
    ranks = [r for worker in range(w) for r in placement.ranks(worker)]
    assert ranks == list(range(k))
    sizes = [len(block_of(k, w, worker)) for worker in range(w)]
    assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1
    assert all(placement.worker_of(r) == worker for worker in range(w) for r in placement.ranks(worker))
    assert all(placement.ranks(placement.worker_of(r))[placement.slot_of(r)] == r for r in range(k))


def test_a_placement_that_loses_duplicates_or_moves_rank_0_is_refused() -> None:
    with pytest.raises(ValueError, match="placed twice"):
        Placement([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="out of range"):
        Placement([[0, 1], [3]])
    with pytest.raises(ValueError, match="rank 0 must be hosted by worker 0"):
        Placement([[1], [0]])
    with pytest.raises(ValueError, match="worker 1 hosts no node"):
        Placement([[0, 1], []])


def test_a_block_is_described_by_its_range_and_other_hosts_by_their_count() -> None:
    assert Placement.blocks(8, 2).describe(1) == "nodes 4-7"
    assert Placement([[0, 2], [1]]).describe(0) == "2 nodes"
    assert Placement.blocks(2, 2).describe(1) == "node 1"
