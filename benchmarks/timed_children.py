"""Fresh Python processes timed from their start: the benchmarks that compare whole runs
(``e2e.py``, ``virtual_nodes.py``, ``gpu_virtual_nodes.py``) start each side here.

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
