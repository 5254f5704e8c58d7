"""Fresh Python processes timed from their start: the benchmarks that compare whole runs
(``e2e.py``, ``virtual_nodes.py``, ``gpu_virtual_nodes.py``) start each side here; and the peak
memory of the worker processes a child's ``fit`` starts (``PeakBelow``, read from Linux ``/proc``).

A child that trains with ExoGym starts the fork server that worker processes fork from at its
first ``Trainer(...)`` (``exogym.runtime.forkserver``), so that the server's imports run
while the child goes on to ``fit``. ``prestart=False`` runs a child with ``EXOGYM_PRESTART=0``:
``fit`` starts the server, which is what the early start saves (``e2e.py --prestart``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time


def run_child(script: str, args: list[str], prestart: bool = True) -> dict:
    """Run ``script --child *args`` in a fresh Python; its last stdout line (JSON) plus
    ``total_s``, the wall time from the process's start to its end. ``prestart=False``: the
    child's ``Trainer(...)`` starts no fork server (``fit`` does)."""
    env = dict(os.environ)
    if not prestart:
        env["EXOGYM_PRESTART"] = "0"
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, os.path.abspath(script), "--child", *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if out.returncode:
        raise RuntimeError(f"benchmark child failed:\n{out.stderr[-3000:]}")
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "total_s": time.perf_counter() - t0}


def descendants(pid: int) -> list[int]:
    """Live processes below ``pid`` (its children, theirs, ...), read from ``/proc``."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parents.items() if p in frontier]
        found += kids
        frontier = kids
    return found


def peak_rss(pid: int) -> int:
    """The peak resident bytes of process ``pid`` (``VmHWM``; 0 once it has gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")), 0)
    except OSError:
        return 0


class PeakBelow:
    """While the ``with`` block runs, every ``interval`` seconds: the largest peak resident set of
    the processes below this one (``fit``'s fork server and workers). ``samples``: ``(seconds
    since the block began, MB)``; ``mb``: the largest."""

    def __init__(self, interval: float) -> None:
        self.interval, self.samples = interval, []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        t0 = time.perf_counter()
        while not self._done.wait(self.interval):
            peaks = [peak_rss(p) for p in descendants(os.getpid())]
            self.samples.append((time.perf_counter() - t0, max(peaks, default=0) / 2**20))

    @property
    def mb(self) -> float:
        return max((mb for _, mb in self.samples), default=0.0)

    def __enter__(self) -> PeakBelow:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
