"""Non-blocking collectives: handles that deliver a collective's result at a simulated time.

``handle = comm.all_reduce(t, async_op=True)`` (also ``all_gather`` and ``broadcast``, the
``torch.distributed`` convention) starts a collective and returns a
[`CollectiveHandle`][exogym.strategy.CollectiveHandle]:

* **data**: what ``t`` holds at the call is sent. The collective runs at once on a copy (every
  member starts it at the same point of its sequence of collectives, so the result is
  deterministic); ``t`` keeps the node's own values until
  [`CollectiveHandle.wait`][exogym.strategy.CollectiveHandle.wait], which writes the result into it
  (overwriting whatever the node wrote there since) and returns it (for ``all_gather``, the gathered
  tensor). Unlike ``torch.distributed``, the node may go on reading and changing ``t`` in between.
* **bytes**: charged once, when it starts, to the step it starts in (as the blocking call).
* **time**: the transfer starts on the node's clock when its step's backward pass starts
  (``Network.backward_share`` of the step's compute before its end, as a blocking collective's
  does) and lasts the collective's modelled seconds
  ([`exogym.core.comm.network.Network.record_seconds`][exogym.Network.record_seconds]: the formula
  that prices a blocking one, on the links its members use, at that simulated second for a world's
  traces). [`CollectiveHandle.is_completed`][exogym.strategy.CollectiveHandle.is_completed] is true
  once the node's clock has reached that time;
  [`CollectiveHandle.wait`][exogym.strategy.CollectiveHandle.wait] advances the clock to it where
  the clock is still behind, and that stall is the waiting step's communication time. A started
  collective is not a meeting: the node does not wait for its peers to start it. Transfers in flight
  together do not share bandwidth: each is priced as if alone on its links.

The clock handles read is the node's own (``LocalClock``): its compute (modelled, times
its speed factor and straggler slowdown) and its communication, stalls included; it leaves out
the time the node waits for slower peers in blocking collectives, which only the clocks
replayed for the rows know (``exogym.clocks``). Where every node computes at the same speed
the two agree. Within a step, handles start and are waited for after the step's compute, in the
order the calls are made; the step's blocking collectives count after them.

[`CollectiveHandle.is_completed`][exogym.strategy.CollectiveHandle.is_completed] answers before the
step's compute is measured, so it needs modelled compute (``Network(compute=<seconds per step>)``,
or ``"flops"`` turned into seconds before the run by a module with ``needs_step_seconds``): with
measured compute it raises ``RuntimeError``.
[`CollectiveHandle.wait`][exogym.strategy.CollectiveHandle.wait] works with any compute model.

A handle still in flight when the run ends is waited for then: its result lands in its tensor,
and the run's simulated time does not include it (no step needed it). A handle saved in a
checkpoint ([`CollectiveHandle.state_dict`][exogym.strategy.CollectiveHandle.state_dict], by the
module that holds it) comes back with ``LocalClock.resume``: its result and arrival time, bit for
bit. A node that rejoins after a fault (``exogym.runtime.faults.rejoin``) drops its own handles in
flight (``LocalClock.abandon``) and resumes those of the node whose state it loads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from exogym.core.comm.ledger import CollectiveRecord

if TYPE_CHECKING:
    from exogym.core.comm.network import Network
    from exogym.core.comm.protocol import Comm

#: The spelling of a delay that follows the clock: an update lands at the first step at which
#: its transfer has arrived (Streaming DiLoCo's ``overlap_steps``, SPARTA's ``delay``).
AUTO = "auto"


def check_modelled_compute(network: Network | None, what: str) -> None:
    """``ValueError`` naming ``what`` (the argument that asks the clock) where ``network``
    measures compute: whether a transfer has arrived would then depend on this machine's speed."""
    if network is not None and network.compute == "measured":
        raise ValueError(
            f"{what} applies an update when its transfer has arrived on the simulated clock, which needs modelled "
            "compute, but the network has compute='measured': pass fit(..., network=Network(..., "
            "compute=<seconds per step>)) (or compute='flops'), or give a number of steps"
        )


class CollectiveHandle:
    """A collective started with ``async_op=True`` (see the module docstring).

    Made by the collectives, not by hand. Attributes: ``kind`` (``"all_reduce"``,
    ``"all_gather"`` or ``"broadcast"``), ``arrival`` (the simulated second the result arrives
    on this node's clock; ``None`` until the step that started it has closed or
    [`is_completed`][exogym.strategy.CollectiveHandle.is_completed] resolves it) and ``records``
    (its ledger records).
    """

    def __init__(
        self,
        clock: LocalClock,
        kind: str,
        result: torch.Tensor,
        target: torch.Tensor | None,
        records: list[CollectiveRecord],
    ) -> None:
        self.kind = kind
        self.arrival: float | None = None
        self.records = records
        self._clock, self._result, self._target = clock, result, target
        self._waited = False

    def is_completed(self) -> bool:
        """Whether the result has arrived by now on the node's clock (true after
        [`wait`][exogym.strategy.CollectiveHandle.wait]). ``RuntimeError`` where the node's compute
        is not modelled (see the module docstring)."""
        return self._waited or self._clock.has_arrived(self)

    def wait(self) -> torch.Tensor:
        """Write the result into the tensor the collective started from and return it (for
        ``all_gather``: return the gathered tensor); advance the node's clock to the arrival if
        it is still behind. A second call returns the same tensor and costs nothing."""
        if not self._waited:
            self._clock.waiting(self)
            self._finish()
        return self._result

    def _finish(self) -> None:
        self._waited = True
        if self._target is not None:
            self._target.copy_(self._result)
            self._result = self._target

    def state_dict(self) -> dict[str, Any]:
        """The handle's kind, result and arrival, for a checkpoint (taken between steps, when
        the arrival is known: tensors and numbers only) or a node that rejoins during a step
        (then with its ledger records instead of the arrival). Restore it with
        ``LocalClock.resume``. ``RuntimeError`` for a handle already waited for (there is
        nothing in flight to keep)."""
        if self._waited:
            raise RuntimeError("only a handle in flight can be saved: this one was waited for")
        state: dict[str, Any] = {"kind": self.kind, "result": self._result, "arrival": self.arrival}
        if self.arrival is None:
            state["records"] = list(self.records)
        return state


class LocalClock:
    """A node's own simulated clock, as the node sees it while it runs (see the module
    docstring): the seconds at the end of its last step, and the handles in flight.

    The node loop drives it: ``attach`` (the network and the running step's modelled
    compute), ``close_step`` after each step, ``finish`` at the end of the run.
    """

    def __init__(self) -> None:
        #: Simulated seconds at the end of the node's last closed step.
        self.seconds = 0.0
        self.network: Network | None = None
        self._compute_now: Callable[[], float] | None = None
        self._events: list[tuple[CollectiveHandle, bool]] = []  # the running step's (handle, is a start)
        self._in_flight: list[CollectiveHandle] = []

    def attach(self, network: Network, compute_now: Callable[[], float] | None) -> None:
        """Price transfers on ``network``; ``compute_now()``: the running step's compute seconds
        (``None``: not known before the step closes, measured compute)."""
        self.network, self._compute_now = network, compute_now

    @property
    def in_flight(self) -> int:
        """Handles started and not waited for."""
        return len(self._in_flight)

    def started(self, handle: CollectiveHandle) -> None:
        """``handle`` started in the running step."""
        self._events.append((handle, True))
        self._in_flight.append(handle)

    def waiting(self, handle: CollectiveHandle) -> None:
        """The node waits for ``handle`` at this point of the running step."""
        self._in_flight.remove(handle)
        self._events.append((handle, False))

    def has_arrived(self, handle: CollectiveHandle) -> bool:
        """Whether ``handle``'s result has arrived by now (``RuntimeError`` without modelled compute)."""
        if self._compute_now is None:
            raise RuntimeError(
                "handle.is_completed() needs the node's simulated clock before the step's compute is measured: "
                "model compute with fit(..., network=Network(..., compute=<seconds per step>)), or use "
                "handle.wait(), which works with measured compute"
            )
        reached = self._walk(self._compute_now())
        assert handle.arrival is not None
        return handle.arrival <= reached

    def close_step(self, compute: float, comm: float) -> float:
        """End the running step, whose compute took ``compute`` seconds and blocking collectives
        ``comm``: the arrivals of the handles it started are fixed, and the clock moves on.
        Returns the seconds its waits stalled the node (its communication time, with ``comm``)."""
        base = self.seconds + compute
        stall = self._walk(compute) - base if self._events else 0.0
        self._events.clear()
        self.seconds = base + comm + stall
        return stall

    def _walk(self, compute: float) -> float:
        """The running step's starts and waits in order: fixes the arrivals of its handles;
        returns the clock after its last wait. A transfer starts as the step's backward pass
        starts (``Network.backward_share`` of its compute before the end, as a blocking
        collective does), or where a wait before it in the step left the clock."""
        end, network = self.seconds + compute, self.network
        t = end
        begin = end - network.backward_share * compute if network is not None else end
        for handle, is_start in self._events:
            if is_start:
                start = begin if t == end else t
                seconds = [network.record_seconds(r, start) for r in handle.records] if network is not None else []
                handle.arrival = start + sum(seconds)
            elif handle.arrival is not None and handle.arrival > t:
                t = handle.arrival
        return t

    def finish(self) -> None:
        """The run ended: write the results of the handles still in flight into their tensors
        (no step waits for them, so the clock does not move), and let go of the node loop's
        compute model (a bound method of its meter: no reference cycle outlives the run)."""
        for handle in list(self._in_flight):
            handle._finish()
        self._in_flight.clear()
        self._events.clear()
        self._compute_now = None

    def resume(self, state: dict[str, Any], target: torch.Tensor | None = None) -> CollectiveHandle:
        """A handle saved with
        [`CollectiveHandle.state_dict`][exogym.strategy.CollectiveHandle.state_dict], in flight
        again; ``target``: the tensor its [`wait`][exogym.strategy.CollectiveHandle.wait] writes the
        result into (``None``: wait returns the saved result itself). One saved during its step
        starts in this node's running step."""
        handle = CollectiveHandle(self, str(state["kind"]), state["result"], target, list(state.get("records", [])))
        if state["arrival"] is None:
            self.started(handle)
        else:
            handle.arrival = float(state["arrival"])
            self._in_flight.append(handle)
        return handle

    def abandon(self) -> None:
        """The node's state is about to be replaced (it rejoins with a peer's): its handles in
        flight go with it, their results never written (the replacing state brings its own)."""
        self._events = [(h, is_start) for h, is_start in self._events if not (is_start and h in self._in_flight)]
        self._in_flight.clear()

    def state_dict(self) -> dict[str, float]:
        """The clock's seconds (the handles in flight are their modules' state)."""
        return {"seconds": self.seconds}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Continue from ``state_dict``."""
        self.seconds = float(state["seconds"])


def start(
    comm: Comm, kind: str, tensor: torch.Tensor, run: Callable[[torch.Tensor], Any], in_place: bool = True
) -> CollectiveHandle:
    """Start ``kind`` on a copy of ``tensor``: ``run(copy)`` is ``comm``'s blocking collective, its
    records in ``comm.ledger`` marked as not blocking the step. ``in_place``: the result goes into
    ``tensor`` at wait (``all_reduce``, ``broadcast``); else wait returns ``run``'s result."""
    ledger = comm.ledger
    first = len(ledger.step_records)
    with ledger.nonblocking():
        result = run(tensor.detach().clone())
    handle = CollectiveHandle(comm.clock, kind, result, tensor if in_place else None, ledger.step_records[first:])
    comm.clock.started(handle)
    return handle


__all__ = ["AUTO", "CollectiveHandle", "LocalClock", "check_modelled_compute", "start"]
