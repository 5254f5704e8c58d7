"""Run metrics: per-step samples on every node, combined across nodes in batches.

Each node appends one ``StepSample`` per step. Every ``flush_every`` steps (and before a
validation and at the end) the nodes combine their pending samples in two small uncharged
all-reduces (sums and maxima), whatever the number of nodes, and send their clock events
(``exogym.clocks``: a few numbers per step that a node computes, meets others or
closes a row) to rank 0, which replays the clocks, turns the results into rows and logs them. So logging
every step does not cost a collective per step.

Row columns (``COLUMNS``; a row fills the ones it has):

* ``step``, ``examples`` (trained by all nodes so far; nodes that sat a step out, e.g. clients
  not sampled in a round, add none), ``lr`` (rank 0's);
* ``train_loss``: mean over the nodes that trained and over the steps since the previous train
  row (``nan`` when no node trained in that interval);
* ``val_loss_local`` (each node's own model on its share of the validation set, averaged),
  ``val_loss_global`` (the all-node average model), ``val_accuracy_local`` /
  ``val_accuracy_global`` when the model has a ``logits(inputs)`` method and batches are
  ``(inputs, integer labels)``: ``argmax(logits, -1) == labels`` over all label entries;
* ``param_distance`` (validation rows): mean over nodes of the L2 distance of a node's
  floating-point state to the all-node average; ``model_correlation``: the mean pairwise
  Pearson correlation of the nodes' flattened models (the original exo gym's
  ``avg_model_correlation``; 1 when all nodes agree), with two nodes or more;
* ``bytes_sent``, ``bytes_received``: cumulative, mean per node; ``bytes_sent_per_step``: mean
  per node and step since the previous train row;
* ``sim_time``: what the run would take on the network: the latest node's simulated clock
  (``exogym.clocks``: every node's compute advances its own clock, a step's
  collectives make their participants wait for the last of them, then take the modelled
  communication time); ``sim_comm_time``: that node's modelled communication seconds;
  ``compute_time = sim_time - sim_comm_time``: the rest of its time, its compute and the
  compute it waited for (modelled by the network's compute model, ``Network(compute=...)``,
  times the node's speed factor and straggler slowdown). Where every node meets every step
  (DDP), these are the sums over steps of the slowest node's compute and communication;
* ``comm_time``: cumulative wall seconds the slowest node spent inside the simulator's transport;
* ``wall_time``: seconds since training started (slowest node); ``peak_memory``: bytes, the
  largest node's peak (CUDA allocator peak, else peak resident set);
* ``nodes_alive``: with faults that drop nodes (``exogym.runtime.faults``), the fewest
  nodes present at any step since the previous train row (added by the node loop).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, NamedTuple

import numpy as np
import torch

from exogym.clocks import NodeClocks, events
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
    "param_distance",
    "model_correlation",
    "nodes_alive",
)


class StepSample(NamedTuple):
    """What one node measured in one step (all zeros but ``lr`` and ``wall`` for a node that sat
    the step out, e.g. a client not sampled in a round). A tuple: ``MetricsBuffer`` keeps
    the fields in this order per pending step."""

    loss_sum: float
    loss_count: float
    examples: float
    sent: float
    received: float
    compute: float
    comm_sim: float
    comm_wall: float
    wall: float
    peak_memory: float
    lr: float
    #: The first of the step's meeting keys (``exogym.clocks.meeting_keys``;
    #: ``0``: meets no one).
    key: float = 0.0


#: Fields summed over nodes, then fields maxed over nodes (``compute`` and ``comm_sim`` reach rank 0
#: as clock events; ``lr`` and ``key`` stay the node's own).
_SUMMED = slice(0, 5)
_MAXED = slice(7, 10)
_COMPUTE, _COMM, _KEY = 5, 6, 11


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or ``None`` (another C library)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    return trim


#: The step of the process's last heap trim (``_give_back_free_memory``).
_TRIMMED_AT = [-1]


def _give_back_free_memory(step: int) -> None:
    """Return the pages of the process's freed heap memory to the system (glibc; elsewhere a
    no-op). A worker's virtual nodes flush in turn: each allocates and frees its flush's
    arrays between the others' long-lived allocations, and malloc keeps the freed pages, so
    that each flush left a worker's resident set a few MB larger (10 MB at the first ones in
    the soak). A trim walks every arena's free lists (a millisecond or more in a worker of
    hundreds of node threads): the flush that ends a run skips it (its nodes are freed next),
    so that a program of many short runs does not pay it per node and run, and a worker trims
    once per flush (``step``: the first of its nodes to flush there trims what the flushes
    before freed; a trim per node would cost a worker of 500 clients half a second per flush)."""
    if _TRIMMED_AT[0] == step:
        return
    _TRIMMED_AT[0] = step
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class MetricsBuffer:
    """Pending samples of one node and (on rank 0) the running totals.

    A flush costs two small uncharged all-reduces (sums and maxima over nodes of the pending
    steps) and an uncharged gather of the nodes' clock events onto rank 0 (with the all-reduce
    of their count); rank 0 replays the clocks, turns the result into rows and keeps the totals
    (other ranks count steps only and only send their share).

    Args:
        comm: the node's collectives.
        network: the model that prices each step's collectives and compute.
        log_interval: a train row every this many steps (and at ``max_steps``).
        max_steps: the last step.
    """

    def __init__(self, comm: NodeComm, network: Network, log_interval: int, max_steps: int) -> None:
        self.comm, self.network = comm, network
        self.log_interval, self.max_steps = log_interval, max_steps
        #: Whether the world has bandwidth traces: then each pending step also keeps the seconds it
        #: stalls on handles (after StepSample's fields) and its collectives, which rank 0 prices
        #: where each meeting starts (``exogym.clocks.RECORD_COLUMNS``).
        self.traced = len(network.trace_changes) > 0
        # Pending steps, one row per step in StepSample's field order; rows [0, _n) are in use.
        self._rows = np.zeros((64, len(StepSample._fields) + self.traced))
        self._n = 0
        self._records: dict[int, tuple[tuple[float, ...], ...]] = {}  # pending row -> its collectives (traced)
        self._more_keys: dict[int, tuple[float, ...]] = {}  # pending row -> its further meeting keys
        self.step = 0  # last step folded into the totals
        self.examples = 0.0
        self.sent = self.received = 0.0
        self.compute_time = self.sim_comm_time = self.comm_time = self.wall = 0.0
        self._sim_time = 0.0
        self.peak_memory = 0.0
        #: Every node's simulated clock, on rank 0, which replays them at each flush (see
        #: ``exogym.clocks``); ``None`` on the other ranks, which only send their events.
        world = network.world if self.traced else None
        self.clocks = NodeClocks(comm.world_size, (), network.backward_share, world) if comm.rank == 0 else None
        self._slowdown = network.slowdown(comm.rank)
        self._interval = [0.0, 0.0, 0.0, 0]  # loss_sum, loss_count, sent per node, steps
        self._partial: list[float] | None = None

    @property
    def sim_time(self) -> float:
        """Simulated seconds up to the last flushed step: the latest node's clock."""
        return self._sim_time

    @property
    def pending(self) -> int:
        """Steps recorded since the last flush."""
        return self._n

    def _reserve(self, steps: int) -> np.ndarray:
        """The next ``steps`` rows (the buffer doubles when full); they count as pending."""
        end = self._n + steps
        if end > len(self._rows):
            grown = np.zeros((max(end, 2 * len(self._rows)), self._rows.shape[1]))
            grown[: self._n] = self._rows[: self._n]
            self._rows = grown
        block = self._rows[self._n : end]
        self._n = end
        return block

    def add(
        self,
        sample: StepSample,
        more_keys: tuple[float, ...] = (),
        records: tuple[tuple[float, ...], ...] = (),
        stall: float = 0.0,
    ) -> None:
        """Record this node's sample of the next step (its ``compute`` is scaled by the network's
        ``compute_slowdown`` of this node here); ``more_keys``: the step's meeting keys after
        ``sample.key``; with traces, ``records``: its collectives (``exogym.clocks.record_rows``)
        and ``stall``: the seconds it waited on handles."""
        if sample.compute and self._slowdown != 1.0:
            sample = sample._replace(compute=sample.compute * self._slowdown)
        if more_keys:
            self._more_keys[self._n] = more_keys
        if records and self.traced:
            self._records[self._n] = records
        row = self._reserve(1)[0]
        row[: len(sample)] = sample
        if self.traced:
            row[len(sample)] = stall

    def flush(self, peak_memory: float = 0.0) -> list[dict[str, Any]]:
        """Combine the pending samples over nodes (collective) and return the train rows they
        complete (on rank 0; other ranks return ``[]``). ``peak_memory``: this node's peak now,
        folded into the last pending step."""
        if not self._n:
            return []
        # (The column slices below are copies: the rows are reused once this returns.)
        local = torch.from_numpy(self._rows[: self._n])
        local[-1, 9] = max(float(local[-1, 9]), peak_memory)
        steps, self._n = self._n, 0
        a = local.numpy()
        more, self._more_keys = self._more_keys, {}
        records, self._records = (self._records, {}) if self.traced else (None, {})
        comm = a[:, len(StepSample._fields)] if self.traced else a[:, _COMM]
        own = events(self.step + 1, a[:, _COMPUTE], comm, a[:, _KEY], self.log_interval, self.max_steps, more, records)
        if self.comm.rank != 0:
            # Only rank 0 keeps the totals and makes rows: the others send their share.
            self.comm.all_reduce_contribute(local[:, _SUMMED].contiguous(), "sum")
            self.comm.all_reduce_contribute(local[:, _MAXED].contiguous(), "max")
            self.comm.all_gather_contribute(self._padded_events(own))
            self.step += steps
            if self.step < self.max_steps:
                _give_back_free_memory(self.step)
            return []
        lrs = local[:, 10].tolist()
        sums_t = self.comm.all_reduce(local[:, _SUMMED].contiguous(), "sum", charge=False)
        maxes_t = self.comm.all_reduce(local[:, _MAXED].contiguous(), "max", charge=False)
        sums, maxes = sums_t.tolist(), maxes_t.tolist()
        assert self.clocks is not None
        times = self.clocks.replay(self._gather_events(own))
        k = self.comm.world_size
        rows = []
        for (loss_sum, count, examples, sent, received), (wall_comm, wall, peak), lr in zip(
            sums, maxes, lrs, strict=True
        ):
            self.step += 1
            self.examples += examples
            self.sent += sent / k
            self.received += received / k
            if self.step in times:
                self._sim_time, self.sim_comm_time = times[self.step]
                self.compute_time = self._sim_time - self.sim_comm_time
            self.comm_time += wall_comm
            self.wall = max(self.wall, wall)
            self.peak_memory = max(self.peak_memory, peak)
            iv = self._interval
            iv[0] += loss_sum
            iv[1] += count
            iv[2] += sent / k
            iv[3] += 1
            if self.step % self.log_interval == 0 or self.step == self.max_steps:
                # An end-of-run row off the log_interval grid closes a partial interval: a run
                # resumed from here continues that interval (see state_dict).
                self._partial = list(iv) if self.step % self.log_interval else None
                self._interval = [0.0, 0.0, 0.0, 0]
                rows.append(
                    {
                        "step": self.step,
                        "examples": int(self.examples),
                        "train_loss": iv[0] / iv[1] if iv[1] else float("nan"),
                        "lr": lr,
                        "bytes_sent": self.sent,
                        "bytes_received": self.received,
                        "bytes_sent_per_step": iv[2] / iv[3],
                        "compute_time": self.compute_time,
                        "sim_comm_time": self.sim_comm_time,
                        "sim_time": self.sim_time,
                        "comm_time": self.comm_time,
                        "wall_time": self.wall,
                        "peak_memory": self.peak_memory,
                    }
                )
        if self.step < self.max_steps:
            _give_back_free_memory(self.step)
        return rows

    def _gather_events(self, own: np.ndarray) -> np.ndarray:
        """Every node's events ``[nodes, events, columns]`` (``exogym.clocks.EVENT_COLUMNS``, or
        ``RECORD_COLUMNS`` with traces, padded with zero rows): an uncharged all-gather, whose
        other nodes only send theirs (``_padded_events``). Collective."""
        return self.comm.all_gather(self._padded_events(own), charge=False).numpy()

    def _padded_events(self, own: np.ndarray) -> torch.Tensor:
        """``own`` padded with zero rows to the most events of any node (a max all-reduce, so
        that every node's share of the gather has one size). Collective."""
        longest = torch.tensor([float(len(own))], dtype=torch.float64)
        self.comm.all_reduce(longest, "max", charge=False)
        padded = np.zeros((int(longest.item()), own.shape[1]))
        padded[: len(own)] = own
        return torch.from_numpy(padded)

    _STATE = ("step", "examples", "sent", "received", "compute_time", "sim_comm_time", "comm_time", "wall")

    def state_dict(self) -> dict[str, Any]:
        """The totals, for checkpoints (taken right after a flush: nothing is pending). At the
        end of a run whose length is off the ``log_interval`` grid, the interval the last row
        closed early is kept open, so a resumed run's rows equal an uninterrupted run's."""
        if self.pending:
            raise RuntimeError("MetricsBuffer.state_dict() with pending samples: flush first")
        state: dict[str, Any] = {k: getattr(self, k) for k in self._STATE}
        interval = self._partial if self._partial is not None else self._interval
        state["peak_memory"], state["interval"] = self.peak_memory, list(interval)
        state["sim_time"] = self._sim_time
        if self.clocks is not None:
            state["clocks"] = self.clocks.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict``'s totals."""
        for k in self._STATE:
            setattr(self, k, state[k])
        self.peak_memory, self._interval = state["peak_memory"], list(state["interval"])
        self._sim_time = state.get("sim_time", self.compute_time + self.sim_comm_time)
        if self.clocks is None:
            return
        if "clocks" in state:
            self.clocks.load_state_dict(state["clocks"])
        else:  # a checkpoint of lock-step time: every node at the run's time
            self.clocks.clock[:] = self._sim_time

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
