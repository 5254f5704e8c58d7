"""Checkpoints of a whole run, written atomically, and resuming from them.

Layout of ``fit(checkpoint_dir=DIR)``::

    DIR/step-00000120/node-00000.pt ... node-00003.pt   one per node (its whole state)
    DIR/step-00000120/meta.pt                           the run's fingerprint, step, SHA-256 of each node file
    DIR/latest                                          "step-00000120"

A checkpoint is written into ``DIR/.step-00000120.partial/``: every node saves its file (each
through a temporary name and a rename), the nodes meet at an uncharged barrier, then rank 0
writes ``meta.pt`` and renames the folder to ``step-00000120`` (one atomic rename), points
``latest`` at it (temporary file and rename) and deletes older checkpoints. A run killed at any
moment therefore leaves the previous complete checkpoint as it was; partial folders are never
read and are replaced by the next write.

Loading trusts nothing in the folder: every file is read with ``torch.load(weights_only=True)``
(tensors and plain containers; a pickle that would run code is refused), and before any node
starts, each node file's SHA-256 is checked against the one ``meta.pt`` recorded
(``verify``), so a truncated or modified file is named instead of loaded, with the fix.

Faults while writing or reading: a write that fails (a full disk: ``ENOSPC``) raises an
``OSError`` naming the checkpoint, the file and the fix, and leaves the previous checkpoint and
``latest`` as they were; a ``latest`` that names no complete checkpoint is not followed (the
newest complete one is used, with a warning), one that is not a regular file (a FIFO) is an
error; a damaged ``meta.pt`` or node file, a step folder whose ``meta.pt`` records another step
(a link to another run's) or a node file without the keys it needs is an error naming the file,
never a silent fall-back to older state.

A node's file holds its whole state (``exogym.runtime.node_state``). With the network's
``compute`` model deterministic, a resumed run is bit-identical to one that never stopped.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import pickle
import re
import shutil
import stat
import sys
from typing import Any

import torch

from exogym.runs import atomic_path

logger = logging.getLogger(__name__)

#: Files and folders of a checkpoint directory.
LATEST = "latest"
META = "meta.pt"
_PREFIX = "step-"
_STEP_NAME = re.compile(r"step-\d{8,}")
_NODE_PREFIX, _NODE_SUFFIX = "node-", ".pt"
#: The fix a damaged checkpoint's error offers.
_DAMAGED = (
    "the checkpoint is damaged: restore {folder} from a copy, or move it away to resume from an older "
    "checkpoint of the same directory (or to start from step 0)"
)
#: ``meta.pt``'s key for ``{file name: SHA-256 hex digest}`` of the checkpoint's node files.
FILES = "sha256"


def step_dir(root: str, step: int) -> str:
    """The folder of the checkpoint after ``step`` steps."""
    return os.path.join(root, f"{_PREFIX}{step:08d}")


def partial_dir(root: str, step: int) -> str:
    """Where the checkpoint after ``step`` steps is written before it is complete."""
    return os.path.join(root, f".{_PREFIX}{step:08d}.partial")


def node_file(folder: str, rank: int) -> str:
    """Node ``rank``'s file in a checkpoint folder."""
    return os.path.join(folder, f"{_NODE_PREFIX}{rank:05d}{_NODE_SUFFIX}")


def sha256(path: str) -> str:
    """The SHA-256 hex digest of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def load_safe(path: str, map_location: str | torch.device | None = None) -> Any:
    """``torch.load(path, weights_only=True)``: tensors and plain containers, never code.

    Raises ``ValueError`` naming the file when it holds anything else or is not a readable torch
    file. A pickle that would run code (a function of Python's own library, such as
    ``posix.system``, or instructions ``torch.save`` never writes) is not a file ExoGym wrote;
    for an object type of your own in a strategy's state the error says to allow that type with
    ``torch.serialization.add_safe_globals([MyType])`` at the top of your script.
    """
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f"GLOBAL {found[1]}" if found else "pickle instructions torch.save does not write"
        refused = f"refusing to load {path}: it holds objects the safe loader (torch.load(weights_only=True)) does not"
        refused += f" load ({what})"
        if found is None or "is blocked" in str(e) or found[1].split(".")[0] in {*sys.stdlib_module_names, "builtins"}:
            raise ValueError(
                f"{refused}: it is not a checkpoint ExoGym wrote, or it was tampered with; never load it with "
                "weights_only=False: restore its folder from a copy you trust, or delete it"
            ) from None
        raise ValueError(
            f"{refused}. If you wrote this checkpoint yourself and its state holds a type of your own, "
            "allow that type with torch.serialization.add_safe_globals([...]) at the top of your script"
        ) from None
    except (RuntimeError, EOFError, OSError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None


def save_atomic(obj: Any, path: str) -> None:
    """``torch.save`` to a temporary name beside ``path``, then rename (``exogym.runs.atomic_path``):
    readers see the old file or the whole new one. A failed write removes its temporary file (on a
    full disk, the space it took) and raises."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def _write_failed(root: str, step: int, path: str, error: OSError) -> OSError:
    """The error of a checkpoint write that failed at ``path``: what failed, what is left, the fix."""
    previous = newest(root)
    kept = (
        f"the previous checkpoint {previous} is untouched and resume_from={root!r} continues from it"
        if previous is not None
        else "no earlier checkpoint exists in it"
    )
    fix = "free space on that disk" if error.errno == errno.ENOSPC else "make it writable"
    return OSError(
        error.errno,
        f"writing the checkpoint after step {step} to checkpoint_dir={root!r} failed at {path}: "
        f"{error.strerror or error}; {kept}. {fix.capitalize()} or pass another checkpoint_dir",
    )


def write_node(root: str, step: int, rank: int, state: dict[str, Any]) -> None:
    """Node ``rank``'s part of the checkpoint after ``step`` steps (before the barrier).

    Raises ``OSError`` (the original errno) saying which checkpoint failed and that the previous
    one is untouched when the file cannot be written (a full disk, no permission).
    """
    folder = partial_dir(root, step)
    path = node_file(folder, rank)
    try:
        os.makedirs(folder, exist_ok=True)
        save_atomic(state, path)
    except OSError as e:
        raise _write_failed(root, step, path, e) from e


def finalize(root: str, step: int, meta: dict[str, Any]) -> str:
    """Rank 0, after every node wrote its file: complete the checkpoint after ``step`` steps,
    point ``latest`` at it and delete older ones; return its folder."""
    folder, final = partial_dir(root, step), step_dir(root, step)
    names = sorted(n for n in os.listdir(folder) if n.startswith(_NODE_PREFIX) and n.endswith(_NODE_SUFFIX))
    files = {name: sha256(os.path.join(folder, name)) for name in names}
    try:
        save_atomic({**meta, "step": step, FILES: files}, os.path.join(folder, META))
    except OSError as e:  # the partial folder is not a checkpoint yet: `latest` still names the previous one
        raise _write_failed(root, step, os.path.join(folder, META), e) from e
    if os.path.exists(final):  # a run that wrote this step before (e.g. resumed from earlier)
        shutil.rmtree(final)
    os.replace(folder, final)
    try:
        with atomic_path(os.path.join(root, LATEST)) as tmp, open(tmp, "w") as f:
            f.write(os.path.basename(final))
    except OSError as e:  # `latest` still names the previous checkpoint, which is kept: resuming uses it
        raise _write_failed(root, step, os.path.join(root, LATEST), e) from e
    for name in os.listdir(root):
        old = os.path.join(root, name)
        if name.startswith(_PREFIX) and old != final and os.path.isdir(old):
            shutil.rmtree(old, ignore_errors=True)
    return final


def resolve(path: str) -> str:
    """The checkpoint folder ``fit(resume_from=path)`` means: ``path`` itself when it is one,
    else the checkpoint ``path/latest`` names (or the newest complete one). Raises
    ``FileNotFoundError`` naming ``resume_from``."""
    if os.path.isfile(os.path.join(path, META)):
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"resume_from={path!r}: no such checkpoint or checkpoint directory")
    folder = newest(path)
    if folder is None:
        raise FileNotFoundError(
            f"resume_from={path!r} holds no complete checkpoint (a run writes them with "
            "fit(checkpoint_dir=..., checkpoint_interval=N))"
        )
    return folder


def newest(root: str) -> str | None:
    """The newest complete checkpoint in the checkpoint directory ``root`` (the one ``latest``
    names, else the highest step), or ``None`` when it holds none or does not exist.

    A ``latest`` that does not name a complete checkpoint of ``root`` (unreadable, damaged, a
    path elsewhere, or a folder without ``meta.pt``) is not followed: the highest complete step
    is taken instead, with a warning naming both.
    """
    if not os.path.isdir(root):
        return None
    done = sorted(
        (n for n in os.listdir(root) if _STEP_NAME.fullmatch(n) and os.path.isfile(os.path.join(root, n, META))),
        key=lambda n: int(n[len(_PREFIX) :]),
    )
    fallback = os.path.join(root, done[-1]) if done else None
    latest = os.path.join(root, LATEST)
    if not os.path.lexists(latest):
        return fallback
    if not stat.S_ISREG(mode := os.lstat(latest).st_mode):  # a FIFO would block the read for ever
        kind = {stat.S_IFIFO: "named pipe (FIFO)", stat.S_IFLNK: "symbolic link", stat.S_IFDIR: "folder"}
        raise ValueError(
            f"{latest} is a {kind.get(stat.S_IFMT(mode), 'special file')}, not a regular file holding a step folder's "
            f"name as ExoGym writes it: remove it (resuming then uses the newest complete checkpoint, {fallback}), "
            "or replace it with a regular file holding the name of the step folder to resume from"
        )
    try:
        with open(latest, encoding="ascii") as f:
            name = f.read(64).strip()
    except (OSError, UnicodeDecodeError) as e:
        name, reason = None, f"cannot be read ({e})"
    else:
        reason = f"names {name!r}, which is not a complete checkpoint folder of {root}"
    if name is not None and name in done:
        return os.path.join(root, name)
    logger.warning(
        "%s %s: using the newest complete checkpoint, %s, instead (rewrite %s with that folder's name to silence this)",
        latest,
        reason,
        fallback if fallback is not None else "none (starting without one)",
        latest,
    )
    return fallback


def load_meta(folder: str) -> dict[str, Any]:
    """The fingerprint, step and file digests of a complete checkpoint folder, loaded safely
    (``load_safe``). Raises ``ValueError`` naming ``meta.pt`` when it is not what
    ``finalize`` writes."""
    path = os.path.join(folder, META)
    try:
        meta = load_safe(path)
    except ValueError as e:
        if not str(e).startswith("cannot read"):  # objects the safe loader refuses: its own advice stands
            raise
        raise ValueError(f"{e}; {_DAMAGED.format(folder=folder)}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
        raise ValueError(
            f"refusing to load {path}: not an ExoGym checkpoint's meta.pt (a dict with its step); "
            + _DAMAGED.format(folder=folder)
        )
    name = os.path.basename(os.path.normpath(folder))
    if _STEP_NAME.fullmatch(name) and int(name[len(_PREFIX) :]) != meta["step"]:  # e.g. a link to another run's
        raise ValueError(
            f"cannot resume from {folder} (which is {os.path.realpath(folder)}): it is named for step "
            f"{int(name[len(_PREFIX) :])}, but its {META} records step {meta['step']}, so it is another checkpoint; "
            "move it away, or pass the checkpoint you mean as resume_from"
        )
    return meta


def load_node(folder: str, rank: int, keys: list[str]) -> dict[str, Any]:
    """Node ``rank``'s file of a checkpoint folder, loaded safely (``load_safe``) to the CPU.
    Raises ``ValueError`` naming it and the ``keys`` it lacks."""
    path = node_file(folder, rank)
    state = load_safe(path, map_location="cpu")
    missing = [k for k in keys if k not in state] if isinstance(state, dict) else list(keys)
    if missing:
        raise ValueError(
            f"{path}: not a node file of an ExoGym checkpoint: it lacks {', '.join(map(repr, missing))}; "
            + _DAMAGED.format(folder=folder)
        )
    return state


def verify(folder: str, meta: dict[str, Any], num_nodes: int) -> None:
    """Check each of the ``num_nodes`` node files against the SHA-256 ``meta`` recorded.

    Raises ``ValueError`` naming the first file that is missing, unrecorded, truncated or
    modified. A checkpoint written without digests (by an earlier ExoGym) is loaded unverified, with a
    warning: its files are still read with the safe loader, and the run's next checkpoint has them.
    """
    files = meta.get(FILES)
    if files is None:
        logger.warning(
            "%s records no SHA-256 of its files (it was written by an earlier ExoGym): its files are loaded "
            "without that check (still with torch.load(weights_only=True)); the checkpoints this run writes have it",
            folder,
        )
        return
    for rank in range(num_nodes):
        path = node_file(folder, rank)
        name = os.path.basename(path)
        if name not in files:
            raise ValueError(f"cannot resume from {folder}: {META} records no SHA-256 for {name}")
        if not os.path.isfile(path):
            raise ValueError(f"cannot resume from {folder}: {path} is missing")
        if sha256(path) != files[name]:
            raise ValueError(
                f"cannot resume from {folder}: {path} does not match the SHA-256 that {META} recorded when the "
                f"checkpoint was written (the file was truncated or modified since); {_DAMAGED.format(folder=folder)}"
            )


def fingerprint(model: torch.nn.Module, strategy: Any, num_nodes: int, batch_size: int, seed: int) -> dict[str, Any]:
    """What a resumed run must share with the run that wrote the checkpoint."""
    config = {k: repr(v) for k, v in strategy.config().items()}
    return {
        "num_nodes": num_nodes,
        "strategy": type(strategy).__name__,
        "strategy_config": config,
        "model": type(model).__name__,
        "state_shapes": {k: (tuple(v.shape), str(v.dtype)) for k, v in model.state_dict().items()},
        "batch_size": batch_size,
        "seed": seed,
    }


def check_compatible(meta: dict[str, Any], run: dict[str, Any], folder: str) -> None:
    """Raise ``ValueError`` naming every way this run differs from the checkpoint's."""
    diffs = [
        f"{key}: checkpoint {meta.get(key)!r}, this run {run[key]!r}"
        for key in ("num_nodes", "strategy", "batch_size", "seed")
        if meta.get(key) != run[key]
    ]
    if meta.get("state_shapes") != run["state_shapes"]:  # the class may be renamed; the state must fit
        theirs, ours = meta.get("state_shapes", {}), run["state_shapes"]
        changed = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        diffs.append(f"model state (shapes or dtypes) differs in {changed[:5]} ({meta.get('model')} -> {run['model']})")
    if meta.get("strategy") == run["strategy"] and meta.get("strategy_config") != run["strategy_config"]:
        theirs, ours = meta.get("strategy_config", {}), run["strategy_config"]
        changed = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        diffs.append(
            "strategy settings: " + ", ".join(f"{k} checkpoint {theirs.get(k)} this run {ours.get(k)}" for k in changed)
        )
    if diffs:
        raise ValueError(f"cannot resume from {folder}: " + "; ".join(diffs))


def rng_state(device: torch.device) -> dict[str, Any]:
    """This thread's node's torch random streams (CPU, and the CUDA device's)."""
    return {
        "cpu": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore what ``rng_state`` returned."""
    torch.set_rng_state(state["cpu"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
