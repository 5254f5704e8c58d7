"""This process's temporary folder, removed however the process ends.

``multiprocessing`` keeps the sockets of the fork server and of the file descriptors it passes
to workers in a ``pymp-*`` folder of the system's temporary directory, removed at a normal exit
only: a process ended by SIGKILL (or by a signal without a handler) leaves it. Before the first
worker starts, ``claim`` writes a small file beside it, ``<tmp>/exogym-<host>-<pid>``, naming
the folder (removed at exit, after the folder), and removes the folders that the files of this
machine's ended processes name: the next run cleans what a killed one left.

Standard library only: the fork server's module (``exogym.runtime.forkserver``) uses it before
torch is imported.
"""

from __future__ import annotations

import contextlib
import multiprocessing.util
import os
import shutil
import socket
import tempfile
import threading

__all__ = ["claim", "marker_of"]

_lock = threading.Lock()
#: ``(pid, marker)`` of the claim this process made (``None`` before ``claim``).
_claimed: tuple[int, str] | None = None


def marker_of(pid: int) -> str:
    """The file naming the temporary folder of process ``pid`` of this machine."""
    return os.path.join(tempfile.gettempdir(), f"exogym-{socket.gethostname()}-{pid}")


def claim() -> str:
    """Make sure multiprocessing's temporary folder of this process exists, write the file that
    names it (``marker_of``), and remove the folders of this machine's ended processes.
    Idempotent; returns the folder."""
    global _claimed
    with _lock:
        folder = multiprocessing.util.get_temp_dir()
        if _claimed is not None and _claimed[0] == os.getpid():
            return folder
        _remove_stale()
        marker = marker_of(os.getpid())
        with open(marker, "w") as f:
            f.write(folder)
        # After multiprocessing's own finalizer of its folder (exit priority -100).
        multiprocessing.util.Finalize(None, _remove, args=(marker,), exitpriority=-101)
        _claimed = (os.getpid(), marker)
        return folder


def _remove_stale() -> None:
    """Remove the folders, and their files, of this machine's processes that have ended."""
    base = tempfile.gettempdir()
    prefix = f"exogym-{socket.gethostname()}-"
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            pid = name.removeprefix(prefix)
            if not (name.startswith(prefix) and pid.isdigit()) or _alive(int(pid)):
                continue
            marker = os.path.join(base, name)
            with contextlib.suppress(OSError, UnicodeDecodeError), open(marker) as f:
                folder = os.path.abspath(f.read().strip())
                # only a multiprocessing folder of this temporary directory, whatever the file says
                if os.path.dirname(folder) == os.path.abspath(base) and os.path.basename(folder).startswith("pymp-"):
                    shutil.rmtree(folder, ignore_errors=True)
            _remove(marker)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True
