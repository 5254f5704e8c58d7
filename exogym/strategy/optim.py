"""``exogym.strategy.optim.OptimSpec``: the import path of the original exo gym (see
``exogym.core.optim``)."""

from exogym.core.optim import OPTIMIZERS, OptimSpec

__all__ = ["OPTIMIZERS", "OptimSpec"]
