"""The clients of a server algorithm on one rank: tasks run here, client state stored here.

A rank keeps one model replica and one copy of the strategy (inner optimizer, LR schedule) and
lends them to each task it runs: the task's client's state is restored into them, the steps
run, and the state is stored again. A client's state is what persists between its tasks in a
real deployment: the inner optimizer's state, its position in the LR schedule, its position in
its data and its random stream. A client that never runs a task has no state, no dataset and no
loader: nothing of it exists.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from exogym import data as D
from exogym.core.events import Task, flat_params, load_flat
from exogym.runtime import checkpoint as ckpt
from exogym.runtime.forward import backward, forward_loss


class Clients:
    """The clients whose tasks this rank runs (see the module docstring).

    Args:
        job: the run (``exogym.runtime.node.NodeJob``).
        device: where the model trains.
        max_steps, steps_per_epoch: the run's ticks and a client's steps per epoch.
    """

    def __init__(self, job: Any, device: torch.device, max_steps: int, steps_per_epoch: int) -> None:
        cfg = self.cfg = job.config
        self.job, self.device = job, device
        self.model = job.model_copy().to(device)
        self.model.train()
        self.strategy = job.strategy_copy()
        self.adversaries = None if cfg.adversaries is None else cfg.adversaries.plan(cfg.num_nodes, cfg.seed)
        self.strategy._attach(None, max_steps, cfg.seed, steps_per_epoch, cfg.network, self.adversaries)
        self.strategy._init_node(self.model, 0, cfg.num_nodes)
        self._initial = self.strategy.state_dict()
        #: Per client that ran a task, what it keeps between its tasks: ``{"strategy": ..., "rng": ...,
        #: "data": ...}`` (its strategy's state, random state and position in its data).
        self.states: dict[int, dict[str, Any]] = {}

    def forward_with(self, batch: Any, model: torch.nn.Module) -> torch.Tensor:
        """``model``'s scalar loss on ``batch``, under the run's autocast."""
        autocast = self.cfg.autocast
        with contextlib.nullcontext() if autocast is None else torch.autocast(self.device.type, dtype=autocast):
            return forward_loss(model, batch)

    def state_dict(self) -> dict[int, dict[str, Any]]:
        """Every client's stored state, by client (checkpoints)."""
        return dict(self.states)

    def load_state_dict(self, states: dict[int, dict[str, Any]]) -> None:
        """The clients' states ``state_dict`` gave (those this rank runs tasks for)."""
        self.states = dict(states)

    def lr_at(self, tick: int) -> float:
        """The inner learning rate of a step at ``tick`` (the same for every client)."""
        self.strategy.load_state_dict(self._initial)
        self.strategy.skip_steps(tick)
        return self.strategy.lr

    def _batches(self, client: int, state: dict[str, Any] | None) -> D.BatchStream:
        cfg = self.cfg
        ds = D.node_dataset(self.job.train_dataset, client, cfg.num_nodes, train=True)
        shared = not D.is_factory(self.job.train_dataset)
        loader, sampler = D.train_loader(
            ds, shared, client, cfg.num_nodes, cfg.batch_size, cfg.shuffle, cfg.seed, cfg.dataloader_kwargs
        )
        stream = D.BatchStream(loader, sampler, cfg.dataloader_kwargs)
        if state is not None:
            stream.load_state_dict(state["data"])
        return stream

    def run(self, task: Task) -> None:
        """Run ``task`` for its client: its steps at its ticks from the parameters it was sent;
        set ``task.local`` and ``task.losses``. A non-finite loss raises ``FloatingPointError``
        (with ``fit(stop_on_nonfinite_loss=True)``)."""
        client, strategy, cfg = task.client, self.strategy, self.cfg
        state = self.states.get(client)
        load_flat(self.model, task.start.to(self.device))
        strategy.load_state_dict(state["strategy"] if state is not None else self._initial)
        if task.train.fresh_optimizer:
            strategy.optim.state.clear()
        if state is not None:
            ckpt.set_rng_state(state["rng"], self.device)
        else:
            torch.manual_seed(cfg.seed + client)
        batches = self._batches(client, state)
        for tick in task.ticks:
            strategy.skip_steps(tick - strategy.local_step)
            strategy.zero_grad()
            batch = next(batches)
            if self.adversaries is not None and self.adversaries.flips_labels(client, tick):
                batch = self.adversaries.poison(batch)
            loss, _ = backward(lambda b: self.forward_with(b, self.model), batch, cfg.accumulation, self.device)
            if not math.isfinite(loss) and cfg.stop_on_nonfinite_loss:
                raise FloatingPointError(
                    f"client {client}: the training loss is {loss / cfg.accumulation} at step {tick} (lower the "
                    "learning rate, clip gradients with max_norm, or pass fit(stop_on_nonfinite_loss=False) to "
                    "train on)"
                )
            task.losses.append(loss / cfg.accumulation)
            strategy.step()
        task.local = flat_params(self.model).cpu()
        if task.train.fresh_optimizer:  # its next task starts afresh too: keep no state of it
            strategy.optim.state.clear()
        self.states[client] = {
            "strategy": strategy.state_dict(),
            "rng": ckpt.rng_state(self.device),
            "data": batches.state_dict(),
        }


__all__ = ["Clients"]
