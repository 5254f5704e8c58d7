"""Quantize what goes on the wire to fp16, bf16, int8, fp8 or fp4, optionally with error feedback.

``CommunicateOptimizeStrategy([...], wire=Int8())`` (or [`FP8`][communicators.FP8], [`FP4`][communicators.FP4],
[`FP16`][communicators.FP16], [`BF16`][communicators.BF16], [`Quantize`][communicators.Quantize])
hands every module a communication object that quantizes every floating-point all-reduce and
all-gather payload before it leaves the node; ``QuantizeCommunicator(inner, "int8")`` does the same
for one module. The ledger charges the collective at the quantized size (for int8 and fp8: one byte
per entry plus one fp32 scale per chunk of ``chunk`` entries), i.e. a quantized ring all-reduce. fp8
is ``float8_e4m3fn`` (3 mantissa bits, largest value 448) scaled per chunk so that the chunk's
largest magnitude maps to 448; its codes travel as bytes. fp4 is OCP e2m1 (``communicators.fp4``:
magnitudes up to 6, rounded to the nearest code) scaled per chunk so that the chunk's largest
magnitude maps to 6; two codes travel in one byte (``ceil(n / 2)`` bytes plus one fp32 scale per
chunk). An all-reduce's result is what a reduction of the quantized contributions gives (no
re-quantization at intermediate hops): each node decodes its own payload and the simulator sums
the decoded values in float32 (the ledger charges the quantized bytes); an all-gather moves the
quantized payloads and every node decodes them.

With ``error_feedback=True`` the quantization error is added to a later payload (Seide et al.
2014; Karimireddy et al. 2019, EF-SGD): per payload site (the n-th payload of a communication
phase) where payloads hold the same entries every round, and per parameter entry where a module
says which entries each payload holds (``Entries``, as error-feedback top-k and SparseLoCo keep
it): a SPARTA payload gets the residuals of the entries it carries, and the entries it does not
carry keep theirs.

A module that codes its payloads into bytes itself (``payloads = "coded"``: error-feedback
top-k's values and indices in one buffer, SparseLoCo's few-bit codes) has no float payload to
quantize: the transforms refuse it when the strategy is made, rather than pass its bytes through
unchanged.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from communicators.fp4 import E2M1_MAX, decode_e2m1, encode_e2m1, pack_nibbles, unpack_nibbles
from exogym.core.comm.comm import Comm, Groups
from exogym.core.comm.entries import Entries
from exogym.core.comm.handles import CollectiveHandle
from exogym.core.communicator import Communicator, Wrapper
from exogym.core.wire import Wire, WireComm

FORMATS = ("int8", "fp16", "bf16", "fp8", "fp4")
#: The value each chunk's largest magnitude maps to: float8_e4m3fn's and e2m1's largest, int8's 127.
_CHUNK_MAX = {"int8": 127.0, "fp8": 448.0, "fp4": E2M1_MAX}


def quantize(x: torch.Tensor, fmt: str, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, scales)`` of a 1-D float tensor. int8: symmetric per-chunk absmax, codes in
    ``[-127, 127]``; fp8: per-chunk absmax scaled to 448, cast to ``float8_e4m3fn`` and viewed as
    ``uint8``; fp4: per-chunk absmax scaled to 6, rounded to e2m1 (ties to even) and packed two
    codes a byte (``ceil(n / 2)`` ``uint8``); fp16/bf16: a cast and no scales."""
    if fmt in ("fp16", "bf16"):
        return x.to(torch.float16 if fmt == "fp16" else torch.bfloat16), x.new_empty(0, dtype=torch.float32)
    n = x.numel()
    chunks = math.ceil(n / chunk)
    rows = torch.nn.functional.pad(x.reshape(-1).to(torch.float32), (0, chunks * chunk - n)).view(chunks, chunk)
    scales = rows.abs().amax(dim=1) / _CHUNK_MAX[fmt]
    scaled = (rows / scales.clamp_min(1e-30)[:, None]).reshape(-1)[:n]
    if fmt == "fp8":
        return scaled.to(torch.float8_e4m3fn).view(torch.uint8), scales
    if fmt == "fp4":
        return pack_nibbles(encode_e2m1(scaled)), scales
    return torch.round(scaled).clamp_(-127, 127).to(torch.int8), scales


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, fmt: str, chunk: int = 256, n: int | None = None
) -> torch.Tensor:
    """Float32 values of ``quantize``'s output; ``n``: the entries it had (fp4, whose bytes hold
    two codes each; default ``2 * codes.numel()``; the other formats have one code per entry)."""
    if fmt in ("fp16", "bf16"):
        return codes.to(torch.float32)
    if fmt == "fp4":
        values = decode_e2m1(unpack_nibbles(codes, 2 * codes.numel() if n is None else n))
    else:
        values = (codes.view(torch.float8_e4m3fn) if fmt == "fp8" else codes).to(torch.float32)
    return values * scales.repeat_interleave(chunk)[: values.numel()]


def quantized_bytes(n: int, fmt: str, chunk: int = 256) -> int:
    """Bytes of one quantized payload of ``n`` entries: int8 and fp8 one per entry, fp4 one per
    two (``ceil(n / 2)``), each with one fp32 scale per chunk; fp16 and bf16 two per entry."""
    if fmt not in _CHUNK_MAX:
        return 2 * n
    return (math.ceil(n / 2) if fmt == "fp4" else n) + 4 * math.ceil(n / chunk)


class QuantizedComm(WireComm):
    """A ``Comm`` around ``base`` that quantizes float all-reduce and all-gather payloads
    (broadcasts pass through as they are).

    Error-feedback residuals belong to a payload *site*: the n-th quantized collective of a
    communication phase (see ``begin_phase``), so two payloads of the same size keep
    separate residuals.
    """

    def __init__(self, base: Comm, fmt: str, chunk: int, error_feedback: bool) -> None:
        super().__init__(base)
        self.fmt, self.chunk, self.error_feedback = fmt, chunk, error_feedback
        self.residuals: dict[tuple, torch.Tensor] = {}
        #: Residuals of located payloads (``Entries``): one per tensor, in parameter space.
        self.entry_residuals: dict[tuple, list[torch.Tensor]] = {}
        self._site = 0

    def begin_phase(self) -> None:
        """Start a communication phase: payload sites are counted from here."""
        self._site = 0

    def _encode_next(
        self, tensor: torch.Tensor, tag: str, entries: Entries | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes, scales)`` of ``tensor`` as the phase's next payload site. With error feedback
        the quantization error is kept for the site's next payload or, where ``entries`` locates
        the values, per parameter entry: each value gets the residual of the entry it comes from,
        the entries sent keep this payload's error, the others their residual."""
        self._site += 1
        x = tensor.detach().reshape(-1).to(torch.float32)
        if not self.error_feedback:
            return quantize(x, self.fmt, self.chunk)
        if entries is None:
            site = (self._site, tag, tensor.numel(), tensor.dtype)
            if site in self.residuals:
                x = x + self.residuals[site]
        else:
            if entries.numel() != tensor.numel():
                raise ValueError(f"entries locate {entries.numel()} values, but the payload has {tensor.numel()}")
            res = self.entry_residuals.get(entries.key(tag))
            if res is None:
                res = [torch.zeros(t.numel(), dtype=torch.float32, device=t.device) for t in entries.tensors]
                self.entry_residuals[entries.key(tag)] = res
            x = x + torch.cat([r[i] for r, i in zip(res, entries.indices, strict=True)])
        codes, scales = quantize(x, self.fmt, self.chunk)
        error = x - dequantize(codes, scales, self.fmt, self.chunk, x.numel())
        if entries is None:
            self.residuals[site] = error
        else:
            for r, i, e in zip(res, entries.indices, error.split([i.numel() for i in entries.indices]), strict=True):
                r[i] = e
        return codes, scales

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: str = "sum",
        groups: Groups | None = None,
        charge: bool = True,
        tag: str = "",
        entries: Entries | None = None,
        async_op: bool = False,
    ) -> torch.Tensor | CollectiveHandle:
        """As ``NodeComm.all_reduce``; float ``sum``/``mean`` payloads travel quantized (with
        ``entries``, error feedback keeps its residual per located entry)."""
        if async_op:
            return self.started("all_reduce", tensor, lambda t: self.all_reduce(t, op, groups, charge, tag, entries))
        if not tensor.is_floating_point() or op not in ("sum", "mean"):
            return self.base.all_reduce(tensor, op, groups, charge, tag, entries)
        # The reduction of the quantized contributions: each node's payload as its peers decode
        # it, summed in float32. The decoding is the same on every node, so each decodes its own
        # and the sum travels as one plain all-reduce (not an all-gather that every node decodes
        # whole: K^2 decodings a round).
        decoded = dequantize(*self._encode_next(tensor, tag, entries), self.fmt, self.chunk, tensor.numel())
        self.base.all_reduce(decoded, op, groups, charge=False)
        tensor.copy_(decoded.view_as(tensor))
        if charge:
            present = tuple(self.base.present(groups))
            self.base.charge("all_reduce", len(present), *self.wire_payload(tensor, tag), members=present)
        return tensor

    def all_gather(
        self,
        tensor: torch.Tensor,
        groups: Groups | None = None,
        charge: bool = True,
        tag: str = "",
        async_op: bool = False,
    ) -> torch.Tensor | CollectiveHandle:
        """As ``NodeComm.all_gather``; float payloads travel quantized."""
        if async_op:
            return self.started("all_gather", tensor, lambda t: self.all_gather(t, groups, charge, tag), False)
        if not tensor.is_floating_point():
            return self.base.all_gather(tensor, groups, charge, tag)
        codes, scales = self._encode_next(tensor, tag)
        all_codes = self.base.all_gather(codes, groups=groups, charge=False)
        all_scales = self.base.all_gather(scales, groups=groups, charge=False)
        decoded = torch.stack(
            [dequantize(c, s, self.fmt, self.chunk, tensor.numel()) for c, s in zip(all_codes, all_scales, strict=True)]
        )
        if charge:
            self.base.charge("all_gather", decoded.shape[0], *self.wire_payload(tensor, tag))
        return decoded.view(decoded.shape[0], *tensor.shape).to(tensor.dtype)

    def wire_payload(self, tensor: torch.Tensor, tag: str = "") -> tuple[int, str]:
        """``(bytes, tag)`` that ``all_reduce`` charges for ``tensor``: the quantized size
        of a float payload (tag ``"<tag>+<fmt>"``), else its own."""
        if not tensor.is_floating_point():
            return self.base.wire_payload(tensor, tag)
        return quantized_bytes(tensor.numel(), self.fmt, self.chunk), f"{tag}+{self.fmt}"

    def state_dict(self) -> dict[str, Any]:
        return {"residuals": dict(self.residuals), "entry_residuals": dict(self.entry_residuals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.residuals = dict(state.get("residuals", {}))
        self.entry_residuals = {k: list(v) for k, v in state.get("entry_residuals", {}).items()}


class Quantize(Wire):
    """A wire transform that quantizes every float payload to ``fmt``.

    Args:
        fmt: one of ``FORMATS``.
        chunk: entries per int8/fp8/fp4 scale.
        error_feedback: carry the quantization error into later payloads: per payload site where
            the payloads hold the same entries every round (``payloads = "stable"``), per
            parameter entry where they say which entries they hold (``payloads = "located"``: SPARTA).
    """

    def __init__(self, fmt: str = "int8", chunk: int = 256, error_feedback: bool = False) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
        if not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"chunk must be a positive int, got {chunk!r}")
        self.fmt, self.chunk, self.error_feedback = fmt, chunk, bool(error_feedback)

    def wrap(self, comm: Comm) -> QuantizedComm:
        return QuantizedComm(comm, self.fmt, self.chunk, self.error_feedback)

    def check(self, module: Communicator) -> None:
        """Raise ``ValueError`` where the transform cannot apply to ``module``: it codes its
        payloads into bytes itself (``payloads = "coded"``: nothing to quantize, the wire would do
        nothing), or error feedback is asked for and its payloads hold different entries each
        round without saying which (``payloads = "varying"``)."""
        if module.payloads == "coded":
            raise ValueError(
                f"a quantizing wire ({self.describe()}) acts on float payloads, but {module.describe()} codes its "
                "payload into bytes itself (payloads='coded': values and indices in one buffer, at the precision the "
                "module sets), so the wire would pass it through unchanged; leave the quantizing wire out for this "
                "module (no wire= on the strategy, no QuantizeCommunicator around it)"
            )
        if self.error_feedback and module.payloads == "varying":
            raise ValueError(
                f"error_feedback=True needs payloads that hold the same entries every round (payloads = 'stable' on "
                f"the module's class), or that say which entries they hold (payloads = 'located'), but "
                f"{module.describe()} sends different entries each round without saying which (payloads = "
                f"{module.payloads!r}: its residuals would be added to the wrong entries); use error_feedback=False"
            )

    def describe(self) -> str:
        return f"{self.fmt}{', EF' if self.error_feedback else ''}"


class Int8(Quantize):
    """[`Quantize`][communicators.Quantize] to int8 (per-chunk absmax scales)."""

    def __init__(self, chunk: int = 256, error_feedback: bool = False) -> None:
        super().__init__("int8", chunk, error_feedback)


class FP8(Quantize):
    """[`Quantize`][communicators.Quantize] to float8_e4m3fn (per-chunk scales)."""

    def __init__(self, chunk: int = 256, error_feedback: bool = False) -> None:
        super().__init__("fp8", chunk, error_feedback)


class FP4(Quantize):
    """[`Quantize`][communicators.Quantize] to OCP e2m1 4-bit floats, two a byte (per-chunk
    scales; ``communicators.fp4``)."""

    def __init__(self, chunk: int = 256, error_feedback: bool = False) -> None:
        super().__init__("fp4", chunk, error_feedback)


class FP16(Quantize):
    """[`Quantize`][communicators.Quantize] to float16."""

    def __init__(self, error_feedback: bool = False) -> None:
        super().__init__("fp16", 256, error_feedback)


class BF16(Quantize):
    """[`Quantize`][communicators.Quantize] to bfloat16."""

    def __init__(self, error_feedback: bool = False) -> None:
        super().__init__("bf16", 256, error_feedback)


class QuantizeCommunicator(Wrapper):
    """Wrap ``inner`` so that its float payloads travel as ``fmt`` (``int8``, ``fp8``, ``fp4``,
    ``fp16``, ``bf16``): the [`Quantize`][communicators.Quantize] wire transform applied to one module.

    Runs exactly when ``inner`` runs (its space and schedule); state is
    ``inner``'s plus the error-feedback residuals.

    Args:
        inner: the communicator whose payload is quantized.
        fmt: one of ``FORMATS``.
        chunk: entries per int8/fp8/fp4 scale.
        error_feedback: carry each site's quantization error into its next payload.
    """

    def __init__(self, inner: Communicator, fmt: str = "int8", chunk: int = 256, error_feedback: bool = False) -> None:
        super().__init__(inner)
        self.wire = Quantize(fmt, chunk, error_feedback)
        self.wire.check(inner)

    def wrap_comm(self, comm: Comm) -> Comm:
        self.qcomm = self.wire.wrap(comm)
        return self.qcomm

    @contextlib.contextmanager
    def around(self, step: int) -> Iterator[None]:
        self.qcomm.begin_phase()
        yield

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), **self.qcomm.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        self.qcomm.load_state_dict(state)

    def describe(self) -> str:
        return f"Quantize[{self.wire.describe()}]({self.inner.describe()})"


__all__ = [
    "BF16",
    "FORMATS",
    "FP4",
    "FP8",
    "FP16",
    "Int8",
    "Quantize",
    "QuantizeCommunicator",
    "QuantizedComm",
    "dequantize",
    "quantize",
    "quantized_bytes",
]
