"""SPARTA-style sparse averaging: each step, average a fraction ``p`` of the parameters.

Which entries are averaged is decided by a *selector*. The shared-seed selectors derive the
indices from the run's seed, the step and the tensor's position, so every rank computes the same
indices and none is ever sent (SPARTA, Baioumy & Cheema 2025):

* ``random`` (default): a fresh stratified draw each step
  ([`exogym.ops.select_indices`][exogym.ops.select_indices]);
* ``sequential``: one random permutation of each tensor cut into ``P = round(1/p)`` partitions,
  visited in turn, so every entry is averaged once every ``P`` steps;
* ``partitioned``: ``P`` strided partitions ``{i : i % P == c}``; each step picks ``c`` at random;
* ``blockwise``: one contiguous block (wrapping around) at a random offset per tensor.

``topk`` instead picks, on each rank, the entries that changed most since they were last
averaged; the ranks' choices differ, so the indices are all-gathered (and charged) before the
union is averaged.

With ``delay`` (asynchronous SPARTA), each round's all-reduce starts without waiting
(``exogym.core.comm.handles``) and its average is written ``delay`` rounds later, after a
wait that stalls the node only for what the rounds between did not cover; ``delay="auto"``
writes it at the first step at which its transfer has arrived on the node's clock (rounds land
in the order they were sent), so the delay follows the link speed. ``"auto"`` needs modelled
compute (``Network(compute=<seconds per step>)``).

For ``random`` and ``blockwise``, a tensor of ``n`` entries averages ``floor(p*n)`` entries plus
one more with probability ``frac(p*n)`` (shared draw), so the expected payload is exactly ``p``
of the dense one and small tensors are not starved.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from communicators.checks import check_int, check_number
from communicators.islands import draw_islands
from communicators.topk import index_dtype, topk_count
from exogym import ops
from exogym.core.comm.entries import Entries
from exogym.core.comm.flat import dtype_buckets, group_by_dtype
from exogym.core.comm.handles import AUTO, CollectiveHandle, check_modelled_compute
from exogym.core.pipeline import Communicator, NodeContext
from exogym.core.seeding import generator

SELECTORS = ("random", "sequential", "partitioned", "blockwise", "topk")
_COUNT_SALT, _PART_SALT, _BLOCK_SALT, _PERM_SALT = 0xC0, 0x9A, 0xB1, 0x9E


def expected_count(n: int, p: float, seed: int, step: int, tensor_id: int) -> int:
    """``floor(p*n)``, plus one with probability ``frac(p*n)`` from the shared seed."""
    exact = p * n
    base = math.floor(exact)
    frac = exact - base
    if frac > 0 and torch.rand((), generator=generator(seed, _COUNT_SALT, step, tensor_id)).item() < frac:
        base += 1
    return min(base, n)


class SharedSelector:
    """Indices from the shared seed. ``select(step)`` returns one sorted int64 tensor per parameter."""

    def __init__(self, mode: str, p: float, seed: int, shapes: list[int], device: torch.device) -> None:
        self.mode, self.p, self.seed, self.numels, self.device = mode, p, seed, shapes, device
        self.parts = max(1, round(1.0 / p)) if p > 0 else 0
        self._perms: list[torch.Tensor] | None = None

    def select(self, step: int) -> list[torch.Tensor]:
        return [self._one(step, i, n) for i, n in enumerate(self.numels)]

    def _one(self, step: int, i: int, n: int) -> torch.Tensor:
        if self.mode == "random":
            return ops.select_indices(n, expected_count(n, self.p, self.seed, step, i), self.seed, step, i, self.device)
        if self.mode == "blockwise":
            k = expected_count(n, self.p, self.seed, step, i)
            offset = int(torch.randint(n, (), generator=generator(self.seed, _BLOCK_SALT, step, i)))
            return ((torch.arange(k, device=self.device) + offset) % n).sort().values
        if self.mode == "partitioned":
            c = int(torch.randint(self.parts, (), generator=generator(self.seed, _PART_SALT, step)))
            return torch.arange(c, max(c, n), self.parts, device=self.device)
        # sequential: shuffled partitions cycled in order
        if self._perms is None:
            self._perms = [
                torch.randperm(m, generator=generator(self.seed, _PERM_SALT, j)).to(self.device)
                for j, m in enumerate(self.numels)
            ]
        c = step % self.parts
        lo, hi = c * n // self.parts, (c + 1) * n // self.parts
        return self._perms[i][lo:hi].sort().values


class SparseCommunicator(Communicator):
    """Average a fraction ``p`` of the parameters every ``H`` steps (after the optimizer step).

    All parameters of a dtype travel in one buffer: ``sparse_gather`` -> one all-reduce (sum) ->
    ``sparse_scatter_`` with the ``1/n`` average fused. ``p=1`` averages everything (FedAvg with
    ``H=1``); ``p=0`` communicates nothing.

    Args:
        p: fraction of entries averaged per round, in ``[0, 1]``. ``sparsification_rate`` is an
            accepted alias (the original exo gym's spelling); give one.
        selector: one of ``SELECTORS`` (see the module docstring).
        H: communicate every ``H`` steps.
        island_size: average within random islands of this many nodes instead of the world.
        delay: apply each round's average ``delay`` rounds later (asynchronous SPARTA: the
            averages travel while training goes on; the values written are those of the round
            they were taken in, replacing the local progress on those entries since). ``0``:
            at once; ``"auto"``: at the first step at which it has arrived on the simulated
            clock. Averages still in flight when the run ends are not applied. Not with
            ``topk``.
    """

    space: ClassVar[str] = "param"
    #: The averaged entries change from round to round; every all-reduce says which parameter
    #: entries it carries (error feedback per entry).
    payloads: ClassVar[str] = "located"

    def __init__(
        self,
        p: float | None = None,
        selector: str = "random",
        H: int = 1,
        island_size: int | None = None,
        *,
        sparsification_rate: float | None = None,
        delay: int | str = 0,
    ) -> None:
        super().__init__(H)
        if p is not None and sparsification_rate is not None:
            raise TypeError("give the fraction once: p or its alias sparsification_rate, not both")
        p = sparsification_rate if p is None else p
        if p is None:
            p = 0.005
        check_number("p", p, 0, 1, "the fraction of parameters averaged", upto=True)
        if selector not in SELECTORS:
            raise ValueError(f"selector must be one of {SELECTORS}, got {selector!r}")
        check_int("island_size", island_size, why="nodes per island", none="everyone")
        if delay != AUTO and (not isinstance(delay, int) or isinstance(delay, bool) or delay < 0):
            raise ValueError(
                f"delay (rounds before an average is applied) must be an int >= 0 or 'auto' (when it arrives on the "
                f"simulated clock), got {delay!r}"
            )
        if delay and selector == "topk":
            raise ValueError("delay is not available with selector='topk' (its snapshots follow each average)")
        self.p, self.selector, self.island_size, self.delay = float(p), selector, island_size, delay
        #: The shared-index selectors average among the present nodes; ``topk`` all-gathers.
        self.supports_dropout = selector != "topk"  # type: ignore[misc]
        #: "auto" asks the clock whether a round has arrived while the step runs: with
        #: compute="flops", the run turns FLOPs into seconds per step before it starts.
        self.needs_step_seconds = delay == AUTO  # type: ignore[misc]

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        if self.delay == AUTO:
            check_modelled_compute(ctx.network, "delay='auto' (SPARTA's async_sparta_delay)")
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.dtype_groups = group_by_dtype(self.params)
        device = self.params[0].device if self.params else torch.device("cpu")
        if self.selector == "topk":
            self.buckets = dtype_buckets(self.params)
            self.snapshots = [b.buffer.pack(b.tensors).clone() for b in self.buckets]
        else:
            self.shared = SharedSelector(self.selector, self.p, ctx.seed, [p.numel() for p in self.params], device)
        #: Averages in flight (with ``delay``), oldest first: (scale, [(dtype group, indices, handle
        #: whose wait gives the sums)]).
        self.pending: list[tuple[float, list[tuple[int, list[torch.Tensor], CollectiveHandle]]]] = []

    def _islands(self, step: int) -> tuple[list[list[int]] | None, int]:
        """(islands or None, how many present nodes this rank's average is over)."""
        islands = None
        if self.island_size:
            islands = draw_islands(self.ctx.num_nodes, self.island_size, self.ctx.seed, step // self.H)
        return islands, max(1, len(self.ctx.comm.present(islands)))

    def is_due(self, step: int) -> bool:
        """A round every ``H`` steps; with ``delay="auto"``, every step while one is in flight."""
        return super().is_due(step) or (self.delay == AUTO and bool(self.pending))

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        if self.p == 0:
            return
        if self.selector == "topk":
            self._communicate_topk(step)
            return
        if super().is_due(step):
            self._round(step)
        if self.delay == AUTO:
            while self.pending and all(h.is_completed() for _, _, h in self.pending[0][1]):
                self._land()
        elif self.delay and len(self.pending) > self.delay:
            self._land()

    def _round(self, step: int) -> None:
        """Average this round's entries, or start their all-reduce (with ``delay``)."""
        islands, size = self._islands(step)
        indices = self.shared.select(step)
        sent = []
        for g, group in enumerate(self.dtype_groups):
            params = [self.params[i] for i in group]
            idx = [indices[i] for i in group]
            if sum(t.numel() for t in idx) == 0:
                continue
            buf = ops.sparse_gather(params, idx)
            handle = self.ctx.comm.all_reduce(
                buf, op="sum", groups=islands, tag="sparse", entries=Entries(params, idx), async_op=bool(self.delay)
            )
            if self.delay:
                sent.append((g, idx, handle))
            else:
                ops.sparse_scatter_(params, idx, buf, 1.0 / size)
        if self.delay:
            self.pending.append((1.0 / size, sent))

    def _land(self) -> None:
        """Wait for the oldest round in flight and write its average."""
        scale, arrived = self.pending.pop(0)
        for g, idx, handle in arrived:
            ops.sparse_scatter_([self.params[i] for i in self.dtype_groups[g]], idx, handle.wait(), scale)

    def _communicate_topk(self, step: int) -> None:
        islands, _ = self._islands(step)
        comm = self.ctx.comm
        for bucket, snap in zip(self.buckets, self.snapshots, strict=True):
            flat = bucket.buffer.pack(bucket.tensors)
            local = (flat - snap).abs().topk(topk_count(flat.numel(), self.p), sorted=False).indices
            gathered = comm.all_gather(local.to(index_dtype(flat.numel())), groups=islands, tag="sparse_topk_indices")
            union = torch.unique(gathered.reshape(-1)).to(torch.int64)
            values = flat[union]
            entries = Entries.of_flat(bucket.tensors, union)
            comm.all_reduce(values, op="mean", groups=islands, tag="sparse_topk_values", entries=entries)
            flat[union] = values
            snap[union] = values
            bucket.buffer.unpack(bucket.tensors)

    def state_dict(self) -> dict:
        if self.selector == "topk":
            return {"snapshots": list(self.snapshots)}
        if not self.delay:
            return {}
        return {"pending": [(s, [(g, list(i), h.state_dict()) for g, i, h in items]) for s, items in self.pending]}

    def load_state_dict(self, state: dict) -> None:
        if self.selector == "topk":
            for s, t in zip(self.snapshots, state["snapshots"], strict=True):
                s.copy_(t)
        elif self.delay:
            clock = self.ctx.comm.clock
            self.pending = [
                (float(s), [(int(g), list(i), clock.resume(h)) for g, i, h in items]) for s, items in state["pending"]
            ]
        else:
            super().load_state_dict(state)

    def describe(self) -> str:
        isl = f", island_size={self.island_size}" if self.island_size else ""
        delay = f", delay={self.delay}" if self.delay else ""
        return f"Sparse(p={self.p}, {self.selector}, H={self.H}{isl}{delay})"
