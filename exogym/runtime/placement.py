"""Which worker process hosts which virtual nodes: worker ``w`` hosts a contiguous block of
ranks (``block_of``). Where a node runs never changes what it computes: its data, random stream
and state belong to its rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def block_of(num_nodes: int, workers: int, worker: int) -> range:
    """The ranks worker ``worker`` hosts in contiguous blocks, the first ``num_nodes % workers``
    blocks one node larger."""
    base, extra = divmod(num_nodes, workers)
    start = worker * base + min(worker, extra)
    return range(start, start + base + (1 if worker < extra else 0))


class Placement:
    """The ranks each worker hosts: ``hosts[w]`` for worker ``w``, ascending. Every rank of
    ``0 .. K-1`` appears once, rank 0 on worker 0 (its worker makes the run's rows and returns
    the result), and every worker hosts at least one node.

    Args:
        hosts: per worker, the ranks it hosts (any order).
    """

    def __init__(self, hosts: Sequence[Iterable[int]]) -> None:
        self.hosts: tuple[tuple[int, ...], ...] = tuple(tuple(sorted(int(r) for r in h)) for h in hosts)
        self.workers = len(self.hosts)
        self.num_nodes = sum(len(h) for h in self.hosts)
        self._worker = [-1] * self.num_nodes
        self._slot = [-1] * self.num_nodes
        for w, ranks in enumerate(self.hosts):
            if not ranks:
                raise ValueError(f"worker {w} hosts no node")
            for i, r in enumerate(ranks):
                if not 0 <= r < self.num_nodes or self._worker[r] != -1:
                    raise ValueError(f"rank {r} is out of range or placed twice in {self.num_nodes} nodes")
                self._worker[r], self._slot[r] = w, i
        if self._worker[0] != 0:
            raise ValueError("rank 0 must be hosted by worker 0")

    @classmethod
    def blocks(cls, num_nodes: int, workers: int) -> Placement:
        """Contiguous blocks (``block_of``)."""
        return cls([block_of(num_nodes, workers, w) for w in range(workers)])

    def ranks(self, worker: int) -> tuple[int, ...]:
        """The ranks worker ``worker`` hosts, ascending."""
        return self.hosts[worker]

    def worker_of(self, rank: int) -> int:
        """The worker that hosts ``rank``."""
        return self._worker[rank]

    def slot_of(self, rank: int) -> int:
        """``rank``'s index among the ranks of its worker."""
        return self._slot[rank]

    def describe(self, worker: int) -> str:
        """``"nodes 4-7"`` for a contiguous block, else ``"12 nodes"`` (for logs and errors)."""
        ranks = self.hosts[worker]
        if ranks[-1] - ranks[0] + 1 == len(ranks):
            return f"node {ranks[0]}" if len(ranks) == 1 else f"nodes {ranks[0]}-{ranks[-1]}"
        return f"{len(ranks)} nodes"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Placement) and self.hosts == other.hosts

    def __hash__(self) -> int:
        return hash(self.hosts)

    def __repr__(self) -> str:
        return f"Placement({', '.join(self.describe(w) for w in range(self.workers))})"


__all__ = ["Placement", "block_of"]
