"""Collectives on every transport: grouped payloads of unequal sizes, streamed payloads, and
mismatched or missing peers that must raise within the deadline instead of hanging."""

import time

import pytest
import torch

from exogym.core.comm import shm
from exogym.runtime.launch import NodeFailedError
from tests.fake_world import run_ranks
from tests.helpers import child_pids, run_collectives

pytestmark = [pytest.mark.timeout(120)]

TRANSPORTS = ["gloo", pytest.param("shm", marks=pytest.mark.skipif(not shm.supported(), reason="no shm barrier here"))]


def _values(rank: int, n: int) -> torch.Tensor:
    """Random floats that every rank can recompute for any other rank."""
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 + rank), dtype=torch.float64)


def unequal_groups(comm):
    """Groups {0, 2} and {1, 3} all-reduce and all-gather payloads of different sizes."""
    groups = [[0, 2], [1, 3]]
    n = 5 if comm.rank in (0, 2) else 9
    reduced = comm.all_reduce(_values(comm.rank, n), op="sum", groups=groups)
    maxed = comm.all_reduce(_values(comm.rank, n), op="max", groups=groups)
    gathered = comm.all_gather(_values(comm.rank, n), groups=groups)
    return reduced, maxed, gathered


def _check_unequal_groups(out: list) -> None:
    for r in range(4):
        members = [0, 2] if r in (0, 2) else [1, 3]
        n = 5 if r in (0, 2) else 9
        rows = torch.stack([_values(m, n) for m in members])
        reduced, maxed, gathered = out[r]
        torch.testing.assert_close(reduced, rows.sum(0), rtol=1e-12, atol=0)
        assert torch.equal(maxed, rows.amax(0))
        assert torch.equal(gathered, rows)


@pytest.mark.procs
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_grouped_collectives_with_unequal_group_payloads(transport: str) -> None:
    _check_unequal_groups(run_collectives(unequal_groups, 4, transport))


def test_grouped_collectives_with_unequal_group_payloads_on_threads() -> None:
    _check_unequal_groups(run_ranks(4, lambda rank, comm: unequal_groups(comm)))


def streamed(comm):
    """Payloads of 1 MB through 64 KiB slots: 16 pieces each."""
    x = _values(comm.rank, 1 << 17).float()
    return (
        comm.all_reduce(x.clone(), op="sum"),
        comm.all_gather(x.clone()),
        comm.broadcast(x.clone(), src=1),
        comm.all_reduce(x[: 3 + comm.rank % 2].clone(), op="sum", groups=[[0, 2], [1, 3]]),
    )


@pytest.mark.procs
@pytest.mark.skipif(not shm.supported(), reason="no shm barrier here")
def test_payloads_larger_than_a_slot_are_streamed_and_equal_gloo() -> None:
    got = run_collectives(streamed, 4, "shm", payload_hint=1 << 20, slot_mb=1 / 16)
    ref = run_collectives(streamed, 4, "gloo")
    rows = torch.stack([_values(r, 1 << 17).float() for r in range(4)])
    for r in range(4):
        for a, b in zip(got[r], ref[r], strict=True):
            torch.testing.assert_close(a, b)  # float sums in another order: default tolerance
        assert torch.equal(got[r][1], rows)
        assert torch.equal(got[r][2], rows[1])
    assert torch.equal(got[0][0], got[3][0])  # every rank holds the same reduced bits


def mismatched(comm):
    if comm.rank == 0:
        comm.all_reduce(torch.ones(10), op="sum")  # 40 bytes
    else:
        comm.all_gather(torch.ones(20))  # 80 bytes
    return None


@pytest.mark.procs
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mismatched_collective_raises_within_the_deadline_naming_both_ops(transport: str) -> None:
    timeout = 3.0
    t0 = time.monotonic()
    with pytest.raises(NodeFailedError) as info:
        run_collectives(mismatched, 2, transport, timeout_s=timeout)
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert "all_reduce(sum) of 40 bytes" in msg and "all_gather of 80 bytes" in msg, msg
    assert "CollectiveMismatchError" in msg
    # the deadline, plus the peers' report window (gloo) and process start-up
    assert elapsed < timeout + 15, elapsed
    assert child_pids() == []


def one_rank_skips(comm):
    if comm.rank == 0:
        comm.all_reduce(torch.ones(4), op="sum")
    return None


@pytest.mark.procs
@pytest.mark.skipif(not shm.supported(), reason="no shm barrier here")
def test_a_peer_that_never_arrives_times_out_naming_it() -> None:
    with pytest.raises(NodeFailedError, match=r"waited collective_timeout=2s for rank\(s\) \[1\]") as info:
        run_collectives(one_rank_skips, 2, "shm", timeout_s=2.0)
    assert "all_reduce(sum) of 16 bytes" in str(info.value)


def stress(comm):
    """Back-to-back collectives whose values differ per rank and per iteration: a rank that read
    a slot before its peer wrote it (or after the next write) gets a wrong sum."""
    k, out = comm.world_size, []
    for i in range(300):
        t = torch.full((257,), float(comm.rank * 1000 + i))
        comm.all_reduce(t, op="sum")
        expected = float(sum(r * 1000 + i for r in range(k)))
        if not torch.all(t == expected):
            raise AssertionError(f"iteration {i}: got {t[0].item()}, expected {expected}")
        g = comm.all_gather(torch.tensor([comm.rank * 7 + i]))
        if g.view(-1).tolist() != [r * 7 + i for r in range(k)]:
            raise AssertionError(f"iteration {i}: gathered {g.tolist()}")
        out.append(t[0].item())
    return out


@pytest.mark.procs
@pytest.mark.skipif(not shm.supported(), reason="no shm barrier here")
def test_back_to_back_collectives_with_changing_values_stay_consistent() -> None:
    out = run_collectives(stress, 4, "shm")
    assert out[0] == out[3] == [float(sum(r * 1000 + i for r in range(4))) for i in range(300)]
