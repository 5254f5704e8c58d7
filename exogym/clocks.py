"""A simulated clock per node.

Every node keeps its own simulated time. Its compute advances it; a step's collectives start when
the last of their participants' backward passes starts (``Network.backward_share`` of its compute
before the end) and last the step's modelled communication time (the longest of theirs, from
``Network.records_span``: where a meeting joins several collectives, e.g. a FedAvg round's
all-reduce among the participants and the broadcast to the others, everyone leaves when the last
transfer ends); every participant leaves when they end, or when its own compute ends if that is
later. What of a node's own transfers its backward pass does not hide counts as its
communication, the rest of the meeting as waiting. A node's collectives in one step are taken as
one meeting of everyone they join; nodes that take part in no collective of a step do not wait
for anyone: islands that average inside themselves run on their own clocks. The run's simulated
time is the latest node's clock.

How it is computed: each node turns its pending step samples into *events* (the steps where it
computes, meets others, closes a train row, or ends a flush: ``(step, compute seconds, meeting
key, communication seconds)``, ``events``); the metrics flush gathers them and rank
0 replays them in step order (``NodeClocks``). With bandwidth traces a step's collectives cost
what the bandwidths make them when its meeting starts, which only the replay knows: a node's
events then carry its step's collectives themselves (``RECORD_COLUMNS``), and rank 0 prices each
node's at the start of its meeting, on the world of that trace epoch (a bisection), among the
nodes whose events carry the collective's key in that step (its members). A meeting key names a group of participants
(``meeting_keys``): in one step, the nodes joined through common keys meet (the first
participant of a FedAvg round, in the participants' all-reduce and in the broadcast to the
others, joins both: every node of the round waits for its slowest participant).

Per node the replay keeps compute seconds, communication seconds and seconds spent waiting for
others (``clock = compute + communication + waiting``; utilisation ``= compute / clock``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from exogym.core.comm.ledger import KINDS, CollectiveRecord

if TYPE_CHECKING:
    from exogym.core.comm.world import World

#: Columns of an event row: the step's communication seconds in ``comm``. Tables priced ahead
#: for each epoch of a world's bandwidth traces carry one ``comm`` column per epoch.
EVENT_COLUMNS = ("step", "compute", "key", "comm")

#: Columns of the events of a world with bandwidth traces, whose collectives rank 0 prices: a
#: step's row has ``kind`` 0 and in ``comm`` the seconds it stalls on handles (non-blocking
#: waits); after it, one row per blocking collective of the step, in the node's order, with
#: ``kind`` ``1 + KINDS.index(kind)``, its ``key`` (``record_key``; 0 for a group of one), payload
#: bytes, ``size`` (the group's; negative: a charge that names no members) and ``overlap`` steps.
RECORD_COLUMNS = (*EVENT_COLUMNS, "kind", "payload", "size", "overlap")

_KEY_MOD = (1 << 52) - 1  # keys are exact in a float64

# Per process: the key of a members tuple seen last, by identity (records of one group share one
# tuple, so a step's key is found without hashing a thousand ranks again).
_KEYS: dict[int, tuple[tuple[int, ...], float]] = {}


def _key_of(participants: tuple[Any, ...]) -> float:
    return float(hash(participants) % _KEY_MOD + 1)


def _group_key(members: tuple[int, ...]) -> float:
    cached = _KEYS.get(id(members))
    if cached is not None and cached[0] is members:
        return cached[1]
    key = _key_of(members)
    if len(_KEYS) > 4096:
        _KEYS.clear()
    _KEYS[id(members)] = (members, key)
    return key


def record_key(r: CollectiveRecord) -> float:
    """The meeting key of one record's group (its members', or the unnamed group of its size's);
    ``0`` for a group of one."""
    if r.group_size <= 1:
        return 0.0
    return _group_key(r.members) if r.members is not None else _key_of(("unnamed", r.group_size))


def record_rows(records: Sequence[CollectiveRecord]) -> tuple[tuple[float, ...], ...]:
    """The rows (``RECORD_COLUMNS`` from ``kind`` on, with the key first) of a step's blocking
    ``records``, in their order: ``(key, kind, payload, size, overlap)``."""
    return tuple(
        (record_key(r), 1.0 + KINDS.index(r.kind), r.payload, r.group_size * (1 if r.members is not None else -1),
         r.overlap_steps)
        for r in records
        if r.blocking
    )  # fmt: skip


def meeting_keys(records: Sequence[CollectiveRecord]) -> tuple[float, ...]:
    """The keys of the groups a step's ``records`` meet in, one per distinct group of two
    or more (the same key on every member): ``()`` when the node meets no one. A record
    whose participants are not named meets the nodes charged alike (keyed by its group size);
    a collective started with ``async_op=True`` (``blocking=False``) meets no one."""
    keys: list[float] = []
    seen: list[object] = []
    for r in records:
        group: object = r.members if r.members is not None else r.group_size
        if r.group_size <= 1 or not r.blocking or any(g is group or g == group for g in seen):
            continue
        seen.append(group)
        keys.append(record_key(r))
    return tuple(keys)


def events(
    first_done: int,
    compute: np.ndarray,
    comm: np.ndarray,
    keys: np.ndarray,
    log_interval: int,
    max_steps: int,
    more_keys: dict[int, tuple[float, ...]] | None = None,
    records: dict[int, tuple[tuple[float, ...], ...]] | None = None,
) -> np.ndarray:
    """One node's event rows (``EVENT_COLUMNS``) for its pending steps ``first_done``,
    ``first_done + 1``, ... (counted as steps done), from their modelled compute, communication
    (``[steps]``, or ``[steps, epochs]`` priced ahead per trace epoch) and first meeting key
    (``more_keys``: pending index -> the step's other keys, one more row each with no compute or
    communication): an event at every step where the node computes, meets others or
    communicates, where a train row closes, and at the last pending step (the steps between add
    nothing to its clock). Step by step, so a clock's sums do not depend on
    where the flushes fall. ``records`` (a world with traces: pending index -> ``record_rows``
    of the step): ``RECORD_COLUMNS`` rows, ``comm`` the steps' stalls on handles."""
    n = len(compute)
    comm = comm.reshape(n, -1)
    done = first_done + np.arange(n)
    mark = (compute != 0) | (keys != 0) | (comm != 0).any(axis=1) | (done % log_interval == 0) | (done == max_steps)
    if records:
        mark[[i for i, rows in records.items() if rows]] = True
    mark[-1] = True
    at = np.flatnonzero(mark)
    table = np.column_stack([done[at].astype(np.float64), compute[at], keys[at], comm[at]])
    width = len(RECORD_COLUMNS) if records is not None else table.shape[1]
    if width > table.shape[1]:
        table = np.concatenate([table, np.zeros((len(table), width - table.shape[1]))], axis=1)
    extra = []
    for i, ks in sorted((more_keys or {}).items()):
        extra.extend([first_done + i, 0.0, k] + [0.0] * (width - 3) for k in ks)
    for i, rows in sorted((records or {}).items()):
        extra.extend([first_done + i, 0.0, key, 0.0, *rest] for key, *rest in rows)
    if extra:
        table = np.concatenate([table, np.array(extra, dtype=np.float64)])
    return table


def _components(node: np.ndarray, key: np.ndarray, count: int) -> np.ndarray:
    """Per node index in ``[0, count)``: a label shared by the nodes joined through common keys
    (``node[i]`` meets in ``key[i]``; key ``0`` joins no one)."""
    parent = list(range(count))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[float, int] = {}
    for i, k in zip(node.tolist(), key.tolist(), strict=True):
        if k == 0:
            continue
        j = first.setdefault(k, i)
        a, b = root(i), root(j)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return np.array([root(i) for i in range(count)])


class NodeClocks:
    """Every node's clock and its parts, replayed from the nodes' events (rank 0's).

    Args:
        num_nodes: the run's nodes.
        changes: the simulated seconds at which the world's traces change (event tables priced
            ahead then carry one communication column per epoch: a meeting pays the one of the
            epoch it starts in).
        backward_share: the backward pass's share of a step's compute
            ([`Network.backward_share`][exogym.Network]): an event's communication is the span of
            its collectives from the start of its backward pass, and a meeting's collectives start
            when the last of its participants' backward passes starts.
        world: a world with bandwidth traces whose event tables carry the steps' collectives
            (``RECORD_COLUMNS``): each node's are priced at the start of its meeting
            ([`records_span`][exogym.Network.records_span]'s rule, on ``world.at(start)``).
    """

    def __init__(
        self, num_nodes: int, changes: Sequence[float] = (), backward_share: float = 0.0, world: World | None = None
    ) -> None:
        self.changes = np.asarray(changes, dtype=np.float64)
        self.backward_share = backward_share
        self.world = world
        self._members: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per group: priced once per epoch
        self.clock = np.zeros(num_nodes)
        self.compute = np.zeros(num_nodes)
        self.comm = np.zeros(num_nodes)
        self.wait = np.zeros(num_nodes)

    def replay(self, table: np.ndarray) -> dict[int, tuple[float, float]]:
        """Advance the clocks over ``table`` (``[nodes, events, 3 + epochs]``: every node's events,
        padded with rows of step 0; ``RECORD_COLUMNS`` wide with a ``world``) and return, per step
        that some event names, ``(simulated time, the latest node's communication seconds)`` after
        it: the latest clock, and the communication part of that node's time (the first such node
        by rank)."""
        nodes, per, width = table.shape
        flat = table.reshape(-1, width)
        rank = np.repeat(np.arange(nodes), per)
        keep = flat[:, 0] > 0
        flat, rank = flat[keep], rank[keep]
        order = np.argsort(flat[:, 0], kind="stable")  # by step, ranks ascending within one
        flat, rank = flat[order], rank[order]
        recs = rec_rank = None
        if self.world is not None:  # the collectives apart from the events, in the same order
            is_rec = flat[:, 4] != 0
            recs, rec_rank = flat[is_rec], rank[is_rec]
            flat, rank = flat[~is_rec, :4], rank[~is_rec]
        steps = flat[:, 0]
        bounds = np.flatnonzero(np.diff(steps)) + 1
        out: dict[int, tuple[float, float]] = {}
        clock, compute, comm = self.clock, self.compute, self.comm
        one_epoch = flat.shape[1] == 4
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(steps)], strict=True):
            r, c, key, m = rank[lo:hi], flat[lo:hi, 1], flat[lo:hi, 2], flat[lo:hi, 3:]
            step = int(steps[lo])
            several = len(r) > 1 and (np.diff(r) == 0).any()
            step_recs = None
            if recs is not None and rec_rank is not None:
                a, b = np.searchsorted(recs[:, 0], [step, step + 0.5])
                step_recs = (rec_rank[a:b], recs[a:b]) if b > a else None
            if one_epoch and not several and not key.any() and step_recs is None:
                # No one meets (an asynchronous run's ticks): each clock moves by its own
                # compute and communication, as _advance works out for groups of one.
                arrive = clock[r] + c
                own = m[:, 0] if self.world is None else self._spans(r, c, m[:, 0], arrive, None)
                own = np.maximum(0.0, own - self.backward_share * c)
                compute[r] += c
                comm[r] += own
                clock[r] = arrive + own
            else:
                self._advance(r, c, key, m, several, step_recs)
            last = int(np.argmax(clock))
            out[step] = (float(clock[last]), float(comm[last]))
        return out

    def _advance(
        self,
        r: np.ndarray,
        c: np.ndarray,
        key: np.ndarray,
        m: np.ndarray,
        several: bool,
        recs: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """One step's events (nodes ``r``, compute ``c``, meeting keys ``key``, communication
        ``m`` per epoch, or with a ``world`` the stalls on handles and the step's collectives
        ``recs``): the nodes of each meeting wait for its latest arrival and its longest
        communication. ``several``: some node has several rows (it meets in several groups)."""
        clock, compute, comm, wait = self.clock, self.compute, self.comm, self.wait
        if several:  # a node in several groups: one row per node
            r, at = np.unique(r, return_inverse=True)
            c = np.bincount(at, c, len(r))
            m = np.stack([np.bincount(at, col, len(r)) for col in m.T], axis=1)
            label = _components(at, key, len(r))
        else:
            label = np.where(key != 0, np.unique(key, return_inverse=True)[1] + len(r), np.arange(len(r)))
        arrive = clock[r] + c
        start = arrive - self.backward_share * c  # where each node's collectives may start
        _, group = np.unique(label, return_inverse=True)
        latest = np.full(group.max() + 1, -np.inf)
        np.maximum.at(latest, group, arrive)
        begin = np.full(group.max() + 1, -np.inf)
        np.maximum.at(begin, group, start)
        # Each meeting starts when its last participant's backward pass starts, priced in that epoch.
        if self.world is not None:
            m = self._spans(r, c, m[:, 0], begin[group], recs)
        elif m.shape[1] > 1:
            m = m[np.arange(len(r)), np.searchsorted(self.changes, begin[group], side="right")]
        else:
            m = m[:, 0]
        longest = np.zeros(group.max() + 1)
        np.maximum.at(longest, group, m)
        beyond = np.maximum(0.0, (begin - latest) + longest)  # the meeting past its latest compute end
        own = np.maximum(0.0, m - (arrive - start))  # its own collectives beyond its backward pass
        compute[r] += c
        wait[r] += (latest[group] - arrive) + (beyond[group] - own)
        comm[r] += own
        clock[r] = latest[group] + beyond[group]

    def _spans(
        self,
        r: np.ndarray,
        c: np.ndarray,
        stall: np.ndarray,
        at: np.ndarray,
        recs: tuple[np.ndarray, np.ndarray] | None,
    ) -> np.ndarray:
        """Per node ``r[i]`` (compute ``c[i]``, stalled ``stall[i]`` seconds on handles): the
        span of its step's collectives ``recs`` starting at simulated second ``at[i]``, priced on
        ``world.at(at[i])`` as ``Network.records_span`` prices them; a stall adds to the span
        from the end of the backward pass on, as the node's meter adds it."""
        world = self.world
        assert world is not None
        out = np.zeros(len(r))
        mine: dict[int, list[int]] = {}
        members: dict[float, list[int]] = {}
        if recs is not None:
            ranks, rows = recs
            kinds, payloads, sizes, overlaps, keys = (rows[:, i].tolist() for i in (4, 5, 6, 7, 2))
            for j, (node, k, size) in enumerate(zip(ranks.tolist(), keys, sizes, strict=True)):
                mine.setdefault(node, []).append(j)
                if k and size > 0:
                    group = members.setdefault(k, [])
                    if not group or group[-1] != node:
                        group.append(node)
            named = {}
            for k, group in members.items():
                t = tuple(sorted(set(group)))
                if len(self._members) > 4096:
                    self._members.clear()
                named[k] = self._members.setdefault(t, t)
        rows_of = zip(r.tolist(), c.tolist(), stall.tolist(), at.tolist(), strict=True)
        for i, (node, compute, s, t) in enumerate(rows_of):
            blocking = overlapped = budget = 0.0
            if node in mine:
                epoch = world.at(t)
                for j in mine[node]:
                    n = int(abs(sizes[j]))
                    group = named[keys[j]] if sizes[j] > 0 and n > 1 else None
                    seconds = epoch.seconds(KINDS[int(kinds[j]) - 1], payloads[j], group, n) if n > 1 else 0.0
                    if overlaps[j]:
                        overlapped += seconds
                        budget = max(budget, overlaps[j] * compute)
                    else:
                        blocking += seconds
            span = max(blocking, blocking + overlapped - budget)
            if s:
                span = max(span, self.backward_share * compute) + s
            out[i] = span
        return out

    def table(self) -> list[dict[str, float]]:
        """Per node: ``rank``, ``compute``, ``comm`` and ``wait`` seconds, its ``clock`` and
        ``utilisation`` (compute / clock; 1 for a clock at zero)."""
        return [
            {
                "rank": r,
                "compute": float(self.compute[r]),
                "comm": float(self.comm[r]),
                "wait": float(self.wait[r]),
                "clock": float(self.clock[r]),
                "utilisation": float(self.compute[r] / self.clock[r]) if self.clock[r] > 0 else 1.0,
            }
            for r in range(len(self.clock))
        ]

    def state_dict(self) -> dict[str, list[float]]:
        """The clocks and their parts (checkpoints)."""
        return {k: getattr(self, k).tolist() for k in ("clock", "compute", "comm", "wait")}

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        """Continue from ``state_dict``."""
        for k in ("clock", "compute", "comm", "wait"):
            getattr(self, k)[:] = state[k]


def format_table(rows: Sequence[dict[str, float]], limit: int = 16) -> str:
    """The per-node table (``NodeClocks.table``) as text; with more than ``limit`` nodes,
    the ``limit // 2`` least and most utilised."""
    shown = list(rows)
    if len(shown) > limit:
        by = sorted(shown, key=lambda r: (r["utilisation"], r["rank"]))
        shown = by[: limit // 2] + by[-(limit // 2) :]
    lines = [f"{'node':>6}{'compute s':>12}{'comm s':>12}{'wait s':>12}{'clock s':>12}{'util':>7}"]
    for r in shown:
        lines.append(
            f"{int(r['rank']):>6}{r['compute']:>12.3f}{r['comm']:>12.3f}{r['wait']:>12.3f}"
            f"{r['clock']:>12.3f}{percent(r['utilisation']):>7}"
        )
    if len(shown) < len(rows):
        lines.append(f"({len(rows) - len(shown)} more nodes between these)")
    return "\n".join(lines)


def percent(x: float | None) -> str:
    """A utilisation as text: ``"<1%"`` above 0 and below 0.5%, ``"-"`` for none or ``nan``."""
    if x is None or x != x:
        return "-"
    return "<1%" if 0 < x < 0.005 else f"{x:.0%}"


def format_summary(summary: dict[str, object], limit: int = 16) -> str:
    """A strategy's [`run_summary`][exogym.strategy.Strategy.run_summary] in one line for logs:
    ``key=value`` pairs, floats (also in lists) to 4 significant digits; a list of more than
    ``limit`` numbers (one per node of a large run) as its length, mean, minimum and maximum."""

    def text(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        if isinstance(v, list) and len(v) > limit and all(isinstance(x, (int, float)) for x in v):
            return f"[{len(v)} values: mean {sum(v) / len(v):.4g}, min {text(min(v))}, max {text(max(v))}]"
        if isinstance(v, list):
            return "[" + ", ".join(text(x) for x in v) + "]"
        return str(v)

    return ", ".join(f"{k}={text(v)}" for k, v in summary.items())


__all__ = [
    "EVENT_COLUMNS",
    "RECORD_COLUMNS",
    "NodeClocks",
    "events",
    "format_summary",
    "format_table",
    "meeting_keys",
    "percent",
    "record_key",
    "record_rows",
]
