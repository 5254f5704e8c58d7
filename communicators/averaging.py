"""Average the model or its gradients over all nodes or random islands."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from communicators.aggregation import Rule, aggregate_all_reduce, describe_rule, is_mean, resolve
from communicators.checks import check_int
from communicators.islands import draw_islands
from exogym.core.comm.flat import dtype_buckets
from exogym.core.communicator import Communicator, NodeContext
from exogym.privacy import DifferentialPrivacy, check_privacy

TARGETS = ("params", "grads")


class AveragingCommunicator(Communicator):
    """Every ``H`` steps, replace the parameters (or gradients) by their mean.

    ``target="grads"`` runs before the optimizer step (DDP when ``H=1``); ``target="params"`` runs
    after it (FedAvg / local SGD). One all-reduce per dtype per round, through a flat buffer.

    With ``island_size``, each round the nodes are split into random islands of that size (drawn
    from the shared seed, the same on every rank, see
    [`communicators.islands.draw_islands`][communicators.draw_islands]) and each island averages on
    its own; the ledger charges an all-reduce among the island. Nodes that faults drop from a
    round are left out of its mean.

    Client sampling (only some clients train in a round) is a server algorithm:
    [`FedAvgServer`][communicators.FedAvgServer], or ``FedAvgStrategy(client_sampling=...)``.

    Args:
        H: communicate every ``H`` steps.
        target: ``"params"`` or ``"grads"``.
        island_size: nodes per island (``None``: everyone; ``>= K`` is the same).
        client_sampling: refused (``ValueError`` naming the server that samples clients).
        local_epochs: instead of ``H``, communicate every this many passes over a node's data
            (``H = local_epochs * steps_per_epoch``, resolved when the module is set up).
        aggregate: how the nodes' values become one ([`communicators.aggregation`][communicators.aggregation]):
            ``"mean"`` (the default, an all-reduce), ``"median"``, ``"trimmed_mean"``, ``"krum"``,
            ``"multi_krum"``, ``"centered_clip"`` (each an all-gather) or a rule of your own.
        privacy: clip each node's values and add Gaussian noise
            ([`DifferentialPrivacy`][exogym.privacy.DifferentialPrivacy]); ``None``: none.
    """

    space: ClassVar[str] = "param"
    #: Every form of averaging can leave dropped nodes out.
    supports_dropout: ClassVar[bool] = True
    #: One flat payload per dtype, the same entries every round.
    payloads: ClassVar[str] = "stable"

    def __init__(
        self,
        H: int = 1,
        target: str = "params",
        island_size: int | None = None,
        client_sampling: float | None = None,
        local_epochs: int | None = None,
        aggregate: str | Rule = "mean",
        privacy: DifferentialPrivacy | None = None,
    ) -> None:
        super().__init__(H)
        check_privacy(privacy)
        if privacy is not None and target == "params":
            raise ValueError(
                "AveragingCommunicator(target='params', privacy=...): differential privacy clips updates, and "
                "averaging parameters shares whole models; use it on gradients (target='grads', DDP) or on DiLoCo's "
                "pseudo-gradients (DiLoCoStrategy(privacy=...))"
            )
        self.privacy = privacy
        #: The aggregation rule (``aggregate``), applied through ``aggregate_all_reduce``.
        self.rule = resolve(aggregate)
        #: A robust rule gathers every node's values, which a round with dropped nodes cannot.
        self.supports_dropout = is_mean(self.rule)  # type: ignore[misc]
        check_int("local_epochs", local_epochs, why="passes over a node's data between averages", none="H")
        self.local_epochs = local_epochs
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        check_int("island_size", island_size, why="nodes per island", none="everyone")
        if client_sampling is not None:
            raise ValueError(
                f"AveragingCommunicator(client_sampling={client_sampling!r}): client sampling runs as a server on the "
                "simulated clock, where a client not drawn is never built; use "
                f"FedAvgStrategy(H, client_sampling={client_sampling!r}) or "
                f"ServerStrategy(FedAvgServer(H, {client_sampling!r}, island_size))"
            )
        self.target = target
        self.island_size = island_size
        self.space = "grad" if target == "grads" else "param"  # type: ignore[misc]

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        if self.local_epochs is not None:
            self.H = self.local_epochs * ctx.steps_per_epoch
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.buckets = dtype_buckets(self.params)
        attacked = ctx.adversaries is not None and ctx.adversaries.config.on_updates
        self.aggregation_group(ctx.num_nodes, attacked)
        #: Averaging parameters under an attack or a robust rule: each dtype's parameters as last
        #: averaged, so that the nodes' updates (parameters minus these) are what is attacked.
        self.averaged: list[torch.Tensor] | None = None
        if self.target == "params" and (attacked or not is_mean(self.rule)):
            self.averaged = [bucket.buffer.pack(bucket.tensors).clone() for bucket in self.buckets]

    def aggregation_group(self, num_nodes: int, attacked: bool) -> int:
        """The fewest updates the rule combines in a run of ``num_nodes`` nodes (an island's).

        Raises:
            ValueError: averaging parameters in islands under an attack (it acts on updates from
                one last average, which islands redrawn every round do not share).
        """
        if self.target == "params" and self.island_size and attacked:
            raise ValueError(
                f"{self.describe()} with adversaries: an attack acts on updates from one last average, which islands "
                "redrawn every round do not share; give island_size or adversaries, not both"
            )
        return min(num_nodes, self.island_size or num_nodes)

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        ctx = self.ctx
        islands = draw_islands(ctx.num_nodes, self.island_size, ctx.seed, step // self.H) if self.island_size else None
        tag = f"average_{self.target}"
        for bucket_index, bucket in enumerate(self.buckets):
            tensors = bucket.tensors
            if self.target == "grads":
                for p in tensors:  # a parameter without a gradient contributes zeros and gets the mean
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                tensors = [p.grad for p in tensors]
            flat = bucket.buffer.pack(tensors)
            last = self.averaged[bucket_index] if self.averaged is not None else None
            aggregate_all_reduce(ctx, flat, self.rule, step, tag, islands, self.privacy, offset=last)
            if last is not None:
                last.copy_(flat)
            bucket.buffer.unpack(tensors)

    def state_dict(self) -> dict[str, Any]:
        return {} if self.averaged is None else {"averaged": list(self.averaged)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for last, saved in zip(self.averaged or [], state.get("averaged", []), strict=False):
            last.copy_(saved)

    def describe(self) -> str:
        islands = "" if self.island_size is None else f", island_size={self.island_size}"
        rule = describe_rule(self.rule)
        rule += "" if self.privacy is None else f", {self.privacy.describe()}"
        return f"Averaging({self.target}, H={self.H}{islands}{rule})"
