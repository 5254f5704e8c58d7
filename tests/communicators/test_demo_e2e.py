"""DeMo in real node processes on the built-in task."""

import pytest
import torch

from exogym.strategy import DeMoStrategy, OptimSpec

pytestmark = pytest.mark.procs


@pytest.mark.timeout(120)
def test_four_node_demo_trains_on_the_builtin_task() -> None:
    from exogym import Trainer
    from exogym.tasks import MLPClassifier, digits_datasets

    train, val = digits_datasets()
    trainer = Trainer(MLPClassifier(), train, val)
    trainer.fit(
        DeMoStrategy(OptimSpec(torch.optim.SGD, lr=3e-3)),
        num_nodes=4,
        max_steps=60,
        batch_size=16,
        val_size=len(val),
        val_interval=20,
        logger=False,
        progress=False,
    )
    val_loss = [r["val_loss_global"] for r in trainer.history if "val_loss_global" in r]
    assert val_loss[-1] < 0.7 * val_loss[0], val_loss
