"""Which worker process hosts which virtual nodes: worker ``w`` hosts a contiguous block of
ranks (``block_of``). Where a node runs never changes what it computes: its data, random stream
and state belong to its rank.
"""

from __future__ import annotations


def block_of(num_nodes: int, workers: int, worker: int) -> range:
    """The ranks worker ``worker`` hosts in contiguous blocks, the first ``num_nodes % workers``
    blocks one node larger."""
    base, extra = divmod(num_nodes, workers)
    start = worker * base + min(worker, extra)
    return range(start, start + base + (1 if worker < extra else 0))


class Placement:
    """The ranks each of ``workers`` workers hosts out of ``num_nodes`` (at least one each):
    contiguous blocks (``block_of``), so rank 0 is on worker 0 (its worker makes the run's rows
    and returns the result).

    Attributes:
        hosts: ``hosts[w]``, the ranks worker ``w`` hosts, ascending.
    """

    def __init__(self, num_nodes: int, workers: int) -> None:
        self.num_nodes, self.workers = num_nodes, workers
        self.hosts = tuple(tuple(block_of(num_nodes, workers, w)) for w in range(workers))
        self._worker = [w for w, ranks in enumerate(self.hosts) for _ in ranks]

    def ranks(self, worker: int) -> tuple[int, ...]:
        """The ranks worker ``worker`` hosts, ascending."""
        return self.hosts[worker]

    def worker_of(self, rank: int) -> int:
        """The worker that hosts ``rank``."""
        return self._worker[rank]

    def slot_of(self, rank: int) -> int:
        """``rank``'s index among the ranks of its worker."""
        return rank - self.hosts[self._worker[rank]][0]

    def describe(self, worker: int) -> str:
        """``"nodes 4-7"``, or ``"node 4"`` for a block of one (for logs and errors)."""
        ranks = self.hosts[worker]
        return f"node {ranks[0]}" if len(ranks) == 1 else f"nodes {ranks[0]}-{ranks[-1]}"


__all__ = ["Placement", "block_of"]
