"""The shared-memory transport against gloo and against exact expectations, in real processes."""

import pytest
import torch

from exogym.core.comm import shm
from tests.helpers import run_collectives

pytestmark = [
    pytest.mark.procs,
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
    big = torch.full((40_000,), float(r))  # 160 kB: over the 64 kB slot, streamed in pieces
    out["big"] = comm.all_reduce(big, op="sum")
    out["big_gather"] = comm.all_gather(torch.tensor([float(r)] * 20_000))
    out["empty"] = comm.all_reduce(torch.zeros(0), op="sum")
    comm.barrier()
    return out


def random_floats(comm):
    """Random float payloads (not integer-valued: a summation-order or race error shows)."""
    g = torch.Generator().manual_seed(7 + comm.rank)
    out = {}
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for op in ("sum", "mean", "max", "min"):
            out[f"{op}_{dtype}"] = comm.all_reduce(torch.randn(1000, generator=g).to(dtype), op=op)
        out[f"gather_{dtype}"] = comm.all_gather(torch.randn(5, 3, generator=g).to(dtype))
    out["islands"] = comm.all_reduce(torch.randn(77, generator=g), op="mean", groups=[[0, 2], [1, 3]])
    out["big"] = comm.all_reduce(torch.randn(40_000, generator=g), op="sum")
    return out


def test_shm_equals_gloo_on_random_floats() -> None:
    got = run_collectives(random_floats, 4, "shm")
    ref = run_collectives(random_floats, 4, "gloo")
    for r in range(4):
        for key, val in ref[r].items():
            assert got[r][key].dtype == val.dtype, key
            if key.startswith(("max", "min", "gather")):
                assert torch.equal(got[r][key], val), key  # no arithmetic: exact
            elif "bfloat16" in key:  # gloo rounds to bf16 after every add, shm once after an fp32 sum
                torch.testing.assert_close(got[r][key], val, rtol=2e-2, atol=0.1, msg=key)
            else:  # sums in another order: float tolerance of the dtype
                torch.testing.assert_close(got[r][key], val, msg=key)
        for key in got[0]:
            assert torch.equal(got[r][key], got[0 if key != "islands" else r % 2][key]), key  # same bits


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
