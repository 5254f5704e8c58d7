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

from exogym.core.communicator import Communicator, NodeContext, Participation, Wrapper, supports_dropout
from exogym.core.optim import OptimSpec
from exogym.core.strategy import Strategy
from exogym.core.wire import Wire, WireComm


class Pipeline(Communicator):
    """An ordered list of communicators, itself a [`Communicator`][communicators.Communicator]
    (pipelines nest).

    Its participation statement combines its modules' by one rule: the parameter-space modules
    that declare one must agree on the period; a node trains in the round if every one of them
    lets it train, and a non-participant's state is replaced if every one of them replaces it.
    Modules with different periods give no statement (every node trains).
    """

    def __init__(self, modules: Sequence[Communicator]) -> None:
        super().__init__(H=1)
        modules = list(modules)
        for m in modules:
            if not isinstance(m, Communicator):
                raise TypeError(f"pipeline modules must be Communicator instances, got {m!r}")
        self.modules = modules

    @property  # type: ignore[override]
    def stable_payloads(self) -> bool:
        return all(m.stable_payloads for m in self.modules)

    @property  # type: ignore[override]
    def supports_dropout(self) -> bool:
        return all(supports_dropout(m) for m in self.modules)

    @property  # type: ignore[override]
    def locates_payloads(self) -> bool:
        return all(m.stable_payloads or m.locates_payloads for m in self.modules)

    @property  # type: ignore[override]
    def needs_step_seconds(self) -> bool:
        return any(m.needs_step_seconds for m in self.modules)

    @property  # type: ignore[override]
    def coded_payloads(self) -> bool:
        return any(m.coded_payloads for m in self.modules)

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        for m in self.modules:
            m.bind(ctx)

    def leaves(self) -> list[Communicator]:
        """Every module that communicates, nested pipelines and wrappers flattened, in order."""
        return [leaf for m in self.modules for leaf in m.leaves()]

    def is_due(self, step: int) -> bool:
        return any(m.is_due(step) for m in self.modules)

    def run(self, space: str, step: int) -> None:
        for m in self.modules:
            m.run(space, step)

    def communicate(self, step: int) -> None:
        """Every module due at ``step``, gradient-space ones first."""
        self.run("grad", step)
        self.run("param", step)

    def participation(self, step: int, num_nodes: int, seed: int) -> Participation | None:
        stated = [
            checked_statement(m, p, num_nodes)
            for m in self.leaves()
            if (p := m.participation(step, num_nodes, seed)) is not None
        ]
        if not stated:
            return None
        if len(stated) == 1:
            return stated[0]
        if len({p.period for p in stated}) != 1:
            return None
        trains = frozenset.intersection(*(p.trains for p in stated))
        return Participation(stated[0].period, trains, all(p.replaces for p in stated))

    def finish(self) -> None:
        """Every module's [`finish`][communicators.Communicator.finish], in order. Collective."""
        for m in self.modules:
            m.finish()

    def summary(self) -> dict[str, Any]:
        """The modules' summaries merged in order (a later module's keys win)."""
        out: dict[str, Any] = {}
        for m in self.modules:
            out.update(m.summary())
        return out

    def state_dict(self) -> dict[str, Any]:
        return {str(i): m.state_dict() for i, m in enumerate(self.modules)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, m in enumerate(self.modules):
            m.load_state_dict(state.get(str(i), {}))

    def describe(self) -> str:
        return " -> ".join(m.describe() for m in self.modules) or "(no communication)"


#: Statements found valid lately, by ``id``: (the statement, what it was checked for). A module
#: that keeps its statements (a simulated timeline's, one per tick) is asked the same ones by
#: every node of a worker, again and again.
_VALID: dict[int, tuple[Participation, tuple[Any, ...]]] = {}
_VALID_MAX = 4096


def checked_statement(module: Communicator, statement: Any, num_nodes: int) -> Participation:
    """``statement`` after checking that it is one ``module`` can make (``ValueError`` or
    ``TypeError`` naming the module and the fix otherwise)."""
    key = (module.space, module.H, num_nodes)
    hit = _VALID.get(id(statement))
    if hit is not None and hit[0] is statement and hit[1] == key:
        return statement
    if (
        type(statement) is Participation
        and module.space == "param"
        and statement.period == module.H
        and statement.trains
        and all(type(r) is int and 0 <= r < num_nodes for r in statement.trains)
    ):
        if len(_VALID) >= _VALID_MAX:
            _VALID.clear()
        _VALID[id(statement)] = (statement, key)  # (holds it: its id is not reused meanwhile)
        return statement
    name = module.describe()
    if not isinstance(statement, Participation):
        raise TypeError(
            f"{name}.participation() must return a Participation(period, trains, replaces) or None, "
            f"got {type(statement).__name__}"
        )
    if module.space != "param":
        raise ValueError(
            f"{name} states who trains in a round, but only parameter-space modules (space='param') can leave "
            "nodes idle: a gradient-space module needs every node's gradients"
        )
    if statement.period != module.H:
        raise ValueError(
            f"{name}.participation() gives period={statement.period}, but the module communicates every "
            f"H={module.H} steps: a round is the module's period"
        )
    if not statement.trains or not all(isinstance(r, int) and 0 <= r < num_nodes for r in statement.trains):
        raise ValueError(
            f"{name}.participation() must name at least one node that trains, all ranks in [0, {num_nodes}); "
            f"got trains={sorted(statement.trains, key=repr)}"
        )
    return statement


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
        )
        self.pipeline.bind(ctx)

    def communicate_phase(self, space: str, step: int) -> None:
        """Run the modules of ``space`` (``"grad"`` or ``"param"``) due at ``step``. The
        runtime calls it for the parameter-space phase of an idle node's round end. Collective."""
        if self.wire_comm is not None:
            self.wire_comm.begin_phase()
        self.pipeline.run(space, step)

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
        """Every module's [`finish`][communicators.Communicator.finish] (the asynchronous servers
        apply the updates still in flight). Collective."""
        if self.wire_comm is not None:
            self.wire_comm.begin_phase()
        self.pipeline.finish()

    def run_summary(self) -> dict[str, Any]:
        """The modules' [`summary`][communicators.Communicator.summary], merged."""
        return self.pipeline.summary()

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
    "Participation",
    "Pipeline",
    "Wrapper",
    "supports_dropout",
]
