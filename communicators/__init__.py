"""Communicator modules: the building blocks of ``CommunicateOptimizeStrategy`` pipelines.

Each module is small, does one kind of communication, and charges every byte it would send to
the node's ledger through :class:`exogym.core.comm.NodeComm`.
"""

from communicators.averaging import AveragingCommunicator
from exogym.core.pipeline import Communicator, NodeContext, Pipeline

__all__ = ["AveragingCommunicator", "Communicator", "NodeContext", "Pipeline"]
