"""Legacy import path of the original exo gym (``exogym.strategy.strategy``); see
``exogym.compat``."""

from exogym.core.strategy import Strategy
from exogym.strategy.simple_reduce import SimpleReduceStrategy

__all__ = ["SimpleReduceStrategy", "Strategy"]
