"""Wire transforms: change what goes on the wire for every module of a pipeline at once.

``CommunicateOptimizeStrategy([...], wire=Int8(error_feedback=True))`` hands every module a
communication object that transforms its payloads (``communicators.quantize`` has the
quantizing ones). The modules do not know: a transform reaches every algorithm, the ones still
to be written included, without a line in them.
"""

from __future__ import annotations

from typing import Any

from exogym.core.comm.comm import Comm
from exogym.core.comm.wrapper import CommWrapper


class WireComm(CommWrapper):
    """The communication object a ``Wire`` makes for one node: a
    ``CommWrapper`` with state (e.g. error-feedback residuals)
    and a notion of a communication phase."""

    def begin_phase(self) -> None:
        """A communication phase starts (the gradient-space or the parameter-space modules of
        one step): payloads are numbered from here. The default does nothing."""

    def state_dict(self) -> dict[str, Any]:
        """State for checkpoints (the default: none)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


class Wire:
    """A description of a wire transform (configuration only: it is pickled into every node,
    where ``wrap`` makes the node's own ``WireComm``)."""

    def wrap(self, comm: Comm) -> WireComm:
        """The node's communication object around ``comm``."""
        raise NotImplementedError(f"{type(self).__name__} must implement wrap(comm)")

    def check(self, module: Any) -> None:
        """Raise ``ValueError`` where the transform cannot apply to ``module`` (a communicator of
        the pipeline it is given to), naming the module and the fix: it is called when the
        strategy is made, before any process starts. The default accepts every module; a
        transform of float payloads refuses modules that code their payloads into bytes
        themselves (``module.payloads == "coded"``), on which it would do nothing."""

    def describe(self) -> str:
        """A short label for logs."""
        return type(self).__name__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


__all__ = ["Wire", "WireComm"]
