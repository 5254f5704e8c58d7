"""SimpleReduce (DDP) across real node processes: equivalence, identical ranks, byte counts."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler, Subset

from communicators import AveragingCommunicator
from exogym import Trainer
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.strategy import OptimSpec, SimpleReduceStrategy
from tests.helpers import FIT_DEFAULTS, SaveParams, TinyNet, load_rank_params, regression_data

pytestmark = [pytest.mark.procs, pytest.mark.timeout(90)]

LR, B, STEPS, SEED = 0.05, 8, 12, 3


def single_node_reference(ds, num_nodes: int) -> list[torch.Tensor]:
    """One model trained by SGD on the union of the K nodes' batches, step by step.

    Node r's batches are consecutive slices of DistributedSampler(K, r, seed) over epoch 0; the
    reference concatenates the K batches of each step into one batch of K*B examples.
    """
    model = TinyNet()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    orders = [list(DistributedSampler(ds, num_nodes, r, shuffle=True, seed=SEED)) for r in range(num_nodes)]
    for s in range(STEPS):
        idx = [i for order in orders for i in order[s * B : (s + 1) * B]]
        x, y = ds[idx]
        opt.zero_grad()
        F.mse_loss(model.fc2(torch.tanh(model.fc1(x))), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("transport", ["shm", "gloo"])
@pytest.mark.parametrize("num_nodes", [2, 4])
def test_k_nodes_equal_one_node_with_k_times_the_batch(tmp_path, num_nodes: int, transport: str) -> None:
    ds = regression_data(n=STEPS * B * num_nodes)
    strategy = CommunicateOptimizeStrategy(
        [AveragingCommunicator(target="grads"), SaveParams(str(tmp_path))], OptimSpec(torch.optim.SGD, lr=LR)
    )
    final = Trainer(TinyNet(), ds).fit(
        strategy, num_nodes, max_steps=STEPS, batch_size=B, seed=SEED, transport=transport, **FIT_DEFAULTS
    )
    expected = single_node_reference(ds, num_nodes)
    # float32 sums in another order: differences stay near machine epsilon.
    for got, want in zip(final.parameters(), expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6)
    ranks = load_rank_params(str(tmp_path), num_nodes)
    for r in range(1, num_nodes):
        for a, b in zip(ranks[0], ranks[r], strict=True):
            assert torch.equal(a, b), f"rank {r} diverged from rank 0"


@pytest.mark.parametrize("transport", ["shm", "gloo"])
def test_ledger_charges_one_parameter_sized_all_reduce_per_step(transport: str) -> None:
    k, steps = 4, 5
    model = TinyNet()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    trainer = Trainer(model, regression_data(n=steps * B * k))
    trainer.fit(
        SimpleReduceStrategy(OptimSpec(torch.optim.SGD, lr=LR)),
        k,
        max_steps=steps,
        batch_size=B,
        log_interval=1,
        transport=transport,
        **FIT_DEFAULTS,
    )
    rows = [r for r in trainer.history if "bytes_sent" in r]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    per_step = 2 * (k - 1) / k * param_bytes  # ring all-reduce of the gradient bytes
    for r in rows:
        assert r["bytes_sent"] == pytest.approx(per_step * r["step"])
        assert r["bytes_received"] == pytest.approx(per_step * r["step"])


def test_training_reduces_the_loss_and_reports_validation() -> None:
    full = regression_data(n=576)
    trainer = Trainer(TinyNet(), Subset(full, range(512)), Subset(full, range(512, 576)))
    trainer.fit(
        SimpleReduceStrategy(OptimSpec(torch.optim.SGD, lr=0.1)),
        2,
        num_epochs=2,
        batch_size=16,
        logger=False,
        progress=False,
        val_size=64,
        val_interval=8,
        log_interval=4,
    )
    train = [r["train_loss"] for r in trainer.history if "train_loss" in r]
    val = [r for r in trainer.history if "val_loss_global" in r]
    assert train[-1] < 0.5 * train[0]
    assert [r["step"] for r in val] == [0, 8, 16, 24, 32]
    assert val[-1]["val_loss_global"] < val[0]["val_loss_global"]
    # DDP keeps every rank identical, so the average model is each local model.
    assert val[-1]["val_loss_local"] == pytest.approx(val[-1]["val_loss_global"], rel=1e-5)
