"""Average the model or its gradients over all nodes, random islands, or sampled clients."""

from __future__ import annotations

from typing import ClassVar

import torch

from communicators.islands import draw_round
from exogym.core.comm.flat import Bucket, dtype_buckets
from exogym.core.communicator import Communicator, NodeContext, Participation

TARGETS = ("params", "grads")
#: Rounds whose draw a node keeps (``AveragingCommunicator._round_groups``): few, since a
#: round's islands are lists of every rank, and a node that sleeps far ahead may hold draws that
#: ``draw_round``'s cache has already let go (copies of its own).
KEPT_ROUNDS = 4


class AveragingCommunicator(Communicator):
    """Every ``H`` steps, replace the parameters (or gradients) by their mean.

    ``target="grads"`` runs before the optimizer step (DDP when ``H=1``); ``target="params"`` runs
    after it (FedAvg / local SGD). One all-reduce per dtype per round, through a flat buffer.

    With ``island_size``, each round the nodes are split into random islands of that size (drawn
    from the shared seed, the same on every rank, see
    [`communicators.islands.draw_islands`][communicators.draw_islands]) and each island averages on
    its own; the ledger charges an all-reduce among the island.

    With ``client_sampling=f``, only ``max(1, round(f * n))`` nodes of each island (or of the
    world) contribute to a round; the others receive the participants' mean. Charged as an
    all-reduce among the participants plus a broadcast of the result to the others. With
    ``target="params"`` the others do not train in that round at all
    ([`participation`][communicators.AveragingCommunicator.participation]): they neither compute nor
    read data, and their step time is not counted.

    Args:
        H: communicate every ``H`` steps.
        target: ``"params"`` or ``"grads"``.
        island_size: nodes per island (``None``: everyone; ``>= K`` is the same).
        client_sampling: fraction of nodes that contribute each round (``None``: all).
        local_epochs: instead of ``H``, communicate every this many passes over a node's data
            (``H = local_epochs * steps_per_epoch``, resolved when the module is set up).
    """

    space: ClassVar[str] = "param"
    #: Every form of averaging can leave missing nodes out.
    supports_dropout: ClassVar[bool] = True
    #: One flat payload per dtype, the same entries every round.
    stable_payloads: ClassVar[bool] = True

    def __init__(
        self,
        H: int = 1,
        target: str = "params",
        island_size: int | None = None,
        client_sampling: float | None = None,
        local_epochs: int | None = None,
    ) -> None:
        super().__init__(H)
        if local_epochs is not None and (not isinstance(local_epochs, int) or local_epochs < 1):
            raise ValueError(f"local_epochs must be a positive int, got {local_epochs!r}")
        self.local_epochs = local_epochs
        self._period_known = local_epochs is None
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

    @property
    def uniform_idle_calls(self) -> bool:  # type: ignore[override]
        """Without islands: every client that no round samples receives the same mean in the
        same call. Islands are drawn per rank, and a client's calls name its own island."""
        return self.island_size is None

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        if self.local_epochs is not None:
            self.H, self._period_known = self.local_epochs * ctx.steps_per_epoch, True
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self._drawn: dict[int, tuple] = {}
        # With client sampling a node averages in the rounds it is sampled for: its flat buffer
        # exists only then (1,000 clients would hold a model's worth each for the run).
        self.buckets = dtype_buckets(self.params, lazy=self.client_sampling is not None)

    def _round_groups(self, step: int) -> tuple:
        """(islands or None, this rank's island, its participants, the ranks of the
        participants' all-reduce and of the mean's broadcast) for the round of ``step``.

        Drawn once per round and kept for the next ``KEPT_ROUNDS`` rounds asked about."""
        round_ = step // self.H
        groups = self._drawn.get(round_)
        if groups is None:
            drawn = draw_round(self.ctx.num_nodes, self.island_size, self.client_sampling, self.ctx.seed, round_)
            i = drawn.island_of[self.ctx.rank]
            groups = (drawn.islands, drawn.groups[i], drawn.participants[i], *drawn.charged(i))
            if len(self._drawn) >= KEPT_ROUNDS:  # the earliest half goes (rounds are asked about in order)
                self._drawn = dict(sorted(self._drawn.items())[KEPT_ROUNDS // 2 :])
            self._drawn[round_] = groups
        return groups

    def participation(self, step: int, num_nodes: int, seed: int) -> Participation | None:
        """With ``client_sampling`` on parameters: each round's participants of every island
        train, the others idle and receive the participants' mean (which replaces their
        parameters). ``None`` otherwise, and while ``local_epochs`` is not resolved yet."""
        if self.client_sampling is None or self.target != "params" or not self._period_known:
            return None
        drawn = draw_round(num_nodes, self.island_size, self.client_sampling, seed, step // self.H)
        return Participation(self.H, drawn.trains, replaces=True)

    def _mean_(self, flat: torch.Tensor, round_: tuple) -> None:
        islands, members, participants, senders, receivers = round_
        comm, tag = self.ctx.comm, f"average_{self.target}"
        if len(participants) == len(members):
            comm.all_reduce(flat, op="mean", groups=islands, tag=tag)  # among the present nodes
            return
        rank = self.ctx.rank
        present = comm.present(islands)
        if len(present) < len(members):  # nodes missing from the round (fault injection)
            participants = [r for r in participants if r in present]
            senders = tuple(participants)
            receivers = (participants[0], *(r for r in members if r not in participants)) if participants else ()
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
            comm.charge("all_reduce", len(participants), *comm.wire_payload(flat, tag), members=senders)
        if rank not in participants or rank == participants[0]:
            size = len(members) - len(participants) + 1
            comm.charge("broadcast", size, nbytes, tag, is_root=rank == participants[0], members=receivers)

    def _receives_only(self, participants: list[int]) -> bool:
        """Whether this node only receives the round's mean: it was not sampled, no node is
        missing from the round, and its comm may contribute nothing (not with error feedback,
        whose zero payload carries the node's residual)."""
        comm = self.ctx.comm
        return self.ctx.rank not in participants and not comm.missing and comm.can_sit_out

    def _receive_mean_(self, bucket: Bucket, round_: tuple) -> None:
        """A client that was not sampled takes the participants' mean into its parameters: what
        ``_mean_`` gives it, without writing its zero share anywhere (every node is present)."""
        islands, members, participants, _, receivers = round_
        comm, tag = self.ctx.comm, f"average_{self.target}"
        total = comm.all_reduce_receive(bucket.buffer.like, "sum", groups=islands)
        bucket.buffer.unpack_divided(total, bucket.tensors, len(participants))
        nbytes = total.numel() * total.element_size()
        comm.charge("broadcast", len(members) - len(participants) + 1, nbytes, tag, members=receivers)

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        round_ = self._round_groups(step)
        participants = round_[2]
        for bucket in self.buckets:
            params, buf = bucket.tensors, bucket.buffer
            if self.target == "grads":
                flat = buf.pack([p.grad for p in params])
                self._mean_(flat, round_)
                for p, view in zip(params, buf.views, strict=True):
                    if p.grad is None:
                        p.grad = view.view_as(p).clone()
                    else:
                        p.grad.copy_(view.view_as(p))
            elif self._receives_only(participants):
                self._receive_mean_(bucket, round_)
            else:
                flat = buf.pack(params)
                self._mean_(flat, round_)
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
