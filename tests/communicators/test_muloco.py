"""MuLoCo (Therien et al. 2025, arXiv 2505.23725) against plain-PyTorch references: DiLoCo's
outer step over nodes whose inner optimizer is ``torch.optim.Muon`` on the hidden layers'
matrices and ``torch.optim.AdamW`` on the embeddings, the output head and the other parameters
(the paper's split; every matrix, or the matrices named, on request); its H=1 relation to
data-parallel Muon; its bytes. The references build torch's optimizers themselves, over
parameters they name, not ExoGym's ``MuonAdamW``."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.data import TensorDataset

from exogym import Faults
from exogym.core.muon import MuonAdamW
from exogym.strategy import DiLoCoStrategy, MuLoCoStrategy, OptimSpec
from exogym.tasks.gpt import CharGPT
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, node_batches, regression_data

H, STEPS = 3, 12
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9


#: The paper's split of TinyNet: Muon takes the hidden layer's matrix; fc2 is the output head
#: (AdamW's, as the embeddings and the non-matrix parameters are).
PAPER = ("fc1.weight",)
#: Every matrix to Muon, the output head included (``muon_params="matrices"``).
MATRICES = ("fc1.weight", "fc2.weight")


def inner_optimizers(model: torch.nn.Module, muon: tuple[str, ...] = PAPER) -> list[torch.optim.Optimizer]:
    """MuLoCo's inner optimizer with ``MuonAdamW``'s defaults: Muon (lr 0.02, momentum 0.95,
    Nesterov, weight decay 0.1, 5 Newton-Schulz steps) on the parameters named ``muon``, AdamW
    (lr 1e-3, betas (0.9, 0.999), weight decay 0.01) on the others."""
    named = list(model.named_parameters())
    return [
        torch.optim.Muon([p for n, p in named if n in muon], lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.1),
        torch.optim.AdamW([p for n, p in named if n not in muon], lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01),
    ]


def muloco_reference(
    ds: TensorDataset,
    k: int,
    steps: int,
    h: int,
    outer_lr: float,
    momentum: float,
    dropped: dict[int, list[int]] | None = None,
    muon: tuple[str, ...] = PAPER,
) -> list[torch.Tensor]:
    """K model copies, each stepping its own Muon + AdamW on its batches; every h steps the
    pseudo-gradient ``delta = global - mean_k(local_k)`` takes an outer Nesterov SGD step
    (``buf = delta`` at the first, then ``buf = momentum * buf + delta``;
    ``global -= outer_lr * (delta + momentum * buf)``; plain SGD when momentum is 0) and every
    copy restarts from ``global``. ``dropped[r]``: nodes that sit round r out (no batches, not in
    the mean) and take the lowest survivor's Muon and AdamW state at its end. ``muon``: the
    parameters Muon takes."""
    dropped = dropped or {}
    models = [TinyNet() for _ in range(k)]
    opts = [inner_optimizers(m, muon) for m in models]
    data = [node_batches(ds, k, r) for r in range(k)]
    glob = [p.detach().clone() for p in models[0].parameters()]
    buf: list[torch.Tensor] | None = None
    for s in range(steps):
        gone = dropped.get(s // h, [])
        alive = [r for r in range(k) if r not in gone]
        for r in alive:
            for o in opts[r]:
                o.zero_grad()
            models[r](next(data[r])).backward()
            for o in opts[r]:
                o.step()
        if (s + 1) % h:
            continue
        for r in gone:
            for o, survivor in zip(opts[r], opts[alive[0]], strict=True):
                o.load_state_dict(copy.deepcopy(survivor.state_dict()))
        with torch.no_grad():
            local = [list(models[r].parameters()) for r in alive]
            delta = [g - sum(ps[i] for ps in local) / len(alive) for i, g in enumerate(glob)]
            if momentum:
                buf = (
                    [d.clone() for d in delta]
                    if buf is None
                    else [momentum * b + d for b, d in zip(buf, delta, strict=True)]
                )
                step = [d + momentum * b for d, b in zip(delta, buf, strict=True)]
            else:
                step = delta
            glob = [g - outer_lr * u for g, u in zip(glob, step, strict=True)]
            for m in models:
                for p, g in zip(m.parameters(), glob, strict=True):
                    p.copy_(g)
    return glob


def data_parallel_muon(ds: TensorDataset, k: int, steps: int) -> list[torch.Tensor]:
    """One model; each step the mean of the K nodes' gradients (node r's batch as above) goes
    through one Muon + AdamW step: data-parallel Muon."""
    model = TinyNet()
    opts = inner_optimizers(model)
    data = [node_batches(ds, k, r) for r in range(k)]
    for _ in range(steps):
        grads = []
        for batches in data:
            model.zero_grad()
            model(next(batches)).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = sum(g[i] for g in grads) / k
        for o in opts:
            o.step()
    return [p.detach().clone() for p in model.parameters()]


def _ids(params) -> list[int]:
    return [id(p) for p in params]


def _muloco(h: int, outer_lr: float, momentum: float, **kwargs):
    if momentum:
        return lambda: MuLoCoStrategy(H=h, outer_lr=outer_lr, outer_momentum=momentum, **kwargs)
    return lambda: MuLoCoStrategy(H=h, outer_optim=OptimSpec(torch.optim.SGD, lr=outer_lr), **kwargs)


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize(
    ("kwargs", "muon"),
    [({}, PAPER), ({"muon_params": "matrices"}, MATRICES), ({"muon_params": {"fc2.weight"}}, ("fc2.weight",))],
    ids=["default_the_paper_s_split", "every_matrix", "the_matrices_named"],
)
def test_muloco_matches_the_plain_torch_reference_with_muon_on_the_parameters_it_names(
    k: int, kwargs: dict, muon: tuple[str, ...]
) -> None:
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(k, _muloco(H, OUTER_LR, OUTER_MOMENTUM, **kwargs), STEPS, dataset=ds)
    ref = muloco_reference(ds, k, STEPS, H, OUTER_LR, OUTER_MOMENTUM, muon=muon)
    for o in out:
        for a, b in zip(o["params"], ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        strategy = o["strategy"]
        assert _ids(strategy.optim.muon.param_groups[0]["params"]) == _ids(
            p for n, p in strategy.model.named_parameters() if n in muon
        )


def test_by_default_the_output_head_steps_with_adamw_not_muon_and_the_run_lands_elsewhere() -> None:
    """The default against ``muon_params="matrices"`` (the output head on Muon too): fc2's
    weight ends apart (TinyNet, 2 nodes, 4 rounds)."""
    ds = regression_data(2 * 8 * STEPS)
    paper, matrices = (
        train_ranks(2, _muloco(H, OUTER_LR, OUTER_MOMENTUM, **kw), STEPS, dataset=ds)[0]["params"]
        for kw in ({}, {"muon_params": "matrices"})
    )
    assert not torch.allclose(paper[2], matrices[2], atol=1e-3)  # fc2.weight


def test_with_h1_outer_sgd_lr1_and_equal_gradients_it_equals_data_parallel_muon() -> None:
    """With H=1 and outer SGD lr 1 (no momentum) a round lands on the mean of the nodes'
    one-step models: ``theta - mean_k(u_k)`` for node k's update ``u_k``. Data-parallel Muon
    steps ``theta - u(mean_k g_k)``. Muon's momentum and weight decay are linear in the
    gradient, but its Newton-Schulz orthogonalization is not (nor is AdamW's division by the
    root of its second moment), so ``mean_k u(g_k) = u(mean_k g_k)`` holds when the nodes'
    gradients are equal, and not in general (next test). Here every example is the same, so
    every node computes the same gradient at every step."""
    k = 4
    x, y = regression_data(1).tensors
    ds = TensorDataset(x.repeat(k * 8 * STEPS, 1), y.repeat(k * 8 * STEPS, 1))
    out = train_ranks(k, _muloco(1, 1.0, 0.0), STEPS, dataset=ds)
    ref = data_parallel_muon(ds, k, STEPS)
    for o in out:
        for a, b in zip(o["params"], ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_with_h1_outer_sgd_lr1_and_different_gradients_it_is_the_mean_of_muon_steps_not_data_parallel_muon() -> None:
    """Where the nodes' gradients differ, H=1 MuLoCo equals the reference's mean of one-step
    Muon models, and data-parallel Muon (one orthogonalized step on the mean gradient) lands
    elsewhere: the orthogonalization of a mean is not the mean of the orthogonalizations."""
    k = 4
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(k, _muloco(1, 1.0, 0.0), STEPS, dataset=ds)
    ref = muloco_reference(ds, k, STEPS, 1, 1.0, 0.0)
    for a, b in zip(out[0]["params"], ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    dp = data_parallel_muon(ds, k, STEPS)
    gaps = [(a - b).abs().max().item() for a, b in zip(out[0]["params"], dp, strict=True)]
    assert max(gaps) > 1e-3, gaps


def test_bytes_are_diloco_with_adamw_bytes() -> None:
    k = 4
    muloco = train_ranks(k, _muloco(H, OUTER_LR, OUTER_MOMENTUM), STEPS)
    diloco = train_ranks(k, lambda: DiLoCoStrategy(H=H), STEPS)
    for m, d in zip(muloco, diloco, strict=True):
        ledger = [[[(r.kind, r.group_size, r.payload, r.sent) for r in step] for step in o["records"]] for o in (m, d)]
        assert ledger[0] == ledger[1] and sum(map(len, ledger[0])) == STEPS // H


def test_virtual_nodes_end_as_nodes_on_their_own_threads() -> None:
    alone = train_ranks(4, _muloco(H, OUTER_LR, OUTER_MOMENTUM), STEPS)
    virtual = train_ranks(4, _muloco(H, OUTER_LR, OUTER_MOMENTUM), STEPS, workers=2)
    for a, b in zip(alone, virtual, strict=True):
        for p, q in zip(a["params"], b["params"], strict=True):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_muon_takes_the_hidden_matrix_and_adamw_the_rest_and_a_scheduler_scales_both() -> None:
    model = TinyNet()
    opt = MuonAdamW(model, lr=0.02, adamw_lr=1e-3)
    assert _ids(opt.muon.param_groups[0]["params"]) == _ids([model.fc1.weight])
    assert _ids(opt.adamw.param_groups[0]["params"]) == _ids([model.fc1.bias, model.fc2.weight, model.fc2.bias])
    torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    assert opt.muon.param_groups[0]["lr"] == 0.01 and opt.adamw.param_groups[0]["lr"] == 0.0005
    model(next(node_batches(regression_data(8), 1, 0))).backward()
    opt.step()
    assert sorted(opt.state[model.fc1.weight]) == ["momentum_buffer"]
    assert sorted(opt.state[model.fc1.bias]) == ["exp_avg", "exp_avg_sq", "step"]
    saved = opt.state_dict()
    fresh = MuonAdamW(model)
    fresh.load_state_dict(saved)
    assert torch.equal(fresh.state[model.fc1.weight]["momentum_buffer"], opt.state[model.fc1.weight]["momentum_buffer"])
    assert fresh.param_groups[0] is fresh.muon.param_groups[0] and fresh.param_groups[0]["lr"] == 0.01


def test_another_inner_optimizer_is_refused_naming_diloco() -> None:
    with pytest.raises(TypeError, match="MuLoCoStrategy's inner optimizer is MuonAdamW.*DiLoCoStrategy"):
        MuLoCoStrategy(optim_spec="adamw")
    s = MuLoCoStrategy(optim_spec="muon", lr=0.05, muon_momentum=0.9, adamw_lr=3e-4)
    assert s.optim_spec == OptimSpec(MuonAdamW, lr=0.05, momentum=0.9, adamw_lr=3e-4)


def test_with_a_node_dropped_the_survivors_average_among_themselves_and_it_rejoins() -> None:
    """DiLoCo's module leaves a node out of a round (``supports_dropout``): the survivors' mean
    pseudo-gradient takes the outer step and the dropped node rejoins with the global parameters
    and a survivor's Muon and AdamW state."""
    k, dropped = 4, {1: [2]}
    ds = regression_data(k * 8 * STEPS)
    make = _muloco(H, OUTER_LR, OUTER_MOMENTUM)
    out = train_ranks(k, make, STEPS, dataset=ds, faults=Faults(drop=dropped))
    ref = muloco_reference(ds, k, STEPS, H, OUTER_LR, OUTER_MOMENTUM, dropped=dropped)
    for o in out:
        for a, b in zip(o["params"], ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert [o["node"].batches_drawn for o in out] == [STEPS, STEPS, STEPS - H, STEPS]
    assert not torch.allclose(ref[0], muloco_reference(ds, k, STEPS, H, OUTER_LR, OUTER_MOMENTUM)[0])


def _muon_names(model: torch.nn.Module, **kwargs) -> set[str]:
    muon = {id(p) for p in MuonAdamW(model, **kwargs).muon.param_groups[0]["params"]}
    return {n for n, p in model.named_parameters() if id(p) in muon}


def test_on_a_gpt_muon_takes_the_blocks_matrices_and_adamw_the_embeddings_the_head_and_the_rest() -> None:
    """The paper's split written out for ``CharGPT``: Muon takes the attention's and the MLP's
    matrices of every block; the token and position embeddings, the output head, the norms and
    the biases go to AdamW. ``"matrices"`` gives Muon the embeddings and the head too."""
    model = CharGPT(vocab=32, block=8, n_layer=2, n_head=2, n_embd=16)
    hidden = {f"blocks.{i}.{m}.weight" for i in range(2) for m in ("qkv", "proj", "mlp.0", "mlp.2")}
    assert _muon_names(model) == hidden
    assert _muon_names(model, muon_params="matrices") == hidden | {"tok.weight", "pos.weight", "head.weight"}
    assert _muon_names(model, muon_params={"blocks.0.qkv.weight"}) == {"blocks.0.qkv.weight"}


def test_a_head_tied_to_the_embedding_goes_to_adamw_and_is_named_by_either_name() -> None:
    model = CharGPT(vocab=32, block=8, n_layer=1, n_head=2, n_embd=16)
    model.head.weight = model.tok.weight
    assert _muon_names(model) == {f"blocks.0.{m}.weight" for m in ("qkv", "proj", "mlp.0", "mlp.2")}
    assert _muon_names(model, muon_params={"head.weight"}) == {"tok.weight"}  # one parameter, named once


def test_the_default_needs_the_model_and_bad_muon_params_are_refused_naming_the_argument() -> None:
    model = TinyNet()
    with pytest.raises(TypeError, match=r"pass the model, MuonAdamW\(model, \.\.\.\), not its parameters.*'matrices'"):
        MuonAdamW(model.parameters())
    assert _ids(MuonAdamW(model.parameters(), muon_params="matrices").muon.param_groups[0]["params"]) == _ids(
        [model.fc1.weight, model.fc2.weight]
    )
    with pytest.raises(ValueError, match=r"muon_params must be 'hidden' .*, 'matrices' .* or a set of parameter names"):
        MuLoCoStrategy(muon_params="all")
    with pytest.raises(TypeError, match=r"muon_params must be 'hidden', 'matrices' or a set of parameter names"):
        MuLoCoStrategy(muon_params=2)
    with pytest.raises(ValueError, match=r"muon_params names 'fc3.weight', a parameter the model lacks.*fc1.weight"):
        MuonAdamW(model, muon_params={"fc3.weight"})
    with pytest.raises(ValueError, match=r"muon_params names 'fc1.bias', of 1 dimension\(s\); torch.optim.Muon"):
        MuonAdamW(model, muon_params={"fc1.bias"})
    spec = MuLoCoStrategy(muon_params={"fc2.weight", "fc1.weight"}).optim_spec
    assert spec == OptimSpec(MuonAdamW, muon_params=("fc1.weight", "fc2.weight"))  # sorted: the same repr everywhere
