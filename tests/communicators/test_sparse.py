"""SPARTA sparse averaging: shared indices, selector contracts, and bytes against the formula."""

import pytest
import torch

from communicators.sparse import SELECTORS, SharedSelector, SparseCommunicator
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.strategy import OptimSpec, SimpleReduceStrategy, SPARTAStrategy
from exogym.strategy.sparta import SparseCommunicator as SeedPathSparse
from tests.fake_world import train_ranks
from tests.helpers import TinyNet

pytestmark = pytest.mark.usefixtures("op_path")
SGD = OptimSpec(torch.optim.SGD, lr=0.05)
FROZEN = OptimSpec(torch.optim.SGD, lr=0.0)


class SetToRank(CommunicateOptimizeStrategy):
    """Sets every parameter entry to (rank + 1) * (1 + position) before the pipeline runs."""

    def step(self):
        with torch.no_grad():
            for p in self.model.parameters():
                p.copy_((self.rank + 1) * (1 + torch.arange(p.numel(), dtype=p.dtype)).view_as(p))
        super().step()


@pytest.mark.parametrize("selector", [s for s in SELECTORS if s != "topk"])
def test_shared_selectors_average_the_same_entries_on_every_rank(selector: str) -> None:
    k = 2
    out = train_ranks(k, lambda: SetToRank([SparseCommunicator(0.25, selector)], optim_spec=FROZEN), 1)
    flats = [torch.cat([p.reshape(-1) for p in o["params"]]) for o in out]
    base = torch.cat([1 + torch.arange(p.numel(), dtype=torch.float32) for p in out[0]["params"]])
    averaged = [torch.isclose(f / base, torch.tensor(1.5)) for f in flats]  # mean of r+1 over r=0,1 is 1.5
    assert all(torch.equal(averaged[0], a) for a in averaged[1:])
    n = base.numel()
    assert 0.15 * n < averaged[0].sum() < 0.35 * n
    for r, (f, a) in enumerate(zip(flats, averaged, strict=True)):
        assert torch.equal(f[~a], (r + 1) * base[~a])  # untouched entries keep the rank's value


@pytest.mark.parametrize("selector", ["random", "sequential", "partitioned", "blockwise"])
def test_selectors_are_deterministic_sorted_and_in_range(selector: str) -> None:
    sel = SharedSelector(selector, 0.1, seed=4, shapes=[1000, 37, 5], device=torch.device("cpu"))
    again = SharedSelector(selector, 0.1, seed=4, shapes=[1000, 37, 5], device=torch.device("cpu"))
    for step in range(4):
        a, b = sel.select(step), again.select(step)
        for x, y, n in zip(a, b, [1000, 37, 5], strict=True):
            assert torch.equal(x, y) and torch.equal(x, x.sort().values) and x.unique().numel() == x.numel()
            assert x.numel() == 0 or (0 <= int(x.min()) and int(x.max()) < n)


def test_sequential_visits_every_entry_once_per_cycle() -> None:
    sel = SharedSelector("sequential", 0.25, seed=1, shapes=[103], device=torch.device("cpu"))
    seen = torch.cat([sel.select(s)[0] for s in range(4)])
    assert torch.equal(seen.sort().values, torch.arange(103))


def test_bytes_are_p_times_ddp_without_any_mask() -> None:
    k, steps, p = 2, 400, 0.005
    ddp = train_ranks(k, lambda: SimpleReduceStrategy(optim_spec=SGD), 1, make_model=_wide)
    # A small lr: 400 steps of the wide net at the module's lr diverge, and only bytes matter here.
    slow = OptimSpec(torch.optim.SGD, lr=0.005)
    sp = train_ranks(k, lambda: SPARTAStrategy(p_sparta=p, optim_spec=slow), steps, make_model=_wide)
    dense = sum(r.payload for r in ddp[0]["records"][0])
    payloads = [sum(r.payload for r in recs) for recs in sp[0]["records"]]
    assert all(r.kind == "all_reduce" for recs in sp[0]["records"] for r in recs)  # no index/mask traffic
    # per step within rounding (each tensor rounds p*n up or down), exact in expectation
    n_tensors = len(list(_wide().parameters()))
    assert all(abs(pl - p * dense) <= 4 * n_tensors for pl in payloads)
    assert sum(payloads) / steps == pytest.approx(p * dense, rel=0.02)


def _wide():
    return TinyNet(hidden=400)


def test_topk_sends_indices_and_averages_the_union() -> None:
    k = 2
    out = train_ranks(k, lambda: SPARTAStrategy(p_sparta=0.1, sparsification_mode="topk", optim_spec=SGD), 3)
    recs = out[0]["records"][0]
    assert [r.kind for r in recs] == ["all_gather", "all_reduce"]
    n = sum(p.numel() for p in out[0]["params"])
    kk = round(0.1 * n)
    assert recs[0].payload == 4 * kk  # int32 indices
    assert kk * 4 <= recs[1].payload <= k * kk * 4


def test_seed_spellings() -> None:
    assert SeedPathSparse is SparseCommunicator
    assert SparseCommunicator(sparsification_rate=0.01).p == 0.01
    with pytest.raises(TypeError, match="not both"):
        SparseCommunicator(0.1, sparsification_rate=0.2)
    with pytest.raises(ValueError, match="selector"):
        SparseCommunicator(0.1, selector="bernoulli")
    with pytest.raises(TypeError, match="disagree"):
        SPARTAStrategy(sparsification_mode="random", compression_method="topk")
    assert SPARTAStrategy(compression_method="topk").communication_modules[0].selector == "topk"


def _topk_islands():
    return CommunicateOptimizeStrategy(
        [SparseCommunicator(p=0.2, selector="topk", island_size=2)], optim_spec=OptimSpec(torch.optim.SGD, lr=0.1)
    )


def test_topk_selection_with_islands_runs_on_threads_where_island_unions_differ() -> None:
    """Each island all-reduces its own index union, whose size differs between islands."""
    out = train_ranks(4, _topk_islands, 3)
    values = [r for r in out[0]["records"][0] if r.tag == "sparse_topk_values"]
    assert values and all(r.group_size == 2 for r in values)


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_topk_selection_with_islands_runs_on_gloo() -> None:
    from exogym import Trainer
    from tests.helpers import FIT_DEFAULTS, TinyNet, regression_data

    model = Trainer(TinyNet(), regression_data(256)).fit(
        _topk_islands(), num_nodes=4, max_steps=3, batch_size=8, transport="gloo", **FIT_DEFAULTS
    )
    assert all(torch.isfinite(p).all() for p in model.parameters())
