"""Checks that run the user's objects once in the parent, before any node starts.

The model, strategy and datasets travel to the nodes, the model must return a scalar loss, the
strategy must bind to a copy of the model (optimizer, LR schedule, communicator pipeline) and a
resumed run must match its checkpoint: each of these raises here, in the parent, with the
argument named, instead of in every node after the processes started.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
from collections.abc import Callable
from typing import Any

import torch

from exogym import data as D
from exogym.core.server import ServerStrategy, setup_server
from exogym.core.strategy import Strategy
from exogym.projection import NullTransport
from exogym.runtime import checkpoint as ckpt
from exogym.runtime.forward import backward, call, described_call, forward_loss, loss_of
from exogym.runtime.launch import serialize_job

logger = logging.getLogger(__name__)

#: Models whose state is larger than this are not copied for the strategy check in the parent.
DRY_INIT_MAX_BYTES = 256 * 2**20


def check_job(
    model: torch.nn.Module, strategy: Any, train_dataset: Any, val_dataset: Any, num_nodes: int, batch_size: int
) -> None:
    """Raise ``TypeError``/``ValueError`` when ``strategy`` is no
    [`Strategy`][exogym.strategy.Strategy], the model or strategy cannot travel to the nodes, or a
    dataset is unfit for ``num_nodes``."""
    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be an exogym Strategy instance, got {type(strategy).__name__}")
    # The model and strategy travel to the nodes: say now, in their terms, if they cannot
    # (the datasets are checked the same way when the job is sent, still before any start).
    serialize_job((model, strategy))
    D.check_dataset(train_dataset, "train_dataset", num_nodes)
    D.check_dataset(val_dataset, "val_dataset", 1)
    if isinstance(train_dataset, D.Partition):
        train_dataset.check(num_nodes, batch_size)
        train_dataset.log_summary()


def planned_steps(
    model: torch.nn.Module,
    train_dataset: Any,
    num_nodes: int,
    num_epochs: int,
    max_steps: int | None,
    batch_size: int,
    collate_fn: Callable[[list[Any]], Any] = D.collate,
) -> tuple[int | None, int | None]:
    """``(steps per node, steps per epoch)`` for a shared dataset (after checking the model's
    output on a batch made by ``collate_fn``, and the shard size); for a factory,
    ``(max_steps, None)`` (the nodes then agree on them)."""
    if D.is_factory(train_dataset):
        return max_steps, None
    check_model_output(model, train_dataset, collate_fn=collate_fn)
    n = len(train_dataset)
    per_epoch = D.steps_per_epoch(n, True, num_nodes, batch_size)
    if per_epoch < 1:
        raise ValueError(
            f"batch_size={batch_size} is larger than each node's shard "
            f"({-(-n // num_nodes)} examples of {n} over {num_nodes} nodes); lower batch_size or num_nodes"
        )
    return max_steps or per_epoch * num_epochs, per_epoch


def check_model_output(
    model: torch.nn.Module, dataset: Any, collate_fn: Callable[[list[Any]], Any] = D.collate
) -> None:
    """Run ``model`` once on a probe batch of the first two examples of ``dataset`` collated by
    ``collate_fn`` (no grad, eval mode), called and read as the nodes do
    (``exogym.runtime.forward``: ``model(**batch)`` for a mapping batch), and raise
    ``TypeError`` unless it gives a scalar loss. An error in the model is raised as a
    ``RuntimeError`` naming the dataset, the examples and the batch's shapes, with the model's own
    error as its cause."""
    n = min(2, len(dataset))
    batch = collate_fn([dataset[i] for i in range(n)])
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = call(model, D.to_device(batch, next(model.parameters(), torch.empty(0)).device))
    except Exception as e:
        raise RuntimeError(
            f"{described_call(batch)} failed on ExoGym's probe batch, examples 0 to {n - 1} of train_dataset collated "
            f"into a batch of {n} (shapes {_shapes(batch)}), which fit() runs once before starting the nodes: "
            f"{type(e).__name__}: {e}. A {n} in that error is this probe's batch size, not your batch_size; check "
            "that the model accepts what the dataset's examples collate into"
        ) from e
    finally:
        model.train(was_training)
    loss_of(out, batch)


def _shapes(batch: Any) -> Any:
    """A batch's structure with each tensor replaced by its shape (for error messages)."""
    if isinstance(batch, torch.Tensor):
        return tuple(batch.shape)
    if isinstance(batch, dict):
        return {k: _shapes(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_shapes(v) for v in batch]
    return type(batch).__name__


def flops_as_seconds(
    network: Any,
    model: torch.nn.Module,
    train_dataset: Any,
    num_nodes: int,
    batch_size: int,
    collate_fn: Callable[[list[Any]], Any] = D.collate,
) -> Any:
    """``network`` with ``compute="flops"`` turned into seconds per step: one training step's
    forward and backward FLOPs (counted here on node 0's first ``batch_size`` examples, collated
    by ``collate_fn``, as a node counts its first step) over ``flops_per_second``. For strategies
    that follow a simulated timeline, which needs step seconds before the run."""
    import dataclasses

    from torch.utils.data import DataLoader

    ds = D.node_dataset(train_dataset, 0, num_nodes, train=True)
    batch = next(iter(DataLoader(ds, batch_size=batch_size, drop_last=True, collate_fn=collate_fn)))
    probe = copy.deepcopy(model)
    device = next(probe.parameters(), torch.empty(0)).device
    _, flops = backward(functools.partial(forward_loss, probe), batch, 1, device, count_flops=True)
    speed = network.flops_per_second
    logger.info("compute from FLOPs: %.4g FLOPs a step, %.4g s at %g FLOP/s", flops, flops / speed, speed)
    return dataclasses.replace(network, compute=flops / speed)


def check_strategy_builds(
    strategy: Strategy,
    model: torch.nn.Module,
    state_bytes: int,
    num_nodes: int,
    steps: int | None,
    seed: int,
    per_epoch: int | None,
    network: Any = None,
) -> None:
    """Bind a copy of ``strategy`` to a copy of ``model`` (whose state is ``state_bytes``) here,
    as every node does (optimizer, LR schedule, communicator pipeline), so that a bad argument
    raises before any process starts; then warn (one log line each) about periods and warm-ups
    longer than the run, and outer momentum that the run's rounds cannot build up. Skipped where
    the model is too large to copy here."""
    from exogym.core.comm.comm import NodeComm, set_current

    if isinstance(strategy, ServerStrategy):  # its server's settings against the run's, here
        _check_server(strategy, model, num_nodes, seed, per_epoch, network)
    if state_bytes > DRY_INIT_MAX_BYTES:
        return
    dry = copy.deepcopy(strategy)
    comm = NodeComm(0, num_nodes, NullTransport(num_nodes))
    dry._attach(comm, steps or 1, seed, per_epoch or 1, network)
    set_current(comm)
    try:
        dry._init_node(copy.deepcopy(model), 0, num_nodes)
    finally:
        set_current(None)
    if steps is not None:
        _warn_communicators(dry, steps)
        _warn_warmup(dry, steps)


def _check_server(
    strategy: ServerStrategy, model: torch.nn.Module, num_nodes: int, seed: int, per_epoch: int | None, network: Any
) -> None:
    """Set a copy of ``strategy``'s server up for the run (its ``ValueError`` names the setting),
    without starting it. ``per_epoch``: the run's steps per epoch (``None`` for a dataset
    factory, whose clients' data exists only inside the run: the setup is then checked with 1)."""
    from exogym.core.events import flat_params
    from exogym.runtime.server_run import server_context

    tracked = [name for name, m in model.named_modules() if getattr(m, "track_running_stats", False)]
    if tracked:
        raise ValueError(
            f"{type(strategy).__name__} runs as a server and tasks, whose server keeps the model's trainable "
            f"parameters; the model's {tracked[0] or 'root'} ({type(model.get_submodule(tracked[0])).__name__}) "
            "updates running statistics as it trains, which no server would hold: build it with "
            "track_running_stats=False (or a normalization without them, e.g. GroupNorm or LayerNorm)"
        )
    ctx = server_context(network.for_run(num_nodes, seed), num_nodes, seed, flat_params(model), per_epoch or 1)
    setup_server(copy.deepcopy(strategy.server), ctx)


def _warn_communicators(dry: Strategy, steps: int) -> None:
    """Log the communicators whose period ``H`` is longer than the run (the rounds of the
    others), and those whose own optimizer (DiLoCo's outer SGD, one step per round) has a
    momentum that the run's rounds are too few to build up.

    Heavy-ball momentum ``mu`` averages the updates over about ``1 / (1 - mu)`` steps and reaches
    ``1 - mu**n`` of its steady state after ``n``; ``n = 2 / (1 - mu)`` gives about 86%. With fewer
    outer steps the early, large pseudo-gradients dominate the velocity and the average model
    overshoots (the README's DiLoCo sweep: momentum 0.9 with 10 rounds ends at 4x the loss of 0.5).
    """
    from exogym.core.pipeline import CommunicateOptimizeStrategy

    if not isinstance(dry, CommunicateOptimizeStrategy):
        return
    for m in dry.pipeline.leaves():
        if m.H > steps:
            logger.warning(
                "%s communicates every H=%d steps but the run has %d steps: it will never communicate "
                "(0 rounds); give max_steps >= %d or a smaller H",
                m.describe(),
                m.H,
                steps,
                m.H,
            )
        elif m.H > 1:
            logger.info("%s: %d communication rounds in %d steps", m.describe(), steps // m.H, steps)
        momentum = max((g.get("momentum", 0.0) for o in _optimizers(m) for g in o.param_groups), default=0.0)
        if not 0.0 < momentum < 1.0:
            continue
        needed, rounds = math.ceil(round(2 / (1 - momentum), 6)), steps // m.H
        if 0 < rounds < needed:  # no rounds at all: said above
            logger.warning(
                "%s: its optimizer's momentum %g needs about %d steps (2 / (1 - momentum)) to build up, but the run "
                "gives it %d (%d steps / H=%d); short runs with high outer momentum overshoot or diverge: give more "
                "steps, a smaller H, or a smaller outer momentum (exogym compare's DiLoCo uses H=20, momentum 0.5)",
                m.describe(),
                momentum,
                needed,
                rounds,
                steps,
                m.H,
            )


def _optimizers(module: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers a communicator holds as attributes, alone or in a list."""
    found = []
    for value in vars(module).values():
        items = value if isinstance(value, (list, tuple)) else [value]
        found += [o for o in items if isinstance(o, torch.optim.Optimizer)]
    return found


def _warn_warmup(dry: Strategy, steps: int) -> None:
    """Log a learning-rate warm-up longer than the run, with where the rate ends."""
    warmup = dry.lr_scheduler_kwargs.get("warmup_steps")
    peak = dry.optim_spec.lr
    if warmup and warmup > steps and peak:
        dry.skip_steps(steps - 1)  # the schedule as the last step sees it
        logger.warning(
            "the warm-up of %d steps is longer than the run (%d steps): the learning rate ends at %.3g, "
            "%.1f%% of its peak %.3g",
            warmup,
            steps,
            dry.lr,
            100 * dry.lr / peak,
            peak,
        )


def check_resume(folder: str, run: dict[str, Any], strategy: Strategy) -> None:
    """Raise ``ValueError`` when this run cannot continue the checkpoint in ``folder``."""
    meta = ckpt.load_meta(folder)
    ckpt.check_compatible(meta, run, folder)
    # a server algorithm's run writes one file per worker (``workers``), a node's run one per node
    ckpt.verify(folder, meta, int(meta.get("workers", run["num_nodes"])))
    if run["max_steps"] is not None and meta["step"] >= run["max_steps"]:
        raise ValueError(
            f"resume_from={folder!r} is at step {meta['step']}, and this run has max_steps={run['max_steps']}: "
            "nothing to train; pass a larger max_steps"
        )
    if meta.get("max_steps") != run["max_steps"] and strategy.lr_scheduler is not None:
        logger.warning(
            "resuming a run of max_steps=%s with max_steps=%s: the LR schedule follows the new length, so the "
            "result differs from a run that had max_steps=%s from the start",
            meta.get("max_steps"),
            run["max_steps"],
            run["max_steps"],
        )
    logger.info("resuming from %s (step %d)", folder, meta["step"])
