"""The fork server that worker processes start from, and when it starts.

Workers are forked from a server process that has imported torch, ``torch._dynamo`` (which every
optimizer step imports) and ExoGym once: about 3.5 s of imports on a small machine, which
would otherwise sit between the call to ``fit`` and the first training step. The first
``Trainer(...)`` therefore starts the server ([`prestart`][exogym.prestart]), so that its imports
run on another core while your script goes on to ``fit``; ``exogym.prestart()`` starts it earlier,
at the top of a script, so that they also run beside loading the data and building the model.
``fit`` uses that server, or starts one if there is none. Importing ``exogym`` starts nothing.

The server is not started early where it would not be used or cannot be started cleanly:
``EXOGYM_PRESTART=0``; ``EXOGYM_START_METHOD=spawn`` (or a platform without fork servers); a
process that multiprocessing started (a node, a ``DataLoader`` worker, the server itself); a
``torchrun`` rank; a call outside the main thread. It ignores Ctrl-C (the parent decides what
Ctrl-C stops) and ends with its parent: the process that started it early stops it when it
exits, so that a script which never trains leaves nothing behind, and on Linux the kernel kills
it when the parent dies without exiting (``kill -TERM`` or ``-9`` before ``fit`` handles
signals), even while it still imports torch.

Standard library only: the server imports this module first (``PRELOAD``), which ties its
life to its parent's before the seconds of torch's import.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing as mp
import multiprocessing.forkserver
import os
import signal
import sys
import threading
from typing import Any

from exogym.runtime import tempdir

#: Modules the fork server imports once, so that worker processes start with them loaded (this
#: module first: see the module's docstring).
PRELOAD = [
    "exogym.runtime.forkserver",
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "exogym.runtime.worker",
    "exogym.ops",
    "communicators",
]

#: ``EXOGYM_PRESTART=0`` (or ``false``, ``no``, ``off``): ``prestart`` starts no server (nor
#: does ``Trainer(...)``); ``fit`` starts it.
PRESTART_ENV = "EXOGYM_PRESTART"
#: ``EXOGYM_START_METHOD=spawn|forkserver`` overrides ``start_method``.
START_METHOD_ENV = "EXOGYM_START_METHOD"
#: The variables ``torchrun`` sets that ExoGym needs: where all are set, this process is a
#: launcher's rank (see ``exogym.runtime.cluster``), which starts no worker processes.
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

#: Set in the fork server's environment while it starts: the pid of the process that started it.
SERVER_ENV = "_EXOGYM_FORKSERVER_PARENT"

_OFF = ("0", "false", "no", "off")
#: The process that started the server early (only it stops the server at exit).
_owner: int | None = None
#: Whether this process is a fork server (which starts no server of its own).
_is_server = False


def start_method() -> str:
    """``forkserver`` where available (workers fork from a server that has torch imported: no
    per-worker import of torch, about 1-2 s of CPU each), else ``spawn``;
    ``EXOGYM_START_METHOD`` overrides. Raises ``ValueError`` for any other value."""
    method = os.environ.get(START_METHOD_ENV) or (
        "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    )
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"{START_METHOD_ENV} must be 'forkserver' or 'spawn', got {method!r}")
    return method


def context() -> Any:
    """The multiprocessing context workers start from (the fork server's preload set)."""
    method = start_method()
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


def server_pid() -> int | None:
    """The pid of this process's fork server, ``None`` while none runs."""
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)


def exit_with_parent() -> None:
    """Have the kernel kill this process (SIGKILL) when its parent ends, however the parent
    ends (Linux's ``PR_SET_PDEATHSIG``; elsewhere nothing happens)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def ensure_server() -> None:
    """Start the fork server unless it runs (returns at once; its imports go on in the
    background; one that died is started again). The server ignores Ctrl-C, ends with this
    process and starts no server of its own. Call only when ``start_method`` is
    ``forkserver``."""
    context()
    if _running():  # no SIGINT-ignoring window: a Ctrl-C between two runs of a program is not lost
        return
    tempdir.claim()  # the server's socket goes into a folder that ends with this process
    os.environ[SERVER_ENV] = str(os.getpid())  # read by the server as it imports this module
    # SIGINT ignored meanwhile (on the main thread; signals can be set only there): the server
    # keeps ignoring it, and Python installs no KeyboardInterrupt handler in a process that starts so.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        del os.environ[SERVER_ENV]
        if main:
            signal.signal(signal.SIGINT, previous)


def _running() -> bool:
    """Whether this process's fork server is alive (from ``/proc``; ``False`` where it cannot
    tell, or for a server that died: ``ensure_server`` then goes through multiprocessing,
    which starts it again)."""
    pid = server_pid()
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def prestart() -> bool:
    """Start the fork server that ``fit`` starts its node processes from, now, and return at once
    whether it runs (its imports of torch and ExoGym, a few seconds, go on in the background).
    ``Trainer(...)`` calls it; call it yourself at the top of a script to overlap those imports
    with loading data and building the model. Idempotent; starts nothing where the server would
    not be used (see the module's docstring: ``EXOGYM_PRESTART=0``, ``spawn``, ``torchrun``, a
    process that multiprocessing started, a thread other than the main one). Never raises: a
    setting that ``fit`` would refuse is left for ``fit`` to report."""
    global _owner
    if _is_server or os.environ.get(PRESTART_ENV, "").strip().lower() in _OFF:
        return False
    if mp.parent_process() is not None or all(k in os.environ for k in TORCHRUN_ENV):
        return False
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        if start_method() != "forkserver":
            return False
        ensure_server()
    except Exception:  # noqa: BLE001 - fit starts (and reports on) the server as it always did
        return False
    if _owner is None:
        _owner = os.getpid()
        atexit.register(_stop_at_exit)
    return True


def _follow_parent(parent: str) -> None:
    """In the fork server, importing its first preload: end with the process that started it
    (pid ``parent``), also if that one ended before this took effect."""
    global _is_server
    _is_server = True
    exit_with_parent()
    if str(os.getppid()) != parent:
        os._exit(0)


def _stop_at_exit() -> None:
    """End the server this process started early (it may still be importing torch, when it
    would not notice the parent's exit until its imports are done). Its workers have ended:
    ``fit`` stops them before it returns or raises."""
    pid = server_pid()
    if _owner != os.getpid() or pid is None:  # a child forked from the owner: not its server
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):  # reaps it, closes its pipe and removes its socket
        multiprocessing.forkserver._forkserver._stop()


__all__ = [
    "PRELOAD",
    "PRESTART_ENV",
    "SERVER_ENV",
    "START_METHOD_ENV",
    "TORCHRUN_ENV",
    "context",
    "exit_with_parent",
    "prestart",
    "start_method",
]

# The fork server imports this module first (PRELOAD). The variable goes with it, so that the
# processes it forks, and theirs, do not take themselves for a server.
if SERVER_ENV in os.environ:
    _follow_parent(os.environ.pop(SERVER_ENV))
