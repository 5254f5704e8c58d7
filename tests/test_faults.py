"""Fault injection: dropped nodes (survivors average among themselves, the dropped node rejoins
with a survivor's state), stragglers, and what the metrics and the ledger say about them.

The references below are plain PyTorch loops written from the algorithms (DiLoCo's Algorithm 1,
data-parallel SGD), not from ExoGym's code."""

from __future__ import annotations

import copy
import csv
import os

import pytest
import torch

from exogym import Faults, Trainer
from exogym.core.comm.network import Network
from exogym.logger import CSVLogger
from exogym.runtime import checkpoint as ckpt
from exogym.runtime.faults import FaultPlan, round_steps
from exogym.strategy import (
    DeMoStrategy,
    DiLoCoStrategy,
    FedAvgStrategy,
    OptimSpec,
    SimpleReduceStrategy,
    SPARTADiLoCoStrategy,
    SPARTAStrategy,
)
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, node_batches, regression_data

K, B = 4, 8


def _diloco_reference(ds, steps: int, h: int, dropped: dict[int, list[int]]) -> list[list[torch.Tensor]]:
    """DiLoCo on K plain model copies: AdamW inner steps; every H steps the mean pseudo-gradient
    of the round's survivors drives one Nesterov SGD outer step on the global copy; a node that
    missed the round takes the global copy and the lowest survivor's inner optimizer state."""
    base = TinyNet()
    models = [TinyNet() for _ in range(K)]
    for m in models:
        m.load_state_dict(base.state_dict())
    inner = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in models]
    glob = [p.detach().clone().requires_grad_(False) for p in base.parameters()]
    outer = torch.optim.SGD(glob, lr=0.7, momentum=0.9, nesterov=True)
    data = [node_batches(ds, K, r) for r in range(K)]
    for r in range(steps // h):
        gone = dropped.get(r, [])
        alive = [n for n in range(K) if n not in gone]
        for _ in range(h):
            for n in alive:
                inner[n].zero_grad()
                models[n](next(data[n])).backward()
                inner[n].step()
        with torch.no_grad():
            for i, g in enumerate(glob):
                locals_ = [list(models[n].parameters())[i] for n in alive]
                g.grad = g - sum(locals_) / len(alive)
            outer.step()
            for m in models:
                for p, g in zip(m.parameters(), glob, strict=True):
                    p.copy_(g)
        for n in gone:
            inner[n].load_state_dict(copy.deepcopy(inner[alive[0]].state_dict()))
    return [[p.detach().clone() for p in m.parameters()] for m in models]


@pytest.mark.parametrize("workers", [None, 2], ids=["node_per_thread", "virtual_nodes"])
def test_one_node_dropped_for_one_diloco_round_survivors_match_the_reference_and_it_rejoins(workers) -> None:
    steps, h = 9, 3
    ds = regression_data(K * B * steps)
    out = train_ranks(
        K,
        lambda: DiLoCoStrategy(H=h, optim_spec=OptimSpec(torch.optim.AdamW, lr=0.01)),
        steps,
        dataset=ds,
        faults=Faults(drop={1: [2]}),
        workers=workers,
    )
    ref = _diloco_reference(ds, steps, h, {1: [2]})
    for rank in range(K):
        for a, b in zip(out[rank]["params"], ref[rank], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    for a, b in zip(out[2]["params"], out[0]["params"], strict=True):
        assert torch.equal(a, b)  # the node that rejoined holds exactly the survivors' state
    assert [o["node"].batches_drawn for o in out] == [9, 9, 6, 9]  # it trained nothing in round 1
    # ...and differs from a run where nobody dropped (the fault changed the result)
    whole = _diloco_reference(ds, steps, h, {})
    assert not torch.allclose(whole[0][0], ref[0][0])


def test_a_dropped_node_sends_nothing_and_rejoining_costs_a_broadcast_of_its_state() -> None:
    steps, h = 6, 3
    out = train_ranks(
        K,
        lambda: DiLoCoStrategy(H=h, optim_spec=OptimSpec(torch.optim.AdamW, lr=0.01)),
        steps,
        faults=Faults(drop={0: [3]}),
    )
    param_bytes = sum(p.numel() * 4 for p in TinyNet().parameters())
    n_params = len(list(TinyNet().parameters()))
    # model + DiLoCo's global copy + outer momentum + AdamW's two moments, + AdamW's step counters
    state_bytes = 5 * param_bytes + 4 * n_params

    def sent(rank: int, step: int) -> float:
        return sum(r.sent for r in out[rank]["records"][step])

    ring3 = 2 * (3 - 1) / 3 * param_bytes  # ring all-reduce among the 3 survivors
    ring4 = 2 * (4 - 1) / 4 * param_bytes
    assert [sent(r, 2) for r in range(K)] == pytest.approx([ring3 + state_bytes, ring3, ring3, 0.0])
    received = [sum(r.received for r in out[3]["records"][s]) for s in range(steps)]
    assert received == pytest.approx([0, 0, state_bytes, 0, 0, ring4])  # the rejoin, then round 1
    assert [sent(r, 5) for r in range(K)] == pytest.approx([ring4] * K)


def _ddp_reference(ds, k: int, steps: int, dropped: dict[int, list[int]]) -> list[torch.Tensor]:
    """Data-parallel SGD where a step's gradient is the mean over the nodes present at it."""
    model = TinyNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = [node_batches(ds, k, r) for r in range(k)]
    for s in range(steps):
        alive = [n for n in range(k) if n not in dropped.get(s, [])]
        grads = []
        for n in alive:
            model.zero_grad()
            model(next(data[n])).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = sum(g[i] for g in grads) / len(alive)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_ddp_with_a_node_missing_steps_averages_the_present_nodes_gradients() -> None:
    k, steps = 3, 5
    ds = regression_data(k * B * steps)
    dropped = {1: [0], 3: [2, 1]}
    out = train_ranks(
        k, lambda: SimpleReduceStrategy(optim_spec=OptimSpec(torch.optim.SGD, lr=0.05)), steps, dataset=ds,
        faults=Faults(drop=dropped),
    )  # fmt: skip
    ref = _ddp_reference(ds, k, steps, dropped)
    for rank in range(k):
        for a, b in zip(out[rank]["params"], ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "make",
    [
        lambda: FedAvgStrategy(H=2),
        lambda: SPARTAStrategy(p_sparta=0.3),
        lambda: SPARTADiLoCoStrategy(p_sparta=0.3, H=4),
        lambda: DiLoCoStrategy(H=2, island_size=2),
    ],
    ids=["fedavg", "sparta", "sparta_diloco", "diloco_islands"],
)
def test_random_dropouts_leave_every_node_with_a_survivors_state_at_each_round_end(make) -> None:
    """With nodes dropping at random, a node that missed the last round ends holding exactly the
    lowest survivor's parameters; every node trains in exactly the steps it was present for."""
    steps = 8
    faults = Faults(drop_probability=0.4, seed=3)
    out = train_ranks(K, make, steps, faults=faults)
    plan = FaultPlan(faults, K, round_steps(make()), steps, seed=0)
    events = plan.events()
    assert events, "the draw should drop someone in 8 steps"
    last = events[-1]
    assert last["steps"][1] == steps - 1  # seed 3 drops someone in the final round (rounds of 1, 2, 4)
    for n in last["dropped"]:  # rejoined at the end with the lowest survivor's state
        for a, b in zip(out[n]["params"], out[last["participants"][0]]["params"], strict=True):
            assert torch.equal(a, b)
    missed = {n: sum(e["steps"][1] - e["steps"][0] + 1 for e in events if n in e["dropped"]) for n in range(K)}
    drawn = [o["node"].batches_drawn for o in out]
    assert drawn == [steps - missed[n] for n in range(K)]


def test_nodes_alive_and_the_rounds_participants_are_reported() -> None:
    steps = 6
    faults = Faults(drop={1: [3], 2: [0, 1]})
    out = train_ranks(K, lambda: FedAvgStrategy(H=2), steps, faults=faults)
    rows = [r for r in out[0]["node"].history if "train_loss" in r]
    assert [r["nodes_alive"] for r in rows] == [4, 4, 3, 3, 2, 2]
    assert [r["examples"] for r in rows] == [32, 64, 88, 112, 128, 144]  # only present nodes train
    plan = FaultPlan(faults, K, 2, steps, seed=0)
    assert plan.events() == [
        {"round": 1, "steps": (2, 3), "dropped": [3], "participants": [0, 1, 2]},
        {"round": 2, "steps": (4, 5), "dropped": [0, 1], "participants": [2, 3]},
    ]


def test_dropout_draws_are_shared_seeded_and_always_leave_a_survivor() -> None:
    plan = FaultPlan(Faults(drop_probability=0.9), num_nodes=5, round_steps=1, max_steps=200, seed=7)
    again = FaultPlan(Faults(drop_probability=0.9), num_nodes=5, round_steps=1, max_steps=200, seed=7)
    other = FaultPlan(Faults(drop_probability=0.9, seed=8), num_nodes=5, round_steps=1, max_steps=200, seed=7)
    rounds = [plan.dropped(r) for r in range(200)]
    assert rounds == [again.dropped(r) for r in range(200)]
    assert rounds != [other.dropped(r) for r in range(200)]
    assert all(len(d) <= 4 for d in rounds)
    assert max(len(d) for d in rounds) == 4  # p=0.9: some round drew everyone, one survived
    share = sum(len(d) for d in rounds) / (5 * 200)
    # E[min(X, 4)] / 5 for X ~ Binomial(5, 0.9): (4.5 - 0.9**5) / 5 = 0.782
    assert share == pytest.approx((4.5 - 0.9**5) / 5, abs=0.04)


def _bimodal() -> torch.distributions.Distribution:
    """A factor of 1 or 3 with equal odds."""
    return torch.distributions.TransformedDistribution(
        torch.distributions.Bernoulli(0.5), [torch.distributions.AffineTransform(1.0, 2.0)]
    )


def _compute_per_step(faults: Faults) -> list[float]:
    out = train_ranks(2, SimpleReduceStrategy, 12, network=Network(1e9, 1e-3, compute=0.01), faults=faults)
    rows = [r for r in out[0]["node"].history if "train_loss" in r]
    times = [r["compute_time"] for r in rows]
    return [round(b - a, 9) for a, b in zip([0.0, *times], times, strict=False)]


def test_straggler_slowdowns_vary_per_step_and_simulated_time_takes_the_slowest_node() -> None:
    per_step = _compute_per_step(Faults(slowdown=_bimodal(), seed=1))
    assert set(per_step) == {0.01, 0.03}  # each step: the slower of the two nodes' draws
    assert per_step.count(0.03) > per_step.count(0.01)  # P(some node draws 3) = 3/4
    assert _compute_per_step(Faults(slowdown=_bimodal(), seed=1)) == per_step
    assert _compute_per_step(Faults(slowdown=_bimodal(), seed=2)) != per_step
    assert set(_compute_per_step(Faults())) == {0.01}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"faults": "drop"}, TypeError, r"faults must be an exogym.Faults"),
        ({"faults": Faults(drop={5: [1]})}, ValueError, r"drop=\{5: \[1\]\}\): the run has 4 round\(s\) of 2 step"),
        ({"faults": Faults(drop={1: [4]})}, ValueError, r"names node\(s\) \[4\], but num_nodes=4"),
        ({"faults": Faults(drop={1: [0, 1, 2, 3]})}, ValueError, "drops every node of round 1: at least one"),
        ({"strategy": DeMoStrategy()}, ValueError, r"cannot leave a node out of a round \(DCT"),
    ],
)
def test_bad_faults_are_refused_before_the_run_starts(kwargs, error, match) -> None:
    args = {"strategy": FedAvgStrategy(H=2), "faults": Faults(drop={1: [2]}), **kwargs}
    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(error, match=match):
        trainer.fit(num_nodes=4, max_steps=8, batch_size=8, logger=False, progress=False, **args)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"drop": [1, 2]}, r"must be a mapping \{round: nodes\}"),
        ({"drop": {-1: [0]}}, "keys are rounds"),
        ({"drop": {1: ["a"]}}, "must name nodes as ints"),
        ({"drop_probability": 1.0}, r"must be in \[0, 1\)"),
        ({"slowdown": 2.0}, "must be a torch.distributions.Distribution"),
        ({"slowdown": torch.distributions.Normal(torch.ones(2), 1.0)}, "must draw scalars"),
    ],
)
def test_faults_arguments_are_checked_when_made(kwargs, match) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        Faults(**kwargs)


def test_a_slowdown_that_draws_a_non_positive_factor_names_the_node_and_step() -> None:
    plan = FaultPlan(Faults(slowdown=torch.distributions.Normal(0.0, 1.0)), 2, 1, 10, seed=0)
    with pytest.raises(ValueError, match=r"drew -?[0-9.e-]+ for node \d at step \d+: factors must be finite and > 0"):
        for step in range(10):
            plan.slowdown(0, step)


@pytest.mark.procs
@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", ["shm", "gloo"])
def test_fit_with_a_node_dropped_ends_with_every_node_identical(transport: str, tmp_path) -> None:
    trainer = Trainer(TinyNet(), regression_data(512))
    model = trainer.fit(
        DiLoCoStrategy(H=2),
        num_nodes=K,
        max_steps=6,
        batch_size=8,
        transport=transport,
        logger=CSVLogger(str(tmp_path / "logs")),
        run_name="faults",
        progress=False,
        val_size=0,
        log_interval=1,
        faults=Faults(drop={1: [3]}),
        checkpoint_dir=str(tmp_path / "ckpt"),  # every node's final state, to compare them
    )
    folder = ckpt.resolve(str(tmp_path / "ckpt"))
    states = [torch.load(os.path.join(folder, f"node-{r:05d}.pt"), weights_only=False)["model"] for r in range(K)]
    for state in states[1:]:
        assert all(torch.equal(state[k], states[0][k]) for k in state)
    assert all(torch.equal(p, states[0][n]) for n, p in model.state_dict().items())
    assert [r["nodes_alive"] for r in trainer.history if "train_loss" in r] == [4, 4, 3, 3, 4, 4]
    assert trainer.result["faults"] == [{"round": 1, "steps": (2, 3), "dropped": [3], "participants": [0, 1, 2]}]
    with open(tmp_path / "logs" / "faults" / "latest" / "metrics.csv") as f:
        assert [r["nodes_alive"] for r in csv.DictReader(f) if r["train_loss"]] == ["4", "4", "3", "3", "4", "4"]
