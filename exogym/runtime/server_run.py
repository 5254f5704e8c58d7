"""A server algorithm's run on one rank: the clock, this rank's share of the tasks, the rows.

Every rank runs the same [`ServerLoop`][exogym.core.events.ServerLoop] over the same server
state: the server's rules are cheap and deterministic, so they are replicated rather than sent.
Only the tasks are split: a wave's task for client ``c`` runs on rank ``c % world`` (which
keeps that client's state, ``exogym.runtime.clients``), and its result reaches every rank in a
broadcast. The same run on 1 or 2 workers, or under torchrun, computes the same values.

What the run reports comes from the clock alone: each row's ``sim_time`` is the simulated
second at which the tick after its last begins (the run's end for the last row), the per-node table gives each
client's compute, transfers and waiting over the run's simulated seconds, and the summary
every client's steps and utilisation and the staleness of the updates.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from typing import Any

import torch
from torch.utils.data import DataLoader

from exogym import data as D
from exogym.core.comm.transport import Transport
from exogym.core.events import TIME_DIGITS, ServerLoop, Task, flat_params, load_flat
from exogym.core.server import ServerContext, ServerStrategy
from exogym.runtime import checkpoint as ckpt
from exogym.runtime.clients import Clients
from exogym.runtime.evaluation import Evaluator
from exogym.runtime.meter import peak_memory
from exogym.runtime.progress import Progress

logger = logging.getLogger(__name__)


def transfer_seconds(network: Any, client: int, nbytes: int, direction: str) -> float:
    """Simulated seconds to move ``nbytes`` between ``client`` and the server, ``direction``
    ``"up"`` (the client sends: its result, at its access link's upload) or ``"down"`` (the
    server sends: a model, at the client's download): on a world, over the link between the
    client's region and the server's (the first region) and the client's access link; otherwise
    ``latency + 8 * nbytes / bandwidth``. ``ValueError`` for another direction."""
    if direction not in ("up", "down"):
        raise ValueError(f"transfer_seconds: direction must be 'up' (client to server) or 'down', got {direction!r}")
    world = network.world
    if world is None:
        return network.latency + 8.0 * nbytes / network.bandwidth
    link = world.links[world.region_of[client]][0]  # None: a region of one node, the server's
    a, bw = (0.0, float("inf")) if link is None else (link.latency, link.bandwidth)
    if world.access:
        own = world.access[client]
        a, bw = a + own.latency, min(bw, own.upload if direction == "up" else own.bandwidth)
    return a + 8.0 * nbytes / bw


def step_seconds(network: Any) -> float:
    """Seconds of one training step before a client's speed factor: the network's modelled
    compute (``fit`` turns ``compute="flops"`` into seconds before the run; ``ValueError`` for
    measured compute: the clock must not depend on this machine)."""
    c = network.compute
    if isinstance(c, str):
        raise ValueError(
            f"server algorithms follow a simulated clock, which needs modelled compute: the network has compute={c!r}; "
            "pass fit(..., network=Network(..., compute=<seconds per step>)) or compute='flops'"
        )
    if not round(float(c), TIME_DIGITS) > 0:
        raise ValueError(
            f"server algorithms count steps on a clock kept to 1e-{TIME_DIGITS} s: a step must take time, but the "
            f"network's compute is {float(c):.3g} s per step (with compute='flops': a step's FLOPs over "
            f"flops_per_second); pass Network(..., compute=<seconds per step >= 1e-{TIME_DIGITS}>), or a lower "
            "flops_per_second"
        )
    return float(c)


def server_context(
    network: Any,
    num_clients: int,
    seed: int,
    params: torch.Tensor,
    steps_per_epoch: int,
    projection: Any = None,
    adversaries: Any = None,
) -> ServerContext:
    """What a server gets at setup in a run on ``network`` (its speeds drawn for the run) of
    ``num_clients`` clients from ``seed``, starting from the flat ``params``, whose clients take
    ``steps_per_epoch`` steps per pass over their data; with a scale's ``projection``, a model
    transfer carries the target's bytes; ``adversaries``: the run's ``AdversaryPlan``. ``ValueError``
    where the network's compute is measured."""
    base = step_seconds(network)
    nbytes = params.numel() * params.element_size()
    if projection is not None:
        nbytes = int(round(nbytes * projection.ratio))
    world = network.world
    return ServerContext(
        num_clients=num_clients,
        seed=seed,
        params=params,
        step_seconds=lambda c: base * network.slowdown(c),
        transfer_seconds=lambda c, n=None, *, direction: transfer_seconds(
            network, c, nbytes if n is None else n, direction
        ),
        steps_per_epoch=steps_per_epoch,
        region_of=(lambda c: world.region_of[c]) if world is not None else (lambda c: 0),
        regions=len(world.links) if world is not None else 1,
        network=network,
        nbytes=nbytes,
        adversaries=adversaries,
    )


class ServerRun:
    """One rank's run of a server strategy (collective: every rank of the run runs it).

    Args:
        job: the run (``exogym.runtime.node.NodeJob``) whose strategy is a
            [`ServerStrategy`][exogym.ServerStrategy].
        rank, world: this rank and the number of ranks.
        transport: between the ranks (``None`` with one).
        device: where clients train.
    """

    def __init__(self, job: Any, rank: int, world: int, transport: Transport | None, device: torch.device) -> None:
        cfg = self.cfg = job.config
        self.job, self.rank, self.world, self.transport, self.device = job, rank, world, transport, device
        strategy: ServerStrategy = job.strategy
        self.model = job.model_copy()
        shared = not D.is_factory(job.train_dataset)
        first = D.node_dataset(job.train_dataset, 0, cfg.num_nodes, train=True)
        self.steps_per_epoch = D.steps_per_epoch(len(first), shared, cfg.num_nodes, cfg.batch_size)
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"client 0's dataset has fewer than batch_size={cfg.batch_size} examples: no full batch to train on"
            )
        self.max_steps = cfg.max_steps or self.steps_per_epoch * cfg.num_epochs
        self.clients = Clients(job, device, self.max_steps, self.steps_per_epoch)
        self.server = copy.deepcopy(strategy.server)
        plan = None if cfg.adversaries is None else cfg.adversaries.plan(cfg.num_nodes, cfg.seed)
        ctx = server_context(
            cfg.network, cfg.num_nodes, cfg.seed, flat_params(self.model), self.steps_per_epoch, cfg.projection, plan
        )
        self.validations: list[dict[str, Any]] = []
        self.val_loader = self._val_loader()
        # no autocast around a validation forward: the clients' forward applies the run's
        self.evaluator = Evaluator(
            None, self.model, device, self.val_loader, self.clients.forward_with, contextlib.nullcontext, rank, world
        )  # type: ignore[arg-type]
        # quiet below ERROR: what a server logs at setup, fit's checks logged before the workers started
        logging.disable(logging.WARNING)
        try:
            self.loop = ServerLoop(self.server, ctx, self.max_steps, self._execute, self._between_ticks)
        finally:
            logging.disable(logging.NOTSET)
        self.progress = Progress(self.max_steps, enabled=cfg.progress and rank == 0)
        self._progressed = 0
        self._t0 = time.perf_counter()
        #: Per train row (by its ticks), the wall seconds from the run's start to its end.
        self._walls: dict[int, float] = {}

    def _val_loader(self) -> DataLoader | None:
        """This rank's share of the validation examples (the server model is validated on the
        first ``val_size``, split over the ranks); ``None`` without validation."""
        cfg, job = self.cfg, self.job
        val = D.node_dataset(job.val_dataset, 0, cfg.num_nodes, train=False)
        if val is None or cfg.val_size <= 0:
            return None
        sub = D.val_subset(val, True, self.rank, self.world, cfg.val_size)
        return DataLoader(
            sub,
            batch_size=cfg.minibatch_size,
            **{**cfg.dataloader_kwargs, "collate_fn": D.collate_fn(cfg.dataloader_kwargs)},
        )

    # -- tasks ---------------------------------------------------------------------------------
    def _execute(self, tasks: list[Task]) -> None:
        """Run this rank's share of ``tasks``; every rank then holds every result."""
        for task in tasks:
            if task.client % self.world == self.rank:
                self.clients.run(task)
        if self.world > 1:
            for task in tasks:
                self._share(task)
        done = len(self.loop.ticks)
        if done > self._progressed:
            self.progress.advance(self._progressed, done)
            self._progressed = done

    def _share(self, task: Task) -> None:
        """Broadcast ``task``'s result from the rank that ran it (float64: exact for float32)."""
        n, p = len(task.ticks), task.start.numel()
        owner = task.client % self.world
        buf = torch.empty(p + n, dtype=torch.float64)
        if owner == self.rank:
            assert task.local is not None
            buf[:p] = task.local.double()
            buf[p:] = torch.tensor(task.losses, dtype=torch.float64)
        assert self.transport is not None
        self.transport.broadcast(buf, owner)
        if owner != self.rank:
            task.local = buf[:p].to(task.start.dtype)
            task.losses = buf[p:].tolist()

    # -- between ticks: validation, checkpoints ------------------------------------------------
    def _between_ticks(self, done: int) -> None:
        """After ``done`` ticks: validate (at the start, every ``val_interval`` ticks and at the
        end, as a node's loop does) and checkpoint where due (the same on every rank)."""
        cfg = self.cfg
        last = done == self.max_steps
        if last or done % cfg.log_interval == 0:
            self._walls[done] = time.perf_counter() - self._t0  # the wall time of the row that ends here
        if self.val_loader is not None and (done == 0 or last or (cfg.val_interval and done % cfg.val_interval == 0)):
            self._validate(done)
        if cfg.checkpoint_dir is not None and cfg.checkpoint_interval and 0 < done < self.max_steps:
            if done % cfg.checkpoint_interval == 0:
                self._save(done)

    def _validate(self, done: int) -> None:
        """The server model's validation loss (and accuracy), split over the ranks. Collective."""
        load_flat(self.model, self.server.params.to(self.device))
        stats = torch.tensor(self.evaluator.evaluate(self.model), dtype=torch.float64)
        if self.transport is not None:
            self.transport.all_reduce(stats, "sum")
        loss, count, correct, labelled = stats.tolist()
        at = self._now(done)
        sent = sum(b for t, b, _ in self.loop.transfers if t <= at) / self.cfg.num_nodes
        row: dict[str, Any] = {
            "step": done, "val_loss_global": loss / max(count, 1.0), "bytes_sent": sent, "sim_time": at,
        }  # fmt: skip
        if labelled > 0:
            row["val_accuracy_global"] = correct / labelled
        self.validations.append(row)

    def _now(self, done: int) -> float:
        """The simulated second after ``done`` ticks: the instant the next tick begins, or the
        run's end after the last."""
        loop = self.loop
        if done >= self.max_steps:
            return loop.end_time
        return loop.ticks[done] if done < len(loop.ticks) else loop.time  # (between ticks: the next one's)

    def _save(self, done: int) -> None:
        """Checkpoint after ``done`` ticks: every rank writes its clients' state, rank 0 the clock
        and the server (the same on every rank) and completes the checkpoint. Collective."""
        root = self.cfg.checkpoint_dir
        assert root is not None
        state = {
            "step": done, "clients": self.clients.state_dict(),
            "loop": self.loop.state_dict() if self.rank == 0 else None,
            "validations": self.validations if self.rank == 0 else None,
        }  # fmt: skip
        ckpt.write_node(root, done, self.rank, state)
        if self.transport is not None:
            self.transport.barrier()
        if self.rank == 0:
            folder = ckpt.finalize(root, done, {**(self.job.checkpoint_meta or {}), "workers": self.world})
            logger.info("checkpoint after step %d: %s", done, folder)

    def _restore(self, folder: str) -> None:
        """Continue from the checkpoint in ``folder``: the clock and the server from rank 0's
        file, this rank's clients from every file (they may have run on other ranks)."""
        meta = ckpt.load_meta(folder)
        mine: dict[int, Any] = {}
        for r in range(int(meta.get("workers", 1))):
            state = ckpt.load_node(folder, r, ["step", "clients", "loop", "validations"])
            mine.update((c, saved) for c, saved in state["clients"].items() if c % self.world == self.rank)
            if r == 0:
                self.loop.load_state_dict(state["loop"])
                self.validations = list(state["validations"])
        self.clients.load_state_dict(mine)
        self._progressed = int(meta["step"])

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run the clock to its end; rank 0's result (the others': the final state only), whose
        ``peak_memory`` is the largest worker's (CUDA allocator peak, else peak resident set).
        Collective."""
        self._t0 = time.perf_counter()
        if self.cfg.resume_from is not None:
            self._restore(self.cfg.resume_from)
        self.loop.run()
        self.progress.advance(self._progressed, self.max_steps)
        self.progress.close()
        load_flat(self.model, self.server.params.to(self.device))
        state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        self.job.strategy._summary = summary = self.loop.summary()
        peak = torch.tensor([float(peak_memory(self.device))], dtype=torch.float64)
        if self.transport is not None:  # the largest worker's
            self.transport.all_reduce(peak, "max")
        if self.rank != 0:
            return {"state_dict": state}
        if not self.loop.received:
            logger.warning(
                "%s: no client's result reached the server in the run's %d steps (ticks of the clock), so the model "
                "is the initial one; raise max_steps past a task's length (e.g. FedAvg's H steps per round)",
                self.server.describe(),
                self.max_steps,
            )
        history = sorted(self._rows(time.perf_counter() - self._t0) + self.validations, key=lambda r: r["step"])
        self._log(history)
        return {
            "state_dict": state,
            "history": history,
            "max_steps": self.max_steps,
            "peak_memory": peak.item(),
            "nodes": self.loop.node_table(),
            "summary": summary,
        }

    def _log(self, history: list[dict[str, Any]]) -> None:
        """Hand the run's rows to the run's logger (``fit(logger=...)``), all at the end: the rows
        are the clock's, known once it has run."""
        sink = self.job.logger
        if sink is None:
            return
        sink.start(self.job.run_name, {**self.cfg.to_dict(), **self.job.strategy.config(), "max_steps": self.max_steps})
        for row in history:
            sink.log(row)
        sink.finish()

    def _rows(self, wall: float) -> list[dict[str, Any]]:
        """The train rows, every ``log_interval`` ticks and at the last: per row the mean loss of
        the steps of its ticks, the examples and bytes so far (bytes: mean per client of the
        run), the learning rate of its last tick, and the simulated second at which the next tick
        begins (the run's end for the last row)."""
        cfg, loop, k = self.cfg, self.loop, self.cfg.num_nodes
        transfers = sorted(loop.transfers)
        rows: list[dict[str, Any]] = []
        loss = steps = examples = moved = sent = received = last_sent = 0
        for i in range(len(loop.ticks)):
            loss += loop.tick_loss[i]
            steps += loop.tick_steps[i]
            examples += loop.tick_steps[i] * cfg.batch_size
            done = i + 1
            if done % cfg.log_interval and done != self.max_steps:
                continue
            until = self._now(done)
            while moved < len(transfers) and transfers[moved][0] <= until:
                sent, received = sent + transfers[moved][1], received + transfers[moved][2]
                moved += 1
            ticks = done - (rows[-1]["step"] if rows else 0)
            rows.append(
                {
                    "step": done,
                    "examples": examples,
                    "train_loss": loss / steps if steps else float("nan"),
                    "lr": self.clients.lr_at(i),
                    "bytes_sent": sent / k,
                    "bytes_received": received / k,
                    "bytes_sent_per_step": (sent - last_sent) / k / ticks,
                    "sim_time": until,
                    "wall_time": self._walls.get(done, wall),
                }
            )
            loss = steps = 0
            last_sent = sent
        return rows


def server_worker(worker: int, job: Any, plan: Any) -> dict[str, Any] | None:
    """Process entry of worker ``worker`` of a server strategy's run (what ``fit`` starts on each
    of its workers): rank 0's result, ``None`` elsewhere. Collective."""
    cfg = job.config
    logging.basicConfig(level=cfg.log_level, format=f"[worker {worker}] %(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(cfg.threads_per_worker)
    device = cfg.worker_device(worker)
    transport = plan.connect(worker) if cfg.workers > 1 else None
    out = ServerRun(job, worker, cfg.workers, transport, device).run()
    if transport is not None:
        transport.close()
    return out if worker == 0 or cfg.launcher == "torchrun" else None


__all__ = ["ServerRun", "server_context", "server_worker", "step_seconds", "transfer_seconds"]
