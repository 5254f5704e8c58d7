"""A sweep's finished runs on disk, keyed by a hash of each run's full configuration.

``<out_dir>/runs/<key>/`` holds a run's ``metrics.csv`` and ``config.json`` (written while it
trains) and, once it has finished, ``run.json``: its configuration, summary row and history,
with the SHA-256 ``digest`` of the three. A folder without ``run.json`` is a run that did not
finish (with ``FAILED``, the error of one that raised); it is run again from the start. A
``run.json`` that is not valid JSON, not a run's record, without its digest or whose content
does not match it (cut short by a full disk, edited by hand) is not reused: a warning names it,
its folder is moved aside to ``<key>.damaged-N`` (nothing is deleted) and the run trains again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import types
from typing import Any

from exogym import runs

logger = logging.getLogger(__name__)

#: The entries of a finished run's ``run.json`` that its digest covers.
RECORD = ("config", "row", "history")

__all__ = ["RunStore", "run_key", "stable_str"]


def run_key(config: dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of ``config`` as canonical JSON (sorted keys; values that
    JSON cannot hold by ``stable_str``): equal configurations, equal keys, in any process."""
    text = json.dumps(config, sort_keys=True, default=stable_str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stable_str(value: Any) -> str:
    """``value`` as text that does not depend on the process: a function by its module, name and
    code (an aggregation rule of your own, a lambda), a ``functools.partial`` by its function and
    bound arguments, anything else by its ``str``."""
    if isinstance(value, functools.partial):
        bound = [stable_str(a) for a in value.args]
        bound += [f"{k}={stable_str(v)}" for k, v in sorted(value.keywords.items())]
        return f"{stable_str(value.func)}({', '.join(bound)})"
    code = getattr(value, "__code__", None)
    if code is not None:  # the code, so that two lambdas or two versions of a function differ
        consts = [c.co_code.hex() if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
        body = hashlib.sha256(code.co_code + repr(consts).encode()).hexdigest()[:12]
        return f"{value.__module__}.{value.__qualname__}[{body}]"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '')}.{value.__qualname__}"
    return str(value)


class RunStore:
    """The finished runs under ``<out_dir>/runs``."""

    def __init__(self, out_dir: str) -> None:
        self.root = os.path.join(out_dir, "runs")

    def folder(self, key: str) -> str:
        """The run's folder (its ``metrics.csv`` is written there while it trains)."""
        return os.path.join(self.root, key)

    def load(self, key: str) -> dict[str, Any] | None:
        """The finished run's ``{"config", "row", "history"}``, or ``None`` when it has to train:
        it has not finished, or its ``run.json`` is damaged or edited (then a warning names the
        file and why, and its folder is moved aside, ``set_aside``)."""
        path = os.path.join(self.folder(key), "run.json")
        try:
            with open(path, "rb") as f:
                doc = json.loads(f.read())
        except FileNotFoundError:
            return None
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            return self._damaged(key, path, f"is not valid JSON ({e})")
        if not isinstance(doc, dict) or any(k not in doc for k in RECORD):
            return self._damaged(key, path, "is not a finished run's record")
        record = {k: doc[k] for k in RECORD}
        if "digest" not in doc:
            return self._damaged(key, path, "has no digest")
        if doc["digest"] != _digest(record):
            return self._damaged(key, path, "does not match its digest (edited or damaged)")
        return record

    def _damaged(self, key: str, path: str, problem: str) -> None:
        aside = self.set_aside(key)
        logger.warning("%s %s: not reused; its folder is moved to %s; the run trains again", path, problem, aside)
        return None

    def set_aside(self, key: str) -> str:
        """Move the run's folder to ``<key>.damaged-N`` (the first N free) and return that path."""
        n = 0
        while os.path.lexists(f"{self.folder(key)}.damaged-{n}"):
            n += 1
        aside = f"{self.folder(key)}.damaged-{n}"
        os.rename(self.folder(key), aside)
        return aside

    def clear(self, key: str) -> None:
        """Remove what an unfinished run of ``key`` left, so that it can run again."""
        shutil.rmtree(self.folder(key), ignore_errors=True)

    def mark_failed(self, key: str, error: BaseException) -> None:
        """Write the run's ``FAILED`` file: the error that stopped it (``exogym.runs.mark_failed``)."""
        runs.mark_failed(self.folder(key), error)

    def save(self, key: str, config: dict[str, Any], row: dict[str, Any], history: list[dict[str, Any]]) -> None:
        """Record the run as finished, with the digest of its record (atomically: a run is
        finished or not, never half-written)."""
        # What JSON holds (values it cannot hold by their ``str``), as ``load`` reads it back.
        record = json.loads(json.dumps({"config": config, "row": row, "history": history}, default=str))
        os.makedirs(self.folder(key), exist_ok=True)
        with runs.atomic_path(os.path.join(self.folder(key), "run.json")) as tmp, open(tmp, "w") as f:
            json.dump({**record, "digest": _digest(record)}, f)


def _digest(record: dict[str, Any]) -> str:
    """The SHA-256 of ``record`` as canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
