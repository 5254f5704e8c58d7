"""Robust aggregation and adversaries inside the averaging modules: what the rule receives, what
the nodes end with, what the ledger charges, and that the mean without adversaries is the
all-reduce it always was."""

from __future__ import annotations

import functools

import pytest
import torch

from communicators.aggregation import median
from exogym.adversaries import Adversaries
from exogym.core.optim import OptimSpec
from exogym.strategy.diloco import DiLoCoStrategy
from exogym.strategy.federated_averaging import FedAvgStrategy
from tests.fake_world import train_ranks

K, H = 4, 3
SGD = OptimSpec(torch.optim.SGD, lr=0.05)
OUTER = OptimSpec(torch.optim.SGD, lr=1.0)  # the outer step subtracts the aggregate as it is


def recording(calls: list[torch.Tensor]):
    """A rule that records the rows it is given (one call per rank and round) and returns their
    mean."""

    def rule(updates: torch.Tensor) -> torch.Tensor:
        calls.append(updates.clone())
        return updates.mean(0)

    return rule


def diloco(aggregate) -> DiLoCoStrategy:
    return DiLoCoStrategy(H=H, outer_optim=OUTER, optim_spec=SGD, aggregate=aggregate)


def first_sync_rows(adversaries: Adversaries | None = None) -> torch.Tensor:
    """The rows the rule receives at DiLoCo's first outer step (every rank receives the same)."""
    calls: list[torch.Tensor] = []
    train_ranks(K, lambda: diloco(recording(calls)), H, adversaries=adversaries)
    assert len(calls) == K  # one call per rank (one dtype bucket), all on the same rows
    for c in calls[1:]:
        torch.testing.assert_close(c, calls[0], rtol=0, atol=0)
    return calls[0]


def reference_median(rows: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median, the mean of the two middle values for an even count (Yin et al.)."""
    ordered, _ = torch.sort(rows, dim=0)
    n = rows.shape[0]
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def test_the_rule_receives_each_node_s_pseudo_gradient_and_the_outer_step_applies_the_median() -> None:
    rows = first_sync_rows()
    assert rows.shape[0] == K and rows.abs().sum(1).min() > 0  # every node trained: no zero row
    out = train_ranks(K, lambda: diloco("median"), H)
    base = train_ranks(K, lambda: diloco("mean"), H)
    # theta_after = theta_global - aggregate; theta_global is the start, the same for both runs
    mean_delta = rows.mean(0)
    med_delta = reference_median(rows)
    flat_mean = torch.cat([p.flatten() for p in base[0]["params"]])
    flat_med = torch.cat([p.flatten() for p in out[0]["params"]])
    torch.testing.assert_close(flat_med - flat_mean, mean_delta - med_delta, rtol=1e-5, atol=1e-6)
    for r in out[1:]:  # every node ends with the same parameters
        for a, b in zip(r["params"], out[0]["params"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_robust_rule_is_charged_as_an_all_gather_and_the_mean_as_an_all_reduce() -> None:
    def kinds(aggregate) -> list[tuple[str, int]]:
        out = train_ranks(K, lambda: diloco(aggregate), H)
        return [(r.kind, r.payload) for step in out[0]["records"] for r in step if r.tag == "diloco_pseudo_grad"]

    n = sum(p.numel() for p in train_ranks(1, lambda: diloco("mean"), 1)[0]["params"])
    assert kinds("mean") == [("all_reduce", 4 * n)]
    assert kinds("median") == [("all_gather", 4 * n)]
    assert kinds(functools.partial(median)) == [("all_gather", 4 * n)]


def test_without_adversaries_the_mean_is_one_all_reduce_and_the_gathered_mean_agrees_with_it() -> None:
    plain = train_ranks(K, lambda: diloco("mean"), 2 * H)
    gathered = train_ranks(K, lambda: diloco(lambda u: u.mean(0)), 2 * H)
    for a, b in zip(plain[0]["params"], gathered[0]["params"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert all(r.kind == "all_reduce" for step in plain[0]["records"] for r in step)


@pytest.mark.parametrize("attack", ["sign_flip", "ipm", "free_rider"])
def test_the_malicious_nodes_rows_are_replaced_by_the_attack_before_the_rule(attack: str) -> None:
    adversaries = Adversaries(attack, fraction=0.25)
    bad = adversaries.malicious(K, seed=0)
    assert len(bad) == 1
    honest, attacked = first_sync_rows(), first_sync_rows(adversaries)
    good = [r for r in range(K) if r not in bad]
    torch.testing.assert_close(attacked[good], honest[good], rtol=0, atol=0)  # before the attack: as honest
    expected = {
        "sign_flip": -honest[list(bad)],
        "ipm": -0.5 * honest[good].mean(0, keepdim=True),
        "free_rider": torch.zeros_like(honest[list(bad)]),
    }[attack]
    torch.testing.assert_close(attacked[list(bad)], expected, rtol=1e-6, atol=1e-7)


def test_an_attack_acts_from_its_start_step_and_not_before() -> None:
    late = Adversaries("sign_flip", fraction=0.25, start=H)  # the first sync is at step H - 1
    torch.testing.assert_close(first_sync_rows(late), first_sync_rows(), rtol=0, atol=0)


def test_fedavg_with_a_robust_rule_averages_models_by_it() -> None:
    med = train_ranks(K, lambda: FedAvgStrategy(H=H, optim_spec=SGD, aggregate="median"), H)
    local = train_ranks(K, lambda: FedAvgStrategy(H=H, optim_spec=SGD, aggregate=lambda u: u[0]), H)
    assert all(r.kind == "all_gather" for step in med[0]["records"] for r in step)
    # the "first row" rule returns rank 0's model: every node ends with rank 0's local model
    for r in local:
        for a, b in zip(r["params"], local[0]["params"], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_label_flip_poisons_the_labels_of_a_malicious_node_s_batches() -> None:
    plan = Adversaries("label_flip", fraction=0.5, num_classes=10).plan(4, seed=3)
    x, y = torch.zeros(3, 2), torch.tensor([0, 4, 9])
    assert plan.flips_labels(plan.malicious[0], step=0)
    honest = next(r for r in range(4) if r not in plan.malicious)
    assert not plan.flips_labels(honest, step=0)
    _, flipped = plan.poison((x, y))
    assert flipped.tolist() == [9, 5, 0]
    assert plan.poison({"input": x, "labels": y})["labels"].tolist() == [9, 5, 0]
    with pytest.raises(TypeError, match="integer labels"):
        plan.poison((x, torch.zeros(3)))


def test_an_unknown_rule_is_refused_naming_aggregate_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"aggregate='avg'.*choose from \['centered_clip'"):
        DiLoCoStrategy(H=2, aggregate="avg")


def _server_rows(adversaries: Adversaries | None = None) -> tuple[list[torch.Tensor], list[list[int]]]:
    """The rows a sampled FedAvg server's rule receives per round (6 clients, half a round), and
    the clients drawn."""
    from exogym.core.comm.network import Network
    from tests.fake_world import train_server

    calls: list[torch.Tensor] = []
    out = train_server(
        6, lambda: FedAvgStrategy(H=2, client_sampling=0.5, optim_spec=SGD, aggregate=recording(calls)), 4,
        network=Network(1e9, 1e-3, compute=0.01), adversaries=adversaries,
    )  # fmt: skip
    from communicators.fedavg import drawn_clients

    return calls, [drawn_clients(6, 0.5, 0, r) for r in range(len(calls))], out


def test_a_sampled_fedavg_server_applies_the_rule_to_its_clients_updates_and_the_attack_to_the_malicious_ones() -> None:
    honest, drawn, _ = _server_rows()
    assert len(honest) >= 2 and all(rows.shape[0] == 3 for rows in honest)
    attack = Adversaries("sign_flip", fraction=0.5)
    bad = set(attack.malicious(6, seed=0))
    attacked, _, _ = _server_rows(attack)
    first = drawn[0]  # the first round's clients: the same start, so the same honest rows
    flipped = [i for i, c in enumerate(first) if c in bad]
    kept = [i for i, c in enumerate(first) if c not in bad]
    torch.testing.assert_close(attacked[0][kept], honest[0][kept], rtol=0, atol=0)
    torch.testing.assert_close(attacked[0][flipped], -honest[0][flipped], rtol=0, atol=0)


def test_a_label_flip_attack_poisons_a_server_run_s_malicious_clients_only() -> None:
    from exogym.core.comm.network import Network
    from tests.fake_world import train_server

    flip = Adversaries("label_flip", fraction=0.5, num_classes=3)
    ds = torch.utils.data.TensorDataset(torch.randn(6 * 8 * 4, 8), torch.randint(0, 3, (6 * 8 * 4,)))

    class Classifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 3)

        def forward(self, batch):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.fc(x), y)

    def run(adversaries):
        return train_server(
            6, lambda: FedAvgStrategy(H=2, client_sampling=0.5, optim_spec=SGD), 4, dataset=ds,
            network=Network(1e9, 1e-3, compute=0.01), adversaries=adversaries, make_model=Classifier,
        )[0]["params"]  # fmt: skip

    assert not all(torch.equal(a, b) for a, b in zip(run(None), run(flip), strict=True))


def test_fedbuff_s_server_applies_the_rule_to_a_full_buffer_with_the_malicious_clients_updates_attacked() -> None:
    from exogym.core.comm.network import Network
    from exogym.strategy import FedBuffStrategy
    from tests.fake_world import train_server

    def rows(adversaries: Adversaries | None) -> list[torch.Tensor]:
        calls: list[torch.Tensor] = []
        train_server(
            6, lambda: FedBuffStrategy(local_steps=2, buffer_size=2, concurrency=3, optim_spec=SGD,
                                       aggregate=recording(calls)), 6,
            network=Network(1e9, 1e-3, compute=0.01, compute_slowdown=(1.0, 0.5, 1.0, 0.25, 1.0, 0.5)),
            adversaries=adversaries,
        )  # fmt: skip
        return calls

    honest, attacked = rows(None), rows(Adversaries("sign_flip", fraction=0.8))  # 5 of 6 clients
    assert honest and all(r.shape[0] == 2 for r in honest)
    first_h, first_a = honest[0], attacked[0]  # the first buffer: the same updates before the attack
    same = [torch.equal(a, h) for a, h in zip(first_a, first_h, strict=True)]
    negated = [torch.equal(a, -h) for a, h in zip(first_a, first_h, strict=True)]
    assert all(s or n for s, n in zip(same, negated, strict=True)) and any(negated)


def test_the_noise_attack_draws_gaussian_rows_of_its_strength_the_same_for_the_same_seed_step_and_tag() -> None:
    plan = Adversaries("noise", fraction=0.5, strength=2.0).plan(4, seed=7)
    rows = torch.zeros(4, 20_000)
    a = plan.attack_rows(rows, [0, 1, 2, 3], step=3, tag="x")
    b = plan.attack_rows(rows, [0, 1, 2, 3], step=3, tag="x")
    c = plan.attack_rows(rows, [0, 1, 2, 3], step=4, tag="x")
    bad = list(plan.malicious)
    assert torch.equal(a, b) and not torch.equal(a[bad], c[bad])
    assert float(a[bad].std()) == pytest.approx(2.0, rel=0.03) and abs(float(a[bad].mean())) < 0.05
    good = [r for r in range(4) if r not in bad]
    assert torch.equal(a[good], rows[good])


def test_fedavg_s_rule_and_attack_see_the_nodes_updates_from_the_last_average_not_their_models() -> None:
    from tests.helpers import TinyNet

    start = torch.cat([p.detach().flatten() for p in TinyNet().parameters()])  # every node's first model
    local = train_ranks(K, lambda: FedAvgStrategy(H=H + 1, optim_spec=SGD), H)  # H steps, no average yet
    updates = torch.stack([torch.cat([p.flatten() for p in r["params"]]) - start for r in local])
    calls: list[torch.Tensor] = []
    train_ranks(K, lambda: FedAvgStrategy(H=H, optim_spec=SGD, aggregate=recording(calls)), H)
    torch.testing.assert_close(calls[0], updates, rtol=1e-5, atol=1e-6)  # updates, not models
    attack = Adversaries("sign_flip", fraction=0.25)
    bad = list(attack.malicious(K, seed=0))
    flipped: list[torch.Tensor] = []
    train_ranks(K, lambda: FedAvgStrategy(H=H, optim_spec=SGD, aggregate=recording(flipped)), H, adversaries=attack)
    torch.testing.assert_close(flipped[0][bad], -updates[bad], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("aggregate, kind", [("mean", "all_reduce"), ("median", "all_gather")])
def test_desloc_s_three_averages_take_the_rule(aggregate: str, kind: str) -> None:
    from exogym.strategy.desloc import DESLOCStrategy

    adam = OptimSpec(torch.optim.Adam, lr=0.01)
    out = train_ranks(K, lambda: DESLOCStrategy(Kx=H, Ku=H, Kv=H, aggregate=aggregate, optim_spec=adam), H + 1)
    kinds = {(r.tag, r.kind) for step in out[0]["records"] for r in step}
    assert kinds == {("average_params", kind), ("average_exp_avg", kind), ("average_exp_avg_sq", kind)}


def test_an_optimizer_state_average_gives_its_rule_each_node_s_state_values() -> None:
    from communicators.optimizer_state import OptimizerStateAveraging
    from exogym.core.pipeline import CommunicateOptimizeStrategy
    from tests.helpers import regression_data

    adam, ds = OptimSpec(torch.optim.Adam, lr=0.01), regression_data(K * 8 * (H + 1))
    local = train_ranks(K, lambda: CommunicateOptimizeStrategy([], optim_spec=adam), H, dataset=ds)  # no average
    moments = []
    for o in local:
        opt = o["strategy"].optim
        moments.append(torch.cat([opt.state[p]["exp_avg"].flatten() for p in opt.param_groups[0]["params"]]))
    calls: list[torch.Tensor] = []
    module = lambda: OptimizerStateAveraging("exp_avg", H, aggregate=recording(calls))  # noqa: E731
    train_ranks(K, lambda: CommunicateOptimizeStrategy([module()], optim_spec=adam), H + 1, dataset=ds)
    assert len(calls) == K  # one round (after step H), one call per rank
    torch.testing.assert_close(calls[0], torch.stack(moments), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: diloco(lambda u: u.mean()), r"returns one \[d\] update; on \[4, 3\] it returned \(\)"),
        (lambda: diloco(lambda u: u), r"on \[4, 3\] it returned \(4, 3\)"),
        (lambda: diloco(lambda u: [0.0]), "it returned list"),
        (lambda: diloco(lambda a, b: a), "aggregate of DiLoCoStrategy: its rule cannot combine the 4 updates"),
        (lambda: diloco(functools.partial(median, bta=0.1)), "cannot combine the 4 updates of this run: .*bta"),
    ],
)
def test_a_rule_of_the_wrong_signature_or_result_is_refused_naming_aggregate(make, says: str) -> None:
    from exogym.runtime.plan import check_rules

    with pytest.raises(ValueError, match=says):
        check_rules(make(), K)


def test_a_server_s_rule_is_tried_on_its_buffer_or_sample_and_islands_with_an_attack_are_refused() -> None:
    from exogym.runtime.plan import check_rules
    from exogym.strategy import FedBuffStrategy

    with pytest.raises(ValueError, match="aggregate of FedBuffStrategy: .* 2 updates .*krum"):
        check_rules(FedBuffStrategy(local_steps=2, buffer_size=2, aggregate="krum"), 8)
    check_rules(FedBuffStrategy(local_steps=2, buffer_size=6, aggregate="krum"), 8)  # 6 > f + 2 with f = 1
    with pytest.raises(ValueError, match="aggregate of FedAvgServer: .* 2 updates"):
        check_rules(FedAvgStrategy(H=2, client_sampling=0.5, aggregate="krum"), 4)
    attack = Adversaries("sign_flip", fraction=0.25)
    for strategy in (FedAvgStrategy(H=2, island_size=2), FedAvgStrategy(H=2, client_sampling=0.5, island_size=2)):
        check_rules(strategy, 4)  # without an attack islands are fine
        with pytest.raises(ValueError, match="give island_size or adversaries, not both"):
            check_rules(strategy, 4, attack)


def test_a_robust_rule_over_two_updates_is_said_to_be_their_mean(caplog) -> None:
    from exogym.runtime.plan import check_rules

    check_rules(diloco("median"), 2)
    assert "a robust rule over two or fewer is their mean" in caplog.text
    caplog.clear()
    check_rules(diloco("median"), 3)
    check_rules(diloco("mean"), 2)
    assert "their mean" not in caplog.text


def test_a_share_that_gives_no_malicious_node_is_refused_and_a_start_after_the_run_warned(caplog) -> None:
    with pytest.raises(ValueError, match=r"on 4 nodes no node is malicious; give at least 0.25 \(one node\)"):
        Adversaries("sign_flip", fraction=0.1).check_run(4)
    Adversaries("sign_flip", fraction=0.0).check_run(4)  # a clean run on purpose
    assert Adversaries("noise", fraction=0.625).count(4) == 3  # 2.5 rounds half up
    Adversaries("sign_flip", fraction=0.25, start=20).check_run(4, max_steps=20)
    assert "the attack never acts" in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"attack": "free_rider", "strength": 2.0}, "free_rider takes no strength"),
        ({"attack": "label_flip", "strength": 1.0}, "label_flip takes no strength"),
        ({"attack": "sign_flip", "strength": -2.0}, "sign_flip's factor must be > 0"),
        ({"attack": "ipm", "strength": 0.0}, "ipm's epsilon must be > 0"),
    ],
)
def test_a_strength_an_attack_does_not_take_is_refused(kwargs: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Adversaries(fraction=0.25, **kwargs)


def test_label_flip_refuses_labels_outside_num_classes_naming_it() -> None:
    from exogym.adversaries import check_labels

    with pytest.raises(ValueError, match=r"num_classes=3\): this data's labels reach 9; give num_classes=10"):
        check_labels(torch.arange(10), 3)
    check_labels(torch.arange(10), 10)
    plan = Adversaries("label_flip", fraction=0.5, num_classes=3).plan(2, seed=0)
    with pytest.raises(ValueError, match="give num_classes=10"):
        plan.poison((torch.zeros(10, 2), torch.arange(10)))
