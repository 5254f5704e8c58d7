"""The communicator pipeline: ``Communicator`` modules around the inner optimizer step.

``CommunicateOptimizeStrategy`` runs, every step::

    gradient-space modules due at this step (DDP, DCT top-k), in order
    clip gradients; optimizer.step()
    parameter-space modules due at this step (averaging, DiLoCo), in order

A module decides from its own schedule (``H``) whether this step communicates, and keeps its
own state (``state_dict``/``load_state_dict``). [`Pipeline`][communicators.Pipeline] is itself a
``Communicator``, so pipelines nest. The [`Communicator`][communicators.Communicator] base lives in
``exogym.core.communicator`` and is re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from exogym.core.communicator import Communicator, NodeContext, Wrapper, needs_step_seconds, supports_dropout
from exogym.core.optim import OptimSpec
from exogym.core.strategy import Strategy
from exogym.core.wire import Wire, WireComm


class Pipeline(Communicator):
    """An ordered list of communicators, itself a [`Communicator`][communicators.Communicator]
    (pipelines nest). Its lifecycle (setup, finish, state) is its modules', in order."""

    def __init__(self, modules: Sequence[Communicator]) -> None:
        super().__init__(H=1)
        modules = list(modules)
        for m in modules:
            if not isinstance(m, Communicator):
                raise TypeError(f"pipeline modules must be Communicator instances, got {m!r}")
        self.modules = modules

    @property  # type: ignore[override]
    def supports_dropout(self) -> bool:
        return all(supports_dropout(m) for m in self.modules)

    @property
    def needs_step_seconds(self) -> bool:
        return any(needs_step_seconds(m) for m in self.modules)

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        for m in self.modules:
            m._init_node(ctx)

    def leaves(self) -> list[Communicator]:
        """Every module that communicates, nested pipelines and wrappers flattened, in order."""
        return self._leaves()

    def _leaves(self) -> list[Communicator]:
        return [leaf for m in self.modules for leaf in m._leaves()]

    def is_due(self, step: int) -> bool:
        return any(m.is_due(step) for m in self.modules)

    def _run(self, space: str, step: int) -> None:
        for m in self.modules:
            m._run(space, step)

    def communicate(self, step: int) -> None:
        """Every module due at ``step``, gradient-space ones first."""
        self._run("grad", step)
        self._run("param", step)

    def finish(self) -> None:
        """Every module's [`finish`][communicators.Communicator.finish], in order. Collective."""
        for m in self.modules:
            m.finish()

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
    (DeMo's signs) sets ``clip_before_communication`` to clip the raw local gradients.

    Args:
        communication_modules: the [`Communicator`][communicators.Communicator] modules, in order.
        optim_spec, lr_scheduler, lr_scheduler_kwargs, max_norm, inner_optim, lr, warmup_steps:
            as for [`Strategy`][exogym.strategy.Strategy].
        wire: a transform of every payload the modules send (e.g.
            [`communicators.quantize.Int8`][communicators.Int8]), or ``None``.
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
        wire: Wire | None = None,
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
        if wire is not None and not isinstance(wire, Wire):
            raise TypeError(f"wire must be a Wire (e.g. communicators.quantize.Int8()), got {wire!r}")
        self.pipeline = Pipeline(communication_modules)
        for module in self.pipeline.leaves() if wire is not None else []:
            wire.check(module)
        self.wire = wire
        self.wire_comm: WireComm | None = None

    #: Clip the local gradients before the gradient-space modules instead of after them.
    clip_before_communication: bool = False

    @property
    def needs_step_seconds(self) -> bool:
        return self.pipeline.needs_step_seconds

    @property
    def communication_modules(self) -> list[Communicator]:
        """The modules, in order."""
        return self.pipeline.modules

    def _init_node(self, model: torch.nn.Module, rank: int, num_nodes: int) -> None:
        super()._init_node(model, rank, num_nodes)
        comm = self.comm
        if self.wire is not None:
            comm = self.wire_comm = self.wire.wrap(comm)
        ctx = NodeContext(
            model,
            rank,
            num_nodes,
            comm,
            self.optim,
            self.seed,
            self.max_steps,
            self.steps_per_epoch,
            self.network,
            self.adversaries,
        )
        self.pipeline._init_node(ctx)

    def communicate_phase(self, space: str, step: int) -> None:
        """Run the modules of ``space`` (``"grad"`` or ``"param"``) due at ``step``. Collective."""
        if self.wire_comm is not None:
            self.wire_comm.begin_phase()
        self.pipeline._run(space, step)

    def step(self) -> None:
        step = self.local_step
        if self.clip_before_communication:
            self.clip_grad()
        self.communicate_phase("grad", step)
        if not self.clip_before_communication:
            self.clip_grad()
        self.optim.step()
        self.communicate_phase("param", step)
        super().step()

    def finish(self) -> None:
        """Every module's [`finish`][communicators.Communicator.finish]. Collective."""
        if self.wire_comm is not None:
            self.wire_comm.begin_phase()
        self.pipeline.finish()

    def state_dict(self) -> dict[str, Any]:
        state = {**super().state_dict(), "pipeline": self.pipeline.state_dict()}
        if self.wire_comm is not None:
            state["wire"] = self.wire_comm.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.pipeline.load_state_dict(state["pipeline"])
        if self.wire_comm is not None:
            self.wire_comm.load_state_dict(state.get("wire", {}))

    def config(self) -> dict[str, Any]:
        wire = {} if self.wire is None else {"wire": self.wire.describe()}
        return {**super().config(), "pipeline": self.pipeline.describe(), **wire}


__all__ = [
    "CommunicateOptimizeStrategy",
    "Communicator",
    "NodeContext",
    "Pipeline",
    "Wrapper",
    "supports_dropout",
]
