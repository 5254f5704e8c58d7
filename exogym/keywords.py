"""Unknown keyword arguments named with the closest valid spelling.

``fit(max_step=20)`` and ``DiLoCoStrategy(h=10)`` raise ``TypeError`` naming what was typed and
the keyword meant (``did you mean 'max_steps'?``), or every valid keyword where none is close.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def unexpected_keyword(callee: str, name: str, valid: Sequence[str]) -> TypeError:
    """The ``TypeError`` for keyword ``name`` that ``callee`` (e.g. ``"fit()"``) does not take,
    with the closest of ``valid`` (or all of them where none is close)."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.5)
    close = close or [v for v in valid if v.lower() == name.lower()]
    hint = f" (did you mean {close[0]!r}?)" if close else f"; valid keywords: {', '.join(valid)}"
    return TypeError(f"{callee} got an unexpected keyword argument {name!r}{hint}")


def checked_keywords(func: F) -> F:
    """Decorate ``func`` (which takes no ``**kwargs``) so that an unknown keyword raises
    ``unexpected_keyword``'s error; its signature and docstring stay ``func``'s."""
    signature = inspect.signature(func)
    valid = [
        n
        for n, p in signature.parameters.items()
        if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        unknown = [k for k in kwargs if k not in signature.parameters]
        if unknown:
            raise unexpected_keyword(f"{func.__name__}()", unknown[0], valid) from None
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


__all__ = ["checked_keywords", "unexpected_keyword"]
