"""The shared-memory transport against gloo and against exact expectations, in real processes."""

import pytest
import torch

from exogym.core.comm import shm
from tests.helpers import run_collectives

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not shm.supported(), reason="shared-memory transport needs x86-64"),
]


def every_collective(comm):
    """A fixed sequence of collectives whose results depend only on the rank."""
    r, k = comm.rank, comm.world_size
    out = {}
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64):
        t = (torch.arange(10, dtype=torch.float64) * (r + 1)).to(dtype)
        out[f"sum_{dtype}"] = comm.all_reduce(t.clone(), op="sum")
        out[f"max_{dtype}"] = comm.all_reduce(t.clone(), op="max")
        out[f"min_{dtype}"] = comm.all_reduce(t.clone(), op="min")
    out["mean"] = comm.all_reduce(torch.full((3, 5), float(r)), op="mean")
    out["product"] = comm.all_reduce(torch.full((4,), float(r + 1)), op="product")
    out["gather"] = comm.all_gather(torch.tensor([[r, 2 * r]]))
    out["bcast"] = comm.broadcast(torch.tensor([float(r)] * 7), src=k - 1)
    islands = [[0, k - 1], list(range(1, k - 1))]
    out["islands"] = comm.all_reduce(torch.tensor([float(r), 1.0]), op="mean", groups=islands)
    out["islands_gather"] = comm.all_gather(torch.tensor([r]), groups=islands)
    big = torch.full((40_000,), float(r))  # 160 kB: over the 64 kB capacity, goes through gloo
    out["big"] = comm.all_reduce(big, op="sum")
    out["big_gather"] = comm.all_gather(torch.tensor([float(r)] * 20_000))
    out["empty"] = comm.all_reduce(torch.zeros(0), op="sum")
    comm.barrier()
    return out


@pytest.mark.parametrize("world", [3, 4])
def test_shm_equals_gloo_and_the_expected_values(world: int) -> None:
    got = run_collectives(every_collective, world, "shm")
    ref = run_collectives(every_collective, world, "gloo")
    for r in range(world):
        for key, val in ref[r].items():
            assert got[r][key].dtype == val.dtype, key
            torch.testing.assert_close(got[r][key], val, rtol=1e-2 if "bfloat16" in key else 0, atol=0, msg=key)
    k = world
    base = torch.arange(10, dtype=torch.float64)
    assert torch.equal(got[0]["sum_torch.float64"], base * sum(range(1, k + 1)))
    assert torch.equal(got[1]["max_torch.int64"], (base * k).long())
    assert torch.equal(got[2]["mean"], torch.full((3, 5), (k - 1) / 2))
    assert torch.equal(got[0]["product"], torch.full((4,), float(torch.arange(1, k + 1).prod())))
    assert torch.equal(got[0]["gather"], torch.tensor([[[r, 2 * r]] for r in range(k)]))
    assert all(torch.equal(got[r]["bcast"], torch.full((7,), float(k - 1))) for r in range(k))
    assert torch.equal(got[0]["islands"], torch.tensor([(k - 1) / 2, 1.0]))
    assert torch.equal(got[0]["islands_gather"], torch.tensor([[0], [k - 1]]))
    assert torch.equal(got[1]["big"], torch.full((40_000,), float(sum(range(k)))))


def sum_many(comm):
    t = torch.ones(1000)
    for _ in range(500):
        comm.all_reduce(t, op="mean")
    return t


def test_many_back_to_back_collectives_stay_consistent() -> None:
    out = run_collectives(sum_many, 4, "shm")
    assert all(torch.equal(o, torch.ones(1000)) for o in out)
