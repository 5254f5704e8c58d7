"""``DESLOCStrategy``: Local Adam with parameters and moments averaged on their own periods."""

from __future__ import annotations

from typing import Any

from communicators.aggregation import Rule
from communicators.averaging import AveragingCommunicator
from communicators.optimizer_state import OptimizerStateAveraging
from exogym.compat import legacy_keywords
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.core.strategy import check_strategy_kwargs


@legacy_keywords
class DESLOCStrategy(CommunicateOptimizeStrategy):
    """DES-LOC (Iacob et al. 2025, arXiv 2505.22549): every node runs Adam locally; the parameters
    are averaged every ``Kx`` steps, Adam's first moment every ``Ku`` steps and its second moment
    every ``Kv`` steps (each after the optimizer step). ``Kx = Ku = Kv`` is Local Adam. The
    moments are not averaged after the run's last step, where no step reads them; the
    parameters are, when ``Kx`` divides the run's length.

    Pipeline: ``[AveragingCommunicator(Kx, target="params"), OptimizerStateAveraging("exp_avg",
    Ku), OptimizerStateAveraging("exp_avg_sq", Kv)]``.

    The inner optimizer must hold ``exp_avg`` and ``exp_avg_sq`` (Adam, AdamW: the default is
    AdamW, lr 1e-3); another one fails at the first moment average, naming the state it holds.

    Args:
        Kx: steps between parameter averages (default 32).
        Ku: steps between first-moment averages (default ``3 * Kx``, the paper's suggestion).
        Kv: steps between second-moment averages (default ``6 * Kx``, the paper's suggestion).
        aggregate: how each of the three averages combines the nodes' values (``"mean"``,
            default, or a robust rule of [`communicators.aggregation`][communicators.aggregation]):
            on the parameters it acts on the nodes' updates from the last average, on the
            moments on their values. Attacks act on all three.
        **strategy_kwargs: ``optim_spec`` (alias ``inner_optim``), ``lr``, ``lr_scheduler``,
            ``lr_scheduler_kwargs``, ``warmup_steps``, ``max_norm``, as for ``Strategy``.
    """

    def __init__(
        self,
        Kx: int = 32,
        Ku: int | None = None,
        Kv: int | None = None,
        aggregate: str | Rule = "mean",
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        for name, value in (("Kx", Kx), ("Ku", Ku), ("Kv", Kv)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} (steps between averages) must be a positive int, got {value!r}")
        self.Kx, self.Ku, self.Kv = Kx, 3 * Kx if Ku is None else Ku, 6 * Kx if Kv is None else Kv
        modules = [
            AveragingCommunicator(self.Kx, target="params", aggregate=aggregate),
            OptimizerStateAveraging("exp_avg", self.Ku, aggregate=aggregate),
            OptimizerStateAveraging("exp_avg_sq", self.Kv, aggregate=aggregate),
        ]
        super().__init__(modules, **strategy_kwargs)


__all__ = ["DESLOCStrategy", "OptimizerStateAveraging"]
