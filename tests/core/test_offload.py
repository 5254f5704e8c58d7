"""offload_idle_nodes: a node's state leaves the device while it sits steps out, and nothing changes.

This machine may have no accelerator, so the nodes run on the CPU and the tests make every move
visible by patching the module's two copies (host and device) into plain clones: a tensor that
the walk missed, or a view left on its old memory, then shows up as an unmoved pointer or as a
result that differs from the run without offloading.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from exogym import Trainer
from exogym.core.comm.flat import FlatBuffer
from exogym.core.optim import OptimSpec
from exogym.runtime import offload
from exogym.strategy import DeMoStrategy, DiLoCoStrategy, FedAvgStrategy, SPARTAStrategy
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, regression_data

STRATEGIES = {
    "fedavg_momentum_sampling": lambda: FedAvgStrategy(
        H=2, client_sampling=0.5, optim_spec=OptimSpec(torch.optim.SGD, lr=0.05, momentum=0.9)
    ),
    "diloco_adam": lambda: DiLoCoStrategy(H=2, optim_spec="adam"),
    "sparta": lambda: SPARTAStrategy(p_sparta=0.3),
    "demo": lambda: DeMoStrategy(),
}


def _tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in a (nested) state dict, except optimizer step counters."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for k, v in obj.items() if k != "step" for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def _flat_buffers(obj: Any, seen: set[int] | None = None) -> list[FlatBuffer]:
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (str, int, float, torch.Tensor)) or obj is None:
        return []
    seen.add(id(obj))
    if isinstance(obj, FlatBuffer):
        return [obj]
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else []
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith(("exogym", "communicators")):
        values = list(vars(obj).values())
    return [b for v in values for b in _flat_buffers(v, seen)]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_the_state_walk_finds_what_a_checkpoint_saves_and_moves_all_of_it(name):
    # Reference: the checkpoint's own enumerations (model and strategy state dicts, written
    # for checkpoints independently of the walk), plus every parameter's gradient.
    node = train_ranks(2, STRATEGIES[name], steps=4)[0]["node"]
    model, strategy = node.model, node.strategy
    found = offload.node_state(model, strategy)
    assert len({id(t) for t in found}) == len(found)
    reference = [*model.state_dict(keep_vars=True).values(), *_tensors(strategy.state_dict())]
    reference += [p.grad for p in model.parameters() if p.grad is not None]
    assert {id(t) for t in reference} <= {id(t) for t in found}
    buffers = _flat_buffers(strategy)
    before = {id(t): (t.untyped_storage().data_ptr(), t.detach().clone()) for t in found}
    offload.move_state(found, lambda t: t.clone())
    for t in found:
        old_ptr, value = before[id(t)]
        assert t.untyped_storage().data_ptr() != old_ptr and torch.equal(t, value)
    for fb in buffers:  # views were re-made over their moved buffer: they still share its memory
        assert all(v.untyped_storage().data_ptr() == fb.buffer.untyped_storage().data_ptr() for v in fb.views)
    if name == "fedavg_momentum_sampling":
        assert any("momentum_buffer" in s for s in strategy.optim.state.values())
    if name == "diloco_adam":  # Adam's step counters stay where the optimizer keeps them
        steps = [s["step"] for s in strategy.optim.state.values()]
        assert steps and all(id(s) not in {id(t) for t in found} for s in steps)


def _count_moves(monkeypatch) -> dict[str, int]:
    """Make "host memory" poison (NaN, or the largest integer), keeping each tensor's data aside
    for its way back: a node that reads its offloaded state computes garbage, and one that
    writes to it loses the write."""
    moves = {"host": 0, "device": 0}
    aside: dict[int, torch.Tensor] = {}

    def to_host(t: torch.Tensor) -> torch.Tensor:
        moves["host"] += 1
        aside[id(t)] = t.detach().clone()
        poison = float("nan") if t.is_floating_point() else torch.iinfo(t.dtype).max
        return torch.full_like(t, poison)

    def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
        moves["device"] += 1
        return aside.pop(id(t))

    monkeypatch.setattr(offload, "_to_host", to_host)
    monkeypatch.setattr(offload, "_to_device", to_device)
    return moves


@pytest.mark.parametrize(("workers", "validate"), [(1, False), (2, False), (2, True)])
def test_offloading_idle_nodes_changes_no_result(monkeypatch, workers, validate):
    # FedAvg with islands and client sampling on 6 virtual nodes of 1 or 2 workers: with the
    # idle nodes' state offloaded (to poison), identical parameters on every node, bit for bit;
    # so no node read or wrote its state while it was offloaded.
    def strategy():
        return FedAvgStrategy(H=2, island_size=3, client_sampling=0.5, optim_spec="sgd", lr=0.05)

    data = regression_data(n=6 * 8 * 12)
    # Validation every 3 steps reads every node's model, the offloaded ones' included.
    val = {"val_dataset": regression_data(n=48, seed=1), "val_interval": 3} if validate else {}
    plain = train_ranks(6, strategy, steps=12, dataset=data, workers=workers, **val)
    moves = _count_moves(monkeypatch)
    moved = train_ranks(6, strategy, steps=12, dataset=data, workers=workers, offload_idle_nodes=True, **val)
    assert moves["host"] > 0 and moves["device"] == moves["host"]  # every offloaded tensor came back
    for a, b in zip(plain, moved, strict=True):
        for p, q in zip(a["params"], b["params"], strict=True):
            assert torch.equal(p, q)
        assert b["node"]._offloader.resident  # back on the device for the final average
    keys = ("step", "val_loss_local", "val_loss_global", "param_distance", "model_correlation")
    rows = [[[r[k] for k in keys] for r in run[0]["node"].history if "val_loss_global" in r] for run in (plain, moved)]
    assert rows[0] == rows[1] and (len(rows[0]) == 5) == validate  # steps 0, 3, 6, 9, 12


def test_nodes_that_always_train_or_own_a_process_never_leave_the_device(monkeypatch):
    moves = _count_moves(monkeypatch)
    train_ranks(2, lambda: FedAvgStrategy(H=2, optim_spec="sgd", lr=0.05), steps=6, workers=1, offload_idle_nodes=True)
    sampled = [
        r["node"]._offloader
        for r in train_ranks(2, lambda: FedAvgStrategy(H=2, client_sampling=0.5), steps=6, offload_idle_nodes=True)
    ]
    assert moves == {"host": 0, "device": 0} and sampled == [None, None]


def test_fit_refuses_offloading_on_the_cpu_before_starting_anything():
    trainer = Trainer(TinyNet(), regression_data(64))
    with pytest.raises(ValueError, match=r"offload_idle_nodes=True .*device='cpu'"):
        trainer.fit(FedAvgStrategy(H=2, client_sampling=0.5), num_nodes=2, device="cpu", offload_idle_nodes=True)
    with pytest.raises(TypeError, match="offload_idle_nodes must be True or False"):
        trainer.fit(FedAvgStrategy(H=2), num_nodes=2, device="cpu", offload_idle_nodes="yes")  # type: ignore[arg-type]


def test_a_lazy_flat_buffer_exists_only_between_its_first_use_and_its_release() -> None:
    params = [torch.randn(3, 4), torch.randn(5)]
    fb = FlatBuffer(params, lazy=True)
    # The stand-in: the buffer's dtype, size and device in one element of memory.
    assert (fb.like.dtype, fb.like.numel(), fb.like.untyped_storage().nbytes()) == (torch.float32, 17, 4)
    assert not fb.allocated
    flat = fb.pack(params)
    assert fb.allocated and torch.equal(flat, torch.cat([p.reshape(-1) for p in params]))
    out = [torch.zeros_like(p) for p in params]
    fb.unpack(out)
    assert all(torch.equal(a, b) for a, b in zip(out, params, strict=True))
    fb.release()
    assert not fb.allocated
    fb.pack([None, params[1]])  # made again, with the same layout
    assert fb.allocated and torch.equal(fb.buffer[:12], torch.zeros(12)) and torch.equal(fb.views[1], params[1])
    assert FlatBuffer(params).allocated  # eager by default
