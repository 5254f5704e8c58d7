"""OptimSpec, LR schedules and Strategy constructor spellings."""

import math

import pytest
import torch

from exogym.core.schedule import build_scheduler, lambda_cosine
from exogym.strategy import OptimSpec, SimpleReduceStrategy
from exogym.strategy.optim import OptimSpec as SeedPathOptimSpec


def test_optim_spec_builds_the_optimizer() -> None:
    spec = OptimSpec(torch.optim.AdamW, lr=0.001, weight_decay=0.01)
    opt = spec.build([torch.nn.Parameter(torch.zeros(2))])
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.param_groups[0]["lr"] == 0.001 and opt.param_groups[0]["weight_decay"] == 0.01
    assert SeedPathOptimSpec is OptimSpec


def test_optim_spec_builds_over_a_model_its_parameters_or_param_groups() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    spec = OptimSpec(torch.optim.SGD, lr=0.1)
    from_model = spec.build(model)
    assert [p for g in from_model.param_groups for p in g["params"]] == list(model.parameters())
    assert from_model.param_groups[0]["lr"] == 0.1
    groups = spec.build([{"params": model[0].parameters()}, {"params": model[1].parameters(), "lr": 0.01}])
    assert [g["lr"] for g in groups.param_groups] == [0.1, 0.01]
    with pytest.raises(TypeError, match=r"OptimSpec.build takes a model .* got int; pass the model, model.parameters"):
        spec.build(3)
    with pytest.raises(TypeError, match="got Parameter"):
        spec.build(model[0].weight)


def test_optim_spec_from_string_and_bad_names() -> None:
    assert OptimSpec.from_string("adamw", lr=3e-4) == OptimSpec(torch.optim.AdamW, lr=3e-4)
    assert OptimSpec.from_string("SGD").cls is torch.optim.SGD
    with pytest.raises(ValueError, match="unknown optimizer 'adamx'"):
        OptimSpec.from_string("adamx")


def test_misspelled_optimizer_keyword_fails_at_construction() -> None:
    with pytest.raises(TypeError, match="weight_decy"):
        OptimSpec(torch.optim.AdamW, lr=1e-3, weight_decy=0.1)
    with pytest.raises(TypeError, match="Optimizer subclass"):
        OptimSpec(torch.nn.Linear, lr=1e-3)


def test_strategy_spellings() -> None:
    s = SimpleReduceStrategy(inner_optim="adam", lr=3e-4)
    assert s.optim_spec == OptimSpec(torch.optim.Adam, lr=3e-4)
    s = SimpleReduceStrategy(optim_spec=OptimSpec(torch.optim.SGD, lr=0.1), lr=0.2)
    assert s.optim_spec.lr == 0.2
    assert SimpleReduceStrategy().optim_spec == OptimSpec(torch.optim.AdamW, lr=1e-3)
    with pytest.raises(TypeError, match="not both"):
        SimpleReduceStrategy(optim_spec="sgd", inner_optim="adam")
    with pytest.raises(TypeError, match="H"):
        SimpleReduceStrategy(H=3)
    with pytest.raises(TypeError, match="cosine_anel"):
        SimpleReduceStrategy(lr_scheduler="lambda_cosine", lr_scheduler_kwargs={"cosine_anel": True})
    with pytest.raises(ValueError, match="unknown lr_scheduler"):
        SimpleReduceStrategy(lr_scheduler="linear")


def test_lambda_cosine_against_the_formula() -> None:
    f = lambda_cosine(max_steps=110, warmup_steps=10, cosine_anneal=True, min_lr_factor=0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(110) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    flat = lambda_cosine(max_steps=100, warmup_steps=4, cosine_anneal=False)
    assert [flat(s) for s in (0, 3, 50)] == [0.25, 1.0, 1.0]


def test_scheduler_variants() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    assert build_scheduler(opt, None, {}, 10) is None and build_scheduler(opt, "constant", {}, 10) is None
    sched = build_scheduler(opt, torch.optim.lr_scheduler.StepLR, {"step_size": 2, "gamma": 0.5}, 10)
    for _ in range(2):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == 0.5
    s = SimpleReduceStrategy(lr_scheduler="cosine", warmup_steps=5)
    assert s.lr_scheduler_kwargs == {"warmup_steps": 5}
    s = SimpleReduceStrategy(warmup_steps=5)
    assert s.lr_scheduler == "lambda_cosine" and s.lr_scheduler_kwargs["cosine_anneal"] is False
