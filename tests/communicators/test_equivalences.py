"""With inner SGD, FedAvg(H=1), DiLoCo(H=1, outer SGD lr 1, no momentum) and SPARTA(p=1) all equal
DDP; SPARTA(p=0) is independent training. Run on threads over the in-memory transport."""

import pytest
import torch

from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.strategy import DiLoCoStrategy, FedAvgStrategy, OptimSpec, SimpleReduceStrategy, SPARTAStrategy
from tests.fake_world import train_ranks

SGD = OptimSpec(torch.optim.SGD, lr=0.05)
STEPS = 10

EQUIVALENT_TO_DDP = {
    "fedavg_h1": lambda: FedAvgStrategy(H=1, optim_spec=SGD),
    "diloco_h1": lambda: DiLoCoStrategy(H=1, outer_lr=1.0, outer_momentum=0.0, optim_spec=SGD),
    "sparta_p1": lambda: SPARTAStrategy(p_sparta=1.0, optim_spec=SGD),
    "sparta_p1_sequential": lambda: SPARTAStrategy(p_sparta=1.0, sparsification_mode="sequential", optim_spec=SGD),
}


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("name", sorted(EQUIVALENT_TO_DDP))
def test_equivalent_to_ddp_with_sgd(name: str, k: int) -> None:
    ddp = train_ranks(k, lambda: SimpleReduceStrategy(optim_spec=SGD), STEPS)
    other = train_ranks(k, EQUIVALENT_TO_DDP[name], STEPS)
    for rank in range(k):
        for a, b in zip(ddp[rank]["params"], other[rank]["params"], strict=True):
            # averaging parameters instead of gradients rounds differently: float32 tolerance
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_sparta_p0_is_independent_training() -> None:
    k = 3
    sparta = train_ranks(k, lambda: SPARTAStrategy(p_sparta=0.0, optim_spec=SGD), STEPS)
    alone = train_ranks(k, lambda: CommunicateOptimizeStrategy([], optim_spec=SGD), STEPS)
    for rank in range(k):
        assert all(recs == [] for recs in sparta[rank]["records"])
        for a, b in zip(sparta[rank]["params"], alone[rank]["params"], strict=True):
            assert torch.equal(a, b)
    assert not torch.equal(alone[0]["params"][0], alone[1]["params"][0])
