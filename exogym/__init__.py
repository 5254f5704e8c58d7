"""ExoGym: simulate communication-efficient distributed training on one machine.

``Trainer`` (alias ``LocalTrainer``) runs K nodes as processes that talk through real
collectives; strategies live in :mod:`exogym.strategy`, communicator modules in the top-level
``communicators`` package.
"""

from exogym.runtime.faults import Faults
from exogym.runtime.launch import NodeFailedError
from exogym.trainer import LocalTrainer, Trainer

__version__ = "0.1.0"

__all__ = ["Faults", "LocalTrainer", "NodeFailedError", "Trainer", "__version__"]
