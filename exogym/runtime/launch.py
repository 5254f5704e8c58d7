"""Run a job on worker processes, wait for them, and tear everything down on the first failure.

The processes of a run that returns stay, idle, for the next run of the program
(``exogym.runtime.pool``); those of a run that does not return never outlive it:

* a node that raises (while starting or training) sends its traceback to the parent, which
  stops every other node and raises [`NodeFailedError`][exogym.NodeFailedError] with the first
  failure's exception and traceback;
* Ctrl-C and ``kill -TERM`` of the parent run the same teardown (nodes ignore SIGINT, so the
  parent alone decides); SIGTERM then goes to the parent's previous handler (``exogym
  compare``'s ends the command as Ctrl-C does; the default one ends the process);
* when the parent dies without a teardown (``kill -9``), every node notices within a fraction
  of a second: it holds the read end of a pipe whose only write end is the parent's (a watchdog
  thread ends the node at EOF), and on Linux it also has ``PR_SET_PDEATHSIG``.

The job (model, strategy, datasets: the user's objects) travels with ``cloudpickle``
(``exogym.runtime.pickling``), so closures, lambdas and classes defined in ``__main__`` work; a
worker re-imports the user's script at its first job (``exogym.runtime.main_script``).
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from exogym.runtime import forkserver, pickling, pool
from exogym.runtime.forkserver import start_method
from exogym.runtime.main_script import import_main, main_spec, without_main_import
from exogym.runtime.placement import Placement

logger = logging.getLogger(__name__)

_POLL_S = 0.05
_ERROR_GRACE_S = 2.0
#: Exit code of a node that ended because its parent disappeared.
PARENT_GONE_EXIT = 75


class NodeFailedError(RuntimeError):
    """A node process raised or died; the message carries that node's exception and traceback.

    Attributes:
        rank: the node that failed first (a worker's index when a worker hosting several nodes
            died without reporting an error).
        error_type: the name of its exception's class (``None`` when it died without one).
    """

    def __init__(self, rank: int, message: str, error_type: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.error_type = error_type


def start_processes_server(wait: bool = True) -> float:
    """Make sure the fork server runs (it imports ``PRELOAD``, a
    few seconds; the first ``Trainer(...)`` usually started it already) before the first node
    process; return the seconds this call took (0 when nodes are spawned).

    ``wait=True`` returns once the imports are done, to keep that one-off cost out of the first
    run's wall time (``exogym compare``); ``wait=False`` returns at once, so that the imports
    overlap what the caller does next (``fit`` checks the strategy meanwhile). Idempotent."""
    if start_method() != "forkserver":
        return 0.0
    t0 = time.perf_counter()
    forkserver.ensure_server()
    if wait:
        probe = forkserver.context().Process(target=os.getpid, name="exogym-warm-up")  # starts once preloaded
        with without_main_import():
            probe.start()
        probe.join()
    return time.perf_counter() - t0


def serialize_job(job: Any) -> bytes:
    """``cloudpickle`` bytes of ``job`` (``exogym.runtime.pickling.dumps``); raises
    ``TypeError`` naming what cannot be sent."""
    try:
        return pickling.dumps(job)
    except Exception as e:  # noqa: BLE001 - any pickling failure is the user's object
        raise TypeError(
            f"the job (model, strategy, datasets, logger) cannot be sent to the nodes: {type(e).__name__}: {e}. "
            "Every object passed to Trainer and fit() must be picklable by cloudpickle (no open files, "
            "locks or live connections)."
        ) from e


def _serve(conn: Any, alive: Any) -> None:
    """Process body of a worker (``exogym.runtime.pool``): run the jobs that come through
    ``conn``, one run at a time, until a ``None`` job (or EOF: the parent is gone). A job that
    raises is reported, then the process ends (the parent replaces it); otherwise it stays for
    the next run. Exits without the interpreter's teardown (about 0.5 s of CPU with torch).

    The process ends when the parent goes: PR_SET_PDEATHSIG where Linux offers it, and a
    watchdog thread that waits for EOF on the parent's pipe ``alive`` (everywhere)."""
    forkserver.exit_with_parent()

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            alive.recv()
        os._exit(PARENT_GONE_EXIT)

    threading.Thread(target=watch, name="exogym-parent-watchdog", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops us
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            os._exit(PARENT_GONE_EXIT)
        if job is None:
            _exit(0)
        if not _run_job(conn, *job):
            _exit(1)


def _exit(code: int) -> None:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


#: The ``__main__`` this worker has imported (``main_spec``), once per process.
_imported_main: tuple[str, str] | None = None


def _run_job(
    conn: Any,
    rank: int,
    env: dict[str, str],
    where: tuple[str, list[str]],
    main_spec: tuple[str, str] | None,
    job: bytes,
    args: tuple,
) -> bool:
    """Run ``fn(rank, job, *args)`` as the parent's ``fit`` would see it; send the result or
    the exception back through ``conn``; whether it succeeded.

    ``env`` and ``where`` (working directory, ``sys.path``) are the parent's when the run
    started: a worker started by a fork server, or by an earlier run, would otherwise have
    those of the moment it started. The user's ``__main__`` is imported at the first job.
    """
    global _imported_main
    os.environ.clear()
    os.environ.update(env)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        os.chdir(where[0])
        sys.path[:] = where[1]
        if main_spec != _imported_main:
            import_main(main_spec)
            _imported_main = main_spec
            handlers, level = list(root.handlers), root.level  # the script's own logging stays
        fn, job_obj = cloudpickle.loads(job)
        result = fn(rank, job_obj, *args)
        # Serialised here: tensors pickled by torch.multiprocessing would be shared through a
        # file descriptor that the next run may close before the parent reads it.
        buf = io.BytesIO()
        torch.save(result, buf)
        del fn, job_obj, result
        conn.send(("ok", rank, buf.getvalue()))
    except BaseException as e:  # noqa: BLE001 - report everything, including SystemExit
        # A worker hosting several nodes raises an error that names the node (``node_rank``).
        node = getattr(e, "node_rank", rank)
        type_name = getattr(e, "error_type", type(e).__name__)
        tb = getattr(e, "node_traceback", None) or traceback.format_exc()
        summary = str(e) if hasattr(e, "node_rank") else f"{type(e).__name__}: {e}"
        with contextlib.suppress(OSError):
            conn.send(("error", rank, time.time(), type_name, summary, tb, node))
        return False
    _after_run(handlers, level)
    return True


def _after_run(handlers: list[logging.Handler], level: int) -> None:
    """Undo what a run left in this worker that the next run would see: root-logger handlers it
    added (``worker_process`` configures logging with the run's label and level), a process group
    still joined, its objects (collected here, while the parent reads the result; what survives
    is frozen), and the peak-memory marks that the next run's ``peak_memory`` column reads."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(h)
        h.close()
    root.setLevel(level)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # a group the run's code left behind
    gc.collect()
    # What outlives a run (imports, caches) outlives the worker: frozen, it is not scanned by
    # the next runs' collections, which then cost what those runs made (a full collection of
    # torch's objects takes a quarter of a second).
    gc.freeze()
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux: resets the peak resident set (VmHWM) to the current one
    if torch.cuda.is_initialized():
        for d in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(d)


class _Terminated(BaseException):
    """SIGTERM arrived in the parent while nodes ran."""


@contextlib.contextmanager
def _sigterm_as_exception() -> Iterator[None]:
    """Turn SIGTERM into an exception (so the teardown runs), then hand it to the handler that
    was there before: a Python handler is called (``exogym compare``'s raises
    ``KeyboardInterrupt``: the command ends as after Ctrl-C), the default one ends the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: Any) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, previous)
        if callable(previous):
            previous(signal.SIGTERM, None)  # raises (exogym compare's) or returns
        else:
            sys.stderr.write("\n")  # on a line of its own: rank 0's progress bar may be mid-line
            sys.stderr.flush()
            logger.warning("SIGTERM: every node was stopped")
            os.kill(os.getpid(), signal.SIGTERM)
        raise SystemExit(128 + signal.SIGTERM) from None  # a Python handler that returned
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_nodes(
    fn: Callable[..., Any], num_nodes: int, job: Any = None, args: tuple = (), placement: Placement | None = None
) -> dict[int, Any]:
    """Run ``fn(rank, job, *args)`` in ``num_nodes`` worker processes; return ``{rank: result}``.

    The processes are the idle workers of the previous run where there are some, else new ones
    (``exogym.runtime.pool``); after a run that succeeds they stay for the next. ``placement``
    says which simulated nodes each process hosts when the processes are workers that host
    several each (errors then name the node, ``node 17 of 100 (worker 1 of 2)``); by default
    each process is one node.

    ``fn`` and ``job`` travel with cloudpickle (the user's objects; a function or class of
    ``__main__`` by value); ``args`` with multiprocessing's pickler (shared-memory tensors are
    shared, not copied). Raises [`NodeFailedError`][exogym.NodeFailedError] when any node fails,
    after every process of the run has been stopped; on Ctrl-C, ``KeyboardInterrupt`` after the same
    teardown. A run's processes are reused only when it returns.
    """
    payload = serialize_job((fn, job))
    workers = pool.current(start_method())
    env, where, spec = dict(os.environ), (os.getcwd(), list(sys.path)), main_spec()
    results: dict[int, Any] = {}
    errors: list[tuple] = []
    codes: dict[int, int] = {}  # the exit codes of the processes that ended without a result
    procs: list[pool.PooledProcess] = []
    finished = False
    try:
        with _sigterm_as_exception():
            procs = workers.take(num_nodes, _start_worker)
            for r, w in enumerate(procs):
                with contextlib.suppress(OSError):  # a worker gone meanwhile is reported below
                    w.conn.send((r, env, where, spec, payload, args))
            while True:
                _drain(procs, results, errors)
                codes = {r: w.process.exitcode for r, w in enumerate(procs) if r not in results}
                codes = {r: code for r, code in codes.items() if code is not None}
                if errors or codes:
                    deadline = time.monotonic() + _ERROR_GRACE_S  # time for the failing node's traceback
                    while not errors and time.monotonic() < deadline:
                        time.sleep(_POLL_S)
                        _drain(procs, results, errors)
                    break
                if len(results) == num_nodes:
                    finished = True
                    break
                pending = [r for r in range(num_nodes) if r not in results]
                waiting = [procs[r].conn for r in pending] + [procs[r].process.sentinel for r in pending]
                multiprocessing.connection.wait(waiting, timeout=_POLL_S)
    finally:
        if finished:
            workers.give_back(procs)
        else:
            workers.discard(procs)
    return _outcome(num_nodes, results, errors, codes, placement)


def _start_worker(alive_r: Any, index: int) -> pool.PooledProcess:
    """A new worker process (``_serve``), watching ``alive_r`` for the parent's death."""
    ctx = forkserver.context()
    mine, theirs = ctx.Pipe()
    process = ctx.Process(target=_serve, args=(theirs, alive_r), name=f"exogym-worker-{index}")
    with without_main_import():
        process.start()
    theirs.close()
    return pool.PooledProcess(process, mine)


def _outcome(
    num_nodes: int,
    results: dict[int, Any],
    errors: list[tuple],
    codes: dict[int, int],
    placement: Placement | None,
) -> dict[int, Any]:
    unit = "node" if placement is None else "worker"

    def who(proc: int, node: int) -> str:
        if placement is None:
            return f"node {node} of {num_nodes}"
        return f"node {node} of {placement.num_nodes} (worker {proc} of {num_nodes})"

    silent = [r for r in codes if r not in {e[1] for e in errors}]
    if silent:
        # A process that vanished without a traceback (killed, os._exit, segfault) is reported
        # first: the others' errors are then mostly about losing their peer.
        r, code = silent[0], str(codes[silent[0]])
        with contextlib.suppress(ValueError):  # the signal that ended it: "-9 (SIGKILL)"
            code += f" ({signal.Signals(-codes[r]).name})"
        others = "".join(f"\n  then {who(e[1], e[5])}: {e[4]}" for e in sorted(errors))
        hosted = "" if placement is None else f" (hosting {placement.describe(r)} of {placement.num_nodes})"
        raise NodeFailedError(
            r, f"{unit} {r} of {num_nodes}{hosted} exited with code {code} without reporting an error{others}"
        )
    if errors:
        _, proc, type_name, summary, tb, node = min(errors)
        raise NodeFailedError(node, f"{who(proc, node)} failed: {summary}\n\n{tb}", type_name)
    return results  # every node's: a run without a failure ends when all are in


def _drain(procs: list[pool.PooledProcess], results: dict[int, Any], errors: list) -> None:
    """Read every message the run's workers have sent (a worker's pipe stays readable after
    it exits)."""
    reported = {e[1] for e in errors}
    for r, w in enumerate(procs):
        while r not in results and r not in reported:
            try:
                if not w.conn.poll():
                    break
                msg = w.conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "ok":  # a result from a worker of this run, as the job itself went out by pickle
                results[msg[1]] = torch.load(io.BytesIO(msg[2]), weights_only=False)
            else:
                errors.append((msg[2], msg[1], msg[3], msg[4], msg[5], msg[6]))
                reported.add(r)
