"""Fresh Python processes timed from their start: the benchmarks that compare whole runs
(``e2e.py``, ``virtual_nodes.py``, ``gpu_virtual_nodes.py``) start each side here.

``import exogym`` starts the fork server that worker processes fork from
(:mod:`exogym.runtime.forkserver`). The process that only starts and times children needs none
(one importing torch beside a timed child would slow the child), so importing this module,
before ``exogym``, turns that off in this process (not in one run with ``--child``). Each child
gets the caller's own setting back, or ``EXOGYM_PRESTART=0`` when it uses no ExoGym processes
(an in-process loop that imports ExoGym's tasks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

_ENV = "EXOGYM_PRESTART"
_CALLER = os.environ.get(_ENV)
if "--child" not in sys.argv:
    os.environ[_ENV] = "0"


def run_child(script: str, args: list[str], prestart: bool = True) -> dict:
    """Run ``script --child *args`` in a fresh Python; its last stdout line (JSON) plus
    ``total_s``, the wall time from the process's start to its end. ``prestart=False``: the
    child starts no fork server at ``import exogym`` (a side that trains in-process)."""
    env = dict(os.environ)
    if not prestart:
        env[_ENV] = "0"
    elif _CALLER is None:
        env.pop(_ENV, None)
    else:
        env[_ENV] = _CALLER
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
