"""``Scale``: the model and hardware whose time a run simulates.

A run trains a proxy (the model given to ``fit``, small enough for this machine) and, with a
scale, prices every collective the algorithm makes and every step's compute as if the model were
the target::

    fit(model, ..., strategy=DiLoCoStrategy(H=100), network="internet",
        scale=Scale("10B", step_seconds=0.8))

* **Bytes**: each collective's payload is the target's (``exogym.projection``): the
  strategy runs once beside the proxy on the target's tensors, built on the ``meta`` device (exact
  shapes, no memory), and each payload the proxy sends is replaced by the one the target sends at
  the same point. A payload that is a fraction of the parameters (a fragment, a random share)
  keeps its fraction; one that depends on tensor shapes (PowerSGD's factors, DCT chunks, per-tensor
  top-k minimums) is the target's own. Floating-point payloads travel as ``wire`` values
  (bfloat16 by default); quantized ones keep their bits.
* **Compute**: a training step lasts ``step_seconds``, or ``6 * params * tokens_per_step /
  (accelerators * peak_flops * mfu)``; the network's ``compute_slowdown`` still applies per node.
  Without either, the network's compute model holds.
* **What does not change**: the learning. Losses, accuracies and parameters are the proxy's, the
  same with and without a scale.

The target is a model built on the meta device (``Scale(model=...)``), or a parameter count
(``Scale("10B")``, ``Scale(10e9)``): a decoder-only transformer of that many parameters exactly,
``layers`` blocks deep (``transformer_shapes``).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch

#: Suffixes of a parameter count: ``"350M"``, ``"1.5B"``, ``"10B"``, ``"1T"``.
COUNT_SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}

#: Wire formats of floating-point payloads, by name.
WIRE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

#: The vocabulary of a synthesized target (its embedding's rows, tied with the output layer).
VOCAB = 32_000

_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([KMBGT]?)\s*$")


def parse_count(value: float | int | str, what: str = "params") -> int:
    """A parameter count from ``10e9``, ``"10B"``, ``"1.5B"``, ``"350M"`` (``ValueError`` naming
    ``what`` otherwise)."""
    if isinstance(value, str):
        m = _COUNT.match(value)
        if m is None:
            raise ValueError(f"{what}: {value!r} is not a count; write e.g. 10e9, '10B', '1.5B' or '350M'")
        number = float(m.group(1)) * COUNT_SUFFIX.get(m.group(2), 1.0)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        raise TypeError(f"{what} must be a number or a string such as '10B', got {value!r}")
    if not (math.isfinite(number) and 1 <= number <= 1e15):
        raise ValueError(f"{what} must be between 1 and 1e15 parameters, got {value!r}")
    return int(round(number))


def default_layers(params: int) -> int:
    """Blocks of a synthesized target of ``params`` parameters when ``layers`` is not given:
    ``24 * (params / 1e9) ** (1/3)``, rounded (24 at 1B, 52 at 10B, 111 at 100B: the depth
    grows as the cube root, the width as the remaining square root)."""
    return max(1, round(24 * (params / 1e9) ** (1 / 3)))


def transformer_shapes(params: int, layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """``(name, shape)`` of every tensor of a decoder-only transformer of exactly ``params``
    parameters and ``layers`` blocks: per block a fused query-key-value ``[3d, d]``, an output
    ``[d, d]``, an MLP ``[4d, d]`` and ``[d, 4d]`` and two norms ``[d]`` each (weight and
    bias); a final norm; an embedding tied with the output layer, whose rows take what the
    blocks leave of ``params`` (about ``VOCAB`` of them; a last ``[r]`` tensor holds a
    remainder smaller than one row). The width ``d`` is a multiple of 64 chosen so."""
    per_block_sq, per_block_lin = 12 * layers, 4 * layers + 2
    # 12 L d^2 + (VOCAB + 4L + 2) d = params, for d.
    a, b = per_block_sq, VOCAB + per_block_lin
    d = (-b + math.sqrt(b * b + 4 * a * params)) / (2 * a)
    d = max(64, int(d // 64) * 64)
    while d > 64 and per_block_sq * d * d + per_block_lin * d > params:
        d -= 64
    rest = params - (per_block_sq * d * d + per_block_lin * d)
    if rest < 0:
        least = per_block_sq * d * d + per_block_lin * d
        raise ValueError(
            f"Scale: layers={layers} makes a transformer of at least {least} parameters, more than the {params} asked "
            "for: give more params or fewer layers"
        )
    shapes: list[tuple[str, tuple[int, ...]]] = []
    rows, remainder = divmod(rest, d)
    if rows:
        shapes.append(("embed.weight", (rows, d)))
    for i in range(layers):
        shapes += [
            (f"blocks.{i}.norm1.weight", (d,)),
            (f"blocks.{i}.norm1.bias", (d,)),
            (f"blocks.{i}.qkv.weight", (3 * d, d)),
            (f"blocks.{i}.out.weight", (d, d)),
            (f"blocks.{i}.norm2.weight", (d,)),
            (f"blocks.{i}.norm2.bias", (d,)),
            (f"blocks.{i}.up.weight", (4 * d, d)),
            (f"blocks.{i}.down.weight", (d, 4 * d)),
        ]
    shapes += [("norm.weight", (d,)), ("norm.bias", (d,))]
    if remainder:
        shapes.append(("remainder", (remainder,)))
    return shapes


class MetaTarget(torch.nn.Module):
    """A model of given tensor shapes on the ``meta`` device: parameters without storage, in
    the given order (``named_parameters`` yields them as ``transformer_shapes`` names them)."""

    def __init__(self, shapes: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype) -> None:
        super().__init__()
        self.tensors = torch.nn.ParameterDict()
        for name, shape in shapes:
            self.tensors[name.replace(".", "_")] = torch.nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"))

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError("a scale's target is priced, never run: it has shapes and no values")


@dataclass(frozen=True)
class Scale:
    """The model and hardware whose time a run simulates (see the module docstring).

    Attributes:
        params: the target's parameter count: a number (``10e9``) or a string (``"10B"``,
            ``"1.5B"``, ``"350M"``); or ``None`` with ``model``.
        model: the target itself, built on the ``meta`` device (``with torch.device("meta"):
            model = MyModel(config)``): exact tensor shapes at no memory. Give ``params`` or
            ``model``, not both.
        layers: blocks of the synthesized target (with ``params``; default ``default_layers``).
        wire: how floating-point payloads travel: ``"bf16"`` (default), ``"fp16"``, ``"fp32"``.
        step_seconds: seconds of one training step's compute on the target hardware.
        tokens_per_step, accelerators, peak_flops, mfu: the step's compute as ``6 * params *
            tokens_per_step / (accelerators * peak_flops * mfu)`` seconds (``peak_flops`` per
            accelerator, FLOP/s; ``mfu`` the model FLOPs utilisation, default 0.4), where
            ``step_seconds`` is not given. ``tokens_per_step`` alone turns a number of tokens
            into steps (``exogym bandwidth --tokens``).
    """

    params: float | int | str | None = None
    model: torch.nn.Module | None = field(default=None, compare=False)
    layers: int | None = None
    wire: str = "bf16"
    step_seconds: float | None = None
    tokens_per_step: float | None = None
    accelerators: int = 1
    peak_flops: float | None = None
    mfu: float = 0.4

    def __post_init__(self) -> None:
        if (self.params is None) == (self.model is None):
            raise ValueError("Scale needs the target's size: give params (e.g. Scale('10B')) or model, not both")
        if self.model is not None:
            if not isinstance(self.model, torch.nn.Module):
                raise TypeError(f"Scale(model=...) must be a torch.nn.Module on the meta device, got {self.model!r}")
            devices = {p.device.type for p in self.model.parameters()}
            if devices != {"meta"}:
                raise ValueError(
                    f"Scale(model=...) must be built on the meta device (with torch.device('meta'): ...), its "
                    f"parameters are on {sorted(devices)}"
                )
            count = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            if self.layers is not None:
                raise ValueError("Scale: layers shapes a synthesized target; a given model has its own")
        else:
            count = parse_count(self.params)  # type: ignore[arg-type]
            object.__setattr__(self, "params", count)  # one spelling per size: Scale("10B") == Scale(10e9)
        object.__setattr__(self, "_count", count)
        layers = self.layers
        if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
            raise ValueError(f"Scale: layers must be an int >= 1, got {self.layers!r}")
        if self.model is None:
            transformer_shapes(count, layers if layers is not None else default_layers(count))  # (fits, or says so)
        if self.wire not in WIRE_DTYPES:
            raise ValueError(f"Scale: wire must be one of {sorted(WIRE_DTYPES)}, got {self.wire!r}")
        for name in ("step_seconds", "tokens_per_step", "peak_flops"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf):
                raise ValueError(f"Scale: {name} must be a number > 0, got {v!r}")
        if isinstance(self.accelerators, bool) or not isinstance(self.accelerators, int) or self.accelerators < 1:
            raise ValueError(f"Scale: accelerators must be an int >= 1, got {self.accelerators!r}")
        mfu = self.mfu
        if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0 < mfu <= 1:
            raise ValueError(f"Scale: mfu must be a number in (0, 1], got {mfu!r}")
        if self.peak_flops is not None and self.tokens_per_step is None:
            raise ValueError("Scale: the step's compute from FLOPs needs tokens_per_step with peak_flops")
        if self.peak_flops is not None and self.step_seconds is not None:
            raise ValueError("Scale: give step_seconds or tokens_per_step and peak_flops, not both")

    @property
    def num_params(self) -> int:
        """The target's trainable parameter count."""
        return self._count  # type: ignore[attr-defined]

    @property
    def dtype(self) -> torch.dtype:
        """The dtype floating-point payloads travel as (``wire``)."""
        return WIRE_DTYPES[self.wire]

    def seconds_per_step(self) -> float | None:
        """A training step's compute seconds on the target hardware; ``None`` where the scale
        does not say (the network's compute model holds)."""
        if self.step_seconds is not None:
            return float(self.step_seconds)
        if self.tokens_per_step is not None and self.peak_flops is not None:
            return 6.0 * self.num_params * self.tokens_per_step / (self.accelerators * self.peak_flops * self.mfu)
        return None

    def target_model(self) -> torch.nn.Module:
        """The target on the meta device, its floating-point parameters in the ``wire`` dtype."""
        if self.model is not None:
            return copy.deepcopy(self.model).to(self.dtype)
        layers = self.layers if self.layers is not None else default_layers(self.num_params)
        return MetaTarget(transformer_shapes(self.num_params, layers), self.dtype)

    def describe(self) -> str:
        """The scale in words, for captions and logs."""
        seconds = self.seconds_per_step()
        step = f", {seconds:.3g} s/step" if seconds is not None else ""
        return f"scale {format_count(self.num_params)} parameters ({self.wire} on the wire{step})"


def as_scale(value: Scale | str | float, what: str = "scale") -> Scale:
    """``value`` as a [`Scale`][exogym.Scale]: itself, or ``Scale(value)`` for a parameter count
    (``"10B"``, ``10e9``); ``TypeError`` naming ``what`` for anything else."""
    if isinstance(value, Scale):
        return value
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"{what} must be an exogym.Scale or a parameter count such as '10B', got {value!r}")
    return Scale(value)


def format_count(n: float) -> str:
    """``10000000000`` as ``"10B"``, ``1.5e9`` as ``"1.5B"``, ``350e6`` as ``"350M"``."""
    for suffix, unit in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= unit:
            return f"{n / unit:.3g}{suffix}"
    return f"{n:g}"


__all__ = ["MetaTarget", "Scale", "as_scale", "default_layers", "format_count", "parse_count", "transformer_shapes"]
