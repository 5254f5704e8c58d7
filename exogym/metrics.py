"""Run metrics: per-step samples on every node, combined across nodes in batches.

Each node appends one :class:`StepSample` per step. Every ``flush_every`` steps (and before a
validation and at the end) the nodes exchange their pending samples in **one** uncharged
all-gather, and every node turns them into the same rows; rank 0 logs them. So logging every
step does not cost a collective per step.

Row columns (:data:`COLUMNS`; a row fills the ones it has):

* ``step``, ``examples`` (all nodes), ``lr``;
* ``train_loss``: mean over nodes and over the steps since the previous train row;
* ``val_loss_local`` (each node's own model on its share of the validation set, averaged),
  ``val_loss_global`` (the all-node average model), ``val_accuracy_local`` /
  ``val_accuracy_global`` when the model has a ``logits(inputs)`` method and batches are
  ``(inputs, integer labels)``: ``argmax(logits, -1) == labels`` over all label entries;
* ``bytes_sent``, ``bytes_received``: cumulative, mean per node; ``bytes_sent_per_step``: mean
  per node and step since the previous train row;
* ``compute_time``: cumulative seconds of the slowest node's local work per step (measured step
  time minus time inside collectives, times the network's ``compute_slowdown``);
  ``sim_comm_time``: cumulative modelled communication seconds (slowest node per step);
  ``sim_time = compute_time + sim_comm_time``: what the run would take on the network;
* ``comm_time``: cumulative wall seconds the slowest node spent inside the simulator's transport;
* ``wall_time``: seconds since training started (slowest node); ``peak_memory``: bytes, the
  largest node's peak (CUDA allocator peak, else peak resident set).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

import torch

from exogym.core.comm.comm import NodeComm
from exogym.core.comm.network import Network

COLUMNS = (
    "step",
    "examples",
    "train_loss",
    "val_loss_local",
    "val_loss_global",
    "val_accuracy_local",
    "val_accuracy_global",
    "lr",
    "bytes_sent",
    "bytes_received",
    "bytes_sent_per_step",
    "compute_time",
    "sim_comm_time",
    "sim_time",
    "comm_time",
    "wall_time",
    "peak_memory",
)


@dataclass
class StepSample:
    """What one node measured in one step."""

    loss_sum: float
    loss_count: float
    compute: float
    comm_wall: float
    comm_sim: float
    sent: float
    received: float
    lr: float
    wall: float
    peak_memory: float


_F = len(StepSample.__dataclass_fields__)


class MetricsBuffer:
    """Pending samples of one node and the running totals every node keeps identically.

    Args:
        comm: the node's collectives (the flush is an uncharged all-gather).
        network: the model that prices each step's collectives and compute.
        batch_size: examples per node per step.
        log_interval: a train row every this many steps (and at ``max_steps``).
        max_steps: the last step.
    """

    def __init__(self, comm: NodeComm, network: Network, batch_size: int, log_interval: int, max_steps: int) -> None:
        self.comm, self.network = comm, network
        self.batch_size, self.log_interval, self.max_steps = batch_size, log_interval, max_steps
        self.pending: list[StepSample] = []
        self.step = 0  # last step folded into the totals
        self.sent = self.received = 0.0
        self.compute_time = self.sim_comm_time = self.comm_time = self.wall = 0.0
        self.peak_memory = 0.0
        self._interval = torch.zeros(4, dtype=torch.float64)  # loss_sum, loss_count, sent, steps

    @property
    def sim_time(self) -> float:
        """Cumulative simulated seconds up to the last flushed step."""
        return self.compute_time + self.sim_comm_time

    def add(self, sample: StepSample) -> None:
        """Record this node's sample of the next step."""
        self.pending.append(sample)

    def flush(self) -> list[dict[str, Any]]:
        """Exchange the pending samples (collective) and return the train rows they complete."""
        if not self.pending:
            return []
        local = torch.tensor([astuple(s) for s in self.pending], dtype=torch.float64)
        every = self.comm.all_gather(local, charge=False)  # [nodes, steps, fields]
        self.pending = []
        k = every.shape[0]
        rows = []
        for i in range(every.shape[1]):
            s = every[:, i, :]
            self.step += 1
            self.sent += s[:, 5].sum().item() / k
            self.received += s[:, 6].sum().item() / k
            self.compute_time += max(s[r, 2].item() * self.network.slowdown(r) for r in range(k))
            self.sim_comm_time += s[:, 4].max().item()
            self.comm_time += s[:, 3].max().item()
            self.wall = s[:, 8].max().item()
            self.peak_memory = max(self.peak_memory, s[:, 9].max().item())
            self._interval += torch.stack(
                [s[:, 0].sum(), s[:, 1].sum(), s[:, 5].sum() / k, torch.tensor(1.0, dtype=torch.float64)]
            )
            if self.step % self.log_interval == 0 or self.step == self.max_steps:
                loss_sum, count, sent, steps = self._interval.tolist()
                self._interval.zero_()
                rows.append(
                    {
                        "step": self.step,
                        "examples": self.step * self.batch_size * k,
                        "train_loss": loss_sum / max(count, 1.0),
                        "lr": s[0, 7].item(),
                        "bytes_sent": self.sent,
                        "bytes_received": self.received,
                        "bytes_sent_per_step": sent / steps,
                        "compute_time": self.compute_time,
                        "sim_comm_time": self.sim_comm_time,
                        "sim_time": self.sim_time,
                        "comm_time": self.comm_time,
                        "wall_time": self.wall,
                        "peak_memory": self.peak_memory,
                    }
                )
        return rows

    def validation_row(self, local: tuple[float, ...], glob: tuple[float, ...]) -> dict[str, Any]:
        """A validation row from summed ``(loss_sum, examples, correct, labelled)`` of the
        local models and of the average model (already reduced over nodes)."""
        row: dict[str, Any] = {
            "step": self.step,
            "val_loss_local": local[0] / max(local[1], 1.0),
            "val_loss_global": glob[0] / max(glob[1], 1.0),
            "bytes_sent": self.sent,
            "sim_time": self.sim_time,
            "wall_time": self.wall,
        }
        if local[3] > 0:
            row["val_accuracy_local"] = local[2] / local[3]
            row["val_accuracy_global"] = glob[2] / glob[3]
        return row
