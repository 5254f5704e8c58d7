"""Choosing the largest minibatch that fits: each candidate's peak probed once per model, cached.

The probe runs one forward and backward pass on a copy of the model for each candidate
minibatch size (divisors of ``batch_size``, largest first) and keeps the first whose peak memory
stays within the budget: ``max_memory_usage`` times the device's memory, shared by the nodes
placed on that device. CUDA peaks come from the caching allocator; CPU peaks from the process's
resident-set high-water mark, which Linux lets us reset (``/proc/self/clear_refs``). Where the
peak cannot be measured, the whole batch is used.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from exogym.data import collate, to_device
from exogym.runtime.forward import forward_loss

logger = logging.getLogger(__name__)

#: (model type, parameter count, device, minibatch size) -> the measured peak bytes (``None``: not
#: measurable, ``inf``: out of memory). Peaks, not choices: the budget (the free memory) changes
#: from run to run.
_CACHE: dict[tuple, float | None] = {}


def divisors_desc(n: int) -> list[int]:
    """Divisors of ``n``, largest first."""
    return [d for d in range(n, 0, -1) if n % d == 0]


def device_budget(device: str, nodes_per_device: int, max_memory_usage: float) -> int | None:
    """Bytes one node may use on ``device``, or ``None`` when unknown."""
    if device == "cuda":
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    elif device == "cpu":
        try:
            total = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None
    else:
        return None
    return int(total * max_memory_usage / max(1, nodes_per_device))


def _rss(field: str) -> int:
    """This process's ``VmRSS`` (resident) or ``VmHWM`` (peak resident) bytes (Linux's ``/proc``)."""
    with open("/proc/self/status") as f:
        return next((int(line.split()[1]) * 1024 for line in f if line.startswith(f"{field}:")), 0)


def _measure(model: torch.nn.Module, batch: Any, device: str) -> int | None:
    """Peak extra bytes of one forward+backward of ``model`` on ``batch``, or None if unknown."""
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        forward_loss(model, batch).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    if device != "cpu":
        return None
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak resident set (VmHWM) to the current one
    except OSError:
        return None
    base = _rss("VmRSS")
    forward_loss(model, batch).backward()
    return max(0, _rss("VmHWM") - base)


def probe_minibatch_size(
    model: torch.nn.Module,
    dataset: Any,
    batch_size: int,
    device: str,
    budget: int | None,
    collate_fn: Callable[[list[Any]], Any] = collate,
) -> int:
    """The largest divisor of ``batch_size`` whose forward+backward fits in ``budget`` bytes.

    Each minibatch size's peak is measured once per (model type, parameter count, device) and
    cached, so a later run with another budget (CPU budgets follow the free memory) probes only
    the sizes not measured yet. Falls back to ``batch_size`` when the budget or the peak cannot
    be measured. Raises ``RuntimeError`` when even a minibatch of one example does not fit.
    """
    if budget is None or len(dataset) < 1:
        return batch_size
    nparams = sum(p.numel() for p in model.parameters())
    probe: torch.nn.Module | None = None
    chosen: int | None = None
    for m in divisors_desc(batch_size):
        key = (type(model).__qualname__, nparams, device, m)
        if key not in _CACHE:
            if probe is None:
                probe = copy.deepcopy(model).to(device)
                probe.train()
            batch = to_device(collate_fn([dataset[i % len(dataset)] for i in range(m)]), torch.device(device))
            try:
                _CACHE[key] = _measure(probe, batch, device)
            except torch.OutOfMemoryError:
                _CACHE[key] = float("inf")
            probe.zero_grad(set_to_none=True)
        peak = _CACHE[key]
        if peak is None or peak <= budget:
            chosen = batch_size if peak is None else m
            break
    if probe is not None:
        del probe
        if device == "cuda":
            torch.cuda.empty_cache()
    if chosen is None:
        raise RuntimeError(
            f"even a minibatch of 1 example exceeds the memory budget of {budget / 2**20:.0f} MiB per node; "
            "raise max_memory_usage, use fewer nodes per device, or a smaller model"
        )
    logger.debug("minibatch_size=%d chosen for batch_size=%d on %s", chosen, batch_size, device)
    return chosen
