"""The ``Communicator``: one building block of a lock-step strategy's communication (its class
docstring says what a researcher writes), the ``NodeContext`` it is set up with, and ``Wrapper``,
a communicator around another one that passes all of it on.

Every node trains every step; algorithms where only some clients train, or clients train on
clocks of their own, are servers ([`Server`][exogym.Server]).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from exogym.core.comm.comm import Comm


@dataclass
class NodeContext:
    """What a communicator gets when set up on a node.

    Attributes:
        model: this node's model copy (parameters are updated in place).
        rank: this node's rank.
        num_nodes: the number of nodes.
        comm: the node's collectives (every byte sent goes through it).
        optimizer: the inner optimizer (e.g. to read the current learning rate; its per-parameter
            state through [`optimizer_state`][communicators.NodeContext.optimizer_state]).
        seed: a seed every rank shares; derive shared randomness from it, never broadcast it.
        max_steps: the run's number of steps.
        steps_per_epoch: steps in one pass over a node's data (the same on every rank).
        network: the run's network ([`Network`][exogym.Network], node speeds
            drawn): what asynchronous modules build their simulated timeline from; ``None``
            where the node runs without one (unit tests).
        adversaries: the run's malicious nodes
            ([`AdversaryPlan`][exogym.adversaries.AdversaryPlan]; ``None``: every node is
            honest): what [`aggregate_all_reduce`][communicators.aggregation.aggregate_all_reduce]
            attacks with.
    """

    model: torch.nn.Module
    rank: int
    num_nodes: int
    comm: Comm
    optimizer: torch.optim.Optimizer
    seed: int
    max_steps: int
    steps_per_epoch: int
    network: Any = None
    adversaries: Any = None

    def optimizer_state(self, name: str) -> list[torch.Tensor]:
        """The inner optimizer's state tensor ``name`` of every trainable parameter of
        ``model``, in parameter order: e.g. Adam's and AdamW's moments ``"exp_avg"`` and
        ``"exp_avg_sq"``, SGD's ``"momentum_buffer"``. These are the optimizer's own tensors:
        writing them in place changes its state (DES-LOC averages the moments this way).

        Ask again each time rather than keeping the list: an optimizer makes its state at its
        first step, and loading a checkpoint or a node rejoining after a fault replaces the
        tensors. Parameter-space modules run after the optimizer step, so the state exists there
        from the first step on.

        Raises:
            ValueError: a parameter has no tensor ``name`` in the optimizer's state (yet); the
                message names the optimizer and the state it does hold.
        """
        tensors = []
        for p in self.model.parameters():
            if not p.requires_grad:
                continue
            state = self.optimizer.state.get(p, {})
            t = state.get(name)
            if not isinstance(t, torch.Tensor):
                held = ", ".join(sorted(k for k, v in state.items() if isinstance(v, torch.Tensor))) or "none"
                raise ValueError(
                    f"{type(self.optimizer).__name__} holds no state {name!r} for a parameter (its state tensors: "
                    f"{held}; an optimizer makes its state at its first step)"
                )
            tensors.append(t)
        return tensors


#: The values of ``Communicator.payloads``.
PAYLOADS = ("varying", "stable", "located", "coded")
#: Flags a communicator class may not set, and the ``payloads`` value that says the same
#: (listed in ``exogym.compat``).
PAYLOAD_FLAGS = {"stable_payloads": "stable", "locates_payloads": "located", "coded_payloads": "coded"}


class Communicator:
    """Base of the pipeline's building blocks.

    A subclass sets ``space`` (``"grad"``: runs before the optimizer step on ``p.grad``;
    ``"param"``: after it), gives a schedule (``H``, or its own
    [`is_due`][communicators.Communicator.is_due]), sets itself up per node in
    [`setup`][communicators.Communicator.setup] and does its work in
    [`communicate`][communicators.Communicator.communicate], a collective: every rank calls it on
    the same steps, the ones where [`is_due`][communicators.Communicator.is_due] holds. Optional:
    [`state_dict`][communicators.Communicator.state_dict]/[`load_state_dict`][communicators.Communicator.load_state_dict]
    (every tensor it keeps between steps, for checkpoints),
    [`describe`][communicators.Communicator.describe] (a label with its settings: logs, and the
    check that a resumed run has the settings of the checkpoint),
    [`finish`][communicators.Communicator.finish] (the end of the run). Capabilities are class
    attributes: ``payloads`` and ``supports_dropout``; a module whose schedule follows the
    simulated clock sets ``needs_step_seconds = True``.

    Args:
        H: communicate every ``H`` steps (``H >= 1``).

    Example::

        class SignOfMean(Communicator):
            space = "grad"

            def setup(self, ctx):
                super().setup(ctx)
                self.params = [p for p in ctx.model.parameters() if p.requires_grad]

            def communicate(self, step):
                for p in self.params:
                    self.ctx.comm.all_reduce(p.grad, op="mean")
                    p.grad.sign_()
    """

    #: ``"grad"``: runs before the optimizer step on ``p.grad``; ``"param"``: after it.
    space: ClassVar[str] = "param"
    #: What the module's payloads are, for wire transforms (``communicators.quantize``):
    #: ``"varying"`` (the default: entries that change from round to round, so per-payload
    #: error feedback is refused), ``"stable"`` (each payload holds the same entries every
    #: round), ``"located"`` (each all-reduce says which parameter entries it holds,
    #: ``entries=``: error feedback keeps its residual per entry) or ``"coded"`` (the module
    #: codes values and indices into bytes itself: a quantizing wire refuses it rather than do
    #: nothing).
    payloads: ClassVar[str] = "varying"
    #: Whether the module can run a round with nodes dropped (fault injection, see
    #: ``exogym.runtime.faults``): its collectives are ``sum``/``mean`` all-reduces, which
    #: the comm takes among the present nodes, and any count it divides by comes from
    #: ``comm.present()``. ``False`` makes ``fit(faults=...)`` with dropouts refuse the strategy.
    supports_dropout: ClassVar[bool] = False

    def __init__(self, H: int = 1) -> None:
        if not isinstance(H, int) or isinstance(H, bool) or H < 1:
            raise ValueError(f"H must be a positive int (communicate every H steps), got {H!r}")
        self.H = H

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Check the class's ``payloads`` when the class is made: one of ``PAYLOADS``; a flag
        of ``PAYLOAD_FLAGS`` is refused naming the value that says the same."""
        super().__init_subclass__(**kwargs)
        for flag, value in PAYLOAD_FLAGS.items():
            if flag in vars(cls):
                raise TypeError(f"{cls.__name__}.{flag}: say what the payloads are with payloads = {value!r}")
        given = vars(cls).get("payloads")
        if given is not None and not isinstance(given, property) and given not in PAYLOADS:
            raise TypeError(f"{cls.__name__}.payloads must be one of {', '.join(map(repr, PAYLOADS))}; got {given!r}")

    def setup(self, ctx: NodeContext) -> None:
        """Bind to a node (called once per node, before its first step): keep ``ctx`` as
        ``self.ctx`` and allocate state. Subclasses call ``super().setup(ctx)`` first."""
        self.ctx = ctx

    def _init_node(self, ctx: NodeContext) -> None:
        """Alias of [`setup`][communicators.Communicator.setup] (the spelling of earlier examples;
        see ``exogym.compat``), and what the pipeline calls to set a module up on a node."""
        self.setup(ctx)

    def is_due(self, step: int) -> bool:
        """Whether local step ``step`` (0-based, the step being completed) communicates."""
        return (step + 1) % self.H == 0

    def communicate(self, step: int) -> None:
        """Do this module's communication for ``step``. Collective."""
        raise NotImplementedError(f"{type(self).__name__} must implement communicate(step)")

    def state_dict(self) -> dict[str, Any]:
        """This module's state for checkpoints (tensors are returned as they are)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what [`state_dict`][communicators.Communicator.state_dict] returned."""
        if state:
            raise ValueError(f"{type(self).__name__} has no state but got keys {sorted(state)}")

    def describe(self) -> str:
        """A short label for logs."""
        return f"{type(self).__name__}(H={self.H})"

    def finish(self) -> None:
        """End of the run, after the last step, before the final state is read: the work a
        module has left (e.g. a collective still in flight). The default does nothing.
        Collective: every rank calls it."""

    # -- what the pipeline runs (not for subclasses to override) -----------------------------
    def _leaves(self) -> list[Communicator]:
        """The modules that communicate: this one (a pipeline lists its modules', a wrapper its
        inner module's)."""
        return [self]

    def _run(self, space: str, step: int) -> None:
        """Communicate at ``step`` if this module works in ``space`` and is due."""
        if self.space == space and self.is_due(step):
            self.communicate(step)


class Wrapper(Communicator):
    """A communicator around another one (``inner``), passing on its schedule, space,
    capabilities, lifecycle (setup, finish), state and description. A subclass overrides what it changes,
    e.g. [`wrap_comm`][communicators.Wrapper.wrap_comm] to transform what ``inner`` sends, or
    [`communicate`][communicators.Communicator.communicate] to act around ``inner.communicate``
    (call ``super().communicate(step)``).

    Args:
        inner: the wrapped communicator.
    """

    def __init__(self, inner: Communicator) -> None:
        if not isinstance(inner, Communicator):
            raise TypeError(f"inner must be a Communicator, got {inner!r}")
        super().__init__(H=inner.H)
        self.inner = inner

    @property  # type: ignore[override]
    def space(self) -> str:
        return self.inner.space

    @property  # type: ignore[override]
    def payloads(self) -> str:
        return self.inner.payloads

    @property  # type: ignore[override]
    def supports_dropout(self) -> bool:
        return supports_dropout(self.inner)

    @property
    def needs_step_seconds(self) -> bool:
        return needs_step_seconds(self.inner)

    def wrap_comm(self, comm: Comm) -> Comm:
        """The communication object ``inner`` talks through (the default: ``comm`` itself)."""
        return comm

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        self.inner._init_node(replace(ctx, comm=self.wrap_comm(ctx.comm)))  # through its own comm

    def is_due(self, step: int) -> bool:
        return self.inner.is_due(step)

    def communicate(self, step: int) -> None:
        with self.around(step):
            self.inner.communicate(step)

    @contextlib.contextmanager
    def around(self, step: int) -> Iterator[None]:
        """A context manager entered around each of ``inner``'s communications (the default
        does nothing). Override it as one, e.g.::

            @contextlib.contextmanager
            def around(self, step):
                before = time.perf_counter()
                yield
                self.seconds += time.perf_counter() - before
        """
        yield

    def _run(self, space: str, step: int) -> None:
        if self.inner._leaves() == [self.inner]:  # a single module: through this one's communicate
            super()._run(space, step)
        elif any(m.space == space and m.is_due(step) for m in self.inner._leaves()):
            with self.around(step):
                self.inner._run(space, step)

    def _leaves(self) -> list[Communicator]:
        return self.inner._leaves()

    def finish(self) -> None:
        self.inner.finish()

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])

    def describe(self) -> str:
        return f"{type(self).__name__}({self.inner.describe()})"


def supports_dropout(module: Communicator) -> bool:
    """``module.supports_dropout``, also where a module defines it as a method (the spelling
    of earlier examples; see ``exogym.compat``)."""
    value = module.supports_dropout
    return bool(value() if callable(value) else value)


def needs_step_seconds(module: Communicator) -> bool:
    """Whether ``module`` follows the simulated clock, so the run needs every node's step
    seconds before it starts (``needs_step_seconds = True`` on the module; with
    ``compute="flops"`` the run then counts one training step's FLOPs first)."""
    return bool(getattr(module, "needs_step_seconds", False))


__all__ = [
    "PAYLOADS",
    "PAYLOAD_FLAGS",
    "Communicator",
    "NodeContext",
    "Wrapper",
    "needs_step_seconds",
    "supports_dropout",
]
