"""ExoGym: simulate communication-efficient distributed training on one machine.

``Trainer`` (alias ``LocalTrainer``) runs K nodes as processes that talk through real
collectives; strategies live in [`exogym.strategy`][exogym.strategy], communicator modules in the
top-level ``communicators`` package.

Importing ``exogym`` starts nothing and imports torch only when a name that needs it is first
used. The fork server that node processes start from is started by the first ``Trainer(...)``,
or earlier by [`prestart`][exogym.prestart] (see ``exogym.runtime.forkserver``). Successive ``fit``
calls reuse the worker processes; [`shutdown`][exogym.shutdown] ends them before the program does
(see ``exogym.runtime.pool``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exogym._lazy import lazy_exports

__version__ = "0.1.0"

__all__ = [
    "Adversaries",
    "Availability",
    "Faults",
    "Link",
    "LocalTrainer",
    "Network",
    "NodeFailedError",
    "Result",
    "Scale",
    "Server",
    "ServerContext",
    "ServerStrategy",
    "Train",
    "Trainer",
    "__version__",
    "prestart",
    "sweep",
    "shutdown",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Adversaries": "exogym.adversaries",
        "Availability": "exogym.core.comm.availability",
        "Faults": "exogym.faults_config",
        "Link": "exogym.core.comm.links",
        "Network": "exogym.core.comm.network",
        "LocalTrainer": "exogym.trainer",
        "NodeFailedError": "exogym.runtime.launch",
        "Result": "exogym.core.server",
        "Scale": "exogym.scale",
        "Server": "exogym.core.server",
        "ServerContext": "exogym.core.server",
        "ServerStrategy": "exogym.core.server",
        "Train": "exogym.core.server",
        "Trainer": "exogym.trainer",
        "prestart": "exogym.runtime.forkserver",
        "sweep": "exogym.cli.sweep",
        "shutdown": "exogym.runtime.pool",
    },
)

if TYPE_CHECKING:
    from exogym.adversaries import Adversaries
    from exogym.cli.sweep import sweep
    from exogym.core.comm.availability import Availability
    from exogym.core.comm.links import Link
    from exogym.core.comm.network import Network
    from exogym.core.server import Result, Server, ServerContext, ServerStrategy, Train
    from exogym.faults_config import Faults
    from exogym.runtime.forkserver import prestart
    from exogym.runtime.launch import NodeFailedError
    from exogym.runtime.pool import shutdown
    from exogym.scale import Scale
    from exogym.trainer import LocalTrainer, Trainer
