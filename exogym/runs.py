"""Run folders: names that stay inside their parent, a new folder per run, ``latest``, atomic files.

Every run writes into a folder of its own, so a run never overwrites another's files::

    exogym_runs/compare/version_0/   summary.csv, plots, <strategy>/metrics.csv
    exogym_runs/compare/version_1/   the next comparison
    exogym_runs/compare/latest       -> version_1 (a symbolic link; a file holding the name
                                        where links cannot be made)

Names that become folders (``fit(run_name=...)``, ``compare``'s strategy labels) are single
folder names: ``check_name`` refuses paths. Files read as a whole (summaries, plots,
``config.json``) are written to a temporary name and renamed (``atomic_path``), so a reader
sees the old file or the whole new one. A folder that a run is to write into is checked before
the run starts (``check_writable_folder``); a run that fails leaves a ``FAILED`` file with its
error beside what it wrote (``mark_failed``).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator

#: The link (or file) in a parent folder naming its newest run folder.
LATEST = "latest"
#: The file in a run's folder that says the run failed, and with which error.
FAILED = "FAILED"
_VERSION = re.compile(r"version_(\d+)")


def check_name(name: object, argument: str) -> str:
    """Return ``name`` when it is one folder name; else raise ``ValueError`` naming ``argument``.

    Refused: anything but a non-empty string, ``.`` and ``..``, absolute paths, drive letters,
    and names holding a path separator or a NUL byte: each could write outside the run directory.
    """
    bad = (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "\0" in name
        or any(sep in name for sep in {"/", "\\", os.sep, os.altsep or "/"})
        or os.path.isabs(name)
        or os.path.splitdrive(name)[0] != ""
    )
    if bad:
        raise ValueError(
            f"{argument} becomes a folder name, so it must be one name without path separators, '.' or '..'; "
            f"got {name!r} (e.g. {_suggest(name)!r})"
        )
    return name


def _suggest(name: object) -> str:
    text = re.sub(r"[\\/\0:]+", "_", str(name)).strip("._")
    return text or "run"


def folder_problem(path: object) -> str | None:
    """Why ``path`` cannot be a folder that a run writes into, or ``None`` when it can: an
    existing folder this process can create a file in, or a path whose nearest existing parent
    is one. Leaves nothing behind (the probe file is removed)."""
    if not isinstance(path, (str, os.PathLike)) or os.fspath(path) == "":
        return "is empty" if path == "" else "is not a folder's path"
    text = os.fspath(path)
    existing = os.path.abspath(text)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        what = "a file" if os.path.isfile(existing) else "not a folder"
        if existing == os.path.abspath(text):
            return f"is {what}" + (", not a folder" if what == "a file" else "")
        return f"is under {existing!r}, which is {what}"
    try:
        fd, probe = tempfile.mkstemp(prefix=".exogym-write-check-", dir=existing)
    except OSError as e:
        return f"cannot be written: {e.strerror or e} ({existing})"
    os.close(fd)
    os.remove(probe)
    return None


def check_writable_folder(path: object, argument: str) -> None:
    """Raise ``ValueError`` naming ``argument`` when ``path`` cannot be a folder that a run
    writes into (``folder_problem``): an empty path, a file, a device, a folder on a read-only
    filesystem or without the right to write."""
    problem = folder_problem(path)
    if problem is not None:
        raise ValueError(f"{argument} {path!r} {problem}; give a folder that can be created and written")


def mark_failed(folder: str, error: BaseException) -> None:
    """Write ``folder/FAILED``: the error that stopped the run whose files are in ``folder``
    (its ``metrics.csv`` then holds the rows written before it failed). Never raises: a run that
    failed for want of disk space may not be able to say so."""
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
        with atomic_path(os.path.join(folder, FAILED)) as tmp, open(tmp, "w") as f:
            f.write(f"{type(error).__name__}: {error}\n")


def new_version(parent: str) -> str:
    """Create ``parent/version_N`` (N one more than the highest there, 0 for the first), point
    ``parent/latest`` at it and return its path. Two programs starting at once get two folders."""
    os.makedirs(parent, exist_ok=True)
    taken = [int(m.group(1)) for n in os.listdir(parent) if (m := _VERSION.fullmatch(n))]
    n = max(taken, default=-1) + 1
    while True:
        path = os.path.join(parent, f"version_{n}")
        try:
            os.mkdir(path)
            break
        except FileExistsError:
            n += 1
    point_latest(parent, os.path.basename(path))
    return path


def point_latest(parent: str, name: str) -> None:
    """Make ``parent/latest`` name the folder ``name``, replacing the old one in one step."""
    tmp = os.path.join(parent, f".{LATEST}.tmp{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.remove(tmp)
    try:
        os.symlink(name, tmp, target_is_directory=True)
    except (OSError, NotImplementedError):  # no symbolic links here (e.g. Windows without the right)
        with open(tmp, "w") as f:
            f.write(name)
    os.replace(tmp, os.path.join(parent, LATEST))


def latest(parent: str) -> str | None:
    """The run folder ``parent/latest`` names, or ``None`` when there is none."""
    path = os.path.join(parent, LATEST)
    if os.path.islink(path):
        return os.path.join(parent, os.readlink(path))
    if os.path.isfile(path):
        with open(path) as f:
            return os.path.join(parent, f.read().strip())
    return None


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary name beside ``path`` to write; rename it to ``path`` when the block
    ends, or remove it when the block raises."""
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


__all__ = [
    "FAILED",
    "LATEST",
    "atomic_path",
    "check_name",
    "check_writable_folder",
    "folder_problem",
    "latest",
    "mark_failed",
    "new_version",
    "point_latest",
]
