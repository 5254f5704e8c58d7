"""The worker processes kept between runs: successive ``fit`` calls of a program reuse them.

A local run needs W worker processes (``exogym.runtime.launch.run_nodes``). The first run
starts them; when it succeeds they stay alive, idle, each waiting on its pipe for the next
run's job, with torch, ExoGym and the user's script already imported and warm. A later run
takes them (starting more if it needs more), so a sweep, ``exogym compare`` or a user's loop
over ``fit`` pays process start-up once. What a run changes in a worker is undone before the
next (its environment, working directory and ``sys.path`` are the calling ``fit``'s; handlers
it added to the root logger are removed; its objects are collected), and every random stream a
node uses is seeded by the run, so a run's results equal those of a run on fresh processes.

The processes of a run that fails (a node raises or dies), is interrupted (Ctrl-C, SIGTERM) or
otherwise does not finish are stopped, never reused: the next run starts fresh ones. Idle
workers end with the program: at exit, or earlier, by [`shutdown`][exogym.shutdown]; within a
fraction of a second when it dies without exiting (``kill -9``), as every node process does
(``exogym.runtime.launch``).

A *lane* (``lane``) is one of several runs side by side in one program, each on a thread of
its own (a sweep packing small runs onto the cores): inside it, the thread's ``fit`` calls take
their workers from a pool of the lane's own, kept warm between the lane's runs, and give each
worker one intra-op thread, so that the lanes share the cores. ``WorkerPool.abort`` stops a
lane's running workers from another thread (Ctrl-C in the thread that runs the lanes).

Standard library only, so that ``exogym.shutdown()`` imports no torch.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from exogym.runtime import forkserver, tempdir

_STOP_GRACE_S = 5.0


@dataclass
class PooledProcess:
    """One worker ``process`` (``multiprocessing``'s) and ``conn``, the parent's end of its duplex
    pipe (jobs go out, results come back)."""

    process: Any
    conn: Any


class WorkerPool:
    """The idle worker processes of one start method (``'forkserver'`` or ``'spawn'``).

    Args:
        method: the start method the processes are started with.
        parent: a lane's pool (``lane``) borrows the program's pool's watch pipe (its
            workers die with the program as the program's do) and, once its own idle workers
            are taken, takes the program's idle ones before it starts any.
    """

    def __init__(self, method: str, parent: WorkerPool | None = None) -> None:
        self.method = method
        self.idle: list[PooledProcess] = []
        #: The workers taken and neither given back nor discarded (a run in progress).
        self.busy: list[PooledProcess] = []
        #: Called after ``take`` has the run's workers (a lane's hook, see ``lane``).
        self.started: Callable[[], None] | None = None
        self.parent = parent
        self._aborted = False
        self._lock = threading.Lock()  # fits on several threads take disjoint workers
        if parent is not None:
            self.alive_r, self.alive_w = parent.alive_r, parent.alive_w
        else:
            # Every worker holds the read end and watches for EOF: the write end is this process's
            # alone, so the workers notice when it dies, however it dies.
            self.alive_r, self.alive_w = forkserver.context().Pipe(duplex=False)

    def take(self, n: int, start: Callable[[Any, int], PooledProcess]) -> list[PooledProcess]:
        """``n`` workers for a run: idle ones first (those that died meanwhile are dropped),
        then the parent's idle ones, then new ones from ``start(alive_r, index)``. The caller
        owns them until it calls ``give_back`` or ``discard``. Raises
        ``KeyboardInterrupt`` once ``abort`` was called."""
        taken = self._take_idle(n)
        if self.parent is not None and len(taken) < n:
            taken += self.parent._take_idle(n - len(taken))
        try:
            with self._lock:
                self.busy += taken
            while not self._aborted and len(taken) < n:
                taken.append(start(self.alive_r, len(taken)))
                with self._lock:
                    self.busy.append(taken[-1])
            if self._aborted:
                raise KeyboardInterrupt("the lane's runs were stopped")
        except BaseException:  # Ctrl-C while starting, too: none of them is left behind
            self.discard(taken)
            raise
        if self.started is not None:
            self.started()
        return taken

    def _take_idle(self, n: int) -> list[PooledProcess]:
        """Up to ``n`` live idle workers, out of ``idle`` (dead ones are stopped)."""
        with self._lock:
            alive = [w for w in self.idle if w.process.is_alive()]
            dead = [w for w in self.idle if w not in alive]
            taken, self.idle = alive[:n], alive[n:]
        _stop(dead, busy=True)
        return taken

    def give_back(self, workers: list[PooledProcess]) -> None:
        """Keep ``workers`` (of a run that finished) for the next run. Idle workers the run did
        not use are stopped: the pool holds the processes of the last run (none after
        ``abort``)."""
        with self._lock:
            self.busy = [w for w in self.busy if w not in workers]
            if self._aborted:
                surplus = list(workers)
            else:
                surplus, self.idle = self.idle, list(workers)
        _stop(surplus)

    def discard(self, workers: list[PooledProcess]) -> None:
        """Stop ``workers`` (of a run that did not finish, or dead: they may be busy) and close
        their pipes."""
        with self._lock:
            self.busy = [w for w in self.busy if w not in workers]
        _stop(workers, busy=True)

    def abort(self) -> None:
        """Stop the running run's workers (SIGTERM; the run's ``fit`` then raises and discards
        them) and make every later ``take`` raise ``KeyboardInterrupt``. Callable from any
        thread; never raises for a worker already gone."""
        with self._lock:
            self._aborted = True
            busy = list(self.busy)
        for w in busy:
            if w.process.exitcode is None:
                with contextlib.suppress(OSError):
                    w.process.terminate()

    def close(self) -> None:
        """Stop every idle worker and close the watch pipe (the workers' parent-death signal;
        a lane's pool leaves its parent's pipe open)."""
        with self._lock:
            idle, self.idle = self.idle, []
        _stop(idle)
        if self.parent is None:
            for end in (self.alive_r, self.alive_w):
                with contextlib.suppress(OSError):
                    end.close()


#: This process's pool (``None`` until the first local run).
_pool: WorkerPool | None = None
#: The process that made ``_pool`` (a forked child does not own its parent's workers).
_owner: int | None = None
#: ``pool``: the calling thread's lane pool inside ``lane``.
_local = threading.local()


def current(method: str) -> WorkerPool:
    """The pool a ``fit`` on the calling thread takes its workers from: the thread's lane's
    (``lane``), else this process's pool for ``method``, made at the first call (and again
    when the start method changed: the old pool's workers are stopped). Registers
    [`shutdown`][exogym.shutdown] at exit."""
    global _pool, _owner
    own = getattr(_local, "pool", None)
    if own is not None and own.method == method:
        return own
    if _pool is not None and (_pool.method != method or _owner != os.getpid()):
        if _owner == os.getpid():
            _pool.close()
        _pool = None
    if _pool is None:
        tempdir.claim()  # the sockets that pass file descriptors to the workers go there
        _pool, _owner = WorkerPool(method), os.getpid()
        atexit.register(shutdown)
    return _pool


def lane_threads() -> int | None:
    """The intra-op threads per worker of a ``fit`` on the calling thread: 1 inside ``lane``,
    ``None`` elsewhere (``fit`` then divides the cores among the run's workers)."""
    return 1 if getattr(_local, "pool", None) is not None else None


@contextlib.contextmanager
def lane(started: Callable[[], None] | None = None) -> Iterator[WorkerPool]:
    """Within the block, the calling thread's ``fit`` calls run as one lane of several side by
    side: on workers of a pool of the lane's own (yielded; idle ones of the program's pool are
    taken before any is started), kept between the lane's runs, each worker with one intra-op
    thread (``lane_threads``). ``started``: called on the lane's thread each time a run has
    its workers (its planning, in this process, is over). At the end of the block the lane's idle
    workers go to the program's pool, where the next ``fit`` finds them (they are stopped
    instead after ``WorkerPool.abort``). Lanes do not nest: raises ``RuntimeError`` inside
    another lane."""
    if getattr(_local, "pool", None) is not None:
        raise RuntimeError("this thread already runs a lane; lanes do not nest")
    program = current(forkserver.start_method())
    own = WorkerPool(program.method, parent=program)
    own.started = started
    _local.pool = own
    try:
        yield own
    finally:
        _local.pool = None
        with own._lock:
            idle, own.idle = own.idle, []
        if idle and not own._aborted and _pool is program:
            program.give_back(idle)
        else:
            _stop(idle)


def shutdown() -> None:
    """End the worker processes that ``fit`` keeps between runs; the next ``fit`` starts new
    ones. Idempotent; called at the program's exit. Ends idle workers only: a ``fit`` in
    progress (on another thread) stops its own when it ends."""
    global _pool
    if _pool is None or _owner != os.getpid():
        return
    pool, _pool = _pool, None
    pool.close()


def worker_pids() -> list[int]:
    """The pids of the idle worker processes that the next ``fit`` of this process will reuse."""
    if _pool is None or _owner != os.getpid():
        return []
    return [w.process.pid for w in _pool.idle if w.process.is_alive()]


def _stop(workers: list[PooledProcess], busy: bool = False) -> None:
    """Ask idle workers to exit (a ``None`` job) or terminate ``busy`` ones, kill any left after
    a grace period; join them all and close their pipes. Never raises for one already gone."""
    for w in workers:
        asked = False
        if not busy:
            with contextlib.suppress(OSError, ValueError):  # its pipe is gone
                w.conn.send(None)  # the job that ends an idle worker
                asked = True
        if not asked and w.process.exitcode is None:
            with contextlib.suppress(OSError):
                w.process.terminate()
    deadline = time.monotonic() + _STOP_GRACE_S
    for w in workers:
        w.process.join(timeout=max(0.0, deadline - time.monotonic()))
        if w.process.exitcode is None:
            with contextlib.suppress(OSError):
                os.kill(w.process.pid, signal.SIGKILL)
            w.process.join()
        with contextlib.suppress(OSError):
            w.conn.close()


__all__ = ["PooledProcess", "WorkerPool", "current", "lane", "lane_threads", "shutdown", "worker_pids"]
