"""A few-bit quantizer of a vector of values: ``bits``-bit codes and a codebook of ``2**bits``
float32 levels.

SparseLoCo (Sarfi et al. 2025, arXiv 2508.15706) sends its top-k values in 2 bits. The
quantizer here is modelled on the statistical quantizer of the authors' training code: with
``L = 2**bits`` levels, ``shift = mean(v)``, ``c = v - shift``, ``sigma`` the unbiased standard
deviation of ``v`` (0 for a single value) and ``scale = range_sigmas * sigma / L`` (1 where that
is 0 or not finite), each value gets the code ``clamp(round(c / scale + L // 2), 0, L - 1)``;
level ``l`` of the codebook is ``shift`` plus the mean of ``c`` over the values of code ``l``
(``shift`` for a code no value has). Decoding is a lookup: ``codebook[code]``. The codebook
travels with the codes: ``4 * L`` bytes per quantized vector.
"""

from __future__ import annotations

import math

import torch

#: The clipping range in standard deviations (the authors' code's default).
RANGE_SIGMAS = 6.0


def quantize(values: torch.Tensor, bits: int, range_sigmas: float = RANGE_SIGMAS) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, codebook)`` of the 1-D ``values``: int64 codes in ``[0, 2**bits)`` (same length)
    and the ``[2**bits]`` float32 levels they decode to (see the module docstring)."""
    levels = 1 << bits
    v = values.to(torch.float32)
    shift = v.mean()
    centered = v - shift
    m = centered.numel()
    sigma = centered.norm() / math.sqrt(m - 1) if m > 1 else centered.new_zeros(())
    scale = range_sigmas * sigma / levels
    scale = torch.where(torch.isfinite(scale) & (scale != 0), scale, torch.ones_like(scale))
    codes = (centered / scale + levels // 2).round().clamp(0, levels - 1).to(torch.int64)
    sums = torch.zeros(levels, dtype=torch.float32, device=v.device).index_add_(0, codes, centered)
    counts = torch.zeros(levels, dtype=torch.float32, device=v.device).index_add_(0, codes, torch.ones_like(centered))
    codebook = sums / counts.clamp_min(1) + shift  # a code no value has: sums 0, so shift
    return codes, codebook


def dequantize(codes: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """The float32 values ``codes`` stand for: ``codebook[codes]``."""
    return codebook[codes]


__all__ = ["RANGE_SIGMAS", "dequantize", "quantize"]
