"""A training script the torchrun tests launch: ``torchrun ... tests/torchrun_script.py
STRATEGY NUM_NODES OUT [fail|mismatch|unseeded]``. Every rank saves the model ``fit`` returned to
``OUT.<RANK>`` (STRATEGY ``presets``: each of ``PRESETS`` in turn, to ``OUT.<PRESET>.<RANK>``;
``async``: each of ``ASYNC``, likewise);
rank 0 also saves ``trainer.history``, the launcher and the worker count to ``OUT.history``."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from exogym import Network, Trainer  # noqa: E402
from exogym.strategy import DiLoCoStrategy, SimpleReduceStrategy  # noqa: E402
from exogym.strategy.registry import build  # noqa: E402
from tests.helpers import FailOnRank, TinyNet, regression_data  # noqa: E402

STEPS, BATCH = 8, 8


#: The 2024-2026 presets, run one after another by the ``presets`` variant.
PRESETS = ("sparseloco", "muloco", "eager_diloco", "noloco", "desloc", "powersgd", "topk_ef")
#: The asynchronous presets, run one after another by the ``async`` variant on ``ASYNC_NETWORK``.
ASYNC = ("async_diloco", "fedbuff")
#: Modelled compute (their timeline needs it), unequal speeds, 1 ms each way.
ASYNC_NETWORK = Network(1e9, 1e-3, compute=0.01, compute_slowdown=(1.0, 0.5, 1.0, 0.25))


def make_strategy(name: str):
    if name == "ddp":
        return SimpleReduceStrategy()
    if name == "diloco":
        return DiLoCoStrategy(H=3)
    return build(name, 1e-3, 3)


def fit(name: str, num_nodes: int, model: torch.nn.Module | None = None, **kw) -> tuple[torch.nn.Module, Trainer]:
    trainer = Trainer(model or TinyNet(), regression_data(256))
    args = {"max_steps": STEPS, "batch_size": BATCH, "logger": False, "progress": False, "val_size": 0, **kw}
    return trainer.fit(make_strategy(name), num_nodes=num_nodes, **args), trainer


if __name__ == "__main__":
    name, nodes, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    variant = sys.argv[4] if len(sys.argv) > 4 else ""
    rank = int(os.environ["RANK"])
    if variant == "fail":
        fit(name, nodes, FailOnRank(fail_rank=1, fail_call=3), max_steps=200)
    elif variant == "mismatch":
        fit(name, nodes + rank)  # rank 1 asks for one node more
    elif name == "async":  # the asynchronous presets, 4 nodes on the ranks: OUT.<preset>.<rank>
        for preset in ASYNC:
            model, _ = fit(preset, nodes, network=ASYNC_NETWORK)
            torch.save([p.detach() for p in model.parameters()], f"{out}.{preset}.{rank}")
    elif name == "presets":  # every 2024-2026 preset in one launch: OUT.<preset>.<rank>
        for preset in PRESETS:
            model, _ = fit(preset, nodes)
            torch.save([p.detach() for p in model.parameters()], f"{out}.{preset}.{rank}")
    elif variant == "unseeded":  # every rank builds a different initial model
        model, _ = fit(name, nodes, TinyNet(seed=rank))
        torch.save([p.detach() for p in model.parameters()], f"{out}.{rank}")
    else:
        model, trainer = fit(name, nodes)
        torch.save([p.detach() for p in model.parameters()], f"{out}.{rank}")
        if rank == 0:
            cfg = trainer.result["config"]
            torch.save({"history": trainer.history, "launcher": cfg.launcher, "workers": cfg.workers}, f"{out}.history")
