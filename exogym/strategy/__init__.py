"""Strategies: the ``Strategy`` base, the communicator pipeline, and the presets.

Presets are :class:`CommunicateOptimizeStrategy` pipelines of modules from the top-level
``communicators`` package.
"""

from exogym.core.optim import OptimSpec
from exogym.core.pipeline import CommunicateOptimizeStrategy, Communicator
from exogym.core.strategy import Strategy
from exogym.strategy.simple_reduce import SimpleReduceStrategy

__all__ = [
    "CommunicateOptimizeStrategy",
    "Communicator",
    "OptimSpec",
    "SimpleReduceStrategy",
    "Strategy",
]
