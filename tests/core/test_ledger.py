"""The byte ledger and NodeComm accounting, against formulas written out here."""

import pytest
import torch

from exogym.core.comm.ledger import Ledger, wire_bytes
from tests.fake_world import run_ranks


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_wire_bytes_follow_the_ring_formulas(n: int) -> None:
    b = 1000
    assert wire_bytes("all_reduce", n, b) == (2 * (n - 1) / n * b,) * 2
    assert wire_bytes("all_gather", n, b) == ((n - 1) * b,) * 2
    assert wire_bytes("reduce_scatter", n, b) == ((n - 1) / n * b,) * 2
    root = (b, 0) if n > 1 else (0, 0)
    assert wire_bytes("broadcast", n, b, is_root=True) == root
    assert wire_bytes("barrier", n, b) == (0, 0)


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown collective kind"):
        wire_bytes("allreduce", 2, 10)


def test_ledger_totals_and_step_reset() -> None:
    led = Ledger()
    led.record("all_reduce", 4, 400)
    led.record("all_gather", 4, 100)
    step = led.end_step()
    assert [r.kind for r in step] == ["all_reduce", "all_gather"]
    assert led.step_records == []
    assert led.total_sent == pytest.approx(1.5 * 400 + 3 * 100)
    assert led.total_payload == 500 and led.total_collectives == 2


def test_a_charge_with_a_count_is_that_many_identical_charges() -> None:
    one, many = Ledger(), Ledger()
    for _ in range(3):
        one.record("broadcast", 7, 120, "t")
    many.record("broadcast", 7, 120, "t", count=3)
    assert many.step_records == one.step_records and len(many.step_records) == 3
    assert (many.total_sent, many.total_received, many.total_payload, many.total_collectives) == (0.0, 360.0, 360, 3)
    assert many.end_step() == one.step_records and many.step_records == []


def test_all_reduce_mean_and_charge() -> None:
    def fn(rank, comm):
        t = torch.full((5,), float(rank))
        comm.all_reduce(t, op="mean")
        return t, comm.ledger.end_step()

    out = run_ranks(4, fn)
    for t, recs in out:
        assert torch.equal(t, torch.full((5,), 1.5))
        assert len(recs) == 1 and recs[0].payload == 20 and recs[0].group_size == 4
        assert recs[0].sent == pytest.approx(2 * 3 / 4 * 20)


def test_all_reduce_over_islands_reduces_within_each_group_and_charges_the_island() -> None:
    groups = [[0, 3], [1, 2]]

    def fn(rank, comm):
        t = torch.tensor([float(rank), 10.0 * rank])
        comm.all_reduce(t, op="sum", groups=groups)
        return t, comm.ledger.end_step()[0]

    out = run_ranks(4, fn)
    assert torch.equal(out[0][0], torch.tensor([3.0, 30.0])) and torch.equal(out[3][0], out[0][0])
    assert torch.equal(out[1][0], torch.tensor([3.0, 30.0])) and torch.equal(out[2][0], out[1][0])
    rec = out[0][1]
    assert rec.group_size == 2 and rec.sent == pytest.approx(2 * 1 / 2 * 8)


def test_uneven_islands_average_separately() -> None:
    groups = [[0], [1, 2, 3]]

    def fn(rank, comm):
        t = torch.tensor([float(rank)])
        return comm.all_reduce(t, op="mean", groups=groups).item()

    assert run_ranks(4, fn) == [0.0, 2.0, 2.0, 2.0]


def test_groups_must_partition_the_world() -> None:
    def fn(rank, comm):
        comm.all_reduce(torch.zeros(1), groups=[[0, 1], [1, 2, 3]])

    with pytest.raises(ValueError, match="partition"):
        run_ranks(4, fn)


def test_all_gather_and_broadcast() -> None:
    def fn(rank, comm):
        g = comm.all_gather(torch.tensor([rank, rank + 1]))
        b = comm.broadcast(torch.tensor([rank]), src=2)
        return g, b, comm.ledger.end_step()

    out = run_ranks(3, fn)
    for rank, (g, b, recs) in enumerate(out):
        assert torch.equal(g, torch.tensor([[0, 1], [1, 2], [2, 3]]))
        assert b.item() == 2
        assert recs[0].sent == pytest.approx(2 * 16)
        assert recs[1].sent == (16 * 0 + 8 if rank == 2 else 0)


def test_uncharged_collectives_leave_no_record() -> None:
    def fn(rank, comm):
        comm.all_reduce(torch.ones(3), charge=False)
        return comm.ledger.total_collectives

    assert run_ranks(2, fn) == [0, 0]


def test_a_groups_partition_is_checked_and_gives_each_rank_its_group() -> None:
    from exogym.core.comm import comm as comm_mod

    groups = [[0, 2], [1, 3]]
    a, b = comm_mod.NodeComm(0, 4, None), comm_mod.NodeComm(3, 4, None)  # type: ignore[arg-type]
    assert a._group(groups) == [0, 2] and b._group(groups) == [1, 3]
    groups[0], groups[1] = [0, 3], [1, 2]  # the same object, changed in place: checked again
    assert b._group(groups) == [0, 3]
    assert a._group(((0, 1), (2, 3))) == [0, 1]  # tuples work
    assert a._group(None) == (0, 1, 2, 3)
    for bad in ([[0, 1], [1, 2, 3]], [[0, 1], [2]], [[0, 1, 2, 3], []], [[0, 0, 1], [2, 3]]):
        with pytest.raises(ValueError, match="groups must"):
            a._group(bad)
