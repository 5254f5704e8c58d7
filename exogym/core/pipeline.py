"""The communicator pipeline: ``Communicator`` modules around the inner optimizer step.

``CommunicateOptimizeStrategy`` runs, every step::

    for module in modules: module.before_optim(step)   # gradient-space modules (DDP, DCT top-k)
    clip gradients; optimizer.step()
    for module in modules: module.after_optim(step)    # parameter-space modules (averaging, DiLoCo)

A module decides from its own schedule (``H``) whether this step communicates, and keeps its
own state (``state_dict``/``load_state_dict``). :class:`Pipeline` is itself a ``Communicator``,
so pipelines nest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.optim.lr_scheduler import LRScheduler

from exogym.core.comm.comm import Comm
from exogym.core.optim import OptimSpec
from exogym.core.strategy import Strategy, chain_idle_spans


@dataclass
class NodeContext:
    """What a communicator gets when bound to a node.

    Attributes:
        model: this node's model copy (parameters are updated in place).
        rank: this node's rank.
        num_nodes: the number of nodes.
        comm: the node's collectives (every byte sent goes through it).
        optimizer: the inner optimizer (e.g. to read the current learning rate).
        seed: a seed every rank shares; derive shared randomness from it, never broadcast it.
        max_steps: the run's number of steps.
        steps_per_epoch: steps in one pass over a node's data (the same on every rank).
    """

    model: torch.nn.Module
    rank: int
    num_nodes: int
    comm: Comm
    optimizer: torch.optim.Optimizer
    seed: int
    max_steps: int
    steps_per_epoch: int


class Communicator:
    """Base of the pipeline's building blocks.

    Subclasses set :attr:`space` (``"grad"``: runs before the optimizer step on ``p.grad``;
    ``"param"``: runs after it on the parameters) and implement :meth:`communicate`, which the
    pipeline calls on steps where :meth:`is_due` holds (every ``H``-th step: after local steps
    ``H-1, 2H-1, ...``). ``communicate`` is a collective: every rank calls it on the same steps.

    Args:
        H: communicate every ``H`` steps (``H >= 1``).
    """

    space: ClassVar[str] = "param"
    #: Whether each payload holds the same entries every round (error feedback can apply to it).
    stable_payloads: ClassVar[bool] = True

    def __init__(self, H: int = 1) -> None:
        if not isinstance(H, int) or isinstance(H, bool) or H < 1:
            raise ValueError(f"H must be a positive int (communicate every H steps), got {H!r}")
        self.H = H

    def _init_node(self, ctx: NodeContext) -> None:
        """Bind to a node; subclasses allocate their state here and call ``super()._init_node``."""
        self.ctx = ctx

    def is_due(self, step: int) -> bool:
        """Whether local step ``step`` (0-based, the step being completed) communicates."""
        return (step + 1) % self.H == 0

    def idle_steps(self, step: int) -> int:
        """How many steps from ``step`` on this node sits out: it neither computes nor reads
        its data, and only the last of those steps communicates (e.g. a client not sampled for
        a FedAvg round receives the round's average and nothing else). ``0``: the node trains
        at ``step`` (the default). Only parameter-space modules may make a node idle; the
        answer must depend only on shared values (step, rank, seed)."""
        return 0

    def overwritten_at(self, step: int) -> int | None:
        """For a node idle at ``step``, a step where this module communicates: the later step
        whose communication replaces everything the node would receive now, the node staying
        idle until then; ``None`` (the default) when the node must take part now. Where it is
        not ``None``, the node loop may call :meth:`sit_out` instead of :meth:`communicate`
        (it checks that nothing reads the node's state in between). Depends only on shared
        values (step, rank, seed)."""
        return None

    @property
    def round_steps(self) -> int | None:
        """Steps per round where this module samples the clients that train in each round
        (:meth:`sampled_nodes`; the progress bar counts rounds, ``fit`` places nodes by them);
        ``None`` (the default): it samples none."""
        return None

    def idle_span_ends(self, step: int, stop: int, read_at: int) -> list[int]:
        """The last steps of the idle spans in a row from ``step`` that the node may sit out
        (see :meth:`exogym.core.strategy.Strategy.idle_span_ends`). The default asks
        :meth:`idle_steps` and :meth:`overwritten_at` span by span; a module that makes nodes
        idle for many rounds may answer at once (the same answer)."""
        return chain_idle_spans(self.idle_steps, self.overwritten_at, step, stop, read_at)

    def sampled_nodes(self, num_nodes: int, seed: int, step: int) -> list[int] | None:
        """The nodes this module lets train in the round of ``step`` (the others idle), drawn
        from the shared ``seed``; ``None`` (the default): every node trains. Asked on the
        module as built, before it is bound to a node (see
        :meth:`exogym.core.strategy.Strategy.sampled_nodes`)."""
        return None

    def sit_out(self, step: int) -> None:
        """Take part in ``step``'s communication without contributing or receiving (see
        :meth:`overwritten_at`), with the ledger charged as :meth:`communicate` would charge
        it. The default communicates. Collective."""
        self.communicate(step)

    def sit_out_rounds(self, steps: Sequence[int]) -> bool:
        """:meth:`sit_out` at each of ``steps`` (ascending, each allowed by
        :meth:`overwritten_at`, the node idle in between) in one call: the node loop's fast way
        through the rounds a FedAvg client sleeps. Charges one record per bucket for each step,
        in order (the loop splits the ledger's records evenly by step). ``False`` (the
        default): not supported, and nothing done; the loop then sits each round out itself.
        Collective."""
        return False

    def supports_dropout(self) -> bool:
        """Whether this module can run a round with nodes missing (fault injection, see
        :mod:`exogym.runtime.faults`): its collectives are ``sum``/``mean`` all-reduces, which
        :class:`~exogym.core.comm.comm.NodeComm` takes among the present nodes, and any count it
        divides by comes from :meth:`~exogym.core.comm.comm.NodeComm.present`. ``False`` (the
        default) makes ``fit(faults=...)`` with dropouts refuse the strategy before it starts."""
        return False

    def before_optim(self, step: int) -> None:
        """Hook before the optimizer step: runs :meth:`communicate` for gradient-space modules."""
        if self.space == "grad" and self.is_due(step):
            self.communicate(step)

    def after_optim(self, step: int) -> None:
        """Hook after the optimizer step: runs :meth:`communicate` for parameter-space modules."""
        if self.space == "param" and self.is_due(step):
            self.communicate(step)

    def communicate(self, step: int) -> None:
        """Do this module's communication for ``step``. Collective."""
        raise NotImplementedError(f"{type(self).__name__} must implement communicate(step)")

    def state_dict(self) -> dict[str, Any]:
        """This module's state for checkpoints (tensors are returned as they are)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if state:
            raise ValueError(f"{type(self).__name__} has no state but got keys {sorted(state)}")

    def describe(self) -> str:
        """A short label for logs."""
        return f"{type(self).__name__}(H={self.H})"


class Pipeline(Communicator):
    """An ordered list of communicators, itself a :class:`Communicator`."""

    def __init__(self, modules: Sequence[Communicator]) -> None:
        super().__init__(H=1)
        modules = list(modules)
        for m in modules:
            if not isinstance(m, Communicator):
                raise TypeError(f"pipeline modules must be Communicator instances, got {m!r}")
        self.modules = modules

    @property
    def stable_payloads(self) -> bool:  # type: ignore[override]
        return all(m.stable_payloads for m in self.modules)

    def _init_node(self, ctx: NodeContext) -> None:
        super()._init_node(ctx)
        for m in self.modules:
            m._init_node(ctx)
        self._leaves = self.leaves()  # asked at every step by idle_steps

    def leaves(self) -> list[Communicator]:
        """Every non-pipeline module, nested pipelines flattened, in order."""
        out: list[Communicator] = []
        for m in self.modules:
            out.extend(m.leaves() if isinstance(m, Pipeline) else [m])
        return out

    def idle_steps(self, step: int) -> int:
        """The longest span a module declares idle, cut at the first step where another module
        communicates; ``0`` when a gradient-space module would communicate inside the span
        (it needs this node's gradients, so the node trains)."""
        leaves = self._leaves
        if len(leaves) == 1:  # its own idle span ends where it communicates
            return leaves[0].idle_steps(step) if leaves[0].space == "param" else 0
        n = max((m.idle_steps(step) for m in leaves), default=0)
        for s in range(step, step + n):
            due = [m for m in leaves if m.is_due(s)]
            if any(m.space == "grad" for m in due):
                return 0
            if due:
                return s - step + 1
        return n

    def supports_dropout(self) -> bool:
        return all(m.supports_dropout() for m in self.modules)

    def overwritten_at(self, step: int) -> int | None:
        """Where every module due at ``step`` is overwritten at the same later step and the
        node is idle until then (no other module communicates in between)."""
        leaves = self._leaves
        if len(leaves) == 1:  # its own answer keeps the node idle until then
            m = leaves[0]
            return m.overwritten_at(step) if m.space == "param" and m.is_due(step) else None
        due = [m for m in leaves if m.is_due(step)]
        if not due:
            return None
        at = {m.overwritten_at(step) for m in due}
        if len(at) != 1 or None in at:
            return None
        (t,) = at
        return t if self.idle_steps(step + 1) == t - step else None

    @property
    def round_steps(self) -> int | None:
        """The first module's that samples clients (nested pipelines and wrappers included)."""
        return next((m.round_steps for m in self.modules if m.round_steps), None)

    def idle_span_ends(self, step: int, stop: int, read_at: int) -> list[int]:
        """A pipeline of one parameter-space module: that module's (its idle spans end where it
        communicates); else asked span by span."""
        leaves = self._leaves
        if len(leaves) == 1 and leaves[0].space == "param":
            return leaves[0].idle_span_ends(step, stop, read_at)
        return chain_idle_spans(self.idle_steps, self.overwritten_at, step, stop, read_at)

    def sampled_nodes(self, num_nodes: int, seed: int, step: int) -> list[int] | None:
        """A pipeline of one module: that module's; else ``None``."""
        leaves = self.leaves()
        return leaves[0].sampled_nodes(num_nodes, seed, step) if len(leaves) == 1 else None

    def sit_out(self, step: int) -> None:
        for m in self._leaves:
            if m.is_due(step):
                m.sit_out(step)

    def sit_out_rounds(self, steps: Sequence[int]) -> bool:
        """A pipeline of one module at its own communications: that module's; else ``False``."""
        leaves = self._leaves
        if len(leaves) != 1 or not all(leaves[0].is_due(s) for s in steps):
            return False
        return leaves[0].sit_out_rounds(steps)

    def before_optim(self, step: int) -> None:
        for m in self.modules:
            m.before_optim(step)

    def after_optim(self, step: int) -> None:
        for m in self.modules:
            m.after_optim(step)

    def state_dict(self) -> dict[str, Any]:
        return {str(i): m.state_dict() for i, m in enumerate(self.modules)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, m in enumerate(self.modules):
            m.load_state_dict(state.get(str(i), {}))

    def describe(self) -> str:
        return " -> ".join(m.describe() for m in self.modules) or "(no communication)"


class CommunicateOptimizeStrategy(Strategy):
    """A strategy made of communicator modules around the inner optimizer step.

    Gradients are clipped (``max_norm``) after the gradient-space modules, i.e. on what the
    optimizer will apply; a subclass whose modules transform gradients into something else
    (DeMo's signs) sets :attr:`clip_before_communication` to clip the raw local gradients.

    Args:
        communication_modules: the :class:`Communicator` modules, in order.
        optim_spec, lr_scheduler, lr_scheduler_kwargs, max_norm, inner_optim, lr, warmup_steps:
            as for :class:`~exogym.core.strategy.Strategy`.
    """

    def __init__(
        self,
        communication_modules: Sequence[Communicator],
        optim_spec: OptimSpec | str | None = None,
        lr_scheduler: str | type[LRScheduler] | None = None,
        lr_scheduler_kwargs: dict[str, Any] | None = None,
        max_norm: float | None = None,
        *,
        inner_optim: OptimSpec | str | None = None,
        lr: float | None = None,
        warmup_steps: int | None = None,
    ) -> None:
        super().__init__(
            optim_spec,
            lr_scheduler,
            lr_scheduler_kwargs,
            max_norm,
            inner_optim=inner_optim,
            lr=lr,
            warmup_steps=warmup_steps,
        )
        self.pipeline = Pipeline(communication_modules)

    #: Clip the local gradients before the gradient-space modules instead of after them.
    clip_before_communication: bool = False

    @property
    def communication_modules(self) -> list[Communicator]:
        """The modules, in order."""
        return self.pipeline.modules

    def _init_node(self, model: torch.nn.Module, rank: int, num_nodes: int) -> None:
        super()._init_node(model, rank, num_nodes)
        ctx = NodeContext(
            model, rank, num_nodes, self.comm, self.optim, self.seed, self.max_steps, self.steps_per_epoch
        )
        self.pipeline._init_node(ctx)

    def step(self) -> None:
        step = self.local_step
        if self.clip_before_communication:
            self.clip_grad()
        self.pipeline.before_optim(step)
        if not self.clip_before_communication:
            self.clip_grad()
        self.optim.step()
        self.pipeline.after_optim(step)
        super().step()

    def idle_steps(self, step: int) -> int:
        return self.pipeline.idle_steps(step)

    @property
    def round_steps(self) -> int | None:
        """The pipeline's: the period of its first module that samples clients, if any."""
        return self.pipeline.round_steps

    def overwritten_at(self, step: int) -> int | None:
        return self.pipeline.overwritten_at(step)

    def idle_span_ends(self, step: int, stop: int, read_at: int) -> list[int]:
        """The pipeline's (see :meth:`exogym.core.pipeline.Communicator.idle_span_ends`)."""
        return self.pipeline.idle_span_ends(step, stop, read_at)

    def sampled_nodes(self, num_nodes: int, seed: int, step: int) -> list[int] | None:
        """The pipeline's (see :meth:`exogym.core.pipeline.Communicator.sampled_nodes`)."""
        return self.pipeline.sampled_nodes(num_nodes, seed, step)

    def sit_out_rounds(self, steps: Sequence[int]) -> bool:
        """The pipeline's (see :meth:`exogym.core.pipeline.Communicator.sit_out_rounds`); the
        step counter does not move. ``False`` for a subclass that overrides :meth:`idle_step`:
        it sees every round's."""
        if type(self).idle_step is not CommunicateOptimizeStrategy.idle_step:
            return False
        return self.pipeline.sit_out_rounds(steps)

    def idle_step(self, sit_out: bool = False) -> None:
        """The last step of an idle span: no optimizer step; the parameter-space modules due
        now communicate (the node receives what its peers send), or sit it out."""
        if sit_out:
            self.pipeline.sit_out(self.local_step)
        else:
            self.pipeline.after_optim(self.local_step)
        self.skip_steps(1)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "pipeline": self.pipeline.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.pipeline.load_state_dict(state["pipeline"])

    def config(self) -> dict[str, Any]:
        return {**super().config(), "pipeline": self.pipeline.describe()}
