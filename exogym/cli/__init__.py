"""Command-line pieces: ``exogym compare`` and its plots (``python -m exogym`` is the entry)."""

from __future__ import annotations

import re

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :class:`x`, :func:`~a.b`
_LITERAL = re.compile(r"``([^`]+)``")


def plain_help(doc: str | None) -> str:
    """A docstring for ``--help``: reST roles and double-backquoted literals become plain text
    (``:class:`Network``` -> ``Network``, ````fit()```` -> ``fit()``), ``::`` ends like ``:``."""
    text = _LITERAL.sub(r"\1", _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], doc or ""))
    return re.sub(r"(?<=\S)::$", ":", text, flags=re.MULTILINE)
