"""``RunPlan``: what ``Trainer.fit`` derives from its checked sections before anything starts.

::

    args = FitArgs(RunConfig(num_nodes=4), ...)        # exogym.run_config: values checked
    plan = plan_run(model, train, val, strategy, args)  # the machine, the data, the strategy
    ...                                                 # a launcher runs plan.config's nodes

The plan resolves the device, the workers and their layout (local processes or ``torchrun``
ranks), the steps and the minibatch, the fault rounds and the checkpoint to resume from; it
binds the strategy to a copy of the model once (``exogym.runtime.preflight``), places the
nodes on the workers and makes the transport last, so that nothing is left open when a check
fails.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from exogym import data as D
from exogym.adversaries import Adversaries
from exogym.config import FitConfig, positive_int, resolve_autocast, resolve_device
from exogym.core.comm.network import Network
from exogym.core.comm.plan import TransportPlan, resolve_kind
from exogym.core.server import ServerStrategy
from exogym.core.strategy import Strategy
from exogym.logger import Logger, default_run_name
from exogym.projection import Projection, param_bytes, probe
from exogym.run_config import CheckpointConfig, FitArgs, RunConfig, TransportConfig
from exogym.runs import check_writable_folder
from exogym.runtime import checkpoint as ckpt
from exogym.runtime import cluster, pool, preflight
from exogym.runtime.faults import FaultPlan, Faults, check_can_drop, check_supported, round_steps, with_availability
from exogym.runtime.launch import start_processes_server
from exogym.runtime.memory import device_budget, probe_minibatch_size
from exogym.runtime.placement import Placement
from exogym.runtime.server_run import step_seconds

logger = logging.getLogger(__name__)


@dataclass
class Layout:
    """Where the nodes run.

    Attributes:
        workers: W, the processes that host the nodes (torchrun's world size under torchrun).
        gpus: the CUDA devices the run may use (1 off CUDA).
        transport: the resolved transport: ``'shm'``, ``'gloo'`` or ``'nccl'``.
        devices: the CUDA indices the workers use (under torchrun: this rank's), or ``None``.
        threads_per_worker: intra-op threads per worker (the workers on this machine share its cores).
        launch: this process's place in a ``torchrun`` launch, or ``None`` for local workers.
        mode: ``'deploy'`` or ``'simulate'`` under torchrun, else ``None``.
    """

    workers: int
    gpus: int
    transport: str
    devices: tuple[int, ...] | None
    threads_per_worker: int
    launch: cluster.LaunchEnv | None = None
    mode: str | None = None


@dataclass
class RunPlan:
    """A run ready to launch.

    Attributes:
        config: the settings every node reads.
        transport: how the workers talk (close it in the parent after the run).
        placement: which worker hosts which nodes (``None`` for a server strategy: its tasks
            run where the clock starts them, no node is placed).
        run_name: the run's name in the logs.
        logger: rank 0's logger, or ``None``.
        checkpoint_meta: what a checkpoint records of the run, or ``None`` without checkpoints.
        layout: where the nodes run (its ``launch`` and ``mode`` say how under torchrun).
    """

    config: FitConfig
    transport: TransportPlan
    placement: Placement | None
    run_name: str
    logger: Logger | None
    checkpoint_meta: dict[str, Any] | None
    layout: Layout


def plan_run(model: torch.nn.Module, train_dataset: Any, val_dataset: Any, strategy: Any, args: FitArgs) -> RunPlan:
    """Check ``args`` against the machine, the datasets and ``strategy``, and derive the run.
    Raises ``TypeError``/``ValueError`` naming the ``fit`` argument before any node starts."""
    run = args.run
    preflight.check_job(model, strategy, train_dataset, val_dataset, run.num_nodes, run.batch_size)
    if val_dataset is None and D.is_factory(train_dataset) and args.data.val_size > 0:
        logger.warning(
            "no validation will run: Trainer got a dataset_factory for training and no val_dataset (the val_loss "
            "columns stay empty). To validate on the factory's validation data, pass it as val_dataset too: "
            "Trainer(model, factory, factory) calls it with train_dataset=False inside each node"
        )
    device = _device(run)
    autocast = resolve_autocast(run.autocast, device)
    if args.checkpoint.checkpoint_dir is not None:  # found here, not at the first checkpoint
        check_writable_folder(args.checkpoint.checkpoint_dir, "checkpoint_dir")
    resume_folder = _resume_folder(args.checkpoint)
    fault_round = _fault_round(args.faults, strategy, run.network_model)
    check_adversaries(args.adversaries, strategy, args.faults, run.network_model)
    check_rules(strategy, run.num_nodes, args.adversaries)
    layout = _layout(run, args.transport, device)
    collate_fn = D.collate_fn(args.data.loader_kwargs)
    steps, per_epoch = preflight.planned_steps(
        model, train_dataset, run.num_nodes, run.num_epochs, run.max_steps, run.batch_size, collate_fn
    )
    if args.adversaries is not None:
        check_attack_run(args.adversaries, run.num_nodes, steps, train_dataset)
    if isinstance(strategy, ServerStrategy) and run.network_model.compute == "measured":
        step_seconds(run.network_model)  # raises: a server's clock needs modelled compute
    if layout.launch is None:
        # The fork server imports torch (and torch._dynamo, the optimizers need it) while
        # this process checks that the strategy builds: the two take seconds each.
        start_processes_server(wait=False)
    if strategy.needs_step_seconds and run.network_model.counts_flops:
        run.network_model = preflight.flops_as_seconds(
            run.network_model, model, train_dataset, run.num_nodes, run.batch_size, collate_fn
        )
    if isinstance(strategy, ServerStrategy):
        step_seconds(run.network_model)  # a step that takes no time on the clock: said here, not in the nodes
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    preflight.check_strategy_builds(
        strategy, model, state_bytes, run.num_nodes, steps, run.seed, per_epoch, run.network_model
    )
    faults = args.faults  # with an availability trace's rounds where the run's length is known
    if steps is not None:
        faults = with_availability(args.faults, run.network_model, run.num_nodes, fault_round, steps, strategy)
        if faults is not None:
            FaultPlan(faults, run.num_nodes, fault_round, steps, run.seed).check()
    minibatch = run.given_minibatch_size or _probe_minibatch(model, train_dataset, run, device, collate_fn)
    config = _fit_config(
        args, layout, steps, device=device, autocast=autocast, minibatch_size=minibatch,
        val_size=args.data.val_size if val_dataset is not None else 0, resume_from=resume_folder,
        faults=faults, fault_round_steps=fault_round, projection=_projection(model, strategy, run, steps),
    )  # fmt: skip
    meta = _checkpoint_meta(model, strategy, config)
    placement = None if isinstance(strategy, ServerStrategy) else Placement(run.num_nodes, layout.workers)
    # The transport: over torchrun's process group, or a store (and shared-memory segment) made here.
    timeout_s, asked = config.collective_timeout, args.transport
    if layout.launch is not None:
        transport = TransportPlan.for_launcher(layout.transport, layout.workers, timeout_s)
    else:
        transport = TransportPlan.create(
            asked.transport, device, layout.workers, state_bytes, layout.gpus, timeout_s, asked.shm_slot_mb
        )
    return RunPlan(
        config=config,
        transport=transport,
        placement=placement,
        run_name=args.logging.run_name or default_run_name(_label(strategy)),
        logger=args.logging.sink,
        checkpoint_meta=meta,
        layout=layout,
    )


def _label(strategy: Strategy) -> str:
    """The strategy's class name, or a plain ``ServerStrategy``'s server's (the runs of
    ``FedAvgStrategy(client_sampling=...)`` go to ``FedAvgServer``'s folder)."""
    return type(strategy.server if type(strategy) is ServerStrategy else strategy).__name__


def usable_cpus() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def resolve_workers(workers: int | None, num_nodes: int, device: str, gpus: int) -> int:
    """``workers`` checked against ``num_nodes``, or the default ``min(K, cores or GPUs)``
    (``gpus``: the CUDA devices the run may use)."""
    if workers is None:
        units = gpus if device == "cuda" else usable_cpus()
        return max(1, min(num_nodes, units))
    positive_int(workers, "workers")
    if workers > num_nodes:
        raise ValueError(f"workers={workers} is more than num_nodes={num_nodes}; each worker hosts at least one node")
    return workers


def _device(run: RunConfig) -> str:
    """The nodes' device type; ``devices`` must list existing CUDA devices, and only with ``device='cuda'``."""
    device, devices = resolve_device(run.device), run.devices
    if devices is not None:
        if device != "cuda":
            raise ValueError(f"devices= lists CUDA devices but device={device!r}")
        count = torch.cuda.device_count()
        if not devices or any(not 0 <= d < count for d in devices):
            raise ValueError(f"devices must be non-empty CUDA indices in [0, {count}), got {devices}")
    return device


def _resume_folder(checkpoint: CheckpointConfig) -> str | None:
    """The complete checkpoint folder the run continues from, or ``None``."""
    resume_from = checkpoint.resume_from
    if checkpoint.resume:
        assert checkpoint.checkpoint_dir is not None
        resume_from = ckpt.newest(checkpoint.checkpoint_dir)
        if resume_from is None:
            logger.info("resume=True: no checkpoint in %s yet; starting at step 0", checkpoint.checkpoint_dir)
    return ckpt.resolve(resume_from) if resume_from is not None else None


def _fault_round(faults: Faults | None, strategy: Strategy, network: Network) -> int:
    """Check ``fit(faults=...)`` and the network's availability trace against the strategy;
    return the steps per fault round."""
    availability = network.availability
    if faults is None and availability is None:
        return 1
    if faults is not None and isinstance(strategy, ServerStrategy):
        raise ValueError(
            f"fit(faults=...) drops nodes from lock-step rounds; {type(strategy).__name__} runs "
            f"{strategy.server.describe()} as a server and tasks on the simulated clock, with no rounds to drop "
            "nodes from: give the network node speeds (Network(..., compute_slowdown=...)) for stragglers"
        )
    if faults is not None:
        check_supported(faults, strategy)
    if availability is not None and availability.drops and not strategy.follows_availability:
        if isinstance(strategy, ServerStrategy):
            raise ValueError(
                f"network {network.name!r} has an availability trace that takes clients away, but "
                f"{strategy.server.describe()} does not read it (Server.follows_availability is False: its clients "
                "would train while absent); drop the trace, or use a server that follows it (DecoupledDiLoCoStrategy)"
            )
        check_can_drop(strategy, f"Availability traces that take nodes away (network {network.name!r})")
    return round_steps(strategy)


def _modules(strategy: Strategy) -> list[Any]:
    """Where ``strategy`` may aggregate: its server, or its pipeline's communicating modules."""
    if isinstance(strategy, ServerStrategy):
        return [strategy.server]
    return strategy.pipeline.leaves() if strategy.pipeline is not None else []


def check_rules(strategy: Strategy, num_nodes: int, adversaries: Adversaries | None = None) -> None:
    """Run each aggregation rule of ``strategy`` (a pipeline module's or its server's ``rule``)
    once on rows of zeros, as many as the fewest updates it combines in this run (the module's
    ``aggregation_group(num_nodes, attacked)``, else ``num_nodes``), so that a rule the run cannot
    take (Krum on too few updates, a trimmed mean that trims everything, a function of the wrong
    signature or result) fails here, naming ``aggregate``, rather than inside the nodes; and so
    that a module that cannot take the attack (``aggregation_group`` raises) is refused here.
    A robust rule over two updates or fewer is their mean: a warning says so."""
    attacked = adversaries is not None and adversaries.on_updates
    owner = strategy.server if type(strategy) is ServerStrategy else strategy  # (FedAvg's sampling: its server)
    where = f"aggregate of {type(owner).__name__}"
    for module in _modules(strategy):
        rule = getattr(module, "rule", None)
        if rule is None:
            continue
        group = getattr(module, "aggregation_group", lambda n, _: n)(num_nodes, attacked)
        try:
            out = rule(torch.zeros(group, 3))
        except (ValueError, IndexError, RuntimeError, TypeError) as e:
            raise ValueError(f"{where}: its rule cannot combine the {group} updates of this run: {e}") from None
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (3,):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(
                f"{where}: a rule takes the [n, d] updates and returns one [d] update; on [{group}, 3] it returned "
                f"{got}"
            )
        if group <= 2 and getattr(getattr(rule, "func", rule), "__name__", "") != "mean":
            logger.warning(
                "%s: %s combines %d update(s) at a time in this run, and a robust rule over two or fewer is their "
                "mean; give it more (more nodes, a larger buffer or sample)", where, module.describe(), group
            )  # fmt: skip


def check_adversaries(
    adversaries: Adversaries | None, strategy: Strategy, faults: Any = None, network: Network | None = None
) -> None:
    """Check ``fit(adversaries=...)`` against the strategy: an attack on updates needs a module
    that aggregates them through ``communicators.aggregation.aggregate_all_reduce`` (one that
    keeps its rule as ``rule``), and gathers every node's update, which a round with nodes
    dropped cannot."""
    if adversaries is None or not adversaries.on_updates:
        return
    if not any(getattr(m, "rule", None) is not None for m in _modules(strategy)):  # a server's rule too
        raise ValueError(
            f"fit(adversaries=Adversaries({adversaries.attack!r}, ...)): {type(strategy).__name__} has no module "
            "where attacks act (they act where the nodes' updates are aggregated: DDP, FedAvg, DiLoCo and its eager, "
            "streaming and decoupled forms, MuLoCo, DES-LOC, SPARTA+DiLoCo, FedBuff); attack='label_flip' poisons "
            "the data under any strategy"
        )
    if isinstance(strategy, ServerStrategy):  # a server aggregates the results it received, whoever is away
        return
    trace = None if network is None else network.availability
    drops = (faults is not None and faults.drops) or (trace is not None and trace.drops)
    if drops:
        raise ValueError(
            f"fit(adversaries=Adversaries({adversaries.attack!r}, ...)) with nodes dropped (faults or an availability "
            "trace): an attack gathers every node's update, which a round with nodes away does not have; give one "
            "or the other"
        )


#: How many of a dataset's first examples ``label_flip``'s check reads (all of a ``TensorDataset``).
LABELS_CHECKED = 256


def check_attack_run(adversaries: Adversaries, num_nodes: int, steps: int, train_dataset: Any) -> None:
    """The attack against the run: a share that gives no malicious node is refused, a start after
    the last step warned about (``Adversaries.check_run``); ``label_flip``'s ``num_classes``
    against the training labels (a ``TensorDataset``'s, else its first ``LABELS_CHECKED``
    examples'; a dataset factory's or an iterable one's, and the rest, are checked as the nodes
    read them)."""
    from exogym.adversaries import check_labels, labels_of

    adversaries.check_run(num_nodes, steps)
    indexable = hasattr(train_dataset, "__getitem__") and hasattr(train_dataset, "__len__")
    if adversaries.attack != "label_flip" or D.is_factory(train_dataset) or not indexable:
        return
    tensors = getattr(train_dataset, "tensors", None)  # a TensorDataset's labels, else the first examples'
    if tensors:
        labels = tensors[-1]
    else:
        found = [labels_of(train_dataset[i]) for i in range(min(len(train_dataset), LABELS_CHECKED))]
        if any(x is None for x in found):
            raise ValueError(
                "Adversaries('label_flip') flips the labels of (inputs, labels) examples or a mapping's 'labels'; "
                f"this dataset's examples are {type(train_dataset[0]).__name__}"
            )
        labels = torch.stack([torch.as_tensor(x) for x in found])
    if labels.is_floating_point():
        raise ValueError(f"Adversaries('label_flip') needs integer labels; this dataset's are {labels.dtype}")
    check_labels(labels, adversaries.num_classes)


def _layout(run: RunConfig, transport: TransportConfig, device: str) -> Layout:
    """The workers and the transport between them: local processes, or this ``torchrun``
    launch's ranks (``torchrun_mode`` is refused outside one)."""
    launch = cluster.detect()
    if launch is None and transport.torchrun_mode is not None:
        raise ValueError(
            f"torchrun_mode={transport.torchrun_mode!r} applies only under torchrun (RANK, WORLD_SIZE, MASTER_ADDR "
            "and MASTER_PORT unset here); drop it, or start the script with torchrun"
        )
    devices = tuple(run.devices) if run.devices else None
    gpus = len(set(devices)) if devices else (torch.cuda.device_count() if device == "cuda" else 1)
    if launch is not None:
        mode = cluster.resolve_mode(transport.torchrun_mode, run.num_nodes, launch.world_size, transport.workers)
        kind = cluster.resolve_transport(transport.transport, device)
        threads = max(1, usable_cpus() // launch.local_world_size)
        own = cluster.worker_device(device, devices, launch)
        return Layout(launch.world_size, gpus, kind, own, threads, launch, mode)
    workers = resolve_workers(transport.workers, run.num_nodes, device, gpus)
    kind = resolve_kind(transport.transport, device, gpus, workers)  # a transport that cannot work fails first
    # A lane of runs side by side (a packed sweep) gives each worker one core's thread.
    threads = pool.lane_threads() or max(1, usable_cpus() // workers)
    return Layout(workers, gpus, kind, devices, threads)


def _probe_minibatch(
    model: torch.nn.Module, train_dataset: Any, run: RunConfig, device: str, collate_fn: Callable[[list[Any]], Any]
) -> int:
    """The largest divisor of ``batch_size`` whose forward and backward, on examples collated by
    ``collate_fn``, fit in memory (the whole batch for a dataset factory, whose examples exist
    only inside the nodes)."""
    if D.is_factory(train_dataset):
        return run.batch_size
    per_device = -(-run.num_nodes // max(1, len(set(run.devices)) if run.devices else 1))
    budget = device_budget(device, per_device if device == "cuda" else run.num_nodes, run.max_memory_usage)
    return probe_minibatch_size(model, train_dataset, run.batch_size, device, budget, collate_fn)


def _fit_config(args: FitArgs, layout: Layout, max_steps: int | None, **derived: Any) -> FitConfig:
    """The settings every node reads: ``args``' and ``layout``'s, the steps, and the ``derived``
    fields (``FitConfig``'s: the device, the minibatch, the run's faults with an availability
    trace's rounds and the like, worked out by ``plan_run``)."""
    run, data, log, folder = args.run, args.data, args.logging, args.checkpoint.checkpoint_dir
    val_interval = data.val_interval
    if val_interval is None and max_steps:
        val_interval = max(1, max_steps // 10)
    return FitConfig(
        num_nodes=run.num_nodes,
        workers=layout.workers,
        max_steps=max_steps,
        num_epochs=run.num_epochs,
        batch_size=run.batch_size,
        devices=layout.devices,
        transport=layout.transport,
        # A worker waits for its peers while each of them runs all its nodes in turn.
        collective_timeout=float(args.transport.collective_timeout * -(-run.num_nodes // layout.workers)),
        val_interval=val_interval,
        seed=run.seed,
        log_interval=log.log_interval,
        shuffle=data.shuffle,
        progress=log.progress,
        threads_per_worker=layout.threads_per_worker,
        log_level=logging.getLogger("exogym").getEffectiveLevel(),
        network=run.network_model,
        stop_on_nonfinite_loss=run.stop_on_nonfinite_loss,
        launcher="exogym" if layout.launch is None else "torchrun",
        checkpoint_dir=os.path.abspath(folder) if folder is not None else None,
        checkpoint_interval=args.checkpoint.checkpoint_interval,
        adversaries=args.adversaries,
        dataloader_kwargs=data.loader_kwargs,
        **derived,
    )


def _projection(model: torch.nn.Module, strategy: Strategy, run: RunConfig, steps: int | None) -> Projection | None:
    """With ``run.scale``, the target's payloads for the proxy's (``exogym.projection``): a
    server algorithm's clients send whole models, in the ratio of parameter bytes; a lock-step
    strategy is probed."""
    if run.scale is None:
        return None
    if isinstance(strategy, ServerStrategy):
        ratio = param_bytes(run.scale.target_model()) / max(1, param_bytes(model))
        return Projection(ratio=ratio, scale=run.scale.describe())
    return probe(strategy, model, run.scale, run.num_nodes, steps or 1, run.seed)


def _checkpoint_meta(model: torch.nn.Module, strategy: Strategy, config: FitConfig) -> dict[str, Any] | None:
    """What a checkpoint records of the run (checked against the one it resumes from), or
    ``None`` for a run that neither writes nor reads checkpoints."""
    if config.checkpoint_dir is None and config.resume_from is None:
        return None
    fingerprint = ckpt.fingerprint(model, strategy, config.num_nodes, config.batch_size, config.seed)
    meta = {**fingerprint, "max_steps": config.max_steps}
    if config.resume_from is not None:
        preflight.check_resume(config.resume_from, meta, strategy)
    return meta
