"""Command-line pieces: ``exogym compare`` and its plots (``python -m exogym`` is the entry)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :class:`x`, :func:`~a.b`
_LITERAL = re.compile(r"``([^`]+)``")


def plain_help(doc: str | None) -> str:
    """A docstring for ``--help``: reST roles and double-backquoted literals become plain text
    (``:class:`Network``` -> ``Network``, ````fit()```` -> ``fit()``), ``::`` ends like ``:``."""
    text = _LITERAL.sub(r"\1", _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], doc or ""))
    return re.sub(r"(?<=\S)::$", ":", text, flags=re.MULTILINE)


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``low`` (argparse names the option in its error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def strategy_names(parser: argparse.ArgumentParser, text: str, option: str) -> list[str]:
    """The preset names of a comma-separated ``option`` value; ``parser.error`` (exit 2) names
    the unknown ones and the choices."""
    from exogym.strategy.registry import PRESETS

    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in PRESETS]
    if unknown or not names:
        what = f"unknown strategies {unknown}" if unknown else "no strategy given"
        parser.error(f"argument {option}: {what}; choose from {sorted(PRESETS)}")
    return names
