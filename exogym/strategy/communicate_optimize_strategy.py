"""Legacy import path of the original exo gym (``exogym.strategy.communicate_optimize_strategy``);
see ``exogym.compat``."""

from exogym.compat import CommunicationModule
from exogym.core.pipeline import CommunicateOptimizeStrategy

__all__ = ["CommunicateOptimizeStrategy", "CommunicationModule"]
