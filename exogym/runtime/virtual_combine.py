"""A virtual node's call of a collective (``Call``), and how a worker combines its virtual
nodes' calls of one collective: reduced (or gathered) locally, then once across the workers
through the worker's ``Transport``, and written into every node's call. The combining half of
``exogym.runtime.virtual.VirtualHub``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from exogym.core.comm.transport import Transport, reduce_rows_into
from exogym.runtime.placement import Placement


@dataclass
class Call:
    """One node's call of a collective, as its worker's hub queues and runs it."""

    kind: str
    op: str | None = None
    members: tuple[int, ...] | None = None
    tensor: torch.Tensor | None = None
    src: int | None = None
    #: The node contributes ``tensor`` but needs no result: it does not wait for the call.
    detached: bool = False
    #: The node waits for this call (a real one, or the last one a full queue takes).
    waits: bool = False
    #: The node's contribution was reduced on arrival (``tensor`` is a stand-in on "meta").
    folded: bool = False
    result: torch.Tensor | None = None

    def describe(self) -> str:
        if self.tensor is None:
            return self.kind
        extra = f" op={self.op}" if self.op else (f" src={self.src}" if self.src is not None else "")
        group = "" if self.members is None else f" group={list(self.members)}"
        return f"{self.kind}({self.tensor.numel()} x {self.tensor.dtype}{extra}{group})"


class Combining:
    """The collectives of ``VirtualHub``, over the calls its nodes queued for one collective
    (the hub sets the attributes below)."""

    placement: Placement
    worker: int
    workers: int
    num_nodes: int
    outer: Transport | None
    device: torch.device
    _executed: int
    _folded: dict[tuple[int, tuple[int, ...] | None], torch.Tensor]

    def _broadcast(self, calls: list[Call], src: int) -> None:
        owner = self.placement.worker_of(src)
        buf = calls[self.placement.slot_of(src)].tensor if owner == self.worker else calls[0].tensor
        assert buf is not None
        if self.outer is not None:
            self.outer.broadcast(buf, owner)
        for c in calls:
            if c.tensor is not buf:
                c.tensor.copy_(buf)  # type: ignore[union-attr]

    def _all_reduce(self, calls: list[Call], first: Call) -> None:
        """Reduce the calls (per group), then across workers."""
        op = first.op
        assert op is not None and first.tensor is not None
        groups: dict[tuple[int, ...] | None, list[torch.Tensor]] = {}
        for c in calls:
            # (the group's folded contributions, once, where its first one sits)
            t = self._folded.pop((self._executed, c.members), None) if c.folded else c.tensor
            if t is not None:
                groups.setdefault(c.members, []).append(t)
        partials = {key: torch.empty_like(tensors[0]) for key, tensors in groups.items()}
        for key, tensors in groups.items():
            reduce_rows_into(tensors, op, partials[key])
        if self.outer is not None:
            if first.members is None:
                self.outer.all_reduce(partials[None], op)
            else:
                self._reduce_groups_across_workers(partials, op, first.tensor)
        for c in calls:
            if not c.detached:
                c.tensor.copy_(partials[c.members])  # type: ignore[union-attr]

    def _group_key(self, members: tuple[int, ...] | None) -> int:
        return 0 if members is None else members[0]

    def _reduce_groups_across_workers(self, partials: dict, op: str, like: torch.Tensor) -> None:
        """Combine per-group partial results of several workers: every worker all-gathers the
        padded table of its partials (with their group ids), then reduces the rows of its own
        groups in worker order. ``like`` gives the dtype where this worker has no partial."""
        outer = self.outer
        assert outer is not None
        spans = [
            k for k in partials if any(self.placement.worker_of(r) != self.worker for r in k or range(self.num_nodes))
        ]
        keys = sorted(spans, key=self._group_key)  # the groups that span other workers, in a fixed order
        meta = torch.tensor([float(len(keys)), float(max([partials[k].numel() for k in keys], default=0))])
        outer.all_reduce(meta, "max")
        rows, width = int(meta[0]), int(meta[1])
        if rows == 0:
            return
        table = torch.zeros(rows, width, dtype=like.dtype, device=self.device)
        ids = torch.full((rows,), -1.0, dtype=torch.float64)
        for r, key in enumerate(keys):
            flat = partials[key].reshape(-1)
            table[r, : flat.numel()] = flat
            ids[r] = self._group_key(key)
        all_ids = outer.all_gather(ids)
        all_rows = outer.all_gather(table)
        for key in keys:
            gid, n = self._group_key(key), partials[key].numel()
            parts = [all_rows[w, r, :n] for w in range(self.workers) for r in range(rows) if all_ids[w, r] == gid]
            reduce_rows_into(parts, op, partials[key].view(-1))

    def _all_gather(self, calls: list[Call]) -> None:
        tensors = [c.tensor for c in calls]
        if self.outer is None:
            world: list[torch.Tensor] = tensors  # type: ignore[assignment]
        else:
            world = self._gather_across_workers(tensors, all(c.members is None for c in calls))
        # Only nodes that wait get a result (others only contributed theirs): stacked once per
        # group and shape, then copied for each further node (stacking the world's rows for
        # every node costs K^2 row copies, a second at K=1,000).
        stacked: dict[tuple, torch.Tensor] = {}
        for c in calls:
            if not c.waits:
                continue
            shape = c.tensor.shape  # type: ignore[union-attr]
            key = (c.members, tuple(shape))
            made = stacked.get(key)
            if made is None:
                members = range(self.num_nodes) if c.members is None else c.members
                c.result = stacked[key] = torch.stack([world[r].reshape(shape) for r in members])
            else:
                c.result = made.clone()  # each node's own result, as from a transport of its own

    def _gather_across_workers(self, tensors: list[torch.Tensor], uniform: bool) -> list[torch.Tensor]:
        """Every node's tensor, flattened and indexed by rank (padded through the workers)."""
        outer = self.outer
        assert outer is not None
        slots = max(len(h) for h in self.placement.hosts)
        sizes = torch.zeros(self.workers * slots, dtype=torch.float64)
        if uniform:
            width = tensors[0].numel()
        else:
            local = torch.tensor([float(t.numel()) for t in tensors], dtype=torch.float64)
            sizes = outer.all_gather(torch.nn.functional.pad(local, (0, slots - len(tensors)))).reshape(-1)
            width = int(sizes.max())
        table = torch.zeros(slots, width, dtype=tensors[0].dtype, device=tensors[0].device)
        for r, t in enumerate(tensors):
            table[r, : t.numel()] = t.reshape(-1)
        gathered = outer.all_gather(table)
        world: list[torch.Tensor] = [gathered[0, 0]] * self.num_nodes
        for w in range(self.workers):
            for j, r in enumerate(self.placement.ranks(w)):
                n = width if uniform else int(sizes[w * slots + j])
                world[r] = gathered[w, j, :n]
        return world


__all__ = ["Call", "Combining"]
