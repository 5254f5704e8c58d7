"""Quantize another communicator's payload to fp16, bf16, int8 or fp8, optionally with error feedback.

``QuantizeCommunicator(inner)`` hands ``inner`` a communication object that quantizes every
floating-point all-reduce and all-gather payload before it leaves the node. The ledger charges
the collective at the quantized size (for int8 and fp8: one byte per entry plus one fp32 scale per
chunk of ``chunk`` entries), i.e. a quantized ring all-reduce. fp8 is ``float8_e4m3fn`` (3 mantissa
bits, largest value 448) scaled per chunk so that the chunk's largest magnitude maps to 448; its
codes travel as bytes. An all-reduce's result is what a
reduction of the quantized contributions gives (no re-quantization at intermediate hops): each
node decodes its own payload and the simulator sums the decoded values in float32 (the ledger
charges the quantized bytes); an all-gather moves the quantized payloads and every node decodes
them.

With ``error_feedback=True`` each payload site keeps the quantization error and adds it to the
next payload from that site (Seide et al. 2014; Karimireddy et al. 2019, EF-SGD).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from exogym.core.comm.comm import Comm, Groups
from exogym.core.pipeline import Communicator, NodeContext

FORMATS = ("int8", "fp16", "bf16", "fp8")
#: Largest finite float8_e4m3fn value: the per-chunk absmax of an fp8 payload maps to it.
_FP8_MAX = 448.0


def quantize(x: torch.Tensor, fmt: str, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, scales)`` of a 1-D float tensor. int8: symmetric per-chunk absmax, codes in
    ``[-127, 127]``; fp8: per-chunk absmax scaled to 448, cast to ``float8_e4m3fn`` and viewed as
    ``uint8``; fp16/bf16: a cast and no scales."""
    if fmt == "fp16":
        return x.to(torch.float16), x.new_empty(0, dtype=torch.float32)
    if fmt == "bf16":
        return x.to(torch.bfloat16), x.new_empty(0, dtype=torch.float32)
    n = x.numel()
    chunks = math.ceil(n / chunk)
    padded = torch.zeros(chunks * chunk, dtype=torch.float32, device=x.device)
    padded[:n] = x.reshape(-1)
    rows = padded.view(chunks, chunk)
    if fmt == "fp8":
        scales = rows.abs().amax(dim=1) / _FP8_MAX
        codes8 = (rows / scales.clamp_min(1e-30)[:, None]).to(torch.float8_e4m3fn)
        return codes8.reshape(-1)[:n].contiguous().view(torch.uint8), scales
    scales = rows.abs().amax(dim=1) / 127.0
    codes = torch.round(rows / scales.clamp_min(1e-30)[:, None]).clamp_(-127, 127).to(torch.int8)
    return codes.reshape(-1)[:n], scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor, fmt: str, chunk: int = 256) -> torch.Tensor:
    """Float32 values of :func:`quantize`'s output."""
    if fmt in ("fp16", "bf16"):
        return codes.to(torch.float32)
    if fmt == "fp8":
        codes = codes.view(torch.float8_e4m3fn)
    n = codes.numel()
    idx = torch.arange(n, device=codes.device) // chunk
    return codes.to(torch.float32) * scales[idx]


def quantized_bytes(n: int, fmt: str, chunk: int = 256) -> int:
    """Bytes of one quantized payload of ``n`` entries."""
    if fmt in ("int8", "fp8"):
        return n + 4 * math.ceil(n / chunk)
    return 2 * n


class QuantizedComm:
    """A :class:`~exogym.core.comm.comm.Comm` around ``base`` that quantizes float payloads.

    Error-feedback residuals belong to a payload *site*: the n-th quantized collective of a
    round (see :meth:`begin_round`), so two payloads of the same size keep separate residuals.
    """

    def __init__(self, base: Comm, fmt: str, chunk: int, error_feedback: bool) -> None:
        self.base, self.fmt, self.chunk, self.error_feedback = base, fmt, chunk, error_feedback
        self.residuals: dict[tuple, torch.Tensor] = {}
        self.rank, self.world_size, self.ledger = base.rank, base.world_size, base.ledger
        self._site = 0

    def begin_round(self) -> None:
        """Start a communication round: payload sites are counted from here."""
        self._site = 0

    def _encode(self, tensor: torch.Tensor, site: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        x = tensor.detach().reshape(-1).to(torch.float32)
        if self.error_feedback:
            res = self.residuals.get(site)
            if res is not None:
                x = x + res
        codes, scales = quantize(x, self.fmt, self.chunk)
        if self.error_feedback:
            self.residuals[site] = x - dequantize(codes, scales, self.fmt, self.chunk)
        return codes, scales

    def _encode_next(self, tensor: torch.Tensor, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_encode` ``tensor`` as the round's next payload site."""
        self._site += 1
        return self._encode(tensor, (self._site, tag, tensor.numel(), tensor.dtype))

    def _gather_decoded(self, tensor: torch.Tensor, groups: Groups | None, tag: str) -> torch.Tensor:
        codes, scales = self._encode_next(tensor, tag)
        all_codes = self.base.all_gather(codes, groups=groups, charge=False)
        all_scales = self.base.all_gather(scales, groups=groups, charge=False)
        return torch.stack([dequantize(c, s, self.fmt, self.chunk) for c, s in zip(all_codes, all_scales, strict=True)])

    def all_reduce(
        self, tensor: torch.Tensor, op: str = "sum", groups: Groups | None = None, charge: bool = True, tag: str = ""
    ) -> torch.Tensor:
        """As :meth:`NodeComm.all_reduce`; float ``sum``/``mean`` payloads travel quantized."""
        if not tensor.is_floating_point() or op not in ("sum", "mean"):
            return self.base.all_reduce(tensor, op, groups, charge, tag)
        # The reduction of the quantized contributions: each node's payload as its peers decode
        # it, summed in float32. The decoding is the same on every node, so each decodes its own
        # and the sum travels as one plain all-reduce (not an all-gather that every node decodes
        # whole: K^2 decodings a round, 25 s a round for 200 virtual nodes).
        decoded = dequantize(*self._encode_next(tensor, tag), self.fmt, self.chunk)
        self.base.all_reduce(decoded, op, groups, charge=False)
        tensor.copy_(decoded.view_as(tensor))
        if charge:
            self.base.charge(
                "all_reduce",
                len(self.base.present(groups)),
                quantized_bytes(tensor.numel(), self.fmt, self.chunk),
                f"{tag}+{self.fmt}",
            )
        return tensor

    def all_gather(
        self, tensor: torch.Tensor, groups: Groups | None = None, charge: bool = True, tag: str = ""
    ) -> torch.Tensor:
        """As :meth:`NodeComm.all_gather`; float payloads travel quantized."""
        if not tensor.is_floating_point():
            return self.base.all_gather(tensor, groups, charge, tag)
        decoded = self._gather_decoded(tensor, groups, tag)
        if charge:
            self.base.charge(
                "all_gather",
                decoded.shape[0],
                quantized_bytes(tensor.numel(), self.fmt, self.chunk),
                f"{tag}+{self.fmt}",
            )
        return decoded.view(decoded.shape[0], *tensor.shape).to(tensor.dtype)

    def wire_payload(self, tensor: torch.Tensor, tag: str = "") -> tuple[int, str]:
        """``(bytes, tag)`` that :meth:`all_reduce` charges for ``tensor``: the quantized size
        of a float payload (tag ``"<tag>+<fmt>"``), else its own; for a caller that charges an
        all-reduce itself (client sampling charges the participants' all-reduce apart)."""
        if not tensor.is_floating_point():
            return tensor.numel() * tensor.element_size(), tag
        return quantized_bytes(tensor.numel(), self.fmt, self.chunk), f"{tag}+{self.fmt}"

    @property
    def absent(self) -> frozenset[int]:
        """The base's nodes missing from the round."""
        return self.base.absent

    @property
    def can_contribute_nothing(self) -> bool:
        """Whether a node may take part in a float all-reduce without a payload
        (:meth:`all_reduce_receive`, :meth:`all_reduce_absent`) and get what sending zeros gives:
        without error feedback, as zeros quantize to zero codes; with it, a node's zero payload
        carries its residual, so every node sends."""
        return not self.error_feedback

    def _refuse_feedback(self, what: str) -> None:
        if self.error_feedback:
            raise RuntimeError(f"{what} with error feedback: a zero payload carries this node's residual; send it")

    def all_reduce_receive(self, like: torch.Tensor, op: str = "sum", groups: Groups | None = None) -> torch.Tensor:
        """As :meth:`NodeComm.all_reduce_receive` (contributing zeros, whose codes are zero).
        Not with error feedback (see :attr:`can_contribute_nothing`)."""
        self._refuse_feedback("all_reduce_receive")
        return self.base.all_reduce_receive(like, op, groups)

    def all_reduce_absent(
        self, like: torch.Tensor, op: str = "sum", groups: Groups | None = None, repeat: int = 1
    ) -> None:
        """As :meth:`NodeComm.all_reduce_absent`. Not with error feedback (see
        :attr:`can_contribute_nothing`)."""
        self._refuse_feedback("all_reduce_absent")
        self.base.all_reduce_absent(like, op, groups, repeat)

    def broadcast(self, tensor: torch.Tensor, src: int = 0, charge: bool = True, tag: str = "") -> torch.Tensor:
        """Passed through unquantized."""
        return self.base.broadcast(tensor, src, charge, tag)

    def barrier(self) -> None:
        self.base.barrier()

    def charge(
        self, kind: str, group_size: int, payload: int, tag: str = "", is_root: bool = False, count: int = 1
    ) -> None:
        self.base.charge(kind, group_size, payload, tag, is_root, count)

    def present(self, groups: Groups | None = None) -> list[int]:
        return self.base.present(groups)


class QuantizeCommunicator(Communicator):
    """Wrap ``inner`` so that its float payloads travel as ``fmt`` (``int8``, ``fp16``, ``bf16``).

    Runs exactly when ``inner`` runs (its space and schedule); state is ``inner``'s plus the
    error-feedback residuals.

    Args:
        inner: the communicator whose payload is quantized.
        fmt: one of :data:`FORMATS`.
        chunk: entries per int8 scale.
        error_feedback: carry each site's quantization error into its next payload.
    """

    def __init__(self, inner: Communicator, fmt: str = "int8", chunk: int = 256, error_feedback: bool = False) -> None:
        super().__init__(H=1)
        if not isinstance(inner, Communicator):
            raise TypeError(f"inner must be a Communicator, got {inner!r}")
        if fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        if error_feedback and not inner.stable_payloads:
            raise ValueError(
                f"error_feedback=True needs payloads that hold the same entries every round, but "
                f"{inner.describe()} sends different entries each round (its residuals would be added to the "
                "wrong entries); use error_feedback=False"
            )
        self.inner, self.fmt, self.chunk, self.error_feedback = inner, fmt, chunk, error_feedback

    def _init_node(self, ctx: NodeContext) -> None:
        super()._init_node(ctx)
        self.qcomm = QuantizedComm(ctx.comm, self.fmt, self.chunk, self.error_feedback)
        inner_ctx = NodeContext(
            ctx.model, ctx.rank, ctx.num_nodes, self.qcomm, ctx.optimizer, ctx.seed, ctx.max_steps, ctx.steps_per_epoch
        )  # type: ignore[arg-type]
        self.inner._init_node(inner_ctx)

    def idle_steps(self, step: int) -> int:
        """``inner``'s (a quantized FedAvg with client sampling leaves its unsampled clients idle
        as the plain one does)."""
        return self.inner.idle_steps(step)

    def overwritten_at(self, step: int) -> int | None:
        """``inner``'s without error feedback (an unsampled client sleeps through rounds as the
        plain one does: its payload would be zeros, whose codes are zero); ``None`` with it (the
        node's zero payload carries its residual, so it takes part in every round)."""
        return None if self.error_feedback else self.inner.overwritten_at(step)

    def idle_span_ends(self, step: int, stop: int, read_at: int) -> list[int]:
        """``inner``'s without error feedback; none with it (see :meth:`overwritten_at`)."""
        return [] if self.error_feedback else self.inner.idle_span_ends(step, stop, read_at)

    def sit_out(self, step: int) -> None:
        """``inner``'s (only where :meth:`overwritten_at` allows it: no error feedback)."""
        self.qcomm.begin_round()
        self.inner.sit_out(step)

    def sit_out_rounds(self, steps: Sequence[int]) -> bool:
        """``inner``'s; ``False`` with error feedback."""
        return False if self.error_feedback else self.inner.sit_out_rounds(steps)

    @property
    def round_steps(self) -> int | None:
        """``inner``'s."""
        return self.inner.round_steps

    def sampled_nodes(self, num_nodes: int, seed: int, step: int) -> list[int] | None:
        """``inner``'s."""
        return self.inner.sampled_nodes(num_nodes, seed, step)

    def before_optim(self, step: int) -> None:
        self.qcomm.begin_round()
        self.inner.before_optim(step)

    def after_optim(self, step: int) -> None:
        self.qcomm.begin_round()
        self.inner.after_optim(step)

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), "residuals": dict(self.qcomm.residuals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        self.qcomm.residuals = dict(state["residuals"])

    def describe(self) -> str:
        return f"Quantize[{self.fmt}{', EF' if self.error_feedback else ''}]({self.inner.describe()})"
