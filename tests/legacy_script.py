"""A training script in the original exo gym's style (exo-explore/gym): its import paths, its
keywords, its positional ``fit(num_epochs, strategy, num_nodes)`` and its README's custom
strategy. Must run unchanged.

Usage: python tests/legacy_script.py SAVE_DIR"""

import sys
from typing import Literal

import torch
import torch.distributed as dist

from exogym.strategy.communicate import all_reduce
from exogym.strategy.communicate_optimize_strategy import CommunicateOptimizeStrategy, CommunicationModule
from exogym.strategy.diloco import DiLoCoStrategy
from exogym.strategy.optim import OptimSpec
from exogym.strategy.sparta import SPARTAStrategy
from exogym.strategy.sparta_diloco import SPARTADiLoCoStrategy
from exogym.strategy.strategy import SimpleReduceStrategy, Strategy
from exogym.trainer import LocalTrainer
from tests.helpers import TinyNet, regression_data


class AverageEveryStep(CommunicationModule):
    """A module written against the original CommunicationModule API."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    def _init_node(self, model, rank, num_nodes):
        self.num_nodes = num_nodes

    def communicate(self, model, rank, num_nodes, local_step):
        for param in model.parameters():
            all_reduce(param.data, op=dist.ReduceOp.SUM)
            param.data /= num_nodes
        self.calls += 1


class QuantizationStrategy(Strategy):
    """The "Custom Algorithms" example of the original exo gym's README, as printed there."""

    def __init__(self, optim_spec, quantization_level: Literal["int8"]):
        super().__init__()
        self.optim_spec = optim_spec
        self.scale = 0.024
        self.zero_point = 0
        self.qdtype = torch.uint8

    def step(self):
        for param in self.model.parameters():
            if param.grad is not None:
                quantized = torch.round(param.grad / self.scale + self.zero_point).clamp(0, 255).to(self.qdtype)

                q_wide = quantized.to(torch.int32)
                all_reduce(q_wide)

                param.grad = (q_wide.to(torch.float32) * self.scale) / self.num_nodes

        self.optim.step()
        super().step()


class AllReduceStrategy(Strategy):
    """A strategy written as the original's own: it builds its optimizer over the model."""

    def __init__(self, optim_spec, **kwargs):
        super().__init__(**kwargs)
        self.optim_spec = optim_spec

    def _init_node(self, model, rank, num_nodes):
        super()._init_node(model, rank, num_nodes)
        self.optim = self.optim_spec.build(model)
        self._setup_scheduler()

    def step(self):
        for param in self.model.parameters():
            if param.grad is not None:
                all_reduce(param.grad)
                param.grad.div_(self.num_nodes)
        self.optim.step()
        super().step()


if __name__ == "__main__":
    save_dir = sys.argv[1]
    trainer = LocalTrainer(TinyNet(), regression_data(512), regression_data(64, seed=1), start_port=12355)
    strategies = [
        SimpleReduceStrategy(optim_spec=OptimSpec(torch.optim.AdamW, lr=1e-3), max_norm=1.0),
        DiLoCoStrategy(optim_spec=OptimSpec(torch.optim.AdamW, lr=1e-3), outer_optim_spec="sgd", H=4),
        SPARTAStrategy(p_sparta=0.1, async_sparta_delay=1),
        SPARTADiLoCoStrategy(
            inner_optim_spec=OptimSpec(torch.optim.AdamW, lr=1e-3),
            outer_optim_spec=OptimSpec(torch.optim.SGD, lr=0.7, nesterov=True, momentum=0.9),
            p_sparta=0.05,
            sparta_interval=2,
            H=4,
        ),
        CommunicateOptimizeStrategy(communication_modules=[AverageEveryStep()], optim_spec="adamw", max_norm=1.0),
        QuantizationStrategy(OptimSpec(torch.optim.SGD, lr=0.05), "int8"),
        AllReduceStrategy(OptimSpec(torch.optim.AdamW, lr=1e-3)),
    ]
    for strategy in strategies:
        model = trainer.fit(
            1,  # num_epochs, strategy, num_nodes: the original's positional order
            strategy,
            2,
            max_steps=8,
            batch_size=16,
            minibatch_size=8,
            shuffle=True,
            val_size=32,
            val_interval=4,
            checkpoint_interval=4,
            correlation_interval=4,
            save_dir=save_dir,
            dataloader_kwargs={"num_workers": 0, "pin_memory": False},
        )
        rows = [r for r in trainer.history if "model_correlation" in r]
        print(f"{type(strategy).__name__} ok: {len(rows)} correlation rows, final {rows[-1]['model_correlation']:.6f}")
