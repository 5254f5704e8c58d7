"""Where virtual nodes run: contiguous blocks of ranks, rank 0 on worker 0."""

from __future__ import annotations

import pytest

from exogym.runtime.placement import Placement, block_of


@pytest.mark.parametrize("k,w", [(10, 3), (16, 4), (5, 5), (7, 1)])
def test_blocks_are_contiguous_one_larger_first_and_cover_every_rank_once(k: int, w: int) -> None:
    placement = Placement(k, w)
    ranks = [r for worker in range(w) for r in placement.ranks(worker)]
    assert ranks == list(range(k))
    sizes = [len(block_of(k, w, worker)) for worker in range(w)]
    assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1
    assert all(placement.worker_of(r) == worker for worker in range(w) for r in placement.ranks(worker))
    assert all(placement.ranks(placement.worker_of(r))[placement.slot_of(r)] == r for r in range(k))


def test_a_block_is_described_by_its_range() -> None:
    assert Placement(8, 2).describe(1) == "nodes 4-7"
    assert Placement(2, 2).describe(1) == "node 1"
