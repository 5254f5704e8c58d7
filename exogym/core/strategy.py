"""The ``Strategy`` base class: inner optimizer, LR schedule, clipping and the step counter.

A strategy is constructed in the user's process (configuration only), pickled into every node,
and bound there: the node calls ``Strategy._attach`` and then ``Strategy._init_node``,
which builds the optimizer over that node's model copy. Custom strategies subclass it::

    class MyStrategy(Strategy):
        def step(self):
            self.communicate_gradients()   # mean of the gradients over all nodes (charged)
            self.update_parameters()       # clip (max_norm) and the inner optimizer's step
            super().step()                 # LR schedule + step counter

The strategy owns the node's step counter (``Strategy.local_step``): ``super().step()``
advances it, and a server run advances a client's to the tick its task starts at
([`Strategy.skip_steps`][exogym.strategy.Strategy.skip_steps]).

Every rank runs the same code; there is no master rank.
"""

from __future__ import annotations

import inspect
import warnings
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from exogym.core.comm.comm import Comm
from exogym.core.comm.flat import Bucket, dtype_buckets
from exogym.core.optim import OptimSpec
from exogym.core.params import ModelParameters
from exogym.core.schedule import build_scheduler, check_scheduler

#: The inner optimizer when none is given.
DEFAULT_OPTIM = OptimSpec(torch.optim.AdamW, lr=1e-3)


def check_strategy_kwargs(owner: object, kwargs: dict[str, Any]) -> None:
    """Raise ``TypeError`` naming ``owner``'s class (what the user typed; ``owner`` is an instance
    or the class itself), not a base class, for a keyword that neither that class's constructor
    nor [`Strategy`][exogym.strategy.Strategy] takes (presets pass ``Strategy``'s keywords on as
    ``**strategy_kwargs``), with the closest valid spelling (``DiLoCoStrategy(h=10)``: did you
    mean 'H'?)."""
    keywords = [n for n in inspect.signature(Strategy.__init__).parameters if n != "self"]
    unknown = [k for k in kwargs if k not in keywords]
    if not unknown:
        return
    from exogym.keywords import unexpected_keyword

    cls = owner if isinstance(owner, type) else type(owner)
    own = [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "strategy_kwargs")]
    valid = own + [k for k in keywords if k not in own]
    raise unexpected_keyword(f"{cls.__name__}()", unknown[0], valid)


class Strategy(ABC):
    """Base of every strategy: owns the inner optimizer, LR schedule, clipping and step count.

    Args:
        optim_spec: the inner optimizer (``OptimSpec``, or a name such as ``'adamw'``);
            AdamW with lr 1e-3 when omitted. ``inner_optim`` is an accepted alias.
        lr_scheduler: ``'lambda_cosine'`` (alias ``'cosine'``), ``'constant'``/``None``, or any
            torch ``LRScheduler`` class (built with ``lr_scheduler_kwargs``).
        lr_scheduler_kwargs: for ``'lambda_cosine'``: ``warmup_steps``, ``cosine_anneal``,
            ``min_lr_factor``; for a class: its constructor keywords.
        max_norm: clip the gradient norm to this before the optimizer step (``None``: no clipping).
        inner_optim: alias of ``optim_spec`` (the original exo gym uses both); give at most one.
        lr: overrides the optimizer spec's learning rate.
        warmup_steps: shortcut for ``lr_scheduler_kwargs['warmup_steps']``; without a scheduler it
            selects ``'lambda_cosine'`` with ``cosine_anneal=False`` (warmup, then flat).

    Raises:
        TypeError: for unknown or conflicting keywords.
    """

    #: The run's network, given by ``_attach`` (``None`` until then or where none is given).
    network: Any = None
    #: The run's malicious nodes ([`AdversaryPlan`][exogym.adversaries.AdversaryPlan]), given by
    #: ``_attach`` (``None``: every node is honest).
    adversaries: Any = None

    def __init__(
        self,
        optim_spec: OptimSpec | str | None = None,
        lr_scheduler: str | type[LRScheduler] | None = None,
        lr_scheduler_kwargs: dict[str, Any] | None = None,
        max_norm: float | None = None,
        *,
        inner_optim: OptimSpec | str | None = None,
        lr: float | None = None,
        warmup_steps: int | None = None,
    ) -> None:
        if optim_spec is not None and inner_optim is not None:
            raise TypeError("give the inner optimizer once: optim_spec or its alias inner_optim, not both")
        spec = OptimSpec.coerce(optim_spec if optim_spec is not None else inner_optim, DEFAULT_OPTIM)
        if lr is not None and not (isinstance(lr, (int, float)) and lr >= 0):
            raise ValueError(f"lr must be a non-negative number, got {lr!r}")
        self.optim_spec = spec.replace(lr=lr) if lr is not None else spec
        if self.optim_spec.lr is not None and not self.optim_spec.lr >= 0:
            raise ValueError(f"the optimizer's lr must be >= 0, got {self.optim_spec.lr!r} ({self.optim_spec!r})")
        if warmup_steps is not None and (not isinstance(warmup_steps, int) or warmup_steps < 0):
            raise ValueError(f"warmup_steps must be a non-negative int, got {warmup_steps!r}")
        kwargs = dict(lr_scheduler_kwargs or {})
        if warmup_steps is not None:
            kwargs["warmup_steps"] = warmup_steps
            if lr_scheduler is None:
                lr_scheduler = "lambda_cosine"
                kwargs.setdefault("cosine_anneal", False)
        check_scheduler(lr_scheduler, kwargs)
        if max_norm is not None and max_norm <= 0:
            raise ValueError(f"max_norm must be positive or None, got {max_norm}")
        self.lr_scheduler = lr_scheduler
        self.lr_scheduler_kwargs = kwargs
        self.max_norm = max_norm
        self.max_steps = 1
        self.seed = 0
        self.steps_per_epoch = 1
        self.local_step = 0

    #: The strategy's communicator pipeline where it has one
    #: (``CommunicateOptimizeStrategy``); the runtime reads the modules' periods from it (the
    #: rounds of fault injection).
    pipeline: Any = None

    # -- binding inside a node --------------------------------------------------------------
    def _attach(
        self, comm: Comm, max_steps: int, seed: int, steps_per_epoch: int, network: Any = None, adversaries: Any = None
    ) -> None:
        """Give the strategy its node's communication object, run length, shared seed, the
        number of steps per epoch, the run's network (``None``: none given) and its malicious
        nodes (``None``: none).

        Called by the node before ``_init_node``; every argument is the same on every rank.
        """
        self.comm = comm
        self.max_steps = max_steps
        self.seed = seed
        self.steps_per_epoch = steps_per_epoch
        self.network = network
        self.adversaries = adversaries

    def _init_node(self, model: torch.nn.Module, rank: int, num_nodes: int) -> None:
        """Bind to this node's model: build the optimizer and the LR scheduler.

        Subclasses that override it must call ``super()._init_node(model, rank, num_nodes)`` first.
        """
        self.model = model
        self.rank = rank
        self.num_nodes = num_nodes
        self.local_step = 0
        # the model's parameters, with the model: an optimizer may treat them by role (MuonAdamW)
        self.optim = self.optim_spec.build(ModelParameters(model))
        self._buckets: list[Bucket] | None = None  # communicate_gradients/models' flat buffers
        self._setup_scheduler()

    def _setup_scheduler(self) -> None:
        """Build the LR scheduler for ``self.optim`` as it is: ``_init_node`` does, and a subclass
        that replaces the optimizer in its ``_init_node`` calls this again after (the original exo
        gym's spelling; see ``exogym.compat``)."""
        self.scheduler = build_scheduler(self.optim, self.lr_scheduler, self.lr_scheduler_kwargs, self.max_steps)

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """Alias of ``self.optim`` (the original exo gym uses both)."""
        return self.optim

    # -- per step ---------------------------------------------------------------------------
    def zero_grad(self) -> None:
        """Clear the gradients of the inner optimizer's parameters."""
        self.optim.zero_grad()

    def clip_grad(self) -> None:
        """Clip the model's gradient norm to ``max_norm`` in place (no-op when it is ``None``)."""
        if self.max_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)

    @abstractmethod
    def step(self) -> None:
        """Communicate and update the model; subclasses end with ``super().step()``, which
        advances the LR schedule and ``local_step``."""
        if self.scheduler is not None:
            self.scheduler.step()
        self.local_step += 1

    @property
    def needs_step_seconds(self) -> bool:
        """Whether the strategy follows a simulated timeline that needs every node's step
        seconds before the run (see ``exogym.core.communicator.needs_step_seconds``)."""
        return False

    @property
    def follows_availability(self) -> bool:
        """Whether the strategy follows the network's availability trace in its own timeline
        (a server algorithm reads it from its network; lock-step pipelines have the trace turned
        into rounds nodes drop out of)."""
        return False

    def finish(self) -> None:
        """End of the run, after the last step and its checkpoint, before the final state is
        read: nothing, unless a strategy has work left (the asynchronous ones apply the updates
        still in flight). Collective: every rank calls it."""
        return None

    def run_summary(self) -> dict[str, Any]:
        """What the strategy reports of the run as a whole on rank 0, beside the metric rows
        (``Trainer.result["summary"]``): ``{}`` unless a strategy says more (the asynchronous
        ones: every node's steps and the staleness of the updates)."""
        return {}

    def skip_steps(self, n: int) -> None:
        """Advance the step counter and the LR schedule by ``n`` steps without computing or
        communicating (the runtime's: a client's counter at the tick its task starts)."""
        if n <= 0:
            return
        self.local_step += n
        sched = self.scheduler
        if sched is None:
            return
        with warnings.catch_warnings():
            # "lr_scheduler.step() before optimizer.step()": a node that has not trained yet.
            warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*", category=UserWarning)
            if type(sched) is LambdaLR:  # closed form: jump straight to the step
                sched.last_epoch += n - 1
                sched.step()
            else:
                for _ in range(n):
                    sched.step()

    # -- helpers for custom strategies ------------------------------------------------------
    def communicate_gradients(self) -> None:
        """Replace every parameter's gradient by its mean over all nodes: one all-reduce per
        dtype through a flat buffer, charged to the ledger. Collective: every rank must call it
        on the same steps."""
        self._average(grads=True)

    def communicate_models(self) -> None:
        """Replace the parameters by their mean over all nodes (in place), charged like
        [`communicate_gradients`][exogym.strategy.Strategy.communicate_gradients]. Collective."""
        self._average(grads=False)

    def update_parameters(self) -> None:
        """Clip the gradients (``max_norm``) and take the inner optimizer's step."""
        self.clip_grad()
        self.optim.step()

    @torch.no_grad()
    def _average(self, grads: bool) -> None:
        if self._buckets is None:
            self._buckets = dtype_buckets([p for p in self.model.parameters() if p.requires_grad])
        tag = "average_grads" if grads else "average_params"
        for bucket in self._buckets:
            if grads:
                for p in bucket.tensors:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
            tensors = [p.grad for p in bucket.tensors] if grads else bucket.tensors
            self.comm.all_reduce(bucket.buffer.pack(tensors), op="mean", tag=tag)
            bucket.buffer.unpack(tensors)

    @property
    def lr(self) -> float:
        """The inner optimizer's current learning rate (first parameter group)."""
        return float(self.optim.param_groups[0]["lr"])

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, scheduler and step counter, for checkpoints."""
        return {
            "optim": self.optim.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "local_step": self.local_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what [`state_dict`][exogym.strategy.Strategy.state_dict] returned (after
        ``_init_node``)."""
        self.optim.load_state_dict(state["optim"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.local_step = state["local_step"]

    def config(self) -> dict[str, Any]:
        """Hyperparameters for logs."""
        return {
            "strategy": type(self).__name__,
            "optim": repr(self.optim_spec),
            "lr_scheduler": getattr(self.lr_scheduler, "__name__", self.lr_scheduler),
            "max_norm": self.max_norm,
        }
