"""DiLoCo's outer step (Douillard et al. 2023, arXiv 2311.08105, Algorithm 1), without a master.

Every ``H`` steps each rank computes the pseudo-gradient ``delta = theta_global - theta_local``
(the last synchronised parameters minus its own), all-reduces its mean, resets its parameters to
``theta_global`` and applies the outer optimizer with ``delta`` as the gradient. Every rank runs
the same outer step on the same averaged ``delta``, so all ranks end identical (as in torchft):
no rank is special and nothing is broadcast. ``theta_global`` stays on the model's device and is
refreshed only at synchronisation, never copied per step.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import torch

from communicators.aggregation import Rule, aggregate_all_reduce, describe_rule, is_mean, resolve, rule_name
from communicators.checks import check_int
from communicators.islands import draw_islands
from exogym.core.comm.comm import Comm, Groups
from exogym.core.comm.flat import dtype_buckets
from exogym.core.optim import OptimSpec
from exogym.core.pipeline import Communicator, NodeContext
from exogym.privacy import DifferentialPrivacy, check_privacy


class PseudoGradReducer(Protocol):
    """Replaces per-parameter pseudo-gradients by their (possibly compressed) mean.

    A reducer may also define ``state_dict()`` and ``load_state_dict(state)`` (what it keeps
    between rounds, such as error-feedback residuals):
    [`DiLoCoCommunicator`][communicators.DiLoCoCommunicator] saves and restores them with its own
    state.
    """

    def reduce_(self, comm: Comm, tensors: list[torch.Tensor], groups: Groups | None) -> None:
        """Collective: replace ``tensors`` (one per trainable parameter, each a fresh tensor of
        the parameter's shape) in place by their mean over this rank's group (``groups``: ``None``
        for every node, or the islands), sending every byte through ``comm``. Every member of a
        group must end with the same tensors."""

    def describe(self) -> str:
        """A short label for logs."""


#: The outer optimizer when none is given: Nesterov SGD, lr 0.7, momentum 0.9 (DiLoCo's choice).
DEFAULT_OUTER = OptimSpec(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)


class DiLoCoCommunicator(Communicator):
    """Every ``H`` steps: average the pseudo-gradient and take an outer optimizer step.

    Args:
        H: inner steps between synchronisations.
        outer_optim: the outer optimizer as an ``OptimSpec`` (default ``DEFAULT_OUTER``).
        normalize: scale the averaged pseudo-gradient to unit L2 norm (over all parameters)
            before the outer step (``outer_optim='sgd_normalized'`` in ``DiLoCoStrategy``).
        island_size: average the pseudo-gradient within random islands of this many nodes.
        reducer: how the pseudo-gradients are averaged (a
            [`PseudoGradReducer`][communicators.diloco.PseudoGradReducer]); by default one exact
            all-reduce per dtype through a flat buffer. E.g.
            [`communicators.dct.DCTTopKReducer`][communicators.DCTTopKReducer] compresses them with
            DCT top-k.
        aggregate: how the nodes' pseudo-gradients become one
            ([`communicators.aggregation`][communicators.aggregation]): ``"mean"`` (the default,
            an all-reduce), a robust rule (an all-gather) or a rule of your own; not with a
            ``reducer``.
        privacy: clip each node's pseudo-gradient and add Gaussian noise
            ([`DifferentialPrivacy`][exogym.privacy.DifferentialPrivacy]); ``None``: none.
    """

    space: ClassVar[str] = "param"

    def __init__(
        self,
        H: int = 100,
        outer_optim: OptimSpec | None = None,
        normalize: bool = False,
        island_size: int | None = None,
        reducer: PseudoGradReducer | None = None,
        aggregate: str | Rule = "mean",
        privacy: DifferentialPrivacy | None = None,
    ) -> None:
        super().__init__(H)
        check_privacy(privacy)
        self.privacy = privacy
        #: The aggregation rule (``aggregate``), applied through ``aggregate_all_reduce``.
        self.rule = resolve(aggregate)
        if reducer is not None and not is_mean(self.rule):
            raise ValueError(
                f"DiLoCoCommunicator(aggregate={rule_name(self.rule)!r}) with a reducer: the reducer decides how "
                "the pseudo-gradients are combined; give one or the other"
            )
        self.outer_spec = outer_optim if outer_optim is not None else DEFAULT_OUTER
        if not isinstance(self.outer_spec, OptimSpec):
            raise TypeError(f"outer_optim must be an OptimSpec, got {outer_optim!r}")
        check_int("island_size", island_size, why="nodes per island", none="everyone")
        self.normalize = normalize
        self.island_size = island_size
        self.reducer = reducer
        #: The exact outer step averages among the present nodes; a custom reducer or a robust
        #: rule (which gathers every node's pseudo-gradient) may not.
        self.supports_dropout = reducer is None and is_mean(self.rule)  # type: ignore[misc]
        #: The mean pseudo-gradient holds every entry every round; a reducer's may not.
        self.payloads = "stable" if reducer is None else "varying"  # type: ignore[misc]

    def aggregation_group(self, num_nodes: int, attacked: bool) -> int:
        """The fewest pseudo-gradients the rule combines in a run of ``num_nodes`` nodes (an
        island's)."""
        return min(num_nodes, self.island_size or num_nodes)

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.buckets = dtype_buckets(self.params)
        # theta_global: the parameters as of the last synchronisation (one copy, on device).
        self.global_params = [p.detach().clone() for p in self.params]
        self.outer = self.outer_spec.build(self.params)

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        islands = None
        if self.island_size:
            islands = draw_islands(self.ctx.num_nodes, self.island_size, self.ctx.seed, step // self.H)
        grads = [g - p for g, p in zip(self.global_params, self.params, strict=True)]
        if self.reducer is not None:
            self.reducer.reduce_(self.ctx.comm, grads, islands)
        else:
            for bucket in self.buckets:
                mine = [grads[i] for i in bucket.indices]
                aggregate_all_reduce(
                    self.ctx, bucket.buffer.pack(mine), self.rule, step, "diloco_pseudo_grad", islands, self.privacy
                )
                bucket.buffer.unpack(mine)
        if self.normalize:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(d) for d in grads]))
            for d in grads:
                d.div_(norm.clamp_min(1e-12))
        self._outer_step(grads)

    def _outer_step(self, grads: list[torch.Tensor]) -> None:
        """The outer optimizer's step from ``global_params`` with ``grads`` (one per parameter) as
        the gradients: the parameters and ``global_params`` both end with its result, and the
        parameters keep their own ``.grad``."""
        saved = [p.grad for p in self.params]
        for p, g, d in zip(self.params, self.global_params, grads, strict=True):
            p.copy_(g)
            p.grad = d
        self.outer.step()
        for p, g, s in zip(self.params, self.global_params, saved, strict=True):
            g.copy_(p)
            p.grad = s

    def state_dict(self) -> dict[str, Any]:
        state = {"global_params": list(self.global_params), "outer": self.outer.state_dict()}
        if hasattr(self.reducer, "state_dict"):
            state["reducer"] = self.reducer.state_dict()  # type: ignore[union-attr]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for g, t in zip(self.global_params, state["global_params"], strict=True):
            g.copy_(t)
        self.outer.load_state_dict(state["outer"])
        if "reducer" in state:
            self.reducer.load_state_dict(state["reducer"])  # type: ignore[union-attr]

    def describe(self) -> str:
        isl = f", island_size={self.island_size}" if self.island_size else ""
        red = f", reducer={self.reducer.describe()}" if self.reducer is not None else ""
        red += describe_rule(self.rule)
        red += "" if self.privacy is None else f", {self.privacy.describe()}"
        return f"DiLoCo(H={self.H}, outer={self.outer_spec!r}{', normalized' if self.normalize else ''}{isl}{red})"
