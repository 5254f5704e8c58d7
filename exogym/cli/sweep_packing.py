"""Packing a sweep's runs onto the cores: runs whose workers leave cores idle train side by side.

A run of K nodes on W worker processes keeps W cores busy. When W is smaller than the
machine's cores (K virtual nodes on one worker, ``workers=1``, a 16-core machine), a sweep runs
several runs at once, each on a *lane*: a thread of the sweep's process with worker processes of
its own, kept warm between the lane's runs (``exogym.runtime.pool.lane``). Runs start in the
sweep's order as soon as a lane is free and their workers fit in the cores that the running runs
leave (a run with as many workers as cores, or more, runs alone); every worker has one
intra-op thread, so that W workers take W cores.

A run's result does not depend on what runs beside it: its nodes seed themselves from the run's
seed, and the parent process plans one run at a time (the model built from the seed, the
strategy checked, the minibatch probed: all of it draws from the process's global random
state), so only the training, in the workers, overlaps.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from exogym.runtime import pool

logger = logging.getLogger(__name__)

__all__ = ["Job", "Lanes", "check_parallel", "width"]

_WAIT_S = 0.2
#: How long an interrupted sweep waits for its lanes to end (their runs were stopped).
_STOP_S = 30.0


def check_parallel(parallel: Any, device: str) -> None:
    """``parallel`` must be ``'auto'`` or a positive int, and more than 1 only on ``device='cpu'``.
    Raises ``ValueError`` or ``TypeError`` naming ``parallel`` and what it accepts."""
    if parallel == "auto":
        return
    if isinstance(parallel, bool) or not isinstance(parallel, int):
        raise TypeError(
            f"parallel must be a positive int (the most runs at once; 1: one after the other) or 'auto' (as many "
            f"as the cores hold), got {parallel!r}"
        )
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1 (1: one run after the other) or 'auto', got {parallel}")
    if parallel > 1 and device != "cpu":
        raise ValueError(
            f"parallel={parallel} packs runs onto CPU cores, but device={device!r}: a sweep on {device!r} runs "
            "one run at a time; use parallel=1 or 'auto'"
        )


def width(parallel: int | str, device: str, needs: Sequence[int], cores: int) -> int:
    """How many runs a sweep trains at once: 1 off the CPU, with ``parallel=1``, and when no
    two runs fit in ``cores`` together; else as many of the smallest runs (``needs``: the
    cores, that is the workers, of each run to train) as the cores hold, at most ``parallel``
    (``'auto'``: no other limit) and at most the runs to train."""
    check_parallel(parallel, device)
    if device != "cpu" or parallel == 1 or not needs:
        return 1
    limit = cores if parallel == "auto" else int(parallel)
    if limit > cores:
        logger.info("parallel=%d: at most %d runs at once, one per core of this machine", limit, cores)
    return max(1, min(limit, cores, cores // min(needs), len(needs)))


@dataclass
class Job:
    """One run for a lane.

    Attributes:
        index: its place in the sweep (outcomes are reported with it).
        label: its name in logs and messages.
        need: the cores it takes: its worker processes, at most every core.
        run: trains it on the lane's thread and returns its outcome (exceptions are the
            caller's to turn into outcomes; one that escapes is re-raised by ``Lanes.run``).
    """

    index: int
    label: str
    need: int
    run: Callable[[], Any]


class Lanes:
    """``width`` lanes sharing ``cores``.

    Attributes:
        running: the labels of the jobs in progress (those that an interrupt stopped, after
            ``run`` raised ``KeyboardInterrupt``).
    """

    def __init__(self, width: int, cores: int) -> None:
        self.width, self.cores = width, cores
        self.running: list[str] = []
        self._inbox: queue.Queue[Job | None] = queue.Queue()
        self._outbox: queue.Queue[tuple[Job | None, Any, BaseException | None]] = queue.Queue()
        self._pools: list[pool.WorkerPool] = []
        self._threads: list[threading.Thread] = []
        self._turn = threading.Lock()
        self._holds = threading.local()
        self._stopping = False

    def run(self, jobs: Sequence[Job], done: Callable[[Job, Any], bool]) -> None:
        """Train ``jobs``: each starts, in order, when a lane is free and its ``need`` fits in
        the free cores (or nothing else runs). ``done(job, outcome)`` is called on this thread as
        each finishes; when it returns ``False`` no further job starts (those running finish).

        On ``KeyboardInterrupt`` (Ctrl-C reaches this thread): every running job's workers are
        stopped, the lanes end, ``done`` is called for the jobs that finished meanwhile, and the
        interrupt is re-raised with ``running`` naming the jobs it stopped. Every lane's
        workers are stopped or handed to the program's pool before this returns or raises."""
        pending = list(jobs)
        free, going, interrupted = self.cores, {}, None
        try:
            self._start_lanes()
            while pending or going:
                while pending and len(going) < self.width and (pending[0].need <= free or not going):
                    job = pending.pop(0)
                    free -= job.need
                    going[job.index] = job
                    self.running.append(job.label)
                    self._inbox.put(job)
                job, outcome, escaped = self._next()
                if job is None:
                    continue
                free += job.need
                del going[job.index]
                self.running.remove(job.label)
                if escaped is not None:
                    raise escaped
                if not done(job, outcome):
                    pending = []
        except KeyboardInterrupt as e:
            interrupted = e
            self._stopping = True
            for p in self._pools:
                p.abort()
        finally:
            self._end_lanes()
        if interrupted is not None:
            self._finished_meanwhile(done)
            raise interrupted

    def _next(self) -> tuple[Job | None, Any, BaseException | None]:
        try:
            job, outcome, escaped = self._outbox.get(timeout=_WAIT_S)
        except queue.Empty:
            return None, None, None
        if job is None:  # a lane could not start
            assert escaped is not None
            raise escaped
        return job, outcome, escaped

    def _start_lanes(self) -> None:
        for i in range(self.width):
            ready = threading.Event()
            thread = threading.Thread(target=self._lane, args=(ready,), name=f"exogym-lane-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
            ready.wait()

    def _lane(self, ready: threading.Event) -> None:
        """A lane's thread: jobs from the inbox, one at a time, on the lane's own workers."""
        try:
            with pool.lane(started=self._turn_over) as own:
                self._pools.append(own)
                ready.set()
                while (job := self._inbox.get()) is not None and not self._stopping:
                    self._turn.acquire()  # this process plans one run at a time
                    self._holds.turn = True
                    try:
                        self._outbox.put((job, job.run(), None))
                    except BaseException as e:  # noqa: BLE001 - handed to the sweep's thread
                        self._outbox.put((job, None, e))
                    finally:
                        self._turn_over()
        except BaseException as e:  # noqa: BLE001 - the lane itself failed to start
            self._outbox.put((None, None, e))
        finally:
            ready.set()

    def _turn_over(self) -> None:
        """The lane's run has its workers: the next lane may plan (a no-op when this thread has
        no turn)."""
        if getattr(self._holds, "turn", False):
            self._holds.turn = False
            self._turn.release()

    def _end_lanes(self) -> None:
        for _ in self._threads:
            self._inbox.put(None)
        for thread in self._threads:
            thread.join(timeout=_STOP_S)
            if thread.is_alive():
                logger.warning("%s did not end within %.0f s; its workers are stopped", thread.name, _STOP_S)
        for p in self._pools:
            p.abort()
            p.close()

    def _finished_meanwhile(self, done: Callable[[Job, Any], bool]) -> None:
        """After an interrupt: report the jobs that finished before their lane stopped (their
        results are complete); drop the ones the interrupt stopped."""
        while True:
            try:
                job, outcome, escaped = self._outbox.get_nowait()
            except queue.Empty:
                return
            if job is not None and escaped is None and getattr(outcome, "error", None) is None:
                if job.label in self.running:
                    self.running.remove(job.label)
                done(job, outcome)
