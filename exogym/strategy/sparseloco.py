"""``SparseLoCoStrategy``: DiLoCo with chunk-wise top-k, few-bit pseudo-gradients and error feedback."""

from __future__ import annotations

from typing import Any, Literal

from communicators.sparseloco import SparseLoCoCommunicator
from exogym.compat import legacy_keywords
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.core.strategy import check_strategy_kwargs


@legacy_keywords
class SparseLoCoStrategy(CommunicateOptimizeStrategy):
    """SparseLoCo (Sarfi et al. 2025): every ``H`` steps each node adds its pseudo-gradient to an
    error-feedback buffer decayed by ``beta`` (in place of DiLoCo's outer momentum), sends the
    ``k`` largest entries of each chunk at ``bits`` bits per value, keeps the rest, and every
    node steps its parameters by ``outer_lr`` times the mean of the decoded payloads (see
    ``communicators.sparseloco``). Chunks are the paper's: blocks of at most ``chunk x chunk``
    of each matrix, runs of at most ``chunk`` entries of each vector.

    Pipeline: ``[SparseLoCoCommunicator(H, chunk, k, beta, bits, outer_lr, chunking)]``.

    Args:
        H: inner steps between synchronisations (default 100).
        chunk: a chunk's side (default 64: 64x64 blocks of a matrix, as in the paper).
        k: entries sent per chunk (default ``None``: 1/64 of a full chunk, 1.6% density; 64 of
            a 64x64 block).
        beta: decay of the error-feedback buffer (default 0.95).
        bits: bits per sent value (default 2).
        outer_lr: the outer step's learning rate (default 1.0).
        chunking: ``"blocks"`` (default, the paper's 2-D blocks) or ``"flat"`` (runs of
            ``chunk`` entries of each flattened tensor).
        **strategy_kwargs: ``optim_spec`` (alias ``inner_optim``), ``lr``, ``lr_scheduler``,
            ``lr_scheduler_kwargs``, ``warmup_steps``, ``max_norm``, as for ``Strategy``.
    """

    def __init__(
        self,
        H: int = 100,
        chunk: int = 64,
        k: int | None = None,
        beta: float = 0.95,
        bits: int = 2,
        outer_lr: float = 1.0,
        chunking: Literal["blocks", "flat"] = "blocks",
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        module = SparseLoCoCommunicator(H, chunk, k, beta, bits, outer_lr, chunking)
        super().__init__([module], **strategy_kwargs)


__all__ = ["SparseLoCoCommunicator", "SparseLoCoStrategy"]
