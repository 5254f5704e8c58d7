"""Rendezvous: the local run's store and process group, on loopback only, and joining the group
an outside launcher (``torchrun``) set up through ``env://``.

A local run is one machine talking to itself, so nothing of it listens beyond loopback: the
parent's store serves a socket bound to 127.0.0.1 (``serve_store``), and the nodes' gloo
pairs bind the loopback interface (``loopback_gloo``). Under torchrun the launcher's store
and the group's addresses are the user's choice and are left as they are.
``TransportPlan`` uses these, and ``exogym.runtime.cluster``
joins a launcher's group before a run.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta

import torch.distributed as dist

#: Where a local run's store listens and its nodes connect.
LOOPBACK = "127.0.0.1"
_STORE_TIMEOUT = timedelta(seconds=60)
_IFF_LOOPBACK = 0x8  # <linux/if.h>
_env_lock = threading.Lock()


def serve_store() -> dist.TCPStore:
    """Start a store server on a loopback port the OS picks (``store.port``).

    ``TCPStore(is_master=True)`` would listen on every interface whatever host it is given; it
    serves a socket made here instead, bound to 127.0.0.1, which the store then owns and closes.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, 0))
        sock.listen(128)
        port = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    fd = sock.detach()  # close-on-exec: no child process inherits the listening socket
    try:
        return dist.TCPStore(
            LOOPBACK, port, is_master=True, wait_for_workers=False, timeout=_STORE_TIMEOUT, master_listen_fd=fd
        )
    except BaseException:
        # The store may own the descriptor by now (it closes it): an interrupt that lands
        # there must surface as itself, not as the close's EBADF.
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def connect_store(port: int) -> dist.TCPStore:
    """A client of the store ``serve_store`` started in the parent."""
    return dist.TCPStore(LOOPBACK, port, is_master=False, timeout=_STORE_TIMEOUT)


def loopback_interface() -> str | None:
    """The name of the loopback network interface (Linux: read from ``/sys/class/net``), or
    ``None`` where it cannot be found."""
    if not sys.platform.startswith("linux"):
        return None
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir("/sys/class/net")):
            with contextlib.suppress(OSError, ValueError), open(f"/sys/class/net/{name}/flags") as f:
                if int(f.read().strip(), 16) & _IFF_LOOPBACK:
                    return name
    return None


@contextlib.contextmanager
def loopback_gloo() -> Iterator[None]:
    """While a gloo process group is made, have its pairs bind the loopback interface.

    gloo binds the address this machine's hostname resolves to, which may be a network
    address; ``GLOO_SOCKET_IFNAME`` names the interface instead. A value the user set is kept.
    """
    with _env_lock:
        name = loopback_interface()
        if name is None or "GLOO_SOCKET_IFNAME" in os.environ:
            yield
            return
        os.environ["GLOO_SOCKET_IFNAME"] = name
        try:
            yield
        finally:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)


def join(backend: str, timeout_s: float) -> None:
    """Join the launcher's process group (``env://``) unless one exists. Collective: every rank
    must call.

    The group is kept for later ``fit`` calls in the same script (``exogym compare`` runs one
    per strategy: re-creating the default group on torchrun's store is not reliable) and
    destroyed when the interpreter exits; a group the user made is used as it is.
    """
    if dist.is_initialized():
        if dist.get_backend() != backend:
            raise ValueError(
                f"a torch.distributed process group with backend {dist.get_backend()!r} already exists, but this "
                f"run needs {backend!r}; destroy it first or pick the matching transport"
            )
        return
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    atexit.register(_destroy)


def _destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def default_store() -> dist.Store | None:
    """The process group's rendezvous store (for error reports), when torch exposes it."""
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None
