"""The shared-memory transport's barrier: a compiled kernel with acquire/release atomics, and
its pure-Python reference.

Every rank owns one line ``flags[rank]`` of eight int64 words in shared memory::

    word 0: (generation << 32) | (tag << 16) | group     (stored last, with release order)
    word 1: ((generation & 0xFFFF) << 48) | payload bytes
    words 2..4: the caller's own mismatch report: (other rank, its word 0, its word 1)

``shm_barrier`` publishes this rank's words and waits until every rank's generation has
reached ``gen``. Ranks at exactly ``gen`` must carry the same ``tag`` (the collective and its
reduce op or root) and, when they name the same ``group``, the same ``size``: otherwise the
barrier returns that rank, so a rank that all-reduces 10 floats while its peer all-gathers 20
gets an error instead of garbage. A rank already past ``gen`` has checked this rank's words.

The kernel (``csrc/cpu/shm_sync.cpp``) is correct under any memory model (x86-64, arm64). The
reference relies on x86's ordering of plain stores and loads and is used only there, when the
extension is not built.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

import torch

from exogym import ops as _ops

#: Return values of ``shm_barrier`` besides a mismatching rank (>= 0).
PASSED, TIMED_OUT = -1, -2
WORDS = 8
_SIZE_MASK = (1 << 48) - 1


def available() -> bool:
    """Whether a correct barrier exists here: the kernel, or the reference on x86-64."""
    return _ops.use_kernel("shm_barrier", torch.device("cpu")) or platform.machine().lower() in ("x86_64", "amd64")


def barrier_function() -> Callable[[torch.Tensor, int, int, int, int, int, float, int], int]:
    """``shm_barrier``'s implementation for CPU tensors, resolved once (the transport calls
    it twice per collective, where a per-call lookup would show)."""
    if _ops.use_kernel("shm_barrier", torch.device("cpu")):
        return torch.ops.exogym.shm_barrier.default
    return shm_barrier_reference


def shm_barrier(
    flags: torch.Tensor, rank: int, gen: int, tag: int, group: int, size: int, timeout_s: float, spin_us: int = 2000
) -> int:
    """Publish ``(gen, tag, group, size)`` in ``flags[rank]`` and wait for every rank to reach
    ``gen``: spin for ``spin_us`` microseconds (lowest latency while each node has a core), then
    sleep until a peer arrives (a futex on Linux; nodes that outnumber the cores then do not take
    each other's). Returns ``PASSED``, ``TIMED_OUT`` after ``timeout_s`` seconds, or the
    rank whose tag (or size, within the same group) differs. The GIL is released while waiting."""
    return barrier_function()(flags, rank, gen, tag, group, size, timeout_s, spin_us)


def shm_barrier_reference(
    flags: torch.Tensor, rank: int, gen: int, tag: int, group: int, size: int, timeout_s: float, spin_us: int = 2000
) -> int:
    """Pure-Python ``shm_barrier`` (same contract, but it yields instead of sleeping);
    correct only under x86 ordering."""
    f = flags.numpy()
    word0 = (gen << 32) | (tag << 16) | group
    f[rank, 1] = ((gen & 0xFFFF) << 48) | size
    f[rank, 0] = word0
    deadline = time.monotonic() + timeout_s
    nxt, spins, world = 0, 0, f.shape[0]
    while True:
        while nxt < world:
            w0 = int(f[nxt, 0])
            g = w0 >> 32
            if g < gen:
                break
            if g == gen:
                w1 = int(f[nxt, 1])
                same = ((w1 >> 48) & 0xFFFF) == (gen & 0xFFFF)
                bad = ((w0 >> 16) & 0xFFFF) != tag
                if not bad and same and (w0 & 0xFFFF) == group:
                    bad = (w1 & _SIZE_MASK) != size
                if bad:
                    f[rank, 2:5] = (nxt, w0, w1)
                    return nxt
            nxt += 1
        if nxt == world:
            return PASSED
        spins += 1
        if spins > 64:
            if spins % 256 == 0 and time.monotonic() > deadline:
                return TIMED_OUT
            os.sched_yield()


__all__ = ["PASSED", "TIMED_OUT", "WORDS", "available", "barrier_function", "shm_barrier", "shm_barrier_reference"]
