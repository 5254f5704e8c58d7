"""The pipeline protocol: order of hooks, user modules, nesting and state."""

import copy
from typing import ClassVar

import pytest
import torch

from communicators import AveragingCommunicator, Communicator, Pipeline, SparseCommunicator
from exogym.strategy import CommunicateOptimizeStrategy, OptimSpec
from tests.fake_world import train_ranks

SGD = OptimSpec(torch.optim.SGD, lr=0.05)


class SignAverage(Communicator):
    """A user module in a few lines: every H steps, replace each gradient by the sign of the
    nodes' mean gradient (signSGD with majority vote, Bernstein et al. 2018)."""

    space: ClassVar[str] = "grad"

    def _init_node(self, ctx):
        super()._init_node(ctx)
        self.rounds = 0

    def communicate(self, step):
        for p in self.ctx.model.parameters():
            self.ctx.comm.all_reduce(p.grad, op="mean", tag="sign_average")
            p.grad.sign_()
        self.rounds += 1

    def state_dict(self):
        return {"rounds": self.rounds}

    def load_state_dict(self, state):
        self.rounds = state["rounds"]


def test_a_user_module_plugs_in_like_a_builtin() -> None:
    out = train_ranks(2, lambda: CommunicateOptimizeStrategy([SignAverage(H=2)], optim_spec=SGD), 6)
    strat = out[0]["strategy"]
    assert strat.communication_modules[0].rounds == 3
    assert [len(r) for r in out[0]["records"]] == [0, 4, 0, 4, 0, 4]  # one all-reduce per tensor
    state = copy.deepcopy(strat.state_dict())
    strat.communication_modules[0].rounds = 0
    strat.load_state_dict(state)
    assert strat.communication_modules[0].rounds == 3


class Recorder(Communicator):
    """Appends (name, hook) to a shared log."""

    def __init__(self, name, space, log):
        super().__init__()
        self.name, self.log = name, log
        self.space = space

    def communicate(self, step):
        self.log.append(self.name)


def test_grad_modules_run_before_and_param_modules_after_the_optimizer() -> None:
    log: list[str] = []

    class Logged(CommunicateOptimizeStrategy):
        def _init_node(self, model, rank, num_nodes):
            super()._init_node(model, rank, num_nodes)
            step, node_log = self.optim.step, self.log
            self.optim.step = lambda *a, **k: (node_log.append("optim"), step(*a, **k))[1]

    def make() -> Logged:
        # The node trains its own copy of the strategy: the log travels with it.
        mods = [
            Recorder("p1", "param", log),
            Recorder("g1", "grad", log),
            Pipeline([Recorder("p2", "param", log), Recorder("g2", "grad", log)]),
        ]
        strategy = Logged(mods, optim_spec=SGD)
        strategy.log = log
        return strategy

    out = train_ranks(1, make, 1)
    assert out[0]["strategy"].log == ["g1", "g2", "optim", "p1", "p2"]


def test_pipeline_state_and_description() -> None:
    s = CommunicateOptimizeStrategy([SparseCommunicator(0.1, "topk"), AveragingCommunicator(H=4)], optim_spec=SGD)
    assert s.config()["pipeline"] == "Sparse(p=0.1, topk, H=1) -> Averaging(params, H=4)"
    with pytest.raises(TypeError, match="Communicator instances"):
        CommunicateOptimizeStrategy([lambda: None])
    with pytest.raises(ValueError, match="H must be a positive int"):
        AveragingCommunicator(H=0)
