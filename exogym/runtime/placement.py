"""Which worker process hosts which virtual nodes.

By default worker ``w`` hosts a contiguous block of ranks (``block_of``). Where the strategy
samples the clients that train in each round from the shared seed (FedAvg with
``client_sampling``), the sampled clients of a round are known before the run starts, and a
round takes as long as the worker with the most of them needs: with 10 of 1,000 clients
sampled per round and two workers, one worker trains 6.2 of them on average where 5 would do.
``place_nodes`` then spreads every round's sampled clients evenly over the workers
(``Placement.balanced``), keeping the number of nodes per worker (their memory) as in the
blocks. An asynchronous run's rounds are the ticks of its simulated timeline: the runtime asks
the strategy as bound for the run (its timeline needs the run's network). Where a node runs
never changes what it computes: its data, random stream and state belong to its rank (results
agree within float rounding: the sums of a collective are taken in another order).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from exogym.runtime import schedule

#: Rounds whose sampled clients ``place_nodes`` balances (the first ones of the run).
PLANNED_ROUNDS = 1000
#: The most sampled-node entries (summed over rounds) it reads before it stops planning.
PLANNED_ENTRIES = 200_000


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
        dormant: the run's dormant nodes (``exogym.runtime.dormant``): on each worker the
            first of them runs and makes the others' calls (``twins``).
    """

    def __init__(self, hosts: Sequence[Iterable[int]], dormant: Iterable[int] = ()) -> None:
        self.hosts: tuple[tuple[int, ...], ...] = tuple(tuple(sorted(int(r) for r in h)) for h in hosts)
        self.dormant = frozenset(dormant)
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
        if 0 in self.dormant or not self.dormant <= set(range(self.num_nodes)):
            raise ValueError("dormant nodes must be ranks of the run other than 0")

    def with_dormant(self, dormant: Iterable[int]) -> Placement:
        """The same hosts, with ``dormant`` as the run's dormant nodes."""
        return Placement(self.hosts, dormant)

    def twins(self, worker: int) -> dict[int, tuple[int, ...]]:
        """``{lead: its twins}`` on worker ``worker``: its first dormant node and the others it
        hosts, whose calls the lead's are (``exogym.runtime.dormant``); ``{}`` where the
        worker hosts fewer than two."""
        mine = [r for r in self.hosts[worker] if r in self.dormant]
        return {mine[0]: tuple(mine[1:])} if len(mine) > 1 else {}

    @classmethod
    def blocks(cls, num_nodes: int, workers: int) -> Placement:
        """Contiguous blocks (``block_of``)."""
        return cls([block_of(num_nodes, workers, w) for w in range(workers)])

    @classmethod
    def balanced(cls, num_nodes: int, workers: int, rounds: Iterable[Sequence[int]]) -> Placement:
        """As many nodes per worker as ``blocks``, placed so that the nodes of each of
        ``rounds`` (the nodes that train in it) spread evenly over the workers. Greedy, round by
        round: a node met for the first time goes to the worker with the fewest of the round's
        nodes so far (then the least work over the rounds so far, then the lowest index) that
        has room; nodes in no round fill the room left in rank order."""
        room = [len(block_of(num_nodes, workers, w)) for w in range(workers)]
        where = {0: 0}
        room[0] -= 1
        work = [0] * workers
        for nodes in rounds:
            count = [0] * workers
            fresh = []
            for r in nodes:
                if r in where:
                    count[where[r]] += 1
                else:
                    fresh.append(r)
            for r in fresh:
                w = min((w for w in range(workers) if room[w]), key=lambda w: (count[w], work[w], w))
                where[r] = w
                room[w] -= 1
                count[w] += 1
            for w in range(workers):
                work[w] += count[w]
        hosts: list[list[int]] = [[] for _ in range(workers)]
        for r, w in where.items():
            hosts[w].append(r)
        w = 0
        for r in range(num_nodes):
            if r in where:
                continue
            while not room[w]:
                w += 1
            hosts[w].append(r)
            room[w] -= 1
        return cls(hosts)

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
        return isinstance(other, Placement) and self.hosts == other.hosts and self.dormant == other.dormant

    def __hash__(self) -> int:
        return hash((self.hosts, self.dormant))

    def __repr__(self) -> str:
        return f"Placement({', '.join(self.describe(w) for w in range(self.workers))})"


def place_nodes(strategy: Any, num_nodes: int, workers: int, seed: int, max_steps: int | None) -> Placement:
    """Where the ``num_nodes`` nodes of a run on ``workers`` workers go: balanced over the
    sampled clients of the first ``PLANNED_ROUNDS`` rounds where ``strategy`` tells them
    (``exogym.runtime.schedule.sampled_nodes``) and some but not all nodes train
    in a round; contiguous blocks otherwise. ``max_steps=None``: the run's length is not known
    yet (epochs of dataset factories), every planned round counts. The same on every machine of
    a run (it reads only the strategy's settings, the seed and the run length)."""
    if workers in (1, num_nodes) or not schedule.samples_clients(strategy, num_nodes, seed):
        return Placement.blocks(num_nodes, workers)
    rounds: list[Sequence[int]] = []
    entries = 0
    period = schedule.round_steps(strategy)
    rounds_in_run = PLANNED_ROUNDS if max_steps is None else -(-max_steps // period)
    for r in range(min(rounds_in_run, PLANNED_ROUNDS)):
        nodes = schedule.sampled_nodes(strategy, num_nodes, seed, r * period)
        if nodes is None or len(nodes) >= num_nodes:
            return Placement.blocks(num_nodes, workers)
        rounds.append(nodes)
        entries += len(nodes)
        if entries > PLANNED_ENTRIES:
            break
    return Placement.balanced(num_nodes, workers, rounds)


__all__ = ["PLANNED_ENTRIES", "PLANNED_ROUNDS", "Placement", "block_of", "place_nodes"]
