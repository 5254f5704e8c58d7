"""The researcher's Communicator surface: small and documented."""

from __future__ import annotations

import inspect

import pytest
import torch

from communicators import Int8, Wrapper
from exogym.core.communicator import PAYLOADS, Communicator
from exogym.core.pipeline import CommunicateOptimizeStrategy
from tests.fake_world import train_ranks

#: Every public member of ``Communicator``: what a subclass sets or overrides (the documented
#: surface); the pipeline's own calls are private.
SURFACE = (
    "space",
    "payloads",
    "supports_dropout",
    "setup",
    "is_due",
    "communicate",
    "state_dict",
    "load_state_dict",
    "describe",
    "finish",
)


def test_the_communicator_has_at_most_ten_public_members_each_documented() -> None:
    public = {n for n in dir(Communicator) if not n.startswith("_")}
    assert public == set(SURFACE) and len(SURFACE) <= 10
    for name in SURFACE[3:]:
        assert inspect.getdoc(getattr(Communicator, name)), name
    assert Communicator.payloads in PAYLOADS and not callable(Communicator.supports_dropout)


class Logged(Wrapper):
    """A wrapper that overrides nothing: everything passes through to ``inner``."""


def test_a_communicator_set_up_with_the_older_init_node_spelling_is_still_set_up() -> None:
    class Old(Communicator):
        def _init_node(self, ctx) -> None:
            super()._init_node(ctx)
            self.params = list(ctx.model.parameters())

        def communicate(self, step: int) -> None:
            for p in self.params:
                self.ctx.comm.all_reduce(p.data, op="mean")

    out = train_ranks(2, lambda: CommunicateOptimizeStrategy([Old(1)], optim_spec="sgd"), 3)
    for a, b in zip(out[0]["params"], out[1]["params"], strict=True):
        assert torch.equal(a, b)


def test_capabilities_are_class_attributes_and_the_method_spelling_is_still_read() -> None:
    from communicators import AveragingCommunicator, DiLoCoCommunicator, SparseCommunicator
    from exogym.core.communicator import supports_dropout

    class OldStyle(Communicator):
        def supports_dropout(self) -> bool:  # type: ignore[override]
            return True

    assert AveragingCommunicator.supports_dropout is True
    assert supports_dropout(OldStyle()) and not supports_dropout(Communicator())
    assert not SparseCommunicator(0.1, selector="topk").supports_dropout
    assert supports_dropout(Logged(DiLoCoCommunicator(H=2)))


def test_error_feedback_is_refused_for_a_module_that_does_not_say_its_payloads_are_stable() -> None:
    class Mine(Communicator):
        def communicate(self, step: int) -> None:
            pass

    class Stable(Mine):
        payloads = "stable"

    with pytest.raises(ValueError, match="needs payloads that hold the same entries every round .payloads = 'stable'"):
        CommunicateOptimizeStrategy([Mine()], wire=Int8(error_feedback=True))
    CommunicateOptimizeStrategy([Stable()], wire=Int8(error_feedback=True))  # declared: accepted


def test_payloads_are_checked_when_the_class_is_made_and_a_flag_names_the_value_that_says_the_same() -> None:
    with pytest.raises(TypeError, match=r"Old.stable_payloads: say what the payloads are with payloads = 'stable'"):

        class Old(Communicator):
            stable_payloads = True

    with pytest.raises(TypeError, match=r"Typo.payloads must be one of 'varying', 'stable', 'located', 'coded'"):

        class Typo(Communicator):
            payloads = "stabel"

    class Located(Communicator):
        payloads = "located"

    assert Located().payloads == "located" and Wrapper(Located()).payloads == "located"
