"""``exogym.strategy.optim.OptimSpec``: the import path the seeds use (see :mod:`exogym.core.optim`)."""

from exogym.core.optim import OPTIMIZERS, OptimSpec

__all__ = ["OPTIMIZERS", "OptimSpec"]
