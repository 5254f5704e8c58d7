"""``Trainer``: checks a run, plans it, launches its nodes and returns the averaged model."""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch

from exogym import compat
from exogym import data as D
from exogym.adversaries import Adversaries
from exogym.clocks import format_summary, format_table
from exogym.core.comm.network import Network
from exogym.core.comm.plan import DEFAULT_SLOT_MB, DEFAULT_TIMEOUT_S, TransportPlan
from exogym.core.strategy import Strategy
from exogym.keywords import checked_keywords
from exogym.logger import Logger
from exogym.run_config import CheckpointConfig, DataConfig, FitArgs, LoggingConfig, RunConfig, TransportConfig
from exogym.runtime import cluster
from exogym.runtime.faults import FaultPlan, Faults
from exogym.runtime.forkserver import prestart
from exogym.runtime.launch import run_nodes, serialize_job
from exogym.runtime.main_script import check_main_guard
from exogym.runtime.node import NodeJob
from exogym.runtime.plan import RunPlan, plan_run, resolve_workers
from exogym.runtime.plan import usable_cpus as usable_cpus
from exogym.runtime.worker import worker_process
from exogym.scale import Scale

logger = logging.getLogger(__name__)

#: ``fit(workers=...)`` checked against ``num_nodes``, or its default (see
#: ``exogym.runtime.plan.resolve_workers``).
_resolve_workers = resolve_workers


class Trainer:
    """Simulated distributed training of ``model`` on one machine.

    Args:
        model: an ``nn.Module`` whose ``forward(batch)`` returns a scalar loss; ``batch`` is what
            the dataset's default collation produces (any structure: tensors, tuples, dicts).
        train_dataset: a map-style ``Dataset`` shared by all nodes (split with a
            ``DistributedSampler``), or a factory ``dataset_factory(rank, num_nodes, train_dataset)``
            called inside each node (with ``train_dataset=True``).
        val_dataset: the same for validation (a factory is called with ``train_dataset=False``;
            pass the training factory here too to validate on its validation data), or ``None``
            (no validation; with a training factory, ``fit`` logs a warning saying so).

    After [`fit`][exogym.Trainer.fit], ``history`` holds the metric rows and ``result`` the run
    summary: ``max_steps``, ``peak_memory``, ``run_name``, ``config``, ``nodes`` (every node's
    simulated compute, communication, waiting and utilisation), ``summary`` (what the strategy
    reports of the run, [`run_summary`][exogym.strategy.Strategy.run_summary]: the asynchronous
    strategies give every node's steps and the updates' staleness) and, with faults, ``faults``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        train_dataset: D.DatasetArg,
        val_dataset: D.DatasetArg = None,
        start_port: int | None = None,
    ) -> None:
        """``start_port`` is the original exo gym's, accepted and ignored (ExoGym finds free ports
        itself; see ``exogym.compat``)."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if train_dataset is None:
            raise TypeError("train_dataset is required (a Dataset or a dataset_factory)")
        self.model = model
        self.train_dataset = train_dataset
        self.val_dataset = val_dataset
        self.history: list[dict[str, Any]] = []
        self.result: dict[str, Any] = {}
        prestart()  # training is certain: the fork server's imports run while the script goes on to fit

    @checked_keywords
    def fit(
        self,
        strategy: Strategy,
        num_nodes: int,
        num_epochs: int = 1,
        max_steps: int | None = None,
        batch_size: int = 32,
        minibatch_size: int | None = None,
        gradient_accumulation: int | None = None,
        device: str | torch.device | None = None,
        devices: list[int] | None = None,
        val_size: int = 256,
        val_interval: int | None = None,
        autocast: bool | torch.dtype = False,
        seed: int = 42,
        logger: Logger | str | None | bool = None,
        log_interval: int = 10,
        max_memory_usage: float = 0.8,
        shuffle: bool = True,
        progress: bool = True,
        run_name: str | None = None,
        network: Network | str | None = None,
        transport: str = "auto",
        collective_timeout: float = DEFAULT_TIMEOUT_S,
        shm_slot_mb: float = DEFAULT_SLOT_MB,
        workers: int | None = None,
        stop_on_nonfinite_loss: bool = True,
        torchrun_mode: str | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_interval: int | None = None,
        resume_from: str | None = None,
        resume: bool = False,
        faults: Faults | None = None,
        dataloader_kwargs: dict[str, Any] | None = None,
        offload_idle_nodes: bool = False,
        *,
        save_dir: str | None = None,
        correlation_interval: int | None = None,
        wandb_project: str | None = None,
        scale: Scale | str | float | None = None,
        adversaries: Adversaries | None = None,
    ) -> torch.nn.Module:
        """Train with ``strategy`` on ``num_nodes`` simulated nodes; return the averaged model.

        ``strategy`` is a [`Strategy`][exogym.strategy.Strategy] (e.g. ``SimpleReduceStrategy()``).
        The other keywords form the sections of ``exogym.run_config``, whose fields say what
        each one does:

        * run (``RunConfig``): ``num_nodes`` (K >= 1), ``num_epochs``,
          ``max_steps`` (steps per node; overrides ``num_epochs``), ``batch_size`` (per node per
          step), ``minibatch_size`` or ``gradient_accumulation`` (neither: the largest divisor of
          ``batch_size`` that fits in ``max_memory_usage`` of the device), ``device``,
          ``devices``, ``autocast``, ``seed``, ``network``, ``scale`` (the model and hardware whose
          time is simulated: [`Scale`][exogym.Scale]), ``stop_on_nonfinite_loss``;
        * data (``DataConfig``): ``val_size``, ``val_interval``,
          ``shuffle``, ``dataloader_kwargs``;
        * transport (``TransportConfig``): ``transport``,
          ``collective_timeout``, ``shm_slot_mb``, ``workers``, ``torchrun_mode``;
        * checkpoint (``CheckpointConfig``): ``checkpoint_dir``,
          ``checkpoint_interval``, ``resume_from``, ``resume``;
        * faults: ``faults`` ([`Faults`][exogym.Faults]): nodes that drop out of rounds and
          stragglers; train rows then carry ``nodes_alive`` and ``result["faults"]`` lists each
          round's dropped nodes and participants;
        * adversaries: ``adversaries`` ([`Adversaries`][exogym.Adversaries]): malicious nodes,
          drawn from the run's seed, that attack where the updates are aggregated (see
          ``communicators.aggregation``); ``result["adversaries"]`` names them;
        * a strategy with ``privacy`` ([`DifferentialPrivacy`][exogym.privacy.DifferentialPrivacy])
          reports the privacy spent in ``result["privacy"]`` (Opacus's RDP accountant);
        * logging (``LoggingConfig``): ``logger``, ``log_interval``,
          ``progress``, ``run_name``.

        ``save_dir``, ``correlation_interval`` and ``wandb_project`` are the original exo gym's
        spellings (see ``exogym.compat``): ``save_dir`` is ``checkpoint_dir``;
        ``correlation_interval`` sets ``val_interval`` when that is not given (every validation
        logs ``model_correlation``); ``wandb_project`` logs to that Weights & Biases project.
        ``fit(num_epochs, strategy, num_nodes)`` in that order is accepted too, and
        ``checkpoint_interval`` alone writes to ``./checkpoints``. ``offload_idle_nodes`` is
        accepted and does nothing (see ``exogym.compat``).

        Returns:
            A copy of the model holding the mean of the nodes' final parameters and buffers
            (under torchrun, on every rank; ``history`` is filled on rank 0 only).

        Raises:
            TypeError, ValueError: for bad arguments, before any process starts.
            exogym.runtime.launch.NodeFailedError: when a node raises; carries its traceback.
        """
        check_main_guard()
        compat.offload_idle_nodes(offload_idle_nodes)
        strategy, num_nodes, num_epochs = compat.legacy_fit_order(strategy, num_nodes, num_epochs)
        checkpoint_dir, val_interval, logger = compat.resolve_fit_legacy(
            checkpoint_dir, checkpoint_interval, val_interval, logger, run_name, save_dir, correlation_interval,
            wandb_project,
        )  # fmt: skip
        args = FitArgs(
            run=RunConfig(
                num_nodes=num_nodes, num_epochs=num_epochs, max_steps=max_steps, batch_size=batch_size,
                minibatch_size=minibatch_size, gradient_accumulation=gradient_accumulation, device=device,
                devices=devices, autocast=autocast, seed=seed, max_memory_usage=max_memory_usage, network=network,
                scale=scale, stop_on_nonfinite_loss=stop_on_nonfinite_loss,
            ),
            data=DataConfig(
                val_size=val_size, val_interval=val_interval, shuffle=shuffle, dataloader_kwargs=dataloader_kwargs
            ),
            transport=TransportConfig(
                transport=transport, collective_timeout=collective_timeout, shm_slot_mb=shm_slot_mb,
                workers=workers, torchrun_mode=torchrun_mode,
            ),
            checkpoint=CheckpointConfig(
                checkpoint_dir=checkpoint_dir, checkpoint_interval=checkpoint_interval, resume_from=resume_from,
                resume=resume,
            ),
            faults=faults,
            adversaries=adversaries,
            logging=LoggingConfig(logger=logger, log_interval=log_interval, progress=progress, run_name=run_name),
        )  # fmt: skip
        plan = plan_run(self.model, self.train_dataset, self.val_dataset, strategy, args)
        job = NodeJob(
            self.model, strategy, self.train_dataset, self.val_dataset, plan.config, plan.run_name, plan.logger,
            plan.checkpoint_meta, plan.placement,
        )  # fmt: skip
        model = self._collect(plan, _launch(job, plan))
        from exogym.privacy import privacy_report

        spent = privacy_report(strategy, self.result["max_steps"])
        if spent:
            self.result["privacy"] = spent
            log = logging.getLogger(__name__)  # (``logger`` is fit's argument here)
            for entry in spent:
                log.info("privacy: %s, %d aggregations: (epsilon %.4g, delta %g)", entry["module"],
                         entry["aggregations"], entry["epsilon"], entry["delta"])  # fmt: skip
        return model

    def _collect(self, plan: RunPlan, out: dict[str, Any]) -> torch.nn.Module:
        """Fill ``history`` and ``result`` from rank 0's ``out``; return the averaged model."""
        cfg = plan.config
        self.history = out.get("history", [])
        self.result = {
            "max_steps": out.get("max_steps", cfg.max_steps),
            "peak_memory": out.get("peak_memory"),
            "run_name": plan.run_name,
            "config": cfg,
            "nodes": out.get("nodes", []),
            "summary": out.get("summary", {}),
        }
        if self.result["nodes"]:
            logger.info("simulated time per node:\n%s", format_table(self.result["nodes"]))
        if self.result["summary"]:
            logger.info("run summary: %s", format_summary(self.result["summary"]))
        if cfg.faults is not None:
            rounds = FaultPlan(cfg.faults, cfg.num_nodes, cfg.fault_round_steps, self.result["max_steps"], cfg.seed)
            self.result["faults"] = rounds.events()
        if cfg.adversaries is not None:
            plan_ = cfg.adversaries.plan(cfg.num_nodes, cfg.seed)
            self.result["adversaries"] = {**cfg.adversaries.to_dict(), "malicious": list(plan_.malicious)}
            logger.info("adversaries: %s from step %d, malicious nodes %s", cfg.adversaries.attack,
                        cfg.adversaries.start, list(plan_.malicious))  # fmt: skip
        final = copy.deepcopy(self.model).cpu()
        final.load_state_dict(out["state_dict"])
        return final


#: The original exo gym's name for the same class.
LocalTrainer = Trainer


def _launch(job: NodeJob, plan: RunPlan) -> dict[str, Any]:
    """Run the planned nodes: on local worker processes, or as this ``torchrun`` rank's share;
    return this process's result (rank 0's carries the history)."""
    if plan.layout.launch is not None:
        assert plan.layout.mode is not None
        return _run_under_torchrun(job, plan.transport, plan.layout.launch, plan.layout.mode)
    cfg = plan.config
    placement = None if cfg.workers == cfg.num_nodes else plan.placement
    try:
        results = run_nodes(worker_process, cfg.workers, job, (plan.transport,), placement=placement)
    finally:
        plan.transport.close()
    return results[0]


def _run_under_torchrun(job: NodeJob, plan: TransportPlan, launch: cluster.LaunchEnv, mode: str) -> dict[str, Any]:
    """This torchrun rank's share of the run: join the launcher's process group, check that
    every rank runs the same arguments, train this rank's nodes in this process; return its
    result (rank 0's has the history; every rank's has the averaged state). Collective."""
    import cloudpickle

    cfg = job.config
    if cfg.device == "cuda":
        torch.cuda.set_device(cfg.worker_device(launch.rank))
    cluster.join(plan.backend, plan.timeout_s)
    cluster.check_agreement(
        {
            "num_nodes": cfg.num_nodes,
            "mode": mode,
            "transport": plan.kind,
            "device": cfg.device,
            "max_steps": cfg.max_steps,
            "batch_size": cfg.batch_size,
            "seed": cfg.seed,
            "strategy": type(job.strategy).__name__,
        }
    )
    if launch.rank == 0:
        logger.info(
            "torchrun %s mode: %d nodes on %d processes over %s", mode, cfg.num_nodes, launch.world_size, plan.kind
        )
    # The nodes own a copy of the user's objects, as in processes fit starts itself; every rank
    # starts from rank 0's model (as DistributedDataParallel does), whatever each rank built.
    own = cloudpickle.loads(serialize_job(job))
    cluster.broadcast_state(own.model, cfg.worker_device(launch.rank) if plan.kind == "nccl" else None)
    out = worker_process(launch.rank, own, plan)
    assert out is not None
    return out
