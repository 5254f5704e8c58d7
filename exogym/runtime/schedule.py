"""Rounds, idle steps and sleeps, derived from the communicators' participation statements.

A communicator that lets only some nodes train in a round says so in one statement
([`participation`][communicators.Communicator.participation]); its pipeline combines its
modules' statements ([`Pipeline`][communicators.Pipeline]). Everything the runtime does
with that is derived here, in one place:

- the run's *round* (``round_steps``): the longest period among the strategy's modules; the
  unit of fault injection, of the progress bar and of node placement;
- which nodes train in a round (``sampled_nodes``), asked before the nodes exist, to place
  them on workers (``exogym.runtime.placement``);
- for one node (``NodeSchedule``): the steps it is idle (``NodeSchedule.idle_steps``),
  whether it may sleep through a round's communication because a later one replaces what it
  would receive (``NodeSchedule.overwritten_at``), and the plan of a sleep through many
  rounds at once (``NodeSchedule.idle_span_ends``).

Every answer depends only on shared values (the statements, step, rank, seed, run length), so
every node derives the same schedule.
"""

from __future__ import annotations

import sys
from typing import Any

from exogym.core.communicator import Communicator, Participation
from exogym.core.pipeline import checked_statement

#: Rounds whose statement a node keeps (it asks about the current round at every step and looks
#: a round or two ahead; a sleep's plan walks further without keeping them).
KEPT_ROUNDS = 4


def modules(strategy: Any) -> list[Communicator]:
    """The communicators of ``strategy`` (nested pipelines and wrappers flattened), or ``[]``
    for a strategy without a pipeline."""
    return [] if strategy.pipeline is None else strategy.pipeline.leaves()


def round_steps(strategy: Any) -> int:
    """Steps per round: the largest ``H`` among the strategy's communicators (1 without any).
    Faults drop nodes for whole rounds; the progress bar of a run that samples clients counts
    them; placement balances each round's sampled clients."""
    return max((m.H for m in modules(strategy)), default=1)


def statement(strategy: Any, step: int, num_nodes: int, seed: int) -> Participation | None:
    """The strategy's participation statement for the round of ``step`` (``None``: every node
    trains)."""
    return None if strategy.pipeline is None else strategy.pipeline.participation(step, num_nodes, seed)


def samples_clients(strategy: Any, num_nodes: int, seed: int) -> bool:
    """Whether the strategy lets only some nodes train in its first round."""
    first = statement(strategy, 0, num_nodes, seed)
    return first is not None and len(first.trains) < num_nodes


def sampled_nodes(strategy: Any, num_nodes: int, seed: int, step: int) -> list[int] | None:
    """The nodes that train in the round of ``step``, ascending, or ``None``: every node trains.
    Asked on the strategy as built, before any node exists: a hint for where nodes run (a
    wrong answer costs time, never correctness)."""
    st = statement(strategy, step, num_nodes, seed)
    return None if st is None else sorted(st.trains)


class NodeSchedule:
    """One node's idle steps and sleeps, from its bound strategy's statements.

    Args:
        strategy: the node's strategy, bound (``_init_node`` done).
        rank, num_nodes, seed, max_steps: the node's and the run's.
    """

    def __init__(self, strategy: Any, rank: int, num_nodes: int, seed: int, max_steps: int) -> None:
        self.strategy, self.rank, self.num_nodes, self.seed = strategy, rank, num_nodes, seed
        self.max_steps = max_steps
        self.leaves = modules(strategy)
        #: Whether contributing nothing equals contributing ``op``'s identity for every module's
        #: comm (not with error-feedback residuals): only then may the node sleep.
        self.can_sit_out = all(_comm_of(m).can_sit_out for m in self.leaves)
        self._period = 0
        self._kept: dict[int, Participation] = {}
        self._planned: dict[int, Participation] = {}  # the last rounds a sleep's plan asked about

    def statement(self, step: int, keep: bool = True) -> Participation | None:
        """The participation statement for the round of ``step``: kept for the next few rounds
        asked about where ``keep``, else only while a sleep's plan walks past it (it asks about
        each round and the next a few times)."""
        period = self._period
        if period:
            round_ = step // period
            st = self._kept.get(round_) or self._planned.get(round_)
            if st is not None:
                return st
        if len(self.leaves) == 1:  # what the pipeline answers for one module, without assembling a list
            st = self.leaves[0].participation(step, self.num_nodes, self.seed)
            if st is None:
                return st
            st = checked_statement(self.leaves[0], st, self.num_nodes)
        else:
            st = statement(self.strategy, step, self.num_nodes, self.seed)
            if st is None:
                return st
        if st.period != period:
            self._period, self._kept, self._planned = st.period, {}, {}
        if not keep:
            if len(self._planned) >= 2:
                self._planned = {}
            self._planned[step // st.period] = st
            return st
        if len(self._kept) >= KEPT_ROUNDS:  # the earliest half goes (rounds are asked about in order)
            self._kept = dict(sorted(self._kept.items())[KEPT_ROUNDS // 2 :])
        self._kept[step // st.period] = st
        return st

    def idle_steps(self, step: int, keep: bool = True) -> int:
        """How many steps from ``step`` on this node sits out: it neither computes nor reads
        its data, and only the last of those steps communicates (the parameter-space modules
        due then). ``0``: it trains at ``step``. A span ends at the first step where any module
        communicates, and is ``0`` where a gradient-space module would communicate inside it
        (it needs this node's gradients)."""
        st = self.statement(step, keep)
        if st is None or not st.idle(self.rank):
            return 0
        span = st.period - step % st.period
        if len(self.leaves) == 1:  # the stating module: the span ends where it communicates
            return span
        for s in range(step, step + span):
            due = [m for m in self.leaves if m.is_due(s)]
            if any(m.space == "grad" for m in due):
                return 0
            if due:
                return s - step + 1
        return span

    def quiet_through(self, step: int, n: int, stop: int) -> int:
        """The idle span of ``n`` steps from ``step`` (``idle_steps``), extended over the
        rounds after it while the module does not communicate at the span's end for this node
        ([`is_due`][communicators.Communicator.is_due]) and the node is idle in the next
        round, before ``stop``: the node sits them out as one span, communicating at most at its
        last step (an asynchronous client between its transfers). Strategies of one module
        only (``n`` otherwise)."""
        if len(self.leaves) != 1:
            return n
        (module,) = self.leaves
        end = step + n - 1
        while end + 1 < stop and not module.is_due(end):
            st = self.statement(end + 1, keep=False)
            if st is None or not st.idle(self.rank):
                break
            end += st.period
        return end - step + 1

    def overwritten_at(self, step: int, keep: bool = True) -> int | None:
        """For a node idle at ``step`` (the last step of an idle span, where modules
        communicate): the later step whose communication replaces all the node would receive
        now, the node idle until then (``step`` itself where no module communicates at it:
        nothing to replace); ``None`` where it must take part now. Where it is not ``None`` the
        node may sit ``step``'s communication out."""
        if not self.can_sit_out:
            return None
        st = self.statement(step, keep)
        if st is None or not st.idle(self.rank):
            return None
        due = [m for m in self.leaves if m.is_due(step)]
        if not due:  # no module communicates at this step: nothing to replace
            return step
        if len(self.leaves) > 1 and any(m.participation(step, self.num_nodes, self.seed) is None for m in due):
            return None  # a module without a statement communicates now: the node takes part
        until = step + st.period
        if until >= self.max_steps:
            return None  # the next round ends after the run
        nxt = self.statement(step + 1, keep)
        if nxt is None or not nxt.replaces or not nxt.idle(self.rank):
            return None
        return until if self.idle_steps(step + 1, keep) == st.period else None

    def idle_span_ends(self, step: int, stop: int, read_at: int) -> list[int]:
        """The plan of a sleep: from ``step`` (where an idle span starts), the last steps of the
        idle spans in a row that the node may sit out whole: each span idle from its first step,
        ending before ``stop``, and its communication replaced before step ``read_at``, where
        something reads the node's state (validation)."""
        if len(self.leaves) == 1:
            return self._single_span_ends(step, stop, read_at)
        ends: list[int] = []
        s = step
        while s < stop:
            n = self.idle_steps(s, keep=False)
            if not n or s + n > stop:
                break
            until = self.overwritten_at(s + n - 1, keep=False)
            if until is None or until >= read_at:
                break
            ends.append(s + n - 1)
            s += n
        return ends

    def _single_span_ends(self, step: int, stop: int, read_at: int) -> list[int]:
        """``idle_span_ends`` of a strategy of one module (the module that states the rounds,
        which communicates at most at each round's last step): each round's statement is asked
        once, and the next round's answers both whether this round's communication is replaced
        and whether the node sleeps on (what ``idle_steps`` and ``overwritten_at`` say,
        step by step, for one module)."""
        ends: list[int] = []
        if not self.can_sit_out:
            return ends
        rank = self.rank
        s = step
        st = self.statement(s, keep=False)
        while s < stop:
            if st is None or rank in st.trains:
                break
            period = st.period
            end = s + period - s % period - 1
            if end >= stop:
                break
            until = end + period
            if until >= self.max_steps or until >= read_at:
                break
            nxt = self.statement(end + 1, keep=False)
            if nxt is None or not nxt.replaces or rank in nxt.trains:
                break
            if nxt.period - (end + 1) % nxt.period != period:  # the next span is not a whole round
                break
            ends.append(end)
            s, st = end + 1, nxt
        return ends

    def may_sit_out(self, step: int, read_at: int = sys.maxsize) -> bool:
        """Whether this idle node may sit out the communication of ``step``: a later
        communication replaces what it would receive, before step ``read_at``."""
        until = self.overwritten_at(step)
        return until is not None and until < read_at


def _comm_of(module: Communicator) -> Any:
    try:
        return module.ctx.comm
    except AttributeError:
        raise TypeError(
            f"{type(module).__name__}.setup(ctx) must call super().setup(ctx) (it keeps the node's context)"
        ) from None


__all__ = [
    "KEPT_ROUNDS",
    "NodeSchedule",
    "modules",
    "round_steps",
    "sampled_nodes",
    "samples_clients",
    "statement",
]
