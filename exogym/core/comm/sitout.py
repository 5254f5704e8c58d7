"""What a node sitting rounds out owes the others: absent calls and charges, coalesced.

``exogym.core.comm.comm.NodeComm.sitting_out`` collects here the all-reduces a node sits
out and the charges its communicators make meanwhile. Consecutive identical absent calls become
one call with a repeat count (virtual nodes queue it once, however many rounds it stands for),
consecutive identical charges one ledger record with a count: a FedAvg client that sleeps
through fifty rounds costs about what one round costs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from exogym.core.comm.ledger import Ledger

#: ``(like, op, members, repeat)``: how the comm makes one absent call.
AbsentFn = Callable[[torch.Tensor, str, "list[int] | None", int], None]


class SitOut:
    """Pending absent calls and charges of one sitting-out block, in call order."""

    def __init__(self) -> None:
        self._calls: list[list] = []  # [key, like, op, members, repeat]
        self._charges: list[list] = []  # [args, count, members]

    def absent(self, like: torch.Tensor, op: str, members: list[int] | None, repeat: int = 1) -> None:
        """An all-reduce sat out (``repeat`` in a row) over ``members`` (``None``: the world)."""
        key = (op, None if members is None else tuple(members), like.dtype, like.numel(), like.device.type)
        if self._calls and self._calls[-1][0] == key:
            self._calls[-1][4] += repeat
        else:
            self._calls.append([key, _stand_in(like), op, members, repeat])

    def charge(
        self,
        kind: str,
        group_size: int,
        payload: int,
        tag: str,
        is_root: bool,
        count: int,
        members: tuple[int, ...] | None = None,
    ) -> None:
        """A charge made while sitting out (recorded when the block ends, in order)."""
        args = (kind, group_size, int(payload), tag, is_root)
        last = self._charges[-1] if self._charges else None
        if last is not None and last[0] == args and (last[2] is members or last[2] == members):
            last[1] += count
        else:
            self._charges.append([args, count, members])

    def flush_calls(self, absent: AbsentFn) -> None:
        """Make the pending absent calls through ``absent``."""
        calls, self._calls = self._calls, []
        for _, like, op, members, repeat in calls:
            absent(like, op, members, repeat)

    def flush(self, absent: AbsentFn, ledger: Ledger) -> None:
        """Make the pending calls and record the pending charges in ``ledger``."""
        self.flush_calls(absent)
        charges, self._charges = self._charges, []
        for args, count, members in charges:
            ledger.record(*args, count=count, members=members)


def _stand_in(like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``like``'s dtype, device and number of elements that holds one element: an
    absent call reads only those, and the caller's tensor (a model-sized buffer, say) is not
    kept alive while the call waits in a queue (a client asleep through 40 rounds queued 40).
    One per dtype, device and size in a process: never written."""
    return _one_element(like.dtype, like.device, like.numel())


@functools.lru_cache(maxsize=64)
def _one_element(dtype: torch.dtype, device: torch.device, numel: int) -> torch.Tensor:
    return torch.zeros((), dtype=dtype, device=device).expand(numel)


__all__ = ["SitOut"]
