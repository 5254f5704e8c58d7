"""DES-LOC against a plain-PyTorch reference written from the paper's update rule (Iacob et al.
2025, arXiv 2505.22549): local Adam, parameters averaged every Kx steps, the first moment every
Ku and the second every Kv; its bytes (no moment is averaged after the run's last step, where
nothing reads it), dropped nodes, and the optimizer-state access it uses."""

from __future__ import annotations

import math

import pytest
import torch

from communicators import AveragingCommunicator, OptimizerStateAveraging
from exogym.faults_config import Faults
from exogym.strategy import CommunicateOptimizeStrategy, DESLOCStrategy, OptimSpec
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, node_batches, regression_data

STEPS = 12
LR, B1, B2, EPS = 0.01, 0.9, 0.999, 1e-8
ADAM = OptimSpec(torch.optim.Adam, lr=LR)


def desloc_reference(
    ds, k: int, steps: int, kx: int, ku: int, kv: int, dropped: dict[int, list[int]] | None = None
) -> list[list[torch.Tensor]]:
    """K model copies, each with its own Adam written out (bias-corrected): m = B1 m + (1-B1) g,
    v = B2 v + (1-B2) g^2, p -= LR * (m / (1-B1^t)) / (sqrt(v / (1-B2^t)) + EPS). After step s
    (0-based) the parameters are replaced by their mean over the nodes when (s+1) % Kx == 0, m
    when (s+1) % Ku == 0, v when (s+1) % Kv == 0 (the paper averages before steps t with t % K ==
    0). ``dropped[r]``: nodes that sit round r (steps r*Kv .. r*Kv+Kv-1) out: no batches, left out
    of every mean, and at the round's end they take the lowest survivor's parameters and Adam
    state (its step count included)."""
    dropped = dropped or {}
    models = [TinyNet() for _ in range(k)]
    data = [node_batches(ds, k, r) for r in range(k)]
    params = [list(m.parameters()) for m in models]
    m = [[torch.zeros_like(p) for p in ps] for ps in params]
    v = [[torch.zeros_like(p) for p in ps] for ps in params]
    t = [0] * k

    def average(state: list[list[torch.Tensor]], alive: list[int]) -> None:
        for i in range(len(state[0])):
            mean = sum(state[r][i] for r in alive) / len(alive)
            for r in alive:
                state[r][i].copy_(mean)

    for s in range(steps):
        gone = dropped.get(s // kv, [])
        alive = [r for r in range(k) if r not in gone]
        for r in alive:
            models[r].zero_grad()
            models[r](next(data[r])).backward()
            t[r] += 1
            with torch.no_grad():
                for p, m_, v_ in zip(params[r], m[r], v[r], strict=True):
                    m_.mul_(B1).add_((1 - B1) * p.grad)
                    v_.mul_(B2).add_((1 - B2) * p.grad * p.grad)
                    m_hat, v_hat = m_ / (1 - B1 ** t[r]), v_ / (1 - B2 ** t[r])
                    p.sub_(LR * m_hat / (v_hat.sqrt() + EPS))
        with torch.no_grad():
            for period, state in ((kx, [[p.data for p in ps] for ps in params]), (ku, m), (kv, v)):
                if (s + 1) % period == 0:
                    average(state, alive)
            if (s + 1) % kv == 0:
                for r in gone:
                    for src, dst in ((params, params), (m, m), (v, v)):
                        for a, b in zip(src[alive[0]], dst[r], strict=True):
                            b.data.copy_(a.data)
                    t[r] = t[alive[0]]
    return [[p.detach().clone() for p in ps] for ps in params]


def _run(k: int, kx: int, ku: int, kv: int, ds, **kw) -> list[dict]:
    return train_ranks(k, lambda: DESLOCStrategy(Kx=kx, Ku=ku, Kv=kv, optim_spec=ADAM), STEPS, dataset=ds, **kw)


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize(("kx", "ku", "kv"), [(2, 3, 6), (1, 3, 6), (4, 4, 4)], ids=["2-3-6", "1-3-6", "local_adam"])
def test_desloc_matches_the_reference_on_every_node(k: int, kx: int, ku: int, kv: int) -> None:
    ds = regression_data(k * 8 * STEPS)
    out = _run(k, kx, ku, kv, ds)
    ref = desloc_reference(ds, k, STEPS, kx, ku, kv)
    for r in range(k):
        for a, b in zip(out[r]["params"], ref[r], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_moments_averaged_on_their_own_periods_differ_from_local_adam_s() -> None:
    ds = regression_data(4 * 8 * STEPS)
    desloc, local_adam = desloc_reference(ds, 4, STEPS, 2, 3, 6), desloc_reference(ds, 4, STEPS, 2, 2, 2)
    assert not torch.allclose(desloc[0][0], local_adam[0][0])


def test_with_a_node_dropped_the_survivors_average_among_themselves_and_it_rejoins() -> None:
    k, dropped = 4, {0: [1], 1: [0, 3]}  # rounds of Kv = 6 steps
    ds = regression_data(k * 8 * STEPS)
    out = _run(k, 2, 3, 6, ds, faults=Faults(drop=dropped))
    ref = desloc_reference(ds, k, STEPS, 2, 3, 6, dropped=dropped)
    for r in range(k):
        for a, b in zip(out[r]["params"], ref[r], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ref[0][0], desloc_reference(ds, k, STEPS, 2, 3, 6)[0][0])


def rounds(steps: int, kx: int, ku: int, kv: int) -> int:
    """All-reduces of a run of ``steps`` steps: the parameters after every step ``s`` with
    ``(s + 1) % Kx == 0``, the last step included; each moment likewise on its period, but not
    after the last step (``s < steps - 1``): ``steps // Kx + (steps - 1) // Ku + (steps - 1) // Kv``."""
    return steps // kx + (steps - 1) // ku + (steps - 1) // kv


@pytest.mark.parametrize("k", [2, 4])
def test_bytes_are_the_sum_of_the_three_periods_all_reduces_without_the_moments_after_the_last_step(k: int) -> None:
    kx, ku, kv = 2, 3, 6
    out = _run(k, kx, ku, kv, regression_data(k * 8 * STEPS))
    param_bytes = sum(4 * p.numel() for p in TinyNet().parameters())  # each moment has the same bytes
    assert rounds(STEPS, kx, ku, kv) == 6 + 3 + 1  # 12 steps: the moments' 4th and 2nd averages would follow step 11
    rounds_ = rounds(STEPS, kx, ku, kv)
    ring = 2 * (k - 1) / k
    for o in out:
        records = [r for step in o["records"] for r in step]
        assert {(r.kind, r.group_size, r.payload) for r in records} == {("all_reduce", k, param_bytes)}
        assert sorted({r.tag for r in records}) == ["average_exp_avg", "average_exp_avg_sq", "average_params"]
        assert sum(r.sent for r in records) == pytest.approx(ring * param_bytes * rounds_)
    after_step_5 = [r.tag for r in out[0]["records"][5]]  # 6 is a multiple of all three periods
    assert after_step_5 == ["average_params", "average_exp_avg", "average_exp_avg_sq"]
    assert [r.tag for r in out[0]["records"][STEPS - 1]] == ["average_params"]  # so is 12, the last


def test_the_last_step_averages_the_parameters_and_no_moment_and_every_node_ends_as_the_reference_s() -> None:
    """Local Adam (Kx = Ku = Kv = 4) over 12 steps: after the last step only the parameters
    are averaged (every node ends with the same ones, the reference's, whose moments are averaged
    there too: nothing reads them after, so the parameters are the same); after steps 3 and 7 all
    three are."""
    k, ds = 2, regression_data(2 * 8 * STEPS)
    out = _run(k, 4, 4, 4, ds)
    ref = desloc_reference(ds, k, STEPS, 4, 4, 4)
    tags = [[r.tag for r in step] for step in out[0]["records"]]
    both = ["average_params", "average_exp_avg", "average_exp_avg_sq"]
    assert [t for t in tags if t] == [both, both, ["average_params"]] and tags[STEPS - 1] == ["average_params"]
    for r in range(k):
        for a, b, c in zip(out[r]["params"], ref[r], out[0]["params"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            assert torch.equal(a, c)
    moments = [o["strategy"].optim.state[o["strategy"].model.fc1.weight]["exp_avg"] for o in out]
    assert not torch.equal(*moments)  # the last moments stay each node's own


def test_virtual_nodes_end_as_nodes_on_their_own_threads() -> None:
    ds = regression_data(4 * 8 * STEPS)
    alone, virtual = _run(4, 2, 3, 6, ds), _run(4, 2, 3, 6, ds, workers=2)
    for a, b in zip(alone, virtual, strict=True):
        for p, q in zip(a["params"], b["params"], strict=True):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_the_pipeline_lists_the_three_modules_with_the_paper_s_default_periods() -> None:
    s = DESLOCStrategy(Kx=16)
    assert (s.Kx, s.Ku, s.Kv) == (16, 48, 96)
    assert s.pipeline.describe() == (
        "Averaging(params, H=16) -> AverageOptimizerState(exp_avg, H=48) -> AverageOptimizerState(exp_avg_sq, H=96)"
    )
    with pytest.raises(ValueError, match=r"Ku \(steps between averages\) must be a positive int, got 0"):
        DESLOCStrategy(Kx=2, Ku=0)


def test_an_optimizer_without_the_state_fails_naming_the_state_it_holds() -> None:
    sgd = OptimSpec(torch.optim.SGD, lr=0.05, momentum=0.9)
    make = lambda: CommunicateOptimizeStrategy([OptimizerStateAveraging("exp_avg", H=2)], sgd)  # noqa: E731
    with pytest.raises(
        ValueError, match=r"SGD holds no state 'exp_avg' for a parameter \(its state tensors: momentum_buf"
    ):
        train_ranks(2, make, 4)  # its first round, after step 1 (not the last)


def test_optimizer_state_gives_the_optimizer_s_own_tensors_in_parameter_order() -> None:
    out = train_ranks(2, lambda: CommunicateOptimizeStrategy([AveragingCommunicator(H=2)], ADAM), 2)
    strategy = out[0]["strategy"]
    ctx = strategy.pipeline.ctx
    params = [p for p in strategy.model.parameters()]
    moments = ctx.optimizer_state("exp_avg")
    assert [m.shape for m in moments] == [p.shape for p in params]
    assert all(m is strategy.optim.state[p]["exp_avg"] for m, p in zip(moments, params, strict=True))
    assert math.isclose(float(ctx.optimizer_state("step")[0]), 2.0)
