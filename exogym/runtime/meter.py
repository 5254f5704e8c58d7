"""A node's measurements of its steps: each step's timings, ledger charges and peak memory
become a ``StepSample`` in the run's ``MetricsBuffer``,
which the nodes flush together into train rows.

Compute time is measured (wall time less the transport's) or modelled by the network
(``Network(compute=...)``) and slowed where faults make the node a straggler; the peak memory is
read only where a row ends, and at flushes by a node that trained since the last one.

The meter also drives the node's own clock (``LocalClock``),
which times its non-blocking collectives: each step closes it with the step's compute and
communication, and a step's stall on a handle is part of its communication time.
"""

from __future__ import annotations

import contextlib
import resource
import time
from typing import Any

import torch

from exogym.clocks import meeting_keys, record_rows
from exogym.core.comm.comm import NodeComm
from exogym.core.comm.network import Network
from exogym.metrics import MetricsBuffer, StepSample
from exogym.runtime import faults as F


class StepMeter:
    """One node's step measurements over one run.

    Args:
        comm: the node's comm (its ledger and transport seconds are read).
        network: the run's network model.
        faults: the run's fault plan (stragglers' slowdown, nodes alive), or ``None``.
        device: the node's.
        log_interval, max_steps: the run's (a train row every ``log_interval`` steps and after
            the last).
    """

    def __init__(
        self,
        comm: NodeComm,
        network: Network,
        faults: F.FaultPlan | None,
        device: torch.device,
        log_interval: int,
        max_steps: int,
    ) -> None:
        self.comm, self.network, self.faults, self.rank, self.device = comm, network, faults, comm.rank, device
        self.log_interval, self.max_steps = log_interval, max_steps
        #: Pending samples and, on rank 0, the run's totals.
        self.metrics = MetricsBuffer(comm, network, log_interval, max_steps)
        #: ``time.perf_counter()`` at the run's start (earlier by the wall time of a resumed run).
        self.start = 0.0
        #: When the current step began: ``time.perf_counter()`` and the transport's seconds.
        self.t0 = self.transport0 = 0.0
        self._trained = False  # since the last flush
        self._step = 0  # the step begun last
        #: Whether the node trains in the step begun last (else it computes nothing).
        self.trains = True
        modelled = isinstance(network.compute, (int, float))
        comm.clock.attach(network, self._compute_now if modelled else None)

    def begin_run(self) -> None:
        """The run's clock starts now, less the wall time already in the metrics (a resumed run)."""
        self.start = time.perf_counter() - self.metrics.wall

    def begin_step(self, step: int = 0) -> None:
        """Step ``step`` begins now."""
        self.t0, self.transport0 = time.perf_counter(), self.comm.transport_seconds
        self._step = step

    def _compute(self, step: int, measured: float = 0.0, flops: float = 0.0) -> float:
        """A training step's compute seconds (``network.compute_seconds``), slowed where faults
        make the node a straggler at ``step``."""
        compute = self.network.compute_seconds(measured, flops)
        return compute * self.faults.slowdown(self.rank, step) if self.faults is not None else compute

    def _compute_now(self) -> float:
        """The running step's modelled compute seconds, as ``add`` will count them (a node
        that does not train in it computes nothing). For a network whose compute is a number."""
        return self._compute(self._step) * self.network.slowdown(self.rank) if self.trains else 0.0

    def add(
        self,
        step: int,
        lr: float,
        loss_sum: float = 0.0,
        count: float = 0.0,
        examples: float = 0.0,
        step_flops: float | None = None,
    ) -> None:
        """Close the work begun at ``begin_step`` (its last step is ``step``, at learning rate
        ``lr``): the ledger records and transport seconds since then become a sample. A node
        that trained passes its summed loss, minibatches (``count``) and examples, and a
        training step's FLOPs (for a network that models compute from them); the others pass
        none."""
        t1 = time.perf_counter()
        records = self.comm.ledger.end_step()
        comm_wall = self.comm.transport_seconds - self.transport0
        network = self.network
        compute = self._compute(step, t1 - self.t0 - comm_wall, step_flops or 0.0) if count else 0.0
        self._trained = self._trained or bool(count)
        metrics = self.metrics
        slowed = compute * network.slowdown(self.rank)
        # The span of the step's collectives from its backward pass's start. With traces, the
        # replay of the clocks prices them where their meeting starts (the node knows only its
        # own start, where it prices them to time its handles).
        window = network.backward_share * slowed
        clock = self.comm.clock
        traced = metrics.traced
        span = network.records_span(records, slowed, clock.seconds + slowed - window if traced else 0.0)
        stall = clock.close_step(slowed, max(0.0, span - window))
        if stall:  # waiting for handles is communication: the step ends that much later
            span = max(span, window) + stall
        keys = meeting_keys(records)
        # The peak memory, a high-water mark, is read where a row ends: each row gets the value a
        # read per step would, without a getrusage per step (slow with hundreds of node threads).
        ends_row = (step + 1) % self.log_interval == 0 or step + 1 == self.max_steps
        metrics.add(
            StepSample(
                loss_sum,
                count,
                examples,
                sum(r.sent for r in records),
                sum(r.received for r in records),
                compute,
                span,
                comm_wall,
                t1 - self.start,
                float(peak_memory(self.device)) if count and ends_row else 0.0,
                lr,
                keys[0] if keys else 0.0,
            ),
            keys[1:],
            record_rows(records) if traced else (),
            stall,
        )

    def flush(self) -> list[dict[str, Any]]:
        """Combine the pending samples over nodes and return the train rows they complete (on
        rank 0; ``[]`` elsewhere), with the nodes alive where faults drop nodes. Collective."""
        # Only a node that trained since the last flush reads the peak memory (a read
        # walks every thread of the process: slow with hundreds of virtual nodes).
        peak = float(peak_memory(self.device)) if self._trained else 0.0
        self._trained = False
        rows = self.metrics.flush(peak)
        if self.faults is not None and self.faults.drops:
            L = self.log_interval
            for row in rows:
                row["nodes_alive"] = self.faults.min_alive((row["step"] - 1) // L * L, row["step"] - 1)
        return rows


def peak_memory(device: torch.device) -> int:
    """Peak bytes: CUDA allocator peak, else the process's peak resident set (on Linux since the
    run started: a worker that ran an earlier run resets the mark between runs)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    with contextlib.suppress(OSError, StopIteration, ValueError), open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) * 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


__all__ = ["StepMeter", "peak_memory"]
