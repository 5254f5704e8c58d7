"""The pipeline's DDP equivalences in real node processes, on every transport."""

import pytest
import torch

from communicators import AveragingCommunicator, DiLoCoCommunicator, SparseCommunicator
from exogym import Trainer
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.strategy import OptimSpec
from tests.helpers import FIT_DEFAULTS, SaveParams, TinyNet, load_rank_params, regression_data

pytestmark = [pytest.mark.procs, pytest.mark.timeout(120)]
SGD = OptimSpec(torch.optim.SGD, lr=0.05)
MODULES = {
    "ddp": lambda: AveragingCommunicator(target="grads"),
    "fedavg_h1": lambda: AveragingCommunicator(H=1),
    "diloco_h1": lambda: DiLoCoCommunicator(H=1, outer_optim=OptimSpec(torch.optim.SGD, lr=1.0)),
    "sparta_p1": lambda: SparseCommunicator(1.0),
}


@pytest.mark.parametrize("transport", ["shm", "gloo"])
def test_fedavg_diloco_sparta_equal_ddp_in_processes(tmp_path, transport: str) -> None:
    ds = regression_data(n=2 * 8 * 6)
    finals = {}
    for name, make in MODULES.items():
        folder = tmp_path / name
        folder.mkdir()
        strategy = CommunicateOptimizeStrategy([make(), SaveParams(str(folder))], SGD)
        finals[name] = Trainer(TinyNet(), ds).fit(
            strategy, 2, max_steps=6, batch_size=8, transport=transport, **FIT_DEFAULTS
        )
        a, b = load_rank_params(str(folder), 2)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), f"{name}: ranks differ"
    for name in ("fedavg_h1", "diloco_h1", "sparta_p1"):
        for p, q in zip(finals["ddp"].parameters(), finals[name].parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
