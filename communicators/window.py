"""``During``: run a module only on the steps of a window, e.g. dense all-reduce before a
compressor takes over (PowerSGD's ``start_powerSGD_iter``)."""

from __future__ import annotations

from communicators.checks import check_int
from exogym.core.communicator import Communicator, Wrapper


class During(Wrapper):
    """``inner`` communicates only at local steps ``start <= step < stop`` where it is due; it is
    set up, checkpointed and described as usual.

    Args:
        inner: one module (not a pipeline: wrap each of its modules).
        start: the first step of the window (0-based).
        stop: the step after the window (``None``: to the end of the run).
    """

    def __init__(self, inner: Communicator, start: int = 0, stop: int | None = None) -> None:
        super().__init__(inner)
        if inner._leaves() != [inner]:
            raise TypeError(f"During wraps one module, got {inner.describe()}: wrap each module instead")
        check_int("start", start, 0)
        if stop is not None and (not isinstance(stop, int) or isinstance(stop, bool) or stop < start):
            raise ValueError(f"stop must be None or an int >= start={start}, got {stop!r}")
        self.start, self.stop = start, stop

    def is_due(self, step: int) -> bool:
        return self.start <= step and (self.stop is None or step < self.stop) and self.inner.is_due(step)

    def _leaves(self) -> list[Communicator]:
        """This module: the runtime asks it, not ``inner``, which steps communicate."""
        return [self]

    def describe(self) -> str:
        stop = "" if self.stop is None else str(self.stop)
        return f"{self.inner.describe()}[steps {self.start}:{stop}]"


__all__ = ["During"]
