"""DiLoCo's outer step against hand-computed updates, and its bytes."""

import copy

import pytest
import torch

from communicators import DiLoCoCommunicator
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.strategy import DiLoCoStrategy, OptimSpec, SimpleReduceStrategy
from tests.fake_world import train_ranks
from tests.helpers import TinyNet

FROZEN = OptimSpec(torch.optim.SGD, lr=0.0)
G0 = 10.0
LOCAL = [[4.0, 6.0, 11.0], [1.0, -3.0, 2.0]]  # LOCAL[round][rank]: what each rank trained to


class ScriptedLocal(CommunicateOptimizeStrategy):
    """Parameters start at G0; before round r's sync, rank k's parameters become G + LOCAL[r][k]
    where G is the rank's current (synchronised) value. The inner optimizer is frozen."""

    def _init_node(self, model, rank, num_nodes):
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(G0)
        super()._init_node(model, rank, num_nodes)

    def step(self):
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(LOCAL[self.local_step][self.rank])
        super().step()


def run(outer: OptimSpec, rounds: int) -> list[dict]:
    return train_ranks(
        3, lambda: ScriptedLocal([DiLoCoCommunicator(H=1, outer_optim=outer)], optim_spec=FROZEN), rounds
    )


def test_outer_sgd_lr1_no_momentum_lands_on_the_average() -> None:
    out = run(OptimSpec(torch.optim.SGD, lr=1.0), rounds=1)
    mean = G0 + sum(LOCAL[0]) / 3
    for o in out:
        for p in o["params"]:
            assert torch.equal(p, torch.full_like(p, mean))


def test_nesterov_matches_the_hand_computed_update() -> None:
    lr, m = 0.7, 0.9
    out = run(OptimSpec(torch.optim.SGD, lr=lr, momentum=m, nesterov=True), rounds=2)
    g, buf = G0, 0.0
    for r in range(2):
        delta = g - sum(g + x for x in LOCAL[r]) / 3  # theta_global - mean(theta_local)
        buf = delta if r == 0 else m * buf + delta  # torch SGD: buffer starts at the first grad
        g = g - lr * (delta + m * buf)  # Nesterov look-ahead
    for o in out:
        for p in o["params"]:
            torch.testing.assert_close(p, torch.full_like(p, g), rtol=1e-6, atol=1e-6)


def test_bytes_are_ddp_bytes_once_per_h_and_ranks_end_identical() -> None:
    k, h, steps = 3, 4, 12
    sgd = OptimSpec(torch.optim.SGD, lr=0.05)
    dil = train_ranks(k, lambda: DiLoCoStrategy(H=h, optim_spec=sgd), steps)
    ddp = train_ranks(k, lambda: SimpleReduceStrategy(optim_spec=sgd), steps)
    sent = [sum(r.sent for recs in o["records"] for r in recs) for o in (dil[0], ddp[0])]
    assert sent[0] == pytest.approx(sent[1] / h)
    param_bytes = sum(p.numel() * 4 for p in TinyNet().parameters())
    assert sent[0] == pytest.approx(steps // h * 2 * (k - 1) / k * param_bytes)
    for o in dil[1:]:
        for a, b in zip(dil[0]["params"], o["params"], strict=True):
            assert torch.equal(a, b)


def test_constructor_spellings() -> None:
    s = DiLoCoStrategy(
        optim_spec=OptimSpec(torch.optim.AdamW, lr=1e-4),
        outer_optim="sgd",
        H=100,
        inner_lr=1e-4,
        outer_lr=0.7,
        nesterov=True,
    )
    mod = s.communication_modules[0]
    assert mod.outer_spec == OptimSpec(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True) and mod.H == 100
    assert s.optim_spec.lr == 1e-4
    assert DiLoCoStrategy(outer_optim="sgd_normalized").communication_modules[0].normalize
    custom = OptimSpec(torch.optim.Adam, lr=0.1)
    assert DiLoCoStrategy(outer_optim=custom).communication_modules[0].outer_spec == custom
    with pytest.raises(TypeError, match="OptimSpec"):
        DiLoCoStrategy(outer_optim=custom, outer_lr=0.5)
    with pytest.raises(TypeError, match="not both"):
        DiLoCoStrategy(lr=0.1, inner_lr=0.2)
    with pytest.raises(ValueError, match="outer_optim"):
        DiLoCoStrategy(outer_optim="adam")


def test_state_dict_round_trip() -> None:
    out = train_ranks(2, lambda: DiLoCoStrategy(H=2, optim_spec=FROZEN), 2)
    strategy = out[0]["strategy"]
    state = copy.deepcopy(strategy.state_dict())  # as a checkpoint on disk would hold it
    mod = strategy.communication_modules[0]
    saved = [g.clone() for g in mod.global_params]
    for g in mod.global_params:
        g.zero_()
    strategy.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(mod.global_params, saved, strict=True))
