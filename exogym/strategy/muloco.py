"""``MuLoCoStrategy``: DiLoCo whose inner optimizer is Muon (AdamW for the embeddings, the output
head and the non-matrix parameters)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from communicators.aggregation import Rule
from communicators.diloco import DiLoCoCommunicator
from exogym.compat import legacy_keywords
from exogym.core.muon import MuonAdamW, check_muon_params
from exogym.core.optim import OptimSpec
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.core.strategy import check_strategy_kwargs
from exogym.privacy import DifferentialPrivacy
from exogym.strategy.diloco import inner_lr_alias, outer_spec


@legacy_keywords
class MuLoCoStrategy(CommunicateOptimizeStrategy):
    """MuLoCo (Therien et al. 2025, arXiv 2505.23725): DiLoCo with Muon as the inner optimizer.
    Every ``H`` steps the mean pseudo-gradient drives the outer optimizer, as in
    [`DiLoCoStrategy`][exogym.strategy.DiLoCoStrategy]; between synchronisations each node steps
    [`MuonAdamW`][exogym.strategy.MuonAdamW]: ``torch.optim.Muon`` on the hidden layers' matrices,
    AdamW on the embeddings, the output head and every parameter that is not a matrix, as the
    paper (and Muon's own convention) splits them. The bytes are DiLoCo's: one all-reduce of the
    pseudo-gradient per ``H`` steps.

    Pipeline: ``[DiLoCoCommunicator(H, outer, island_size)]``, inner ``OptimSpec(MuonAdamW)``.

    Args:
        H: inner steps between synchronisations (default 100).
        outer_optim: ``'sgd'`` (default), ``'sgd_normalized'`` or an ``OptimSpec``, as DiLoCo's.
        outer_lr: outer learning rate for ``'sgd'`` (default 0.7).
        outer_momentum: outer momentum for ``'sgd'`` (default 0.9).
        nesterov: Nesterov momentum for ``'sgd'`` (default True).
        muon_momentum: Muon's momentum (default the spec's, 0.95).
        adamw_lr: the learning rate of the parameters AdamW takes (default the spec's, 1e-3).
        island_size: average the pseudo-gradient within random islands of this many nodes.
        muon_params: the parameters Muon takes (default the spec's, ``"hidden"``): ``"hidden"``
            (every matrix but the ``torch.nn.Embedding`` weights and the output head, the weight
            of the model's last ``torch.nn.Linear`` in ``model.modules()`` order), ``"matrices"``
            (every parameter with two dimensions, the embeddings and the head included) or a set
            of parameter names as ``model.named_parameters()`` gives them (each a matrix).
        aggregate, privacy: as for [`DiLoCoStrategy`][exogym.strategy.DiLoCoStrategy].
        **strategy_kwargs: ``lr`` (Muon's learning rate, default 0.02; alias ``inner_lr``),
            ``optim_spec`` (alias ``inner_optim``: an ``OptimSpec`` of ``MuonAdamW``, to set its
            other arguments), ``lr_scheduler``, ``lr_scheduler_kwargs``, ``warmup_steps``,
            ``max_norm``, as for ``Strategy``.

    Raises:
        TypeError: ``optim_spec`` names another optimizer than ``MuonAdamW`` (for DiLoCo with
            another inner optimizer, use ``DiLoCoStrategy``), or ``muon_params`` is neither a
            rule's name nor a collection of names.
        ValueError: ``muon_params`` is a string other than ``"hidden"`` and ``"matrices"``.
    """

    def __init__(
        self,
        H: int = 100,
        outer_optim: str | OptimSpec = "sgd",
        outer_lr: float | None = None,
        outer_momentum: float | None = None,
        nesterov: bool | None = None,
        muon_momentum: float | None = None,
        adamw_lr: float | None = None,
        inner_lr: float | None = None,
        island_size: int | None = None,
        muon_params: str | Collection[str] | None = None,
        aggregate: str | Rule = "mean",
        privacy: DifferentialPrivacy | None = None,
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        given = [strategy_kwargs.pop(k) for k in ("optim_spec", "inner_optim") if strategy_kwargs.get(k) is not None]
        if len(given) > 1:
            raise TypeError("give the inner optimizer once: optim_spec or its alias inner_optim, not both")
        inner = OptimSpec.coerce(given[0] if given else None, OptimSpec(MuonAdamW))
        if not issubclass(inner.cls, MuonAdamW):
            raise TypeError(
                f"MuLoCoStrategy's inner optimizer is MuonAdamW, got {inner!r}; for DiLoCo with another inner "
                "optimizer use DiLoCoStrategy(optim_spec=...)"
            )
        if muon_params is not None:
            check_muon_params(muon_params)
            if not isinstance(muon_params, str):  # a set's order differs between processes: a stable repr
                muon_params = tuple(sorted(muon_params))
        overrides = {"momentum": muon_momentum, "adamw_lr": adamw_lr, "muon_params": muon_params}
        inner = inner.replace(**{k: v for k, v in overrides.items() if v is not None})
        spec, normalize = outer_spec(outer_optim, outer_lr, outer_momentum, nesterov)
        super().__init__(
            [DiLoCoCommunicator(H, spec, normalize, island_size, aggregate=aggregate, privacy=privacy)],
            optim_spec=inner,
            **inner_lr_alias(strategy_kwargs, inner_lr),
        )


__all__ = ["MuLoCoStrategy", "MuonAdamW"]
