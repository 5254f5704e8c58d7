"""``DecoupledDiLoCoStrategy``: learners on their own clocks, merged by a quorum within a grace window."""

from __future__ import annotations

from typing import Any

from communicators.aggregation import Rule
from communicators.decoupled_diloco import DecoupledDiLoCoServer
from exogym.core.server import ServerStrategy
from exogym.core.strategy import check_strategy_kwargs


class DecoupledDiLoCoStrategy(ServerStrategy):
    """Decoupled DiLoCo (Douillard et al. 2026, arXiv 2604.21428): every node (a learner) trains
    without ever waiting and sends a fragment of its parameters when its step count says so; a
    simulated synchronizer merges a fragment once ``quorum`` learners sent it, after an adaptive
    grace window, weighting each by the steps behind it, with Nesterov SGD or CGAD (Adam on
    pseudo-gradients scaled down by their staleness, arXiv 2605.09126); learners adopt the
    merged fragments as they arrive. Nodes the network's availability trace takes away skip
    their steps and pull the model when they return; training never stops for them.

    Server: [`DecoupledDiLoCoServer`][communicators.DecoupledDiLoCoServer], on the simulated
    clock. Needs modelled compute; node speeds come from ``compute_slowdown``, absences from
    ``Network(availability=...)``.
    [`run_summary`][exogym.ServerStrategy.run_summary] gives each node's steps
    and utilisation, the contributions' staleness and the merges.

    Args:
        H: steps between two sends of one fragment (default 100).
        fragments: fragments of the model, sent in turn (default 1).
        quorum: learners a merge waits for (default: half the nodes).
        grace: share of the slack waited after the quorum, in ``[0, 1)`` (default 0.5).
        tau: overlap in steps the slack is measured in (default 2, the paper's).
        outer_lr: the synchronizer's learning rate (default: 0.7 for Nesterov, 0.1 for CGAD).
        outer_momentum: Nesterov's momentum (default 0.9; ``outer="nesterov"`` only).
        outer: ``"nesterov"`` (default) or ``"cgad"``, the staleness-aware outer optimizer.
        cgad_alpha, cgad_cutoff: CGAD's decay per merge of staleness and the staleness (merges)
            from which a contribution is gated out (defaults 0.1, 16; ``float("inf")``: no gate).
        cgad_betas, cgad_eps: CGAD's Adam betas and epsilon (defaults ``(0.9, 0.999)``, 1e-8).
        aggregate: how a merge combines its contributions (``"mean"``, default, the paper's
            token-weighted mean, or a robust rule of
            [`communicators.aggregation`][communicators.aggregation]).
        **strategy_kwargs: ``optim_spec``, ``lr``, ``lr_scheduler``, ``max_norm``, ... as for
            ``Strategy``.
    """

    def __init__(
        self,
        H: int = 100,
        fragments: int = 1,
        quorum: int | None = None,
        grace: float = 0.5,
        tau: int = 2,
        outer_lr: float | None = None,
        outer_momentum: float = 0.9,
        outer: str = "nesterov",
        cgad_alpha: float = 0.1,
        cgad_cutoff: float = 16,
        cgad_betas: tuple[float, float] = (0.9, 0.999),
        cgad_eps: float = 1e-8,
        aggregate: str | Rule = "mean",
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        server = DecoupledDiLoCoServer(
            H, fragments, quorum, grace, tau, outer_lr, outer_momentum,
            outer=outer, cgad_alpha=cgad_alpha, cgad_cutoff=cgad_cutoff, cgad_betas=cgad_betas, cgad_eps=cgad_eps,
            aggregate=aggregate,
        )  # fmt: skip
        super().__init__(server, **strategy_kwargs)


__all__ = ["DecoupledDiLoCoStrategy"]
