"""Every preset strategy equals its own communicators composed by hand in a
``CommunicateOptimizeStrategy``: the lifecycle hooks (setup, finish, summary, state) reach the
modules through the pipeline, never through code a preset adds."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

import exogym.strategy as S
from exogym.core.comm.links import Link
from exogym.core.comm.network import Network
from exogym.core.communicator import Communicator, Wrapper
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.strategy.registry import PRESETS
from tests.fake_world import train_ranks

K, STEPS = 4, 12
#: Unequal speeds on two regions, modelled compute: what the asynchronous presets need.
WORLD = Network.regions(
    {"a": [0, 1], "b": [2, 3]}, Link(1e9, 0.01), Link(1e8, 0.05), compute=0.1, compute_slowdown=(1.0, 1.0, 0.5, 0.25)
)
#: Settings that make each preset communicate (and, for the servers, finish with updates in
#: flight) within a run of STEPS steps.
SETTINGS = {"H": 3, "k": 0.25, "p_sparta": 0.25}


def _preset(name: str) -> S.Strategy:
    factory = PRESETS[name][0]
    params = inspect.signature(factory).parameters
    return factory(0.01, **{k: v for k, v in SETTINGS.items() if k in params})


def _by_hand(preset: CommunicateOptimizeStrategy) -> CommunicateOptimizeStrategy:
    """The preset's modules in a plain pipeline, with the preset's optimizer and clipping."""
    composed = CommunicateOptimizeStrategy(
        copy.deepcopy(preset.communication_modules),
        optim_spec=preset.optim_spec,
        lr_scheduler=preset.lr_scheduler,
        lr_scheduler_kwargs=preset.lr_scheduler_kwargs,
        max_norm=preset.max_norm,
        wire=preset.wire,
    )
    composed.clip_before_communication = preset.clip_before_communication
    return composed


def test_no_preset_class_defines_a_method_besides_its_constructor() -> None:
    # what a preset adds beyond choosing modules and settings would be lost by composing by hand
    # (its constructors aside: FedAvgStrategy's __new__ returns its server with client_sampling)
    for name in dir(S):
        cls = getattr(S, name)
        if inspect.isclass(cls) and issubclass(cls, CommunicateOptimizeStrategy) and cls.__module__ != S.__name__:
            if cls is CommunicateOptimizeStrategy:
                continue
            own = {k for k, v in vars(cls).items() if callable(v) or isinstance(v, property)} - {"__init__", "__new__"}
            assert not own, f"{cls.__name__} defines {sorted(own)}"


#: The presets that are pipelines of communicators (the others are servers, ``exogym.ServerStrategy``).
PIPELINES = [n for n in sorted(PRESETS) if isinstance(_preset(n), CommunicateOptimizeStrategy)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", PIPELINES)
def test_preset_ends_with_the_parameters_and_summary_of_its_communicators_composed_by_hand(name: str) -> None:
    a = train_ranks(K, lambda: _preset(name), STEPS, network=WORLD)
    b = train_ranks(K, lambda: _by_hand(_preset(name)), STEPS, network=WORLD)
    for rank in range(K):
        for x, y in zip(a[rank]["params"], b[rank]["params"], strict=True):
            assert torch.equal(x, y), f"{name}: rank {rank} differs by {(x - y).abs().max():.3g}"
    assert a[0]["strategy"].run_summary() == b[0]["strategy"].run_summary()


class _AveragesAtTheEnd(Communicator):
    """Trains locally and averages the parameters once, at the end of the run (``finish``)."""

    def communicate(self, step: int) -> None:
        pass

    def is_due(self, step: int) -> bool:
        return False

    def finish(self) -> None:
        for p in self.ctx.model.parameters():
            self.ctx.comm.all_reduce(p.data, op="mean")

    def summary(self) -> dict:
        return {"averaged_at_the_end": True}


def test_a_wrapper_passes_finish_and_summary_to_the_module_it_wraps() -> None:
    sgd = S.OptimSpec(torch.optim.SGD, lr=0.05)
    bare = train_ranks(K, lambda: CommunicateOptimizeStrategy([_AveragesAtTheEnd()], sgd), STEPS)
    wrapped = train_ranks(K, lambda: CommunicateOptimizeStrategy([Wrapper(_AveragesAtTheEnd())], sgd), STEPS)
    for x, y in zip(bare[0]["params"], wrapped[0]["params"], strict=True):
        assert torch.equal(x, y)
    for x, y in zip(wrapped[0]["params"], wrapped[1]["params"], strict=True):
        assert torch.equal(x, y)  # the end's average reached every node
    assert wrapped[0]["strategy"].run_summary() == {"averaged_at_the_end": True}
