"""``SPARTAStrategy`` and ``SPARTADiLoCoStrategy``: sparse parameter averaging every step."""

from __future__ import annotations

from typing import Any

from communicators.aggregation import Rule
from communicators.diloco import DiLoCoCommunicator
from communicators.quantize import QuantizeCommunicator
from communicators.sparse import SELECTORS, SparseCommunicator
from exogym.compat import legacy_keywords
from exogym.core.comm.handles import AUTO
from exogym.core.optim import OptimSpec
from exogym.core.pipeline import CommunicateOptimizeStrategy, Communicator
from exogym.core.strategy import check_strategy_kwargs
from exogym.privacy import DifferentialPrivacy
from exogym.strategy.diloco import inner_lr_alias, outer_spec

_BITS = {8: "int8", 16: "fp16"}


def sparse_module(
    p_sparta: float,
    sparsification_mode: str | None,
    compression_method: str | None,
    quantization_bits: int | None,
    sparta_interval: int = 1,
    async_sparta_delay: int | str = 0,
) -> Communicator:
    """The SPARTA communicator from the preset spellings (``compression_method`` is an alias of
    ``sparsification_mode``; ``quantization_bits`` 8 or 16 wraps it in a quantizer;
    ``sparta_interval`` is its ``H``, ``async_sparta_delay`` its ``delay``)."""
    if sparsification_mode is not None and compression_method is not None and sparsification_mode != compression_method:
        raise TypeError(
            f"sparsification_mode={sparsification_mode!r} and its alias "
            f"compression_method={compression_method!r} disagree"
        )
    if not isinstance(p_sparta, (int, float)) or not 0.0 <= p_sparta <= 1.0:
        raise ValueError(f"p_sparta (the fraction of parameters averaged per step) must be in [0, 1], got {p_sparta!r}")
    mode = sparsification_mode or compression_method or "random"
    if mode not in SELECTORS:
        name = "sparsification_mode" if sparsification_mode is not None else "compression_method"
        raise ValueError(f"{name} must be one of {SELECTORS}, got {mode!r}")
    if not isinstance(sparta_interval, int) or isinstance(sparta_interval, bool) or sparta_interval < 1:
        raise ValueError(f"sparta_interval (steps between SPARTA rounds) must be an int >= 1, got {sparta_interval!r}")
    d = async_sparta_delay
    if d != AUTO and (not isinstance(d, int) or isinstance(d, bool) or d < 0):
        raise ValueError(
            f"async_sparta_delay (rounds before an average is applied) must be an int >= 0 or 'auto' (when it "
            f"arrives on the simulated clock), got {d!r}"
        )
    module: Communicator = SparseCommunicator(p_sparta, mode, H=sparta_interval, delay=async_sparta_delay)
    if quantization_bits is not None and quantization_bits != 32:
        if quantization_bits not in _BITS:
            raise ValueError(f"quantization_bits must be 8, 16, 32 or None, got {quantization_bits!r}")
        module = QuantizeCommunicator(module, _BITS[quantization_bits])
    return module


@legacy_keywords
class SPARTAStrategy(CommunicateOptimizeStrategy):
    """SPARTA: after every inner step, average a fraction ``p_sparta`` of the parameters whose
    indices every rank derives from the shared seed (no mask is sent).

    Pipeline: ``[SparseCommunicator(p_sparta, mode)]``, wrapped in ``QuantizeCommunicator`` when
    ``quantization_bits`` is 8 or 16.

    Args:
        p_sparta: fraction of parameters averaged per step (default 0.005).
        sparsification_mode: ``random`` (default), ``sequential``, ``partitioned``, ``blockwise``
            or ``topk`` (see ``communicators.sparse``). ``compression_method`` is an alias.
        quantization_bits: 8 (int8 with per-chunk scales), 16 (fp16), or 32/``None`` (none).
        sparta_interval: average every this many steps (default 1).
        async_sparta_delay: apply each round's average this many rounds later (default 0: at
            once), as the original exo gym's asynchronous SPARTA; ``"auto"``: at the first step
            at which its transfer has arrived on the simulated clock (needs modelled compute).
        **strategy_kwargs: ``optim_spec`` (alias ``inner_optim``), ``lr``, ``lr_scheduler``,
            ``lr_scheduler_kwargs``, ``warmup_steps``, ``max_norm``, as for ``Strategy``.
    """

    def __init__(
        self,
        p_sparta: float = 0.005,
        sparsification_mode: str | None = None,
        compression_method: str | None = None,
        quantization_bits: int | None = None,
        sparta_interval: int = 1,
        async_sparta_delay: int | str = 0,
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        module = sparse_module(
            p_sparta, sparsification_mode, compression_method, quantization_bits, sparta_interval, async_sparta_delay
        )
        super().__init__([module], **strategy_kwargs)


@legacy_keywords
class SPARTADiLoCoStrategy(CommunicateOptimizeStrategy):
    """SPARTA every step plus a DiLoCo outer step every ``H`` steps.

    Pipeline: ``[SparseCommunicator(p_sparta, mode), DiLoCoCommunicator(H, outer)]``. Arguments as
    for [`SPARTAStrategy`][exogym.strategy.SPARTAStrategy] and
    [`DiLoCoStrategy`][exogym.strategy.DiLoCoStrategy] (``aggregate`` and ``privacy`` apply to the
    outer step).
    """

    def __init__(
        self,
        p_sparta: float = 0.005,
        sparsification_mode: str | None = None,
        H: int = 100,
        outer_optim: str | OptimSpec = "sgd",
        outer_lr: float | None = None,
        outer_momentum: float | None = None,
        nesterov: bool | None = None,
        inner_lr: float | None = None,
        compression_method: str | None = None,
        quantization_bits: int | None = None,
        sparta_interval: int = 1,
        async_sparta_delay: int | str = 0,
        aggregate: str | Rule = "mean",
        privacy: DifferentialPrivacy | None = None,
        **strategy_kwargs: Any,
    ) -> None:
        check_strategy_kwargs(self, strategy_kwargs)
        spec, normalize = outer_spec(outer_optim, outer_lr, outer_momentum, nesterov)
        modules = [
            sparse_module(
                p_sparta,
                sparsification_mode,
                compression_method,
                quantization_bits,
                sparta_interval,
                async_sparta_delay,
            ),
            DiLoCoCommunicator(H, spec, normalize, aggregate=aggregate, privacy=privacy),
        ]
        super().__init__(modules, **inner_lr_alias(strategy_kwargs, inner_lr))


__all__ = ["SPARTADiLoCoStrategy", "SPARTAStrategy", "SparseCommunicator"]
