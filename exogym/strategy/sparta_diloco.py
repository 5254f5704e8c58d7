"""Legacy import path of the original exo gym (``exogym.strategy.sparta_diloco``); see
``exogym.compat``."""

from exogym.strategy.sparta import SPARTADiLoCoStrategy

__all__ = ["SPARTADiLoCoStrategy"]
