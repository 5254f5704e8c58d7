"""The ``Communicator``: one building block of a strategy's communication.

A researcher writes a communicator with four things (the rest has defaults):

- ``Communicator.space``: ``"grad"`` (runs before the optimizer step, on ``p.grad``) or
  ``"param"`` (after it, on the parameters);
- a schedule: ``H`` (communicate after local steps ``H-1, 2H-1, ...``) or an own
  [`Communicator.is_due`][communicators.Communicator.is_due];
- [`Communicator.setup`][communicators.Communicator.setup] (per node: allocate state from the
  [`NodeContext`][communicators.NodeContext]);
- [`Communicator.communicate`][communicators.Communicator.communicate] (the collective work of one
  due step).

Optional:
[`state_dict`][communicators.Communicator.state_dict]/[`load_state_dict`][communicators.Communicator.load_state_dict]
(checkpoints), [`describe`][communicators.Communicator.describe] (logs), and one statement of
participation, [`participation`][communicators.Communicator.participation], for modules that let
only some nodes train in a round (client sampling). Everything the runtime needs to run such rounds
fast (which steps a node is idle, when it may sleep through a round, where to place nodes) it
derives from that statement (``exogym.runtime.schedule``). Capabilities are class attributes:
``supports_dropout``, ``stable_payloads``, ``locates_payloads``, ``coded_payloads``,
``needs_step_seconds``.

[`Wrapper`][communicators.Wrapper] wraps another communicator and forwards all of the above to it.
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

    def with_comm(self, comm: Comm) -> NodeContext:
        """This context with another communication object (what a [`Wrapper`][communicators.Wrapper]
        hands its inner module when it transforms the wire)."""
        return replace(self, comm=comm)


@dataclass(frozen=True)
class Participation:
    """Who trains in one round of a module that lets only some nodes train.

    Round ``r`` is local steps ``[r * period, (r + 1) * period)``; the module communicates after
    its last step. A node not in ``trains`` is idle through the round: it neither computes
    nor reads its data, and takes part only in the round's communication.

    Attributes:
        period: steps per round (the module's ``H``).
        trains: the ranks that train in the round (drawn from the shared seed: the same answer
            on every rank and before any node exists).
        replaces: whether the round's communication replaces a non-participant's state
            (FedAvg: it receives the participants' mean). Then a node idle in two rounds in a
            row may sleep through the first round's communication: the second replaces it.
    """

    period: int
    trains: frozenset[int]
    replaces: bool = True

    def idle(self, rank: int) -> bool:
        """Whether ``rank`` sits this round out."""
        return rank not in self.trains


class Communicator:
    """Base of the pipeline's building blocks.

    A subclass sets ``space`` (``"grad"``: runs before the optimizer step on ``p.grad``;
    ``"param"``: after it), gives a schedule (``H``, or its own
    [`is_due`][communicators.Communicator.is_due]), sets itself up per node in
    [`setup`][communicators.Communicator.setup] and does its work in
    [`communicate`][communicators.Communicator.communicate], a collective: every rank calls it on
    the same steps, the ones where [`is_due`][communicators.Communicator.is_due] holds. Optional:
    [`participation`][communicators.Communicator.participation] (who trains in a round),
    [`state_dict`][communicators.Communicator.state_dict]/[`load_state_dict`][communicators.Communicator.load_state_dict]
    (every tensor it keeps between steps, for checkpoints),
    [`describe`][communicators.Communicator.describe] (a label with its settings: logs, and the
    check that a resumed run has the settings of the checkpoint). Capabilities are class attributes:
    ``supports_dropout``, ``stable_payloads``, ``locates_payloads``, ``coded_payloads``,
    ``needs_step_seconds``, ``uniform_idle_calls``.

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
    #: Whether each payload holds the same entries every round, so per-payload quantization
    #: error feedback applies to it (see ``communicators.quantize``). ``False`` unless a
    #: module says so: error feedback on payloads whose entries change would add residuals
    #: to the wrong entries, so it is refused.
    stable_payloads: ClassVar[bool] = False
    #: Whether each all-reduce says which parameter entries its payload holds
    #: (``entries=``, ``Entries``): then error feedback keeps
    #: its residual per entry, whatever the round's selection.
    locates_payloads: ClassVar[bool] = False
    #: Whether the module needs every node's step seconds before the run: it follows a simulated
    #: timeline or asks a handle's
    #: ``is_completed()`` (``exogym.core.comm.handles``). With ``compute="flops"`` the run
    #: then counts one training step's FLOPs before it starts.
    needs_step_seconds: ClassVar[bool] = False
    #: Whether the module codes its payloads into bytes itself (values and indices packed into
    #: one buffer, values already at a chosen precision): a wire transform that acts on float
    #: payloads would pass them through unchanged, so a quantizing wire refuses the module
    #: rather than do nothing (see ``communicators.quantize``).
    coded_payloads: ClassVar[bool] = False
    #: Whether the module can run a round with nodes missing (fault injection, see
    #: ``exogym.runtime.faults``): its collectives are ``sum``/``mean`` all-reduces, which
    #: the comm takes among the present nodes, and any count it divides by comes from
    #: ``comm.present()``. ``False`` makes ``fit(faults=...)`` with dropouts refuse the strategy.
    supports_dropout: ClassVar[bool] = False
    #: Whether a node that never trains in the run (no round samples it, no event names it)
    #: makes the same calls as every other such node: they follow from the rounds' statements
    #: and the module's settings, not from the node's rank (no group drawn per rank, no state
    #: of its own sent). A worker then runs one of its dormant nodes and makes its calls for
    #: the others (``exogym.runtime.dormant``).
    uniform_idle_calls: ClassVar[bool] = False

    def __init__(self, H: int = 1) -> None:
        if not isinstance(H, int) or isinstance(H, bool) or H < 1:
            raise ValueError(f"H must be a positive int (communicate every H steps), got {H!r}")
        self.H = H

    def setup(self, ctx: NodeContext) -> None:
        """Bind to a node (called once per node, before its first step): keep ``ctx`` as
        ``self.ctx`` and allocate state. Subclasses call ``super().setup(ctx)`` first."""
        self.ctx = ctx

    def _init_node(self, ctx: NodeContext) -> None:
        """Alias of [`setup`][communicators.Communicator.setup] (the spelling of earlier examples);
        calls ``setup``."""
        self.setup(ctx)

    def is_due(self, step: int) -> bool:
        """Whether local step ``step`` (0-based, the step being completed) communicates."""
        return (step + 1) % self.H == 0

    def communicate(self, step: int) -> None:
        """Do this module's communication for ``step``. Collective."""
        raise NotImplementedError(f"{type(self).__name__} must implement communicate(step)")

    def participation(self, step: int, num_nodes: int, seed: int) -> Participation | None:
        """Who trains in the round of ``step`` where this module lets only some nodes train, or
        ``None`` (the default): every node trains every step. A function of the module's
        settings and of ``(step, num_nodes, seed)`` only: it is asked on every node and before
        the nodes exist (to place them). Only parameter-space modules make nodes idle."""
        return None

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
        module has left (an asynchronous server applies the updates still in flight). The
        default does nothing. Collective: every rank calls it."""
        return None

    def summary(self) -> dict[str, Any]:
        """What the module reports of the run as a whole (``Trainer.result["summary"]``):
        ``{}`` by default; the asynchronous servers give every node's steps and the staleness
        of the updates."""
        return {}

    # -- what the pipeline runs (not for subclasses to override) -----------------------------
    def bind(self, ctx: NodeContext) -> None:
        """Set the module up on a node: [`setup`][communicators.Communicator.setup], or a subclass's
        own ``_init_node`` where it defines that spelling instead (see ``exogym.compat``)."""
        if type(self)._init_node is not Communicator._init_node:
            self._init_node(ctx)
        else:
            self.setup(ctx)

    def leaves(self) -> list[Communicator]:
        """The modules that communicate: this one (a [`Pipeline`][communicators.Pipeline]
        lists its modules', a [`Wrapper`][communicators.Wrapper] its inner module's)."""
        return [self]

    def run(self, space: str, step: int) -> None:
        """Communicate at ``step`` if this module works in ``space`` and is due."""
        if self.space == space and self.is_due(step):
            self.communicate(step)


class Wrapper(Communicator):
    """A communicator around another one (``inner``), forwarding its schedule, space,
    participation, capabilities, state and description. A subclass overrides what it changes,
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
    def stable_payloads(self) -> bool:
        return self.inner.stable_payloads

    @property  # type: ignore[override]
    def supports_dropout(self) -> bool:
        return supports_dropout(self.inner)

    @property  # type: ignore[override]
    def locates_payloads(self) -> bool:
        return self.inner.locates_payloads

    @property  # type: ignore[override]
    def needs_step_seconds(self) -> bool:
        return self.inner.needs_step_seconds

    @property  # type: ignore[override]
    def coded_payloads(self) -> bool:
        return self.inner.coded_payloads

    def wrap_comm(self, comm: Comm) -> Comm:
        """The communication object ``inner`` talks through (the default: ``comm`` itself)."""
        return comm

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        self.inner.bind(ctx.with_comm(self.wrap_comm(ctx.comm)))

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

    def run(self, space: str, step: int) -> None:
        if self.inner.leaves() == [self.inner]:  # a single module: through this one's communicate
            super().run(space, step)
        elif any(m.space == space and m.is_due(step) for m in self.inner.leaves()):
            with self.around(step):
                self.inner.run(space, step)

    def leaves(self) -> list[Communicator]:
        return self.inner.leaves()

    def finish(self) -> None:
        self.inner.finish()

    def summary(self) -> dict[str, Any]:
        return self.inner.summary()

    def participation(self, step: int, num_nodes: int, seed: int) -> Participation | None:
        return self.inner.participation(step, num_nodes, seed)

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


__all__ = ["Communicator", "NodeContext", "Participation", "Wrapper", "supports_dropout"]
