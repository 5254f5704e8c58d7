"""The researcher's Communicator surface: small, documented, and enough for client sampling."""

from __future__ import annotations

import inspect

import pytest
import torch

from communicators import Int8, Participation, QuantizeCommunicator, Wrapper
from communicators.islands import draw_participants
from exogym.core.communicator import Communicator
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.strategy import OptimSpec
from tests.fake_world import train_ranks
from tests.helpers import RecordsTrainedSteps

#: What a subclass may override (the documented surface).
SURFACE = (
    "space",
    "is_due",
    "setup",
    "communicate",
    "participation",
    "state_dict",
    "load_state_dict",
    "describe",
    "finish",
    "summary",
)


def test_the_overridable_surface_is_at_most_ten_documented_members() -> None:
    runtime = {"bind", "run", "leaves"}  # what the pipeline calls; not for subclasses
    capabilities = {  # class attributes
        "stable_payloads",
        "supports_dropout",
        "locates_payloads",
        "needs_step_seconds",
        "coded_payloads",
        "uniform_idle_calls",
    }
    public = {n for n in vars(Communicator) if not n.startswith("_")} - runtime - capabilities
    assert public == set(SURFACE) and len(SURFACE) <= 10
    for name in SURFACE[1:]:
        assert inspect.getdoc(getattr(Communicator, name)), name
    assert all(not callable(getattr(Communicator, c)) for c in capabilities)


class SampledMean(Communicator):
    """A new communicator written from the documented surface only: every ``H`` steps, a
    fraction of the nodes (drawn from the shared seed) train and the others receive their mean."""

    def __init__(self, H: int, fraction: float) -> None:
        super().__init__(H)
        self.fraction = fraction

    def setup(self, ctx) -> None:
        super().setup(ctx)
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]

    def participation(self, step: int, num_nodes: int, seed: int) -> Participation:
        trains = draw_participants(list(range(num_nodes)), self.fraction, seed, step // self.H)
        return Participation(self.H, frozenset(trains), replaces=True)

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        ctx = self.ctx
        trains = self.participation(step, ctx.num_nodes, ctx.seed).trains
        for p in self.params:
            share = p.detach().clone() if ctx.rank in trains else torch.zeros_like(p)
            ctx.comm.all_reduce(share, op="sum")
            p.copy_(share / len(trains))


class Logged(Wrapper):
    """The documented wrapper, adding nothing: the participation statement reaches the runtime."""


class Counting(RecordsTrainedSteps, CommunicateOptimizeStrategy):
    """Records the steps a node trains."""


@pytest.mark.parametrize("workers", [None, 2])
@pytest.mark.parametrize(
    "wrap",
    [
        lambda m: ([m], None),
        lambda m: ([Logged(m)], None),
        lambda m: ([QuantizeCommunicator(Logged(m), "int8")], None),
        lambda m: ([Logged(m)], Int8()),
    ],
    ids=["plain", "wrapper", "quantize-wrapper", "int8-wire"],
)
def test_a_new_communicator_with_a_participation_statement_trains_only_the_sampled_clients(wrap, workers) -> None:
    k, h, rounds, frac, seed = 6, 2, 5, 0.34, 3
    sampled = [draw_participants(list(range(k)), frac, seed, r) for r in range(rounds)]

    def make():
        modules, wire = wrap(SampledMean(h, frac))
        return Counting(modules, optim_spec=OptimSpec(torch.optim.SGD, lr=0.1), wire=wire)

    out = train_ranks(k, make, h * rounds, seed=seed, workers=workers)
    for rank in range(k):
        expected = [r * h + i for r in range(rounds) if rank in sampled[r] for i in range(h)]
        assert out[rank]["strategy"].trained == expected
        assert out[rank]["node"].batches_drawn == len(expected)  # the others read no data
    last = out[sampled[-1][0]]["params"]
    for rank in range(k):  # every node ends with the last round's mean
        for a, b in zip(out[rank]["params"], last, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


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


class _States(Communicator):
    """A module whose participation statement is whatever it was given."""

    def __init__(self, statement, H: int = 2, space: str = "param") -> None:
        super().__init__(H)
        self.statement, self.space = statement, space  # type: ignore[misc]

    def participation(self, step, num_nodes, seed):
        return self.statement

    def communicate(self, step: int) -> None:
        pass


@pytest.mark.parametrize(
    "module,error,message",
    [
        (_States([0, 1]), TypeError, r"must return a Participation\(period, trains, replaces\) or None, got list"),
        (_States(Participation(2, frozenset({0, 7}))), ValueError, r"all ranks in \[0, 4\); got trains=\[0, 7\]"),
        (_States(Participation(2, frozenset())), ValueError, "must name at least one node that trains"),
        (
            _States(Participation(3, frozenset({0}))),
            ValueError,
            "gives period=3, but the module communicates every H=2",
        ),
        (_States(Participation(2, frozenset({0})), space="grad"), ValueError, "only parameter-space modules"),
    ],
    ids=["not-a-statement", "unknown-rank", "nobody-trains", "period-not-H", "grad-space"],
)
def test_a_wrong_participation_statement_is_refused_before_any_node_starts_naming_the_module(
    module, error, message
) -> None:
    from exogym.runtime.schedule import sampled_nodes

    with pytest.raises(error, match=message):
        sampled_nodes(CommunicateOptimizeStrategy([module]), 4, 0, 0)


def test_error_feedback_is_refused_for_a_module_that_does_not_say_its_payloads_are_stable() -> None:
    class Mine(Communicator):
        def communicate(self, step: int) -> None:
            pass

    class Stable(Mine):
        stable_payloads = True

    with pytest.raises(ValueError, match="error_feedback=True needs payloads that hold the same entries"):
        CommunicateOptimizeStrategy([Mine()], wire=Int8(error_feedback=True))
    CommunicateOptimizeStrategy([Stable()], wire=Int8(error_feedback=True))  # declared: accepted


@pytest.mark.timeout(60)
def test_fit_refuses_a_wrong_participation_statement_before_starting_a_process() -> None:
    from exogym import Trainer
    from tests.helpers import FIT_DEFAULTS, TinyNet, child_pids, regression_data

    strategy = CommunicateOptimizeStrategy([_States(Participation(2, frozenset({9})))])
    with pytest.raises(ValueError, match=r"got trains=\[9\]"):
        Trainer(TinyNet(), regression_data()).fit(strategy, 2, max_steps=4, batch_size=8, workers=2, **FIT_DEFAULTS)
    assert child_pids() == []  # no node process was started
