"""How the user's objects travel to the nodes: ``cloudpickle``, with code keeping its file name.

``cloudpickle`` sends functions and classes that a node cannot import (those of ``__main__``,
``python -c``, a notebook) by value, code objects included, and names every such code object's
file ``"<dynamic-code>"``. A node's traceback through that code would then read
``File "<dynamic-code>", line 19, in forward``, with no source line. ``Pickler`` sends
code objects as ``marshal`` bytes, the form a ``.pyc`` file holds them in: file name, line
numbers and everything else as compiled, so the traceback names your script's file and line and
shows the source line wherever that file can be read. A node runs the interpreter that pickled
the job (the fork server's or ``spawn``'s ``sys.executable``), so the marshal format matches.
"""

from __future__ import annotations

import io
import marshal
import pickle
import types
from collections import ChainMap
from typing import Any

import cloudpickle


def _code_reduce(code: types.CodeType) -> tuple[Any, tuple[bytes]]:
    """A code object as marshal bytes (its file name and line table kept)."""
    return marshal.loads, (marshal.dumps(code),)


class Pickler(cloudpickle.Pickler):
    """``cloudpickle.Pickler`` whose code objects keep their file name (see the module docstring)."""

    dispatch_table = ChainMap({types.CodeType: _code_reduce}, cloudpickle.Pickler.dispatch_table)


def dumps(obj: Any) -> bytes:
    """``obj`` pickled with ``Pickler`` (read back with ``pickle.loads``)."""
    with io.BytesIO() as f:
        Pickler(f, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
        return f.getvalue()


__all__ = ["Pickler", "dumps"]
