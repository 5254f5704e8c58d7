"""Virtual nodes: many nodes in one worker process, with real collectives between them.

A worker hosts some nodes of the world (``exogym.runtime.placement`` says which). Each node
runs the ordinary ``TrainNode`` loop on a thread of its own, but only one thread runs at a time:
a node runs until its next collective, parks there and hands the turn to the next node of the
worker. The last node to arrive combines the worker's contributions (reduced locally, then once
across workers through the worker's ``Transport``), writes every node's result and hands the
turn back to the first node. The worker therefore computes like a plain loop over its nodes,
and strategies, communicators and ledgers run unchanged: each node still talks through its own
``NodeComm``, whose transport is a ``VirtualTransport``.

Each node keeps its own torch random stream (swapped at every hand-over), so dropout and other
random draws match those of a run with one process per node.

A node may also only *contribute* to a collective (``VirtualTransport.all_reduce_contribute``:
it needs no result, e.g. a node's metrics that rank 0 alone turns into rows): the call is
queued and the node runs on without parking. Each node's calls form a queue; a collective runs
when every node has one queued, and only the nodes that wait for its result get the turn back.
A node that has ``MAX_QUEUED`` calls queued waits for them, which bounds the memory they hold
and how far apart in the run the worker's nodes are.

Why threads and not greenlets or one swapped module per worker: see docs/internals/virtual-nodes.md
(threads keep torch's per-thread state, e.g. grad mode and autocast, separate per node; a
hand-over costs about 20-70 µs).
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from exogym.core.comm.transport import CollectiveMismatchError, Transport, reduce_rows_into
from exogym.runtime import checkpoint as ckpt
from exogym.runtime.placement import Placement
from exogym.runtime.virtual_combine import Call, Combining

#: Calls a node may have queued (ones it does not wait for, see ``VirtualHub.enqueue``).
MAX_QUEUED = 32

#: Held while a hub swaps torch's random state, which is the process's: hubs that share a
#: process (workers on threads, as tests run them) swap it one at a time. At once they can
#: deadlock in torch: a garbage collection inside ``get_rng_state`` gives up the GIL while the
#: generator's mutex is held, and the other hub's ``set_rng_state`` holds the GIL waiting for it.
_RNG_SWAP = threading.Lock()


class VirtualNodeError(Exception):
    """A virtual node raised: carries its rank, the exception's class name and its traceback."""

    def __init__(self, rank: int, error: BaseException, tb: str) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.node_rank = rank
        self.error_type = type(error).__name__
        self.node_traceback = tb


class _Aborted(BaseException):
    """Another node of this worker failed: unwind this one quietly."""


class VirtualHub(Combining):
    """The turn-taking and local combining of one worker's virtual nodes.

    Args:
        placement: which worker hosts which ranks (of the world of K nodes, on W workers).
        worker: this worker's index (it hosts ``placement.ranks(worker)``).
        outer: the transport between workers (``None`` when ``workers == 1``).
        device: the worker's device (its random stream is swapped per node as well).
        seed: node ``r``'s random stream starts from ``torch.manual_seed(seed + r)``, as in a run
            with one process per node.
    """

    def __init__(
        self,
        placement: Placement,
        worker: int,
        outer: Transport | None,
        device: torch.device,
        seed: int,
    ) -> None:
        self.placement = placement
        self.ranks = list(placement.ranks(worker))
        self.n = len(self.ranks)
        self.num_nodes, self.workers, self.worker = placement.num_nodes, placement.workers, worker
        self.outer = outer
        self.device = device
        # Node i runs while it holds the turn: its lock, taken (acquired) by itself, given
        # (released) by whoever runs before it. A bare lock hands over in about half the time of an
        # Event.
        self._turn = [threading.Lock() for _ in self.ranks]
        for lock in self._turn:
            lock.acquire()
        #: Per node, its calls not yet executed (ones it does not wait for, then at most one it waits for).
        self._queued: list[deque[Call]] = [deque() for _ in self.ranks]
        #: How many of those queues are empty (a collective can run when none is).
        self._empty = self.n
        #: The nodes that run before the next collective, in order, and the next one's position.
        self._to_run: list[int] = list(range(self.n))
        self._cursor = 0
        self._failure: VirtualNodeError | None = None
        #: Collectives executed so far (every node's queue starts at the next one).
        self._executed = 0
        #: Running reductions of the contributions queued for a later collective, by (its
        #: index, group): a contributing node's tensor is folded in when it arrives, not kept.
        self._folded: dict[tuple[int, tuple[int, ...] | None], torch.Tensor] = {}
        self._rng: list[Any] = [None] * self.n
        for i, r in enumerate(self.ranks):
            # What torch.manual_seed(seed + r) does for the two streams a node uses, without its
            # lazy calls for every other device type (a captured stack each: 0.3 ms per node).
            torch.default_generator.manual_seed(seed + r)
            if device.type == "cuda":
                torch.cuda.manual_seed(seed + r)
            self._rng[i] = self._get_rng()
        #: Per hosted node (by local index), the transport its ``NodeComm`` talks through.
        self.transports = [VirtualTransport(self, i) for i in range(self.n)]

    # -- random streams -------------------------------------------------------------------
    def _get_rng(self) -> dict[str, Any]:
        with _RNG_SWAP:
            return ckpt.rng_state(self.device)

    def _set_rng(self, state: dict[str, Any]) -> None:
        with _RNG_SWAP:
            ckpt.set_rng_state(state, self.device)

    # -- turns ----------------------------------------------------------------------------
    def _wait_turn(self, i: int) -> None:
        self._turn[i].acquire()
        if self._failure is not None:
            raise _Aborted()
        self._set_rng(self._rng[i])

    def _hand_over(self, i: int, j: int) -> None:
        """Node ``i`` parks and node ``j`` runs; returns when ``i`` has the turn again."""
        self._rng[i] = self._get_rng()
        self._turn[j].release()
        self._wait_turn(i)

    def run(self, fn: Callable[[int, VirtualTransport], Any]) -> dict[int, Any]:
        """Run ``fn(rank, transport)`` for every hosted node, one turn at a time; return
        ``{rank: result}``. Raises ``VirtualNodeError`` for the first node that raised."""
        results: dict[int, Any] = {}

        def body(i: int) -> None:
            rank = self.ranks[i]
            try:
                self._wait_turn(i)
                results[rank] = fn(rank, self.transports[i])
                self._rng[i] = self._get_rng()
                nxt = self._advance()
                if nxt is not None:
                    self._turn[nxt].release()
            except _Aborted:
                pass
            except BaseException as e:  # noqa: BLE001 - reported by the worker
                self._fail(VirtualNodeError(rank, e, traceback.format_exc()))

        threads = [
            threading.Thread(target=body, args=(i,), name=f"exogym-node-{self.ranks[i]}", daemon=True)
            for i in range(self.n)
        ]
        for t in threads:
            t.start()
        self._turn[self._to_run[0]].release()
        for t in threads:
            t.join()
        if self._failure is not None:
            raise self._failure
        return results

    def _fail(self, error: VirtualNodeError) -> None:
        if self._failure is None:
            self._failure = error
        for lock in self._turn:  # every parked node wakes and aborts
            with contextlib.suppress(RuntimeError):  # (a turn given but not yet taken)
                lock.release()

    # -- collectives ----------------------------------------------------------------------
    def _advance(self) -> int | None:
        """The node that had the turn has parked or ended: the node to run next, or ``None``
        when every node has ended. The last node of a turn runs the collectives every node has
        a call queued for, until one of them gives a node its turn back."""
        self._cursor += 1
        if self._cursor < len(self._to_run):
            return self._to_run[self._cursor]
        while self._empty == 0:
            released = self._execute()
            if released:
                self._to_run, self._cursor = released, 0
                return released[0]
        if self._empty < self.n:  # some nodes have nothing queued (finished) while others wait
            ended = [self.ranks[j] for j in range(self.n) if not self._queued[j]]
            waiting = [self.ranks[j] for j in range(self.n) if self._queued[j]]
            what = next(q[0] for q in self._queued if q).describe()
            raise CollectiveMismatchError(f"node(s) {ended} finished the run while node(s) {waiting} wait in {what}")
        return None

    def enqueue(self, i: int, call: Call) -> None:
        """Node ``i`` needs nothing from the next collective (it only contributes,
        ``call.detached``): the call is queued and the node runs on, unless
        it has ``MAX_QUEUED`` calls queued: then it waits for them, which bounds the memory
        they hold and how far the worker's nodes drift apart. A contribution to an all-reduce is
        folded into the collective's running reduction at once (the worker holds one tensor per
        collective and group, not one per node: the final average of 500 nodes would hold 500
        model copies); one to an all-gather is kept until the gather runs."""
        queued = len(self._queued[i])
        self._fold(i, call, self._executed + queued)
        if queued + 1 < MAX_QUEUED:
            self._append(i, call)
            if self._empty == 0:
                self._run_ready(i)
        else:
            self.collective(i, call)

    def _append(self, i: int, call: Call) -> None:
        queue = self._queued[i]
        queue.append(call)
        if len(queue) == 1:
            self._empty -= 1

    def _run_ready(self, i: int) -> None:
        """Node ``i``, which holds the turn and waits for nothing, has queued the last call the
        next collective needed: run at once the collectives every node has a call queued for,
        not once ``i`` parks. Where one gives nodes their turn back, they run first and ``i`` after
        them. A node that trains many steps between its own collectives then lets the
        collectives of other nodes through as it goes (otherwise the worker would hold them,
        and the other workers with them, until it parks)."""
        while self._empty == 0:
            if self.outer is not None and not self.outer.peers_waiting():
                return  # no other worker waits for it yet: work on, run it when this node parks
            released = self._execute()
            if released:
                self._to_run, self._cursor = [*self._to_run[self._cursor + 1 :], *released, i], 0
                self._hand_over(i, self._to_run[0])
                return

    def _fold(self, i: int, call: Call, index: int) -> None:
        """Reduce the tensor of ``call`` (a contribution) into the running result of collective
        ``index`` for its group, and keep only a stand-in (its dtype and shape) in the call. Only
        all-reduces fold, and not in half precision: ``reduce_rows_into`` adds those in float32
        at once."""
        t = call.tensor
        if call.kind != "all_reduce" or t is None or t.dtype in (torch.float16, torch.bfloat16):
            return
        assert call.op is not None
        key = (index, call.members)
        acc = self._folded.get(key)
        if acc is None:
            self._folded[key] = t.clone()
        elif acc.shape != t.shape or acc.dtype != t.dtype:
            raise CollectiveMismatchError(
                f"node {self.ranks[i]} called {call.describe()} where another node contributed "
                f"{acc.numel()} x {acc.dtype} to the same all-reduce"
            )
        else:
            reduce_rows_into([acc, t], call.op, acc)
        call.tensor = torch.empty(t.shape, dtype=t.dtype, device="meta")
        call.folded = True

    def collective(self, i: int, call: Call) -> Call:
        """Node ``i`` arrives at a collective: park until every hosted node has queued a call
        for it and the last one has combined them. Collective: every hosted node must call it."""
        call.waits = True
        self._append(i, call)
        nxt = self._advance()
        assert nxt is not None  # this node's call is queued: some collective gives a turn back
        if nxt != i:
            self._hand_over(i, nxt)
        return call

    def _execute(self) -> list[int]:
        """Run the collective every node's queue starts with; return the nodes whose real call
        it completed (in order)."""
        queued = self._queued
        calls = [q[0] for q in queued]
        first = calls[0]
        for j, c in enumerate(calls):
            self._check(first, c, j)
        if first.kind == "barrier":
            if self.outer is not None:
                self.outer.barrier()
        elif first.kind == "broadcast":
            self._broadcast(calls, first.src)  # type: ignore[arg-type]
        elif first.kind == "all_reduce":
            self._all_reduce(calls, first)
        else:
            self._all_gather(calls)
        self._executed += 1
        released = []
        empty = 0
        for j, c in enumerate(calls):
            if c.waits:
                released.append(j)
            queued[j].popleft()
            empty += not queued[j]
        self._empty = empty
        return released

    def _check(self, first: Call, c: Call, j: int) -> None:
        """``CollectiveMismatchError`` where node ``j``'s call ``c`` does not match ``first``
        (its kind, op, source and dtype, and its size within one group)."""
        same = c.kind == first.kind and c.op == first.op and c.src == first.src
        if same and c.tensor is not None and first.tensor is not None:
            same = c.tensor.dtype == first.tensor.dtype and (
                c.members != first.members or c.tensor.numel() == first.tensor.numel()
            )
        if not same:
            raise CollectiveMismatchError(
                f"node {self.ranks[0]} called {first.describe()} but node "
                f"{self.ranks[j]} called {c.describe()} at the same point"
            )


class VirtualTransport(Transport):
    """The ``Transport`` of one virtual node: every call parks
    the node at its worker's ``VirtualHub`` until the worker's nodes have all arrived."""

    def __init__(self, hub: VirtualHub, index: int) -> None:
        self.hub, self.index = hub, index
        self.rank = hub.ranks[index]
        self.world_size = hub.num_nodes

    def all_reduce(self, tensor: torch.Tensor, op: str, members: Sequence[int] | None = None) -> None:
        self.hub.collective(self.index, Call("all_reduce", op, _key(members), tensor))

    def all_gather(self, tensor: torch.Tensor, members: Sequence[int] | None = None) -> torch.Tensor:
        out = self.hub.collective(self.index, Call("all_gather", None, _key(members), tensor)).result
        assert out is not None
        return out

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.hub.collective(self.index, Call("broadcast", None, None, tensor, src))

    def barrier(self) -> None:
        self.hub.collective(self.index, Call("barrier"))

    def all_reduce_contribute(self, tensor: torch.Tensor, op: str, members: Sequence[int] | None = None) -> None:
        """Returns at once: the hub reads ``tensor`` when the collective runs."""
        self.hub.enqueue(self.index, Call("all_reduce", op, _key(members), tensor, detached=True))

    def all_gather_contribute(self, tensor: torch.Tensor, members: Sequence[int] | None = None) -> None:
        """Returns at once: the hub reads ``tensor`` when the collective runs."""
        self.hub.enqueue(self.index, Call("all_gather", None, _key(members), tensor, detached=True))


def _key(members: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if members is None else tuple(map(int, members))


__all__ = ["MAX_QUEUED", "VirtualHub", "VirtualNodeError", "VirtualTransport"]
