"""The user's ``__main__`` script in the worker processes: a worker re-imports it at its first
job (as multiprocessing would, but inside the node's reported block, so a missing main guard or
an import error comes back as the node's error); programs without a script file (stdin, ``-c``,
notebooks) are not re-imported.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.spawn
import os
import sys
from collections.abc import Iterator
from typing import Any

#: Whether this process is importing the user's ``__main__`` (``import_main``).
_IMPORTING_MAIN = False


def check_main_guard() -> None:
    """Fail fast when a node re-imports a script that lacks ``if __name__ == "__main__":``."""
    if _IMPORTING_MAIN or getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(
            "ExoGym starts worker processes for the nodes, and each re-imports your script. Guard the "
            'code that calls Trainer.fit with `if __name__ == "__main__":` so that the workers do not run it again.'
        )


def main_spec() -> tuple[str, str] | None:
    """How a node re-imports the user's ``__main__``: ``("name", module)``, ``("path", file)``,
    or ``None`` (stdin, ``-c``, notebooks: nothing on disk to import)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return ("name", name)
    path = getattr(main, "__file__", None)
    if path is None:
        return None
    path = os.path.normpath(os.path.join(mp.process.ORIGINAL_DIR or os.getcwd(), path))
    return ("path", path) if os.path.isfile(path) else None


@contextlib.contextmanager
def without_main_import() -> Iterator[None]:
    """While processes start, keep multiprocessing from re-importing ``__main__`` before the
    node's code runs (the node does it inside its reported block: see ``import_main``)."""
    original = mp.spawn.get_preparation_data

    def prepare(name: str) -> dict[str, Any]:
        data = original(name)
        data.pop("init_main_from_name", None)
        data.pop("init_main_from_path", None)
        return data

    mp.spawn.get_preparation_data = prepare
    try:
        yield
    finally:
        mp.spawn.get_preparation_data = original


def import_main(spec: tuple[str, str] | None) -> None:
    """Import the user's ``__main__`` as ``spec`` (``main_spec``) says, in this worker."""
    global _IMPORTING_MAIN
    if spec is None:
        return
    _IMPORTING_MAIN = True
    try:
        getattr(mp.spawn, f"_fixup_main_from_{spec[0]}")(spec[1])  # _fixup_main_from_name or _path
    finally:
        _IMPORTING_MAIN = False


__all__ = ["check_main_guard", "import_main", "main_spec", "without_main_import"]
