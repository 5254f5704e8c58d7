"""The per-node metrics buffer: rows written in bulk equal those written step by step."""

from __future__ import annotations

import platform
import subprocess
import sys

import numpy as np
import pytest
import torch

from exogym.clocks import events
from exogym.metrics import MetricsBuffer, StepSample


class _Comm:
    rank, world_size = 1, 2


class _Network:
    trace_changes = ()
    backward_share = 2 / 3

    def slowdown(self, rank: int) -> float:
        return 1.0


class _RecordingComm:
    """One node's comm in a world of ``world_size``: the all-reduce of the event count answers
    ``longest``; contributions are recorded; an all-gather (rank 0's) stacks its own share
    after the ``others``' (ranks 1, 2, ...), as the gather over nodes does."""

    def __init__(self, rank: int, world_size: int, longest: int, others: list[np.ndarray] | None = None) -> None:
        self.rank, self.world_size, self.longest, self.others = rank, world_size, longest, others or []
        self.gathered: list[np.ndarray] = []
        self.received: list[tuple[int, ...]] = []

    def all_reduce(self, tensor, op="sum", groups=None, charge=True, tag=""):
        self.received.append(tuple(tensor.shape))
        if tensor.numel() == 1:
            tensor.fill_(float(self.longest))
        return tensor

    def all_reduce_contribute(self, tensor, op="sum", groups=None) -> None:
        pass

    def all_gather_contribute(self, tensor, groups=None) -> None:
        self.gathered.append(tensor.numpy().copy())

    def all_gather(self, tensor, groups=None, charge=True, tag=""):
        assert self.rank == 0, "only rank 0 gathers the events"
        return torch.from_numpy(np.stack([tensor.numpy(), *self.others]))


def _node_steps(buffer: MetricsBuffer, rank: int) -> None:
    """Rank ``rank``'s 5 pending steps: it computes at steps 1 and 1 + rank, meets others at 4."""
    for i in range(5):
        compute = 0.5 + rank if i in (0, rank) else 0.0
        key = 7.0 if i == 3 else 0.0
        buffer.add(StepSample(1.0, 1.0, 8.0, 4.0, 4.0, compute, 0.1 * key, 0.0, 1.0, 0.0, 0.1, key))


def test_a_flush_sends_each_nodes_clock_events_to_rank_0_alone() -> None:
    world, steps = 3, 5
    # The reference: each node's event rows (exogym.clocks.events), stacked, padded to the longest.
    own = []
    for rank in range(world):
        ref = MetricsBuffer(_Comm(), _Network(), 10, 100)
        _node_steps(ref, rank)
        rows = ref._rows[:steps]
        own.append(events(1, rows[:, 5], rows[:, 6], rows[:, 11], 10, 100))
    longest = max(len(e) for e in own)
    expected = np.zeros((world, longest, own[0].shape[1]))
    for rank, e in enumerate(own):
        expected[rank, : len(e)] = e
    contributed = []
    for rank in (1, 2):
        comm = _RecordingComm(rank, world, longest)
        buffer = MetricsBuffer(comm, _Network(), 10, 100)
        _node_steps(buffer, rank)
        assert buffer.flush() == []
        assert comm.received == [(1,)]  # the longest event count only: no table comes back
        assert len(comm.gathered) == 1 and np.array_equal(comm.gathered[0], expected[rank])
        contributed.append(comm.gathered[0])
    comm = _RecordingComm(0, world, longest, others=contributed)
    buffer = MetricsBuffer(comm, _Network(), 10, 100)
    _node_steps(buffer, 0)
    replayed: list[np.ndarray] = []
    assert buffer.clocks is not None
    replay = buffer.clocks.replay
    buffer.clocks.replay = lambda table: replayed.append(table.copy()) or replay(table)  # type: ignore[method-assign]
    buffer.flush()
    assert np.array_equal(replayed[0], expected)


def test_only_rank_0_keeps_clocks_and_only_its_checkpoint_state_holds_them() -> None:
    rank1 = MetricsBuffer(_Comm(), _Network(), 10, 100)
    assert rank1.clocks is None and "clocks" not in rank1.state_dict()
    rank1.load_state_dict(rank1.state_dict())  # a non-zero rank resumes without clocks
    comm0 = _RecordingComm(0, 3, 1)
    rank0 = MetricsBuffer(comm0, _Network(), 10, 100)
    assert rank0.clocks is not None
    rank0.clocks.clock[:] = [1.0, 2.0, 3.0]
    again = MetricsBuffer(comm0, _Network(), 10, 100)
    again.load_state_dict(rank0.state_dict())
    assert again.clocks is not None and again.clocks.clock.tolist() == [1.0, 2.0, 3.0]


TRIM_PROBE = r"""
import ctypes, torch
from exogym.metrics import _give_back_free_memory
libc = ctypes.CDLL(None)
libc.mallopt(-8, 1)  # one arena, as a worker of virtual nodes
libc.mallopt(-3, 64 * 2**20)  # arrays from the heap (as glibc does once one mapping was freed)
libc.mallopt(-1, 2**30)  # free() trims nothing itself: what is freed stays until a trim
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
start = rss()
kept = []
for i in range(300):  # nodes in turn: a 1.6 MB array made and freed, a small allocation kept
    big = torch.ones(200_000 + 64 * i, dtype=torch.float64)  # each a little larger than the last hole
    kept.append(torch.zeros(512 + i, dtype=torch.float64))  # (above the array: too large for the caches)
    del big
before = rss()
_give_back_free_memory(1)
print(before - start, before - rss())
"""


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="malloc_trim and VmRSS are glibc's and Linux's",
)
def test_a_flush_gives_the_freed_heap_pages_of_its_worker_back_to_the_system() -> None:
    # Whether the arrays leave holes in the heap varies from process to process (in about one
    # of three glibc serves them so that each freed array goes back whole): the first of up to
    # 8 probes whose arrays left holes (over 200 MB more resident) is the one asserted on.
    for _ in range(8):
        out = subprocess.run(
            [sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, timeout=100, check=True
        )
        grown, given_back = (int(v) for v in out.stdout.split())
        if grown > 200 * 2**20:
            break
    assert grown > 200 * 2**20, "no probe's arrays left holes in the heap"
    assert given_back > 200 * 2**20  # the holes' pages (~480 MB) leave the resident set


def test_the_nodes_of_a_worker_trim_the_heap_once_per_flush_step(monkeypatch: pytest.MonkeyPatch) -> None:
    import exogym.metrics as M

    trims: list[int] = []
    monkeypatch.setattr(M, "_malloc_trim", lambda: trims.append)
    monkeypatch.setattr(M, "_TRIMMED_AT", [-1])
    for step in (64, 64, 64, 128, 128, 192):  # three nodes flush at 64, two at 128, one at 192
        M._give_back_free_memory(step)
    assert trims == [0, 0, 0]
