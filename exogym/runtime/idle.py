"""How a node spends the steps it does not train: idle spans, the idle step that receives a
round's result, and sleeping through the rounds it sits out.

What is idle and what may be sat out comes from the node's
``NodeSchedule``; this module adds what the loop itself needs:
where the loop's own collectives (metrics flush, validation, checkpoint, the end) bound a span,
and the sleep that sits out the communications of many rounds at once while each round still
gets the steps, charges and metric sample the loop would give it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from exogym.clocks import meeting_keys
from exogym.config import FitConfig
from exogym.core.comm.comm import NodeComm
from exogym.core.communicator import Communicator
from exogym.core.strategy import Strategy
from exogym.runtime import faults as F
from exogym.runtime import schedule as S
from exogym.runtime.meter import StepMeter

#: Pending step samples are exchanged across nodes at least this often (in steps), times the
#: number of whole multiples of it in the nodes a worker hosts (see ``flush_interval``).
_FLUSH_STEPS = 64

#: What the pending step samples of a worker's nodes may take before a flush, where a longer
#: interval is worth it (``flush_interval``), and the bytes of one node's sample of a step
#: (``MetricsBuffer`` keeps twelve float64 numbers per pending step).
_PENDING_BYTES = 128 * 2**20
_SAMPLE_BYTES = 96


def _spans(ends: list[int], start: int) -> np.ndarray:
    """The lengths of the rounds that end at ``ends`` (ascending), the first starting at
    ``start``: what ``np.diff(ends, prepend=start - 1)`` gives, without its copies (a sleep
    between two steps of an asynchronous client)."""
    at = np.asarray(ends, dtype=np.int64)
    spans = np.empty_like(at)
    spans[0] = ends[0] - start + 1
    np.subtract(at[1:], at[:-1], out=spans[1:])
    return spans


def flush_interval(log_interval: int, num_nodes: int, workers: int) -> int:
    """Steps between two exchanges of the nodes' metric samples: a multiple of
    ``log_interval`` of at least 64 steps. A flush costs each worker in proportion to the nodes
    it hosts (``hosted``, the most on any worker) and whatever the steps since the last, so a
    worker of 128 or more nodes flushes every 64 x ``hosted // 16`` steps (about four steps per
    node), or as many as keep its nodes' pending samples within 128 MiB, and at least every 64 x
    ``hosted // 64``: 1,000 FedAvg clients on 2 workers flush every 1,792 steps, where most of
    the clients sleep through the rounds between. The same on every node."""
    hosted = -(-num_nodes // max(1, workers))
    steps = _FLUSH_STEPS * max(1, hosted // _FLUSH_STEPS)
    if hosted >= 2 * _FLUSH_STEPS:
        within = _PENDING_BYTES // (hosted * _SAMPLE_BYTES) // _FLUSH_STEPS * _FLUSH_STEPS
        steps = max(steps, min(4 * steps, within))
    return log_interval * max(1, -(-steps // log_interval))


@functools.cache
def _mkl_thread_free_buffers() -> Any:
    """MKL's ``mkl_thread_free_buffers`` as torch links it (``mkl_serv_thread_free_buffers``
    in ``libtorch_cpu``), or ``None`` where torch has no MKL."""
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        free = lib.mkl_serv_thread_free_buffers
    except (OSError, AttributeError):
        return None
    free.restype = None
    return free


def _release_thread_buffers() -> None:
    """Give back the buffers MKL keeps for the calling thread (a no-op where torch has no MKL).

    On some CPUs MKL keeps a thread's matrix-multiply buffers for its next call (about 150 KB
    per thread after a small MLP's training step). A virtual node runs on a thread of its own,
    so a worker of hundreds of FedAvg clients would hold a set per client that ever trained,
    through the rounds it sits out. An idle node calls this: the next step it trains allocates
    them again, once per round it takes part in (a call with nothing to give back takes well
    under a microsecond).
    """
    free = _mkl_thread_free_buffers()
    if free is not None:
        free()


class IdleSteps:
    """One node's idle spans and sleeps (every answer the same on every node).

    Args:
        cfg: the run's settings.
        max_steps: the run's length.
        strategy, comm, schedule, faults: the node's (``faults``: ``None`` without injection).
        validates: whether the loop validates (then validation reads the node's state).
        rejoin: ``rejoin(step)``, the node's fault rejoin after ``step`` (collective when due).
    """

    def __init__(
        self,
        cfg: FitConfig,
        max_steps: int,
        strategy: Strategy,
        comm: NodeComm,
        schedule: S.NodeSchedule,
        faults: F.FaultPlan | None,
        validates: bool,
        rejoin: Callable[[int], None],
    ) -> None:
        self.cfg, self.max_steps = cfg, max_steps
        self.strategy, self.comm, self.schedule, self.faults = strategy, comm, schedule, faults
        self.validates, self._rejoin = validates, rejoin
        #: Steps between the loop's metrics flushes (``flush_interval``).
        self.flush_every = flush_interval(cfg.log_interval, cfg.num_nodes, cfg.workers)
        #: The price of a round with no charge (the same network all run long), once worked out.
        self._uncharged: tuple | None = None

    def idle_steps(self, step: int) -> int:
        """How many steps from ``step`` on the node sits out, within the run (``0``: it trains):
        its idle span, and the rounds after it at whose ends nothing concerns it
        (``quiet_through``; not where faults are
        injected, whose rejoins follow the rounds, nor with a learning-rate schedule, whose
        rows give each round's rate)."""
        n = min(self.schedule.idle_steps(step), self.max_steps - step)
        if n and self.faults is None and self.strategy.scheduler is None:
            n = self.schedule.quiet_through(step, n, self.max_steps)
        return n

    def idle_step(self, step: int) -> None:
        """The last step of an idle span: no optimizer step; the parameter-space modules due at
        ``step`` communicate (the node receives what its peers send)."""
        _release_thread_buffers()
        self.strategy.communicate_phase("param", step)
        self.strategy.skip_steps(1)

    def may_sit_out(self, step: int) -> bool:
        """Whether this idle node may sit out the communication of ``step``: the strategy says a
        later communication replaces what it would receive, and nothing reads the node's state
        in between (validation reads it). Never when faults drop nodes (a survivor that sat a
        round out could not hand its state to a node that rejoins)."""
        if self.faults is not None and self.faults.drops:
            return False
        return self.schedule.may_sit_out(step, self.next_read(step))

    def next_read(self, step: int) -> int:
        """The first step after ``step`` at whose end validation reads this node's state (the
        end of the run), or ``sys.maxsize`` without validation."""
        if not self.validates:
            return sys.maxsize
        vi = self.cfg.val_interval
        return min(self.max_steps, -(-(step + 1) // vi) * vi) if vi else self.max_steps

    def next_sync(self, step: int) -> int:
        """The first ``done > step`` after which the loop itself communicates (metrics flush,
        validation, the end): an idle span must not run past it."""
        cfg = self.cfg
        points = [self.max_steps, (step // self.flush_every + 1) * self.flush_every]
        if self.validates and cfg.val_interval:
            points.append((step // cfg.val_interval + 1) * cfg.val_interval)
        if cfg.checkpoint_dir is not None and cfg.checkpoint_interval:
            points.append((step // cfg.checkpoint_interval + 1) * cfg.checkpoint_interval)
        return min(points)

    def sleep(self, step: int, n: int, meter: StepMeter) -> None:
        """Sleep through the idle span of ``n`` steps from ``step``, whose last communication this
        node sits out, and through every following round that it sits out whole and may sit out
        the end of, up to the loop's next own collective (a FedAvg client sleeps from one
        participation, or flush, to the next). The communications run in one sitting-out block
        (``sitting_out``: the absent calls of rounds alike
        are made as one); each round still gets what the loop would give it: its quiet steps
        and LR schedule, its charges and modelled time in its own sample (the transport time of
        the calls is shared out evenly), recorded in ``meter`` (the span began at its last
        ``begin_step``)."""
        _release_thread_buffers()
        ends = [step + n - 1]
        ends += self.schedule.idle_span_ends(step + n, self.next_sync(step), self.next_read(step))
        spans = _spans(ends, step)
        with self.comm.sitting_out():
            self._sit_out(ends)
        per = len(self.comm.ledger.step_records) // len(spans)  # the same charges every round, in order
        comm_wall = (self.comm.transport_seconds - meter.transport0) / len(spans)
        idle_lr, lr = self._advance(spans, ends)
        sent, received, sim, keys, comms = self._charges(len(spans), per)
        # What StepMeter.add_idle and StepMeter.add would add round by round.
        wall = time.perf_counter() - meter.start
        meter.metrics.add_rounds(spans - 1, idle_lr, lr, sent, received, sim, comm_wall, wall, keys, comms)
        sims = sim if isinstance(sim, list) else [sim] * len(spans)
        self.comm.clock.close_idle_steps(sims)  # the rounds' communication on the node's own clock

    def _sit_out(self, ends: list[int]) -> None:
        """The communication of the slept round ends ``ends``: the parameter-space phase at each
        end where a module is due; for a strategy of one plain module (no wrapper, no wire
        format), what that phase runs: the module's ``communicate`` where it is due."""
        strategy = self.strategy
        modules = strategy.pipeline.modules
        due = modules[0].is_due if len(modules) == 1 else strategy.pipeline.is_due
        communicate = functools.partial(strategy.communicate_phase, "param")
        if len(modules) == 1:
            (m,) = modules
            if m.space == "param" and type(m).run is Communicator.run and strategy.wire_comm is None:
                communicate = m.communicate
        for end in ends:
            if due(end):
                communicate(end)

    def _advance(self, spans: np.ndarray, ends: list[int]) -> tuple[list[float] | float, list[float] | float]:
        """Move the step counter over the slept rounds (``spans`` steps each, the last ending at
        ``ends``), rejoining after each where faults are injected; per round (or one number for
        all), the learning rate of its quiet steps and of its last step."""
        strategy = self.strategy
        if strategy.scheduler is None and self.faults is None:  # one LR, no rejoins: the counter moves at once
            strategy.skip_steps(int(spans.sum()))
            return float(strategy.lr), float(strategy.lr)
        idle_lr: list[float] = []
        lr: list[float] = []
        for m, end in zip(spans.tolist(), ends, strict=True):
            strategy.skip_steps(m - 1)
            idle_lr.append(strategy.lr)
            strategy.skip_steps(1)
            lr.append(strategy.lr)
            self._rejoin(end)
        return idle_lr, lr

    def _charges(self, rounds: int, per: int) -> tuple[Any, Any, Any, list, list | None]:
        """Per slept round, its ``per`` ledger records' bytes sent, bytes received, modelled
        communication seconds (each one number for every round where no round has a charge),
        meeting keys and (with a world's traces, else ``None`` for all) communication seconds
        per epoch of the traces. Each round's records end a step of the
        ledger; rounds charged alike are priced once."""
        network = self.cfg.network
        traced = bool(network.trace_changes)

        def price(records: list) -> tuple:
            comms = network.records_times(records) if traced else None
            first = comms[0] if comms is not None else network.records_time(records)
            return (sum(r.sent for r in records), sum(r.received for r in records), first, meeting_keys(records), comms)

        if per == 0:  # no charge in any round (a client asleep through ticks of nothing): one price
            if self._uncharged is None:
                self._uncharged = price([])
            sent, received, sim, keys, comms = self._uncharged
            charged = [comms] * rounds if traced else None
            return float(sent), float(received), float(sim), [keys] * rounds, charged
        out = []
        priced: tuple | None = None
        for _ in range(rounds):
            records = self.comm.ledger.end_step(per)
            if priced is None or records != priced[0]:
                priced = (records, *price(records))
            out.append(priced[1:])
        sent, received, sim, keys, comms_ = (list(col) for col in zip(*out, strict=True))
        return sent, received, sim, keys, comms_ if traced else None


__all__ = ["IdleSteps", "flush_interval"]
