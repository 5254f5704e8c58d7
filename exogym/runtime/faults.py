"""Fault injection: nodes that drop out of rounds, and stragglers whose speed varies per step.

A [`Faults`][exogym.Faults] object describes what goes wrong; ``Trainer.fit(faults=...)`` binds it
to the run as a ``FaultPlan``. Everything is drawn from a seed every rank shares (counter-based:
``(seed, round)`` for dropouts, ``(seed, rank, step)`` for slowdowns), so every rank knows
without a message who is dropped, a resumed run sees the same faults, and two runs with the
same seeds see the same faults.

**Dropouts.** A *round* is the period of the strategy's slowest communication: ``H`` steps for
DiLoCo and FedAvg, one step for DDP and SPARTA (``round_steps``). A node
dropped for a round

- trains nothing in it: it draws no batches and its step time is not counted;
- sends nothing: its share is left out of every average of the round, which the survivors take
  among themselves (each ``mean`` divides by the number of survivors, as torchft's quorum and
  Flower's ``accept_failures`` do), and the ledger charges an all-reduce among the survivors;
- rejoins at the round's end by loading the state of the lowest-ranked survivor: its model and
  its whole strategy state (inner optimizer, LR schedule, communicator state such as DiLoCo's
  global copy and outer optimizer), which is what torchft's recovering replicas receive. The
  ledger charges a broadcast of those bytes from that survivor to the nodes that rejoin.

Strategies whose communicators can leave a node out say so (``Communicator.supports_dropout``):
averaging (DDP, FedAvg, islands, client sampling), DiLoCo's exact outer step, SPARTA's random and
sequential selectors. Others (DeMo, DCT or quantised payloads, which all-gather) are refused before
the run starts.

**Stragglers.** ``slowdown`` is a ``torch.distributions.Distribution``; every node draws a factor
from it at every step, which multiplies that step's compute time (on top of the fixed
``Network(compute_slowdown=...)``). A step's collectives wait for their slowest participant
(``exogym.clocks``), so the tail of the distribution shows in ``compute_time`` and
``sim_time``.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from exogym.faults_config import Faults as Faults
from exogym.faults_config import node_list

logger = logging.getLogger(__name__)

#: Held while a slowdown is drawn through torch's global generator (nodes on threads).
_GLOBAL_RNG = threading.Lock()
#: Domain separators of the counter-based draws (dropouts and slowdowns use separate streams).
_DROP_STREAM, _SLOW_STREAM = 0xD50, 0x510


def check_supported(faults: Faults, strategy: Any) -> None:
    """Raise ``ValueError`` naming what cannot leave a node out when ``faults`` drop nodes and
    ``strategy`` cannot take it. Slowdowns work with every strategy."""
    if faults.drops:
        check_can_drop(strategy, "Faults that drop nodes")


def check_can_drop(strategy: Any, what: str) -> None:
    """Raise ``ValueError`` when ``strategy`` cannot leave a node out of a round; ``what`` names
    the cause of the dropouts in the message (e.g. ``"Faults that drop nodes"``)."""
    from exogym.core.communicator import supports_dropout

    if strategy.pipeline is None:
        raise ValueError(
            f"{what} need a strategy built from communicators that can leave a node out "
            f"(CommunicateOptimizeStrategy); {type(strategy).__name__} communicates by itself. Use slowdown "
            "only, or compose the strategy from communicators"
        )
    bad = [m.describe() for m in strategy.pipeline.leaves() if not supports_dropout(m)]
    if bad:
        raise ValueError(
            f"{what}: {type(strategy).__name__} has communicators that cannot leave a node out "
            f"of a round ({', '.join(bad)}: they all-gather every node's payload). Dropouts work with averaging "
            "(DDP, FedAvg), DiLoCo's exact outer step and SPARTA; use slowdown only with this strategy"
        )


def round_steps(strategy: Any) -> int:
    """Steps per fault round: the largest ``H`` among the strategy's communicators (1 without
    any)."""
    pipeline = strategy.pipeline
    return max((m.H for m in pipeline.leaves()), default=1) if pipeline is not None else 1


def with_availability(
    faults: Faults | None, network: Any, num_nodes: int, round_steps: int, max_steps: int, strategy: Any = None
) -> Faults | None:
    """``faults`` with the rounds ``network``'s availability trace takes nodes away added to its
    ``drop`` ([`Network.drop_plan`][exogym.Network.drop_plan]): the same
    plan ``Faults(drop=...)`` would give for those rounds. ``faults`` itself without a trace,
    when the trace takes no node away during the run, or for a ``strategy`` that follows the
    trace itself (``follows_availability``)."""
    if network.availability is None or getattr(strategy, "follows_availability", False):
        return faults
    plan = network.drop_plan(num_nodes, round_steps, max_steps)
    if not plan:
        return faults
    base = faults if faults is not None else Faults()
    drop = {r: sorted(set(node_list(n))) for r, n in base.drop.items()}
    for r, nodes in plan.items():
        drop[r] = sorted(set(drop.get(r, [])) | set(nodes))
    return dataclasses.replace(base, drop=drop)


class FaultPlan:
    """[`Faults`][exogym.Faults] bound to a run: who is dropped at each step, who rejoins, how slow
    each node is. Every method depends only on shared values (seed, round, step, rank).

    Args:
        faults: the run's faults.
        num_nodes: K.
        round_steps: steps per round (``round_steps``).
        max_steps: the run's length.
        seed: the run's seed (used when ``faults.seed`` is ``None``).
    """

    def __init__(self, faults: Faults, num_nodes: int, round_steps: int, max_steps: int, seed: int) -> None:
        self.faults, self.num_nodes, self.round_steps, self.max_steps = faults, num_nodes, round_steps, max_steps
        self.seed = faults.seed if faults.seed is not None else seed
        self.drops = faults.drops

    def check(self) -> None:
        """Raise ``ValueError`` for dropouts that name nodes or rounds outside the run, or drop
        every node of a round."""
        rounds = self.num_rounds
        for r, nodes in sorted(self.faults.drop.items()):
            nodes = node_list(nodes)
            if r >= rounds:
                raise ValueError(
                    f"Faults(drop={{{r}: {nodes}}}): the run has {rounds} round(s) of {self.round_steps} step(s) "
                    f"(rounds 0..{rounds - 1}); name a round in that range"
                )
            out = [n for n in nodes if n >= self.num_nodes]
            if out:
                raise ValueError(
                    f"Faults(drop={{{r}: {nodes}}}) names node(s) {out}, but num_nodes={self.num_nodes} "
                    f"(nodes 0..{self.num_nodes - 1})"
                )
            if len(set(nodes)) >= self.num_nodes:
                raise ValueError(
                    f"Faults(drop={{{r}: {nodes}}}) drops every node of round {r}: at least one must survive"
                )

    @property
    def num_rounds(self) -> int:
        """Rounds in the run (the last may be partial)."""
        return -(-self.max_steps // self.round_steps)

    def dropped(self, round_: int) -> frozenset[int]:
        """The nodes dropped from round ``round_`` (the same on every rank)."""
        if not self.drops:
            return frozenset()
        explicit = frozenset(n for n in node_list(self.faults.drop.get(round_, [])) if n < self.num_nodes)
        return _draw(self.seed, self.num_nodes, self.faults.drop_probability, round_, explicit)

    def dropped_at(self, step: int) -> frozenset[int]:
        """The nodes dropped at ``step`` (those dropped from its round)."""
        return self.dropped(step // self.round_steps)

    def rejoining(self, step: int) -> tuple[list[int], int] | None:
        """``(nodes, source)`` when ``step`` ends a round some nodes missed and they rejoin now,
        loading the state of ``source`` (the lowest-ranked survivor); else ``None``. Nodes
        dropped from the next round too rejoin only after it (at the run's end, all rejoin)."""
        r, last = step // self.round_steps, step == self.max_steps - 1
        if not self.drops or ((step + 1) % self.round_steps and not last):
            return None
        gone = self.dropped(r)
        back = sorted(gone if last else gone - self.dropped(r + 1))
        return (back, next(r for r in range(self.num_nodes) if r not in gone)) if back else None

    def min_alive(self, first: int, last: int) -> int:
        """The fewest nodes taking part at any step in ``[first, last]``."""
        r0, r1 = first // self.round_steps, last // self.round_steps
        return self.num_nodes - max(len(self.dropped(r)) for r in range(r0, r1 + 1))

    def slowdown(self, rank: int, step: int) -> float:
        """The factor node ``rank``'s compute time at ``step`` is multiplied by (1 without a
        ``slowdown`` distribution). Draws from a stream of its own: the node's RNG is untouched."""
        dist = self.faults.slowdown
        if dist is None:
            return 1.0
        state = np.random.SeedSequence([self.seed, _SLOW_STREAM, rank, step]).generate_state(2, np.uint32)
        with _GLOBAL_RNG, torch.random.fork_rng(devices=[]):
            # The CPU generator only (torch.manual_seed also queues a seed for every GPU, with
            # a captured stack each time: a third of a millisecond per step).
            torch.default_generator.manual_seed(int(state[0]) << 32 | int(state[1]))
            factor = float(dist.sample())
        if not factor > 0 or factor == float("inf"):
            raise ValueError(
                f"Faults(slowdown={dist!r}) drew {factor} for node {rank} at step {step}: factors must be finite "
                "and > 0 (e.g. LogNormal, or 1 + Exponential through a TransformedDistribution)"
            )
        return factor

    def events(self) -> list[dict[str, Any]]:
        """One entry per round that some node missed: ``round``, ``steps`` (first, last),
        ``dropped`` and ``participants`` (node lists)."""
        out = []
        for r in range(self.num_rounds):
            gone = self.dropped(r)
            if gone:
                first, last = r * self.round_steps, min(self.max_steps, (r + 1) * self.round_steps) - 1
                participants = sorted(set(range(self.num_nodes)) - gone)
                out.append({"round": r, "steps": (first, last), "dropped": sorted(gone), "participants": participants})
        return out


@functools.lru_cache(maxsize=256)
def _draw(seed: int, num_nodes: int, p: float, round_: int, explicit: frozenset[int]) -> frozenset[int]:
    """The nodes dropped from round ``round_``: ``explicit`` and those whose uniform draw from
    ``(seed, round_)`` falls below ``p``; where that is every node, the one with the largest draw
    not in ``explicit`` stays. Cached per process: a worker's virtual nodes ask about the same
    rounds, one draw of ``num_nodes`` numbers each."""
    nodes = set(explicit)
    if p > 0:
        u = np.random.default_rng([seed, _DROP_STREAM, round_]).random(num_nodes)
        nodes |= set(np.flatnonzero(u < p).tolist())
        if len(nodes) == num_nodes:  # someone survives: the largest draw not named in drop
            nodes.discard(max(set(range(num_nodes)) - explicit, key=lambda n: u[n]))
    return frozenset(nodes)


def state_tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in a nested structure of dicts, lists and tuples, in traversal order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in state_tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in state_tensors(v)]
    return []


@torch.no_grad()
def rejoin(comm: Any, model: torch.nn.Module, strategy: Any, nodes: Sequence[int], source: int) -> None:
    """``nodes`` load ``source``'s model and strategy state (everything its ``state_dict``
    holds), sent serialised, so the states may differ in layout (a client that sat rounds out
    may have no optimizer state yet); the ledger charges a broadcast of the state's tensor bytes
    from ``source`` to ``nodes`` (tag ``rejoin``). Collective: every rank calls it with the same
    arguments."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    header = torch.zeros(2, dtype=torch.int64, device=device)  # (serialised bytes, tensor bytes)
    payload = None
    if comm.rank == source:
        state = {"model": model.state_dict(), "strategy": strategy.state_dict()}
        raw = io.BytesIO()
        torch.save(state, raw)
        payload = torch.frombuffer(bytearray(raw.getbuffer()), dtype=torch.uint8).to(device)
        header[0] = payload.numel()
        header[1] = sum(t.numel() * t.element_size() for t in state_tensors(state))
    comm.broadcast(header, src=source, charge=False)
    if payload is None:
        payload = torch.empty(int(header[0]), dtype=torch.uint8, device=device)
    comm.broadcast(payload, src=source, charge=False)
    if comm.rank in nodes:
        # A peer node of this run sent it, not a file: a strategy's state of any type travels
        # (checkpoints, which come from disk, are loaded with weights_only=True).
        state = torch.load(io.BytesIO(payload.cpu().numpy().tobytes()), map_location=device, weights_only=False)
        comm.clock.abandon()  # its handles in flight: the source's replace them
        model.load_state_dict(state["model"])
        strategy.load_state_dict(state["strategy"])
    if comm.rank == source or comm.rank in nodes:
        members = tuple(sorted({source, *nodes}))
        comm.charge("broadcast", len(members), int(header[1]), "rejoin", is_root=comm.rank == source, members=members)


__all__ = ["FaultPlan", "Faults", "check_can_drop", "check_supported", "rejoin", "state_tensors", "with_availability"]
