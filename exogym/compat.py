"""Every legacy and alias spelling ExoGym accepts, in one place.

Scripts written for the original exo gym (``exo-explore/gym``) run unchanged; the canonical
modules keep one name per concept and accept the older spellings only through this module.

**Import paths** (thin modules that re-export the canonical classes):

=================================================  =============================================
legacy path                                        canonical
=================================================  =============================================
``exogym.strategy.strategy.Strategy``              ``exogym.core.strategy.Strategy``
``exogym.strategy.strategy.SimpleReduceStrategy``  ``exogym.strategy.SimpleReduceStrategy``
``exogym.strategy.sparta_diloco``                  ``exogym.strategy.SPARTADiLoCoStrategy``
``exogym.strategy.communicate_optimize_strategy``  ``exogym.strategy.CommunicateOptimizeStrategy``,
                                                   ``CommunicationModule`` (below)
``exogym.trainer.LocalTrainer``                    ``exogym.Trainer``
``exogym.tasks.load_task``                         ``exogym.tasks.load``
=================================================  =============================================

**Strategy keywords** (``STRATEGY_KEYWORDS``, applied by ``legacy_keywords`` to every
preset): ``inner_optim_spec`` is ``optim_spec``; ``outer_optim_spec`` is ``outer_optim``.
The original exo gym's spellings ``inner_optim`` (``optim_spec``), ``inner_lr`` (``lr``),
``compression_method`` (``sparsification_mode``) and ``sparsification_rate`` (``p``) are taken
by the constructors themselves and listed in ``docs/algorithms/index.md``.

**fit** (``legacy_fit_order``, ``resolve_fit_legacy``): the positional order
``fit(num_epochs, strategy, num_nodes, max_steps)``; ``save_dir`` (where checkpoints go:
``checkpoint_dir``); ``checkpoint_interval`` without a folder writes to ``./checkpoints``, the
original's default ``save_dir``; ``correlation_interval`` (the model correlation is logged with
every validation, so it sets ``val_interval`` when that is not given); ``wandb_project`` (a
[`WandbLogger`][exogym.logger.WandbLogger] for that project, named ``run_name``).
``Trainer(start_port=...)`` is accepted and ignored: ExoGym finds its own ports.
``fit(offload_idle_nodes=True)`` is accepted and does nothing but log a warning
(``offload_idle_nodes``): every node of a lock-step run trains every step, and sampled clients
run as a server's tasks, where a client not drawn is never built.

**Optimizers**: ``OptimSpec.build(model)`` builds over the model's parameters, as the original's
strategies call it in ``_init_node``
([`exogym.core.optim.OptimSpec.build`][exogym.strategy.OptimSpec.build] takes a model, or parameters
or param groups as a torch optimizer does); ``Strategy._setup_scheduler()`` builds the LR
scheduler again for the optimizer a strategy built itself, as the original's strategies call it
after ``build``.

**Communicators**: ``_init_node(ctx)`` is [`setup`][communicators.Communicator.setup]
(a subclass may define either; the pipeline calls the one it defines); ``supports_dropout``
defined as a method is read as the capability it returns
(``exogym.core.communicator.supports_dropout``); ``QuantizeCommunicator(inner, fmt)`` is
the [`Quantize`][communicators.Quantize] wire transform applied to one module. A class that sets
``stable_payloads``, ``locates_payloads`` or ``coded_payloads`` is refused naming the
``payloads`` value that says the same (``exogym.core.communicator.PAYLOAD_FLAGS``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from exogym.config import positive_int
from exogym.core.pipeline import Communicator, NodeContext

logger = logging.getLogger(__name__)

#: Legacy strategy keyword -> canonical keyword.
STRATEGY_KEYWORDS = {"inner_optim_spec": "optim_spec", "outer_optim_spec": "outer_optim"}
#: Where ``checkpoint_interval`` alone writes, as the original's default ``save_dir``.
LEGACY_SAVE_DIR = "./checkpoints"

T = TypeVar("T")


def legacy_keywords(cls: type[T]) -> type[T]:
    """Class decorator: ``cls(...)`` accepts the ``STRATEGY_KEYWORDS`` legacy spellings for
    the keywords its constructor takes (giving both spellings raises ``TypeError``); a
    ``__new__`` of the class's own gets them folded too."""
    import inspect

    init = cls.__init__  # type: ignore[misc]
    params = inspect.signature(init).parameters
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())

    def folding(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapped(first: Any, *args: Any, **kwargs: Any) -> Any:
            for old, new in STRATEGY_KEYWORDS.items():
                if old in kwargs and (new in params or takes_kwargs):
                    if new in kwargs:
                        raise TypeError(f"give {new} or its legacy spelling {old}, not both")
                    kwargs[new] = kwargs.pop(old)
            return method(first, *args, **kwargs)

        return wrapped

    cls.__init__ = folding(init)  # type: ignore[misc]
    if "__new__" in vars(cls):
        cls.__new__ = staticmethod(folding(vars(cls)["__new__"].__func__))  # type: ignore[assignment]
    return cls


def legacy_fit_order(strategy: Any, num_nodes: Any, num_epochs: Any) -> tuple[Any, Any, Any]:
    """``(strategy, num_nodes, num_epochs)`` from ``fit``'s first three arguments, which the
    original exo gym took as ``fit(num_epochs, strategy, num_nodes)``: an int first and a
    strategy second mean that order."""
    from exogym.core.strategy import Strategy

    if isinstance(num_nodes, Strategy) and isinstance(strategy, int) and not isinstance(strategy, bool):
        return num_nodes, num_epochs, strategy
    return strategy, num_nodes, num_epochs


def offload_idle_nodes(value: Any) -> None:
    """``fit(offload_idle_nodes=...)``: ``TypeError`` unless a bool; where ``True``, a warning
    that it has no effect (no node of a run sits steps out: sampled clients are a server's
    tasks, and only the drawn ones are built)."""
    if not isinstance(value, bool):
        raise TypeError(f"offload_idle_nodes must be True or False, got {value!r}")
    if value:
        logger.warning(
            "offload_idle_nodes=True has no effect: every node of a lock-step run trains every step, and sampled "
            "clients (FedAvgStrategy(client_sampling=...)) run as a server's tasks, where only the drawn clients "
            "are built; drop the argument"
        )


def resolve_fit_legacy(
    checkpoint_dir: str | None,
    checkpoint_interval: int | None,
    val_interval: int | None,
    logger_arg: Any,
    run_name: str | None,
    save_dir: str | None,
    correlation_interval: int | None,
    wandb_project: str | None,
) -> tuple[str | None, int | None, Any]:
    """``(checkpoint_dir, val_interval, logger)`` once the legacy ``fit`` keywords are folded in.
    Raises ``TypeError``/``ValueError`` naming ``checkpoint_interval`` or ``correlation_interval``
    unless each is ``None`` or an int >= 1."""
    positive_int(checkpoint_interval, "checkpoint_interval", allow_none=True)
    positive_int(correlation_interval, "correlation_interval", allow_none=True)
    if save_dir is not None:
        if checkpoint_dir is not None and checkpoint_dir != save_dir:
            raise TypeError(
                f"give checkpoint_dir or its legacy spelling save_dir, not both ({checkpoint_dir!r}, {save_dir!r})"
            )
        checkpoint_dir = save_dir if checkpoint_interval is not None else checkpoint_dir
    if checkpoint_interval is not None and checkpoint_dir is None:
        checkpoint_dir = LEGACY_SAVE_DIR
        logger.info("checkpoint_interval=%d without checkpoint_dir: writing to %s", checkpoint_interval, checkpoint_dir)
    if correlation_interval is not None and val_interval is None:
        val_interval = correlation_interval  # model_correlation comes with every validation
    if wandb_project is not None:
        if logger_arg not in (None, "wandb"):
            raise TypeError(f"give logger={logger_arg!r} or wandb_project={wandb_project!r}, not both")
        from exogym.logger import WandbLogger

        logger_arg = WandbLogger(project=wandb_project, experiment_name=run_name)
    return checkpoint_dir, val_interval, logger_arg


class CommunicationModule(Communicator):
    """The original exo gym's communication module, for modules written against it.

    A subclass implements ``communicate(model, rank, num_nodes, local_step)`` (called after every
    optimizer step, ``local_step`` counting from 0) and may implement
    ``_init_node(model, rank, num_nodes)``. Collectives go through
    ``exogym.strategy.communicate`` (``all_reduce`` etc.), which charges the ledger. New
    modules subclass [`Communicator`][communicators.Communicator] instead.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(H=1)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        legacy_init: Callable[..., None] | None = cls.__dict__.get("_init_node")
        if legacy_init is None:
            return

        def _init_node(self: Any, ctx: Any, rank: int | None = None, num_nodes: int | None = None) -> None:
            if isinstance(ctx, NodeContext):  # bound by the pipeline
                Communicator._init_node(self, ctx)
                legacy_init(self, ctx.model, ctx.rank, ctx.num_nodes)
            else:
                legacy_init(self, ctx, rank, num_nodes)

        cls._init_node = _init_node  # type: ignore[method-assign]

    def _init_node(self, ctx: NodeContext) -> None:  # type: ignore[override]
        super()._init_node(ctx)

    def _run(self, space: str, step: int) -> None:
        """After every optimizer step: the original's ``communicate(model, rank, num_nodes, local_step)``."""
        if space == "param":
            self.communicate(self.ctx.model, self.ctx.rank, self.ctx.num_nodes, step)  # type: ignore[call-arg]

    def communicate(self, model: Any, rank: int, num_nodes: int, local_step: int) -> None:  # type: ignore[override]
        raise NotImplementedError(
            f"{type(self).__name__} must implement communicate(model, rank, num_nodes, local_step)"
        )


__all__ = [
    "LEGACY_SAVE_DIR",
    "STRATEGY_KEYWORDS",
    "CommunicationModule",
    "legacy_fit_order",
    "legacy_keywords",
    "offload_idle_nodes",
    "resolve_fit_legacy",
]
