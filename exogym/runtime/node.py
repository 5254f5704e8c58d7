"""``TrainNode``: one node's training loop, identical on every rank (rank 0 only logs).

It knows nothing of processes: it gets its comm, its job and its device, and the caller decides
where it runs (a node process: ``exogym.runtime.worker``; a thread: the tests' thread world).
The loop draws on its neighbours: ``exogym.runtime.meter`` (each step's measurements), ``exogym.runtime.evaluation``
(validation and the averaged model), ``exogym.runtime.node_state`` (what a checkpoint holds
of the node) and ``exogym.runtime.progress`` (rank 0's progress bar).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from exogym import data as D
from exogym.config import FitConfig
from exogym.core.comm.comm import NodeComm
from exogym.core.strategy import Strategy
from exogym.runtime import faults as F
from exogym.runtime import node_state
from exogym.runtime.evaluation import Evaluator
from exogym.runtime.forward import backward, forward_loss
from exogym.runtime.meter import StepMeter
from exogym.runtime.placement import Placement
from exogym.runtime.progress import Progress

logger = logging.getLogger(__name__)


#: Pending step samples are exchanged across nodes at least this often (in steps), times the
#: number of whole multiples of it in the nodes a worker hosts (see ``flush_interval``).
_FLUSH_STEPS = 64


def flush_interval(log_interval: int, num_nodes: int, workers: int) -> int:
    """Steps between two exchanges of the nodes' metric samples: a multiple of
    ``log_interval`` of at least 64 steps, and of 64 x ``hosted // 64`` where a worker hosts
    ``hosted`` nodes (a flush costs each worker in proportion to the nodes it hosts). The same
    on every node."""
    hosted = -(-num_nodes // max(1, workers))
    steps = _FLUSH_STEPS * max(1, hosted // _FLUSH_STEPS)
    return log_interval * max(1, -(-steps // log_interval))


@dataclass
class NodeJob:
    """The user's side of a run, sent to every node: model, strategy, data, settings."""

    model: torch.nn.Module
    strategy: Strategy
    train_dataset: Any
    val_dataset: Any
    config: FitConfig
    run_name: str
    logger: Any = None
    #: What a checkpoint records of the run (``exogym.runtime.checkpoint.fingerprint``).
    checkpoint_meta: dict[str, Any] | None = None
    #: Which worker hosts which nodes (``None``: contiguous blocks).
    placement: Placement | None = None
    _layout: tuple[set[torch.device], bool] | None = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_layout": None}  # (worked out where used)

    def model_copy(self) -> torch.nn.Module:
        """A node's own copy of ``model``."""
        return copy.deepcopy(self.model)

    def model_layout(self) -> tuple[set[torch.device], bool]:
        """The devices of ``model``'s parameters and buffers, and whether every module of it is
        in training mode (what each of its copies has; worked out at the first call)."""
        if self._layout is None:
            m = self.model
            devices = {t.device for t in itertools.chain(m.parameters(), m.buffers())}
            self._layout = (devices, all(sub.training for sub in m.modules()))
        return self._layout

    def strategy_copy(self) -> Strategy:
        """A node's own copy of ``strategy``."""
        return copy.deepcopy(self.strategy)


class TrainNode:
    """One node: its model copy, data shard and strategy, and the loop that trains them.

    Each step: ``strategy.zero_grad()``, ``accumulation`` forward/backward passes on the batch's
    minibatches (``loss / accumulation``, so gradients are the batch mean), then
    ``strategy.step()`` (which communicates and updates). Metrics are buffered per step and
    combined across nodes in batches (``exogym.metrics``); before the first step, every
    ``val_interval`` steps and after the last, the local models and the all-node average are
    validated. Those measurement collectives are not charged to the ledger: they are not part
    of the algorithm.
    """

    def __init__(self, job: NodeJob, rank: int, comm: NodeComm, device: torch.device) -> None:
        cfg = job.config
        self.cfg, self.rank, self.comm, self.device = cfg, rank, comm, device
        train_ds = D.node_dataset(job.train_dataset, rank, cfg.num_nodes, train=True)
        shared = not D.is_factory(job.train_dataset)
        self.loader, self.sampler = D.train_loader(
            train_ds, shared, rank, cfg.num_nodes, cfg.batch_size, cfg.shuffle, cfg.seed, cfg.dataloader_kwargs
        )
        val_ds = D.node_dataset(job.val_dataset, rank, cfg.num_nodes, train=False)
        self.val_loader = None
        if val_ds is not None and cfg.val_size > 0:
            sub = D.val_subset(val_ds, not D.is_factory(job.val_dataset), rank, cfg.num_nodes, cfg.val_size)
            self.val_loader = DataLoader(
                sub,
                batch_size=cfg.minibatch_size,
                **{**cfg.dataloader_kwargs, "collate_fn": D.collate_fn(cfg.dataloader_kwargs)},
            )
        self.checkpoint_meta = job.checkpoint_meta
        self.logger = job.logger if rank == 0 else None
        self.run_name = job.run_name
        self.history: list[dict[str, Any]] = []
        #: Training batches this node has taken from its data (a node dropped by faults takes none).
        self.batches_drawn = 0
        #: FLOPs of a training step, for ``Network(compute="flops")`` (counted at the first).
        self.step_flops: float | None = None
        # The node is built for its own data's steps per epoch, then the nodes agree on the
        # fewest over their factory datasets (one uncharged all-reduce, last: virtual nodes take
        # turns, and what a node built after a collective would run after rank 0 has started
        # training and its clock). A node whose data gives more is built again for that count.
        local = D.steps_per_epoch(len(train_ds), shared, cfg.num_nodes, cfg.batch_size)
        if local < 1:
            raise ValueError(
                f"node {rank}'s dataset has fewer than batch_size={cfg.batch_size} examples: no full batch to train on"
            )
        self._build(job, local)
        if not shared:
            agreed = torch.tensor([float(local)])
            self.comm.all_reduce(agreed, op="min", charge=False)
            if int(agreed.item()) != local:
                self._build(job, int(agreed.item()))

    def _build(self, job: NodeJob, steps_per_epoch: int) -> None:
        """The node's model copy, strategy, fault plan and evaluator, for ``steps_per_epoch``."""
        cfg, device = self.cfg, self.device
        self.steps_per_epoch = steps_per_epoch
        self.max_steps = cfg.max_steps or steps_per_epoch * cfg.num_epochs
        # An own copy of the model: several nodes may share one job's model (threads).
        self.model = job.model_copy()
        devices, training = job.model_layout()  # (what every copy has: asked of the model once)
        if devices != {device}:
            self.model.to(device)  # (a walk of every module: skipped where nothing would move)
        if not training:
            self.model.train()
        # An own copy of the strategy too: the virtual nodes of a worker share one job.
        self.strategy = job.strategy_copy()
        self.adversaries = None if cfg.adversaries is None else cfg.adversaries.plan(cfg.num_nodes, cfg.seed)
        self.strategy._attach(self.comm, self.max_steps, cfg.seed, steps_per_epoch, cfg.network, self.adversaries)
        self.strategy._init_node(self.model, self.rank, cfg.num_nodes)
        self.faults = None
        faults = F.with_availability(
            cfg.faults, cfg.network, cfg.num_nodes, cfg.fault_round_steps, self.max_steps, self.strategy
        )
        if faults is not None:
            self.faults = F.FaultPlan(faults, cfg.num_nodes, cfg.fault_round_steps, self.max_steps, cfg.seed)
            self.faults.check()  # again: a dataset factory's length is known only here
            # Faulty rounds are logged at INFO, or at DEBUG where a round is one step (DDP, SPARTA:
            # a line per step would drown the log; trainer.result["faults"] lists them all).
            self._fault_log_level = logging.INFO if self.faults.round_steps > 1 else logging.DEBUG
        self.flush_every = flush_interval(cfg.log_interval, cfg.num_nodes, cfg.workers)
        self.evaluator = Evaluator(
            self.comm, self.model, device, self.val_loader, self._forward, self._autocast, self.rank, cfg.num_nodes
        )

    def _autocast(self) -> contextlib.AbstractContextManager:
        """A fresh autocast context for a forward pass (``fit(autocast=...)``; none without)."""
        if self.cfg.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.cfg.autocast)

    def _forward(self, batch: Any, model: torch.nn.Module | None = None) -> torch.Tensor:
        """The loss of ``model`` (the node's model by default) on ``batch`` under autocast, a 0-d
        tensor: ``model(batch)``, or ``model(**batch)`` for a mapping batch, read as
        ``exogym.runtime.forward.forward_loss`` reads it (``TypeError`` without a scalar loss)."""
        with self._autocast():
            return forward_loss(model or self.model, batch)

    def train(self, keep_state: bool = False) -> dict[str, Any] | None:
        """Run ``max_steps`` steps; return the result on rank 0; elsewhere ``None``, or
        ``{"state_dict": the averaged state}`` with ``keep_state`` (a torchrun rank's first node).
        Collective: every node of the run must call it."""
        step = self._begin()
        while step < self.max_steps:
            self.meter.begin_step(step)
            done = self._step(step, self._dropped(step))
            self._end_steps(step, done)
            step = done
        return self._finish(keep_state)

    def _begin(self) -> int:
        """Start the run (logger, progress bar, data stream, step meter), then resume from
        ``cfg.resume_from`` or validate the starting point of every validation curve; the first
        step. Collective."""
        cfg = self.cfg
        if self.logger is not None:
            self.logger.start(self.run_name, {**cfg.to_dict(), **self.strategy.config(), "max_steps": self.max_steps})
        self.progress = Progress(self.max_steps, enabled=cfg.progress and self.rank == 0)
        self.batches = D.BatchStream(self.loader, self.sampler, cfg.dataloader_kwargs)
        self.meter = StepMeter(self.comm, cfg.network, self.faults, self.device, cfg.log_interval, self.max_steps)
        step = 0
        if cfg.resume_from is not None:
            step = node_state.restore(self, cfg.resume_from)
            for row in self.history if self.logger is not None else []:
                self.logger.log(row)  # the resumed run's log holds the whole history
            self.progress.resumed(step)
        elif self.val_loader is not None:
            self._emit(self.evaluator.validate(self.meter.metrics))
        self.meter.begin_run()
        return step

    def _step(self, step: int, dropped: frozenset[int]) -> int:
        """Train on the next batch (forward/backward over its minibatches), then
        ``strategy.step()`` with the ``dropped`` nodes left out; check the loss, record the
        sample. A node dropped from the round (fault injection) takes no data and computes
        nothing: zero gradients, and the strategy's step run with it left out of every
        collective (so the calls line up with its peers'); its state is replaced when it
        rejoins at the round's end. The step counter after it."""
        cfg = self.cfg
        trains = self.meter.trains = self.rank not in dropped  # (what a handle's clock counts)
        self.strategy.zero_grad()
        if trains:
            count = self.step_flops is None and cfg.network.counts_flops  # the first training step only
            batch = next(self.batches)
            if self.adversaries is not None and self.adversaries.flips_labels(self.rank, step):
                batch = self.adversaries.poison(batch)
            loss_sum, flops = backward(self._forward, batch, cfg.accumulation, self.device, count)
            if flops is not None:
                self.step_flops = flops
        else:
            for p in self.model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        with self.comm.leaving_out(dropped):
            self.strategy.step()
        self._rejoin(step)
        if not trains:
            self.meter.add(step, self.strategy.lr)
            return self._steps_done(step)
        if not math.isfinite(loss_sum) and cfg.stop_on_nonfinite_loss:
            raise FloatingPointError(
                f"node {self.rank}: the training loss is {loss_sum / cfg.accumulation} at step {step} "
                "(lower the learning rate, clip gradients with max_norm, or pass "
                "fit(stop_on_nonfinite_loss=False) to train on)"
            )
        self.batches_drawn += 1
        lr, count, examples = self.strategy.lr, float(cfg.accumulation), float(cfg.batch_size)
        self.meter.add(step, lr, loss_sum, count, examples, step_flops=self.step_flops)
        done = self._steps_done(step)
        self.progress.loss(done, cfg.log_interval, loss_sum / cfg.accumulation)
        return done

    def _end_steps(self, step: int, done: int) -> None:
        """After the work from ``step`` to ``done``: the metrics flush, validation and
        checkpoint where due (the same on every node), and the progress bar. Collective when
        any of those is due."""
        validate = self.val_loader is not None and self.due(done, self.cfg.val_interval)
        save = self.cfg.checkpoint_dir is not None and self.due(done, self.cfg.checkpoint_interval)
        if done % self.flush_every == 0 or done == self.max_steps or validate or save:
            for row in self.meter.flush():
                self._emit(row)
                self.progress.row(row)
        if validate:
            self._emit(self.evaluator.validate(self.meter.metrics))
        if save:
            node_state.save(self, done)
        self.progress.advance(step, done)

    def _finish(self, keep_state: bool) -> dict[str, Any] | None:
        """End the run: the averaged final state (collective) and, on rank 0, the result."""
        self.progress.close()
        self.strategy.finish()
        self.comm.clock.finish()  # handles still in flight: results into their tensors
        state = self.evaluator.averaged_state(needed=self.rank == 0 or keep_state)
        if self.logger is not None:
            self.logger.finish()
        if self.rank != 0:
            return {"state_dict": state} if state is not None else None
        return {
            "state_dict": state,
            "history": self.history,
            "max_steps": self.max_steps,
            "peak_memory": self.meter.metrics.peak_memory,
            "nodes": self.meter.metrics.clocks.table(),
            "summary": self.strategy.run_summary(),
        }

    def close(self) -> None:
        """Drop everything the node holds (model copy, strategy, data, evaluator, history); it
        cannot train afterwards. Its parts refer back to it through bound methods (the
        evaluator's forward), so without this a finished node is freed only
        by the cyclic garbage collector: in a worker of 500 virtual nodes, a scan of some 80,000
        objects per run. What ``train`` returned stays valid."""
        self.__dict__.clear()

    def due(self, done: int, interval: int | None) -> bool:
        """Whether something done every ``interval`` steps and after the last one (a train
        row, a validation, a checkpoint) is due after ``done`` steps."""
        return done == self.max_steps or bool(interval and done % interval == 0)

    def _dropped(self, step: int) -> frozenset[int]:
        """The nodes dropped from ``step``'s round (the same on every node); rank 0 logs each
        such round as it begins."""
        if self.faults is None or not self.faults.drops:
            return frozenset()
        dropped = self.faults.dropped_at(step)
        if dropped and self.rank == 0 and step % self.faults.round_steps == 0:
            logger.log(
                self._fault_log_level,
                "faults: round %d (steps %d-%d): node(s) %s dropped, %d of %d nodes take part",
                step // self.faults.round_steps,
                step,
                min(self.max_steps, step + self.faults.round_steps) - 1,
                sorted(dropped),
                self.cfg.num_nodes - len(dropped),
                self.cfg.num_nodes,
            )
        return dropped

    def _steps_done(self, step: int) -> int:
        """The step counter after the work begun at ``step``: the strategy's, which owns it
        (``super().step()`` advances it)."""
        done = self.strategy.local_step
        if done <= step:
            raise RuntimeError(
                f"{type(self.strategy).__name__}.step() must end with super().step(): it advances the LR "
                f"schedule and the step counter (still at {done} after step {step})"
            )
        return done

    def _rejoin(self, step: int) -> None:
        """After ``step``: nodes back from a round they missed load a survivor's state.
        Collective when it happens (the same steps on every node)."""
        back = self.faults.rejoining(step) if self.faults is not None else None
        if back is None:
            return
        nodes, source = back
        F.rejoin(self.comm, self.model, self.strategy, nodes, source)
        if self.rank == 0:
            logger.log(
                self._fault_log_level,
                "faults: after step %d node(s) %s rejoin with node %d's state",
                step,
                nodes,
                source,
            )

    def _emit(self, row: dict[str, Any] | None) -> None:
        if row is None:  # ranks other than 0 make no validation rows
            return
        self.history.append(row)
        if self.logger is not None:
            self.logger.log(row)


__all__ = ["NodeJob", "TrainNode", "flush_interval"]
