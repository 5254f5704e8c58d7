"""Checks of the settings a communicator or a server is made with: each raises a ``ValueError``
that names the argument, the values it takes and what it stands for."""

from __future__ import annotations

import math
from typing import Any


def is_number(x: object) -> bool:
    """Whether ``x`` is a finite real number (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_int(name: str, value: Any, low: int = 1, high: int | None = None, why: str = "", none: str = "") -> None:
    """``ValueError`` unless ``value`` is an int (not a bool) in ``[low, high]`` (``high=None``: no
    upper bound), or ``None`` where ``none`` says what ``None`` stands for. ``why``: what the
    argument means, for the message."""
    if value is None and none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        alias = f" or None ({none})" if none else ""
        raise ValueError(f"{name} must be an int {bound}{f' ({why})' if why else ''}{alias}, got {value!r}")


def check_number(
    name: str, value: Any, low: float, high: float = math.inf, why: str = "", above: bool = False, upto: bool = False
) -> None:
    """``ValueError`` unless ``value`` is a finite number (not a bool) from ``low`` (excluded
    with ``above``) below ``high`` (included with ``upto``). ``why``: what the argument means,
    for the message."""
    if is_number(value) and (value > low if above else value >= low) and (value <= high if upto else value < high):
        return
    if high == math.inf:
        bound = f"> {low}" if above else f">= {low}"
    else:
        bound = f"in {'(' if above else '['}{low}, {high}{']' if upto else ')'}"
    raise ValueError(f"{name} must be a number {bound}{f' ({why})' if why else ''}, got {value!r}")


__all__ = ["check_int", "check_number", "is_number"]
