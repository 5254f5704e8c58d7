"""Average the model or its gradients over all nodes, random islands, or sampled clients."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import ClassVar

import torch

from communicators.islands import draw_round
from exogym.core.comm.flat import Bucket, dtype_buckets
from exogym.core.pipeline import Communicator, NodeContext

TARGETS = ("params", "grads")
#: Rounds whose draw a node keeps (:meth:`AveragingCommunicator._round_groups`): few, since a
#: round's islands are lists of every rank, and a node that sleeps far ahead may hold draws that
#: :func:`~communicators.islands.draw_round`'s cache has already let go (copies of its own).
KEPT_ROUNDS = 4


class AveragingCommunicator(Communicator):
    """Every ``H`` steps, replace the parameters (or gradients) by their mean.

    ``target="grads"`` runs before the optimizer step (DDP when ``H=1``); ``target="params"`` runs
    after it (FedAvg / local SGD). One all-reduce per dtype per round, through a flat buffer.

    With ``island_size``, each round the nodes are split into random islands of that size (drawn
    from the shared seed, the same on every rank, see :func:`communicators.islands.draw_islands`)
    and each island averages on its own; the ledger charges an all-reduce among the island.

    With ``client_sampling=f``, only ``max(1, round(f * n))`` nodes of each island (or of the
    world) contribute to a round; the others receive the participants' mean. Charged as an
    all-reduce among the participants plus a broadcast of the result to the others. With
    ``target="params"`` the others do not train in that round at all (:meth:`idle_steps`): they
    neither compute nor read data, and their step time is not counted.

    Args:
        H: communicate every ``H`` steps.
        target: ``"params"`` or ``"grads"``.
        island_size: nodes per island (``None``: everyone; ``>= K`` is the same).
        client_sampling: fraction of nodes that contribute each round (``None``: all).
    """

    space: ClassVar[str] = "param"

    def __init__(
        self, H: int = 1, target: str = "params", island_size: int | None = None, client_sampling: float | None = None
    ) -> None:
        super().__init__(H)
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        if island_size is not None and (not isinstance(island_size, int) or island_size < 1):
            raise ValueError(f"island_size must be a positive int or None, got {island_size!r}")
        if client_sampling is not None and not 0.0 < client_sampling <= 1.0:
            raise ValueError(f"client_sampling must be in (0, 1] or None, got {client_sampling!r}")
        self.target = target
        self.island_size = island_size
        self.client_sampling = client_sampling
        self.space = "grad" if target == "grads" else "param"  # type: ignore[misc]

    def _init_node(self, ctx: NodeContext) -> None:
        super()._init_node(ctx)
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self._drawn: dict[int, tuple] = {}
        # With client sampling a node averages in the rounds it is sampled for: its flat buffer
        # exists only then (1,000 clients would hold a model's worth each for the run).
        self.buckets = dtype_buckets(self.params, lazy=self.client_sampling is not None)

    def _round_groups(self, step: int) -> tuple[list[list[int]] | None, list[int], list[int]]:
        """(islands or None, this rank's island, its participants) for the round of ``step``.

        Drawn once per round and kept for the next :data:`KEPT_ROUNDS` rounds asked about (the
        node loop asks at every step and looks one round ahead)."""
        round_ = step // self.H
        groups = self._drawn.get(round_)
        if groups is None:
            groups = self._draw_groups(round_)
            if len(self._drawn) >= KEPT_ROUNDS:  # the earliest half goes (rounds are asked about in order)
                self._drawn = dict(sorted(self._drawn.items())[KEPT_ROUNDS // 2 :])
            self._drawn[round_] = groups
        return groups

    def _draw_groups(self, round_: int) -> tuple[list[list[int]] | None, list[int], list[int]]:
        drawn = draw_round(self.ctx.num_nodes, self.island_size, self.client_sampling, self.ctx.seed, round_)
        i = drawn.island_of[self.ctx.rank]
        return drawn.islands, drawn.groups[i], drawn.participants[i]

    def supports_dropout(self) -> bool:
        """Every form of averaging can leave missing nodes out."""
        return True

    def idle_steps(self, step: int) -> int:
        """With ``client_sampling`` on parameters, a node not sampled for the round of ``step``
        sits the rest of the round out and receives the participants' mean at its end."""
        if self.client_sampling is None or self.target != "params":
            return 0
        _, _, participants = self._round_groups(step)
        return 0 if self.ctx.rank in participants else self.H - step % self.H

    @property
    def round_steps(self) -> int | None:
        """``H`` with ``client_sampling`` (each round samples its clients), else ``None``."""
        return self.H if self.client_sampling else None

    def sampled_nodes(self, num_nodes: int, seed: int, step: int) -> list[int] | None:
        """With ``client_sampling`` on parameters: the round's participants of every island
        (the nodes that train in it), ascending; else ``None``."""
        if self.client_sampling is None or self.target != "params":
            return None
        drawn = draw_round(num_nodes, self.island_size, self.client_sampling, seed, step // self.H)
        return sorted(r for group in drawn.participants for r in group)

    def overwritten_at(self, step: int) -> int | None:
        """An unsampled client of parameter averaging that is not sampled in the next round
        either receives that round's mean, which replaces this round's: it may sit this round's
        collective out (a FedAvg client then costs nothing while it sleeps through rounds)."""
        if self.idle_steps(step) == 0 or step + self.H >= self.ctx.max_steps:
            return None  # sampled now, or the next round ends after the run
        return step + self.H if self.idle_steps(step + 1) == self.H else None

    def _idle_round(self, round_: int) -> bool:
        """Whether this node is not sampled for ``round_`` (with ``client_sampling``), from the
        worker's shared draw (not kept: asked while planning a sleep)."""
        return self.ctx.rank not in self._draw_groups(round_)[2]

    def idle_span_ends(self, step: int, stop: int, read_at: int) -> list[int]:
        """The rounds from ``step`` (a round's first step) that this client sits out in a row,
        round by round as :meth:`idle_steps` and :meth:`overwritten_at` answer (not sampled in the
        round nor in the next, which ends before the run does), without asking them per round:
        a FedAvg client that sleeps through most of a long run plans it at once."""
        H = self.H
        if self.client_sampling is None or self.target != "params" or step % H:
            return super().idle_span_ends(step, stop, read_at)
        # The round of end e counts while e < stop, e + H < max_steps and e + H < read_at.
        last = min(stop - 1, self.ctx.max_steps - H - 1, read_at - H - 1)
        ends: list[int] = []
        round_, end = step // H, step + H - 1
        idle = self._idle_round(round_)
        while idle and end <= last:
            idle = self._idle_round(round_ + 1)  # the next round's mean replaces this one's
            if idle:
                ends.append(end)
            round_, end = round_ + 1, end + H
        return ends

    def sit_out(self, step: int) -> None:
        """The unsampled client's share of the round (charged as when it receives), without
        moving data: it contributes zeros and its parameters are replaced next round."""
        self.sit_out_rounds([step])

    def sit_out_rounds(self, steps: Sequence[int]) -> bool:
        """:meth:`sit_out` at each of ``steps`` (ascending; the node is idle in between), in one
        go: the absent calls first (one queued call for all of them where every round averages
        over the world and there is one bucket), then the charges, per step one per bucket."""
        drawn = [self._draw_groups(s // self.H) for s in steps]  # (not kept: no later step asks)
        rank, comm, tag = self.ctx.rank, self.ctx.comm, f"average_{self.target}"
        for s, (_, _, participants) in zip(steps, drawn, strict=True):
            if rank in participants:
                raise RuntimeError(f"rank {rank} is sampled for the round of step {s}: it cannot sit it out")
        if len(self.buckets) == 1 and all(islands is None for islands, _, _ in drawn):
            comm.all_reduce_absent(self.buckets[0].buffer.like, "sum", repeat=len(steps))
        else:
            for islands, _, _ in drawn:
                for bucket in self.buckets:
                    comm.all_reduce_absent(bucket.buffer.like, "sum", groups=islands)
        sizes = [len(members) - len(participants) + 1 for _, members, participants in drawn]
        if len(self.buckets) == 1:  # runs of equal rounds in one charge each
            flat = self.buckets[0].buffer.like
            for size, run in itertools.groupby(sizes):
                comm.charge("broadcast", size, flat.numel() * flat.element_size(), tag, count=len(list(run)))
            return True
        for size in sizes:
            for bucket in self.buckets:
                flat = bucket.buffer.like
                comm.charge("broadcast", size, flat.numel() * flat.element_size(), tag)
        return True

    def _mean_(
        self, flat: torch.Tensor, islands: list[list[int]] | None, members: list[int], participants: list[int]
    ) -> None:
        comm, tag = self.ctx.comm, f"average_{self.target}"
        if len(participants) == len(members):
            comm.all_reduce(flat, op="mean", groups=islands, tag=tag)  # among the present nodes
            return
        rank = self.ctx.rank
        present = comm.present(islands)
        if len(present) < len(members):  # nodes missing from the round (fault injection)
            participants = [r for r in participants if r in present]
            if rank not in present:
                comm.all_reduce(flat, op="sum", groups=islands, charge=False)  # leaves it out, charges nothing
                return
            if not participants:  # every sampled client is missing: the island keeps what it has
                comm.all_reduce(torch.zeros_like(flat), op="sum", groups=islands, charge=False)
                return
        if rank not in participants:
            flat.zero_()
        comm.all_reduce(flat, op="sum", groups=islands, charge=False)
        flat.div_(len(participants))
        nbytes = flat.numel() * flat.element_size()
        if rank in participants:  # (at what the comm sends: a quantizing one sends less)
            wire = getattr(comm, "wire_payload", None)
            sent, sent_tag = wire(flat, tag) if wire is not None else (nbytes, tag)
            comm.charge("all_reduce", len(participants), sent, sent_tag)
        if rank not in participants or rank == participants[0]:
            comm.charge("broadcast", len(members) - len(participants) + 1, nbytes, tag, is_root=rank == participants[0])

    def _receives_only(self, participants: list[int]) -> bool:
        """Whether this node only receives the round's mean: it was not sampled, no node is
        missing from the round, and its comm can receive without sending (not
        :class:`~communicators.quantize.QuantizedComm` with error feedback, whose zero payload
        carries the node's residual: see its ``can_contribute_nothing``)."""
        comm = self.ctx.comm
        return (
            self.ctx.rank not in participants
            and not getattr(comm, "absent", True)
            and hasattr(comm, "all_reduce_receive")
            and getattr(comm, "can_contribute_nothing", True)
        )

    def _receive_mean_(
        self, bucket: Bucket, islands: list[list[int]] | None, members: list[int], participants: list[int]
    ) -> None:
        """A client that was not sampled takes the participants' mean into its parameters: what
        :meth:`_mean_` gives it, without writing its zero share anywhere (every node is present)."""
        comm, tag = self.ctx.comm, f"average_{self.target}"
        total = comm.all_reduce_receive(bucket.buffer.like, "sum", groups=islands)
        bucket.buffer.unpack_divided(total, bucket.tensors, len(participants))
        nbytes = total.numel() * total.element_size()
        comm.charge("broadcast", len(members) - len(participants) + 1, nbytes, tag)

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        islands, members, participants = self._round_groups(step)
        for bucket in self.buckets:
            params, buf = bucket.tensors, bucket.buffer
            if self.target == "grads":
                flat = buf.pack([p.grad for p in params])
                self._mean_(flat, islands, members, participants)
                for p, view in zip(params, buf.views, strict=True):
                    if p.grad is None:
                        p.grad = view.view_as(p).clone()
                    else:
                        p.grad.copy_(view.view_as(p))
            elif self._receives_only(participants):
                self._receive_mean_(bucket, islands, members, participants)
            else:
                flat = buf.pack(params)
                self._mean_(flat, islands, members, participants)
                buf.unpack(params)
            if self.client_sampling is not None:
                buf.release()

    def describe(self) -> str:
        extra = "".join(
            f", {k}={v}"
            for k, v in (("island_size", self.island_size), ("client_sampling", self.client_sampling))
            if v is not None
        )
        return f"Averaging({self.target}, H={self.H}{extra})"
