"""Start K node processes, wait for them, and tear everything down on the first failure.

The rendezvous store is created here, in the parent, on a port the OS picks (no guessing, no
retry loop), so several ``fit`` calls in one program, and several programs at once, never
collide. A node that raises sends its traceback to the parent; the parent then terminates every
other node (they may be blocked in a collective with it) and raises :class:`NodeFailedError`
with the traceback of the *first* node that failed. No process outlives ``run_nodes``.
"""

from __future__ import annotations

import io
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

import torch
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
    """Fail fast when a node process re-runs a script that lacks ``if __name__ == "__main__":``."""
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(
            "ExoGym starts one process per node (forkserver or spawn), which re-imports your "
            "script in every node. Guard the code that calls Trainer.fit with "
            '`if __name__ == "__main__":` so that the nodes do not run it again.'
        )


def create_store() -> dist.TCPStore:
    """A rendezvous store served by the parent on a free loopback port chosen by the OS."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))


def connect_store(port: int) -> dist.TCPStore:
    """The node-side client of :func:`create_store`'s store."""
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))


def _entry(fn: Callable[..., Any], rank: int, queue: Any, env: dict[str, str], args: tuple) -> None:
    """Process body: run ``fn(rank, *args)``; report its result or its traceback to the parent.

    ``env`` is the parent's environment when the run started: a fork server's children would
    otherwise see the environment of the moment the server started.
    """
    os.environ.clear()
    os.environ.update(env)
    code = 0
    try:
        result = fn(rank, *args)
        # Serialised here: tensors pickled by torch.multiprocessing would be shared through a
        # file descriptor that dies with this process before the parent reads it.
        buf = io.BytesIO()
        torch.save(result, buf)
        queue.put(("ok", rank, buf.getvalue()))
    except BaseException as e:  # noqa: BLE001 - report everything, including SystemExit
        queue.put(("error", rank, time.time(), f"{type(e).__name__}: {e}", traceback.format_exc()))
        code = 1
    # The result is already in the pipe. Skipping the interpreter's teardown (about 0.5 s of CPU
    # per node with torch loaded) makes the run end as soon as the last node reports.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


#: Modules the fork server imports once, so that node processes start with them loaded.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "exogym.runtime.node", "exogym.ops", "communicators"]


def start_method() -> str:
    """``forkserver`` where available (nodes fork from a server that has torch imported: no
    per-node import of torch, about 1-2 s of CPU each), else ``spawn``; ``EXOGYM_START_METHOD``
    overrides. Both re-import the user's ``__main__`` in each node, hence the main guard."""
    method = os.environ.get("EXOGYM_START_METHOD") or (
        "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    )
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"EXOGYM_START_METHOD must be 'forkserver' or 'spawn', got {method!r}")
    return method


def _context() -> Any:
    method = start_method()
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


def run_nodes(fn: Callable[..., Any], num_nodes: int, args: tuple) -> dict[int, Any]:
    """Run ``fn(rank, *args)`` in ``num_nodes`` new processes; return ``{rank: result}``.

    ``fn`` must be a module-level function (it is pickled by reference). Raises
    :class:`NodeFailedError` when any node fails, after every node has been stopped.
    """
    ctx = _context()
    queue = ctx.SimpleQueue()
    env = dict(os.environ)
    procs = [
        ctx.Process(target=_entry, args=(fn, r, queue, env, args), name=f"exogym-node-{r}") for r in range(num_nodes)
    ]
    results: dict[int, Any] = {}
    errors: list[tuple[float, int, str, str]] = []
    failed: list[int] = []
    codes: dict[int, int | None] = {}
    try:
        for p in procs:
            p.start()
        while True:
            _drain(queue, results, errors)
            failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if errors or failed:
                codes = {r: procs[r].exitcode for r in failed}
                _collect_late_errors(queue, results, errors)
                break
            alive = [p.sentinel for p in procs if p.exitcode is None]
            if not alive:
                _drain(queue, results, errors)
                break
            multiprocessing.connection.wait(alive, timeout=_POLL_S)
    finally:
        _stop_all(procs)
    silent = [r for r in failed if r not in {e[1] for e in errors}]
    if silent:
        # A node that vanished without a traceback (killed, os._exit, segfault) is reported
        # first: the others' errors are then mostly about losing their peer.
        r = silent[0]
        others = "".join(f"\n  then node {e[1]}: {e[2]}" for e in sorted(errors))
        raise NodeFailedError(
            r,
            f"node {r} of {num_nodes} exited with code {codes[r]}{_signal_name(codes[r])} "
            f"without reporting an error{others}",
        )
    if errors:
        _, rank, summary, tb = min(errors)
        raise NodeFailedError(rank, f"node {rank} of {num_nodes} failed: {summary}\n\n{tb}")
    missing = [r for r in range(num_nodes) if r not in results]
    if missing:
        raise NodeFailedError(missing[0], f"node {missing[0]} of {num_nodes} ended without a result")
    return results


def _drain(queue: Any, results: dict[int, Any], errors: list) -> None:
    while not queue.empty():
        msg = queue.get()
        if msg[0] == "ok":
            results[msg[1]] = torch.load(io.BytesIO(msg[2]), weights_only=False)
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
