"""Start K node processes, wait for them, and tear everything down on the first failure.

The rendezvous store is created here, in the parent, on a port the OS picks (no guessing, no
retry loop), so several ``fit`` calls in one program, and several programs at once, never
collide. A node that raises sends its traceback to the parent; the parent then terminates every
other node (they may be blocked in a collective with it) and raises :class:`NodeFailedError`
with the traceback of the *first* node that failed. No process outlives ``run_nodes``.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

logger = logging.getLogger(__name__)

_POLL_S = 0.05
_ERROR_GRACE_S = 2.0
_TERMINATE_GRACE_S = 5.0


class NodeFailedError(RuntimeError):
    """A node process raised or died; the message carries that node's traceback."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(message)
        self.rank = rank


def check_main_guard() -> None:
    """Fail fast when a spawned child re-runs a script that lacks ``if __name__ == "__main__":``."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(
            "ExoGym starts one process per node with the 'spawn' method, which re-imports your "
            "script in every node. Guard the code that calls Trainer.fit with "
            "`if __name__ == \"__main__\":` so that the nodes do not run it again."
        )


def create_store() -> dist.TCPStore:
    """A rendezvous store served by the parent on a free loopback port chosen by the OS."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))


def connect_store(port: int) -> dist.TCPStore:
    """The node-side client of :func:`create_store`'s store."""
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))


def _entry(fn: Callable[..., Any], rank: int, queue: Any, args: tuple) -> None:
    """Process body: run ``fn(rank, *args)``; report its result or its traceback to the parent."""
    code = 0
    try:
        result = fn(rank, *args)
        queue.put(("ok", rank, result))
    except BaseException as e:  # noqa: BLE001 - report everything, including SystemExit
        queue.put(("error", rank, time.time(), f"{type(e).__name__}: {e}", traceback.format_exc()))
        code = 1
    # The result is already in the pipe. Skipping the interpreter's teardown (about 0.5 s of CPU
    # per node with torch loaded) makes the run end as soon as the last node reports.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_nodes(fn: Callable[..., Any], num_nodes: int, args: tuple) -> dict[int, Any]:
    """Run ``fn(rank, *args)`` in ``num_nodes`` spawned processes; return ``{rank: result}``.

    ``fn`` must be a module-level function (spawn pickles it by reference). Raises
    :class:`NodeFailedError` when any node fails, after every node has been stopped.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=_entry, args=(fn, r, queue, args), name=f"exogym-node-{r}") for r in range(num_nodes)]
    results: dict[int, Any] = {}
    errors: list[tuple[float, int, str, str]] = []
    try:
        for p in procs:
            p.start()
        while True:
            _drain(queue, results, errors)
            failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if errors or failed:
                _collect_late_errors(queue, results, errors)
                break
            alive = [p.sentinel for p in procs if p.exitcode is None]
            if not alive:
                _drain(queue, results, errors)
                break
            multiprocessing.connection.wait(alive, timeout=_POLL_S)
    finally:
        _stop_all(procs)
    if errors:
        _, rank, summary, tb = min(errors)
        raise NodeFailedError(rank, f"node {rank} of {num_nodes} failed: {summary}\n\n{tb}")
    for r, p in enumerate(procs):
        if p.exitcode != 0 or r not in results:
            raise NodeFailedError(r, f"node {r} of {num_nodes} exited with code {p.exitcode}{_signal_name(p.exitcode)} without reporting an error")
    return results


def _drain(queue: Any, results: dict[int, Any], errors: list) -> None:
    while not queue.empty():
        msg = queue.get()
        if msg[0] == "ok":
            results[msg[1]] = msg[2]
        else:
            errors.append((msg[2], msg[1], msg[3], msg[4]))


def _collect_late_errors(queue: Any, results: dict[int, Any], errors: list) -> None:
    """After a first failure, give the failing node a moment to deliver its traceback."""
    deadline = time.monotonic() + _ERROR_GRACE_S
    while not errors and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        _drain(queue, results, errors)


def _stop_all(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + _TERMINATE_GRACE_S
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join()


def _signal_name(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f" ({signal.Signals(-code).name})"
        except ValueError:
            return ""
    return ""
