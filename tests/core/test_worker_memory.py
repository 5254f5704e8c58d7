"""A worker that hosts virtual nodes allocates from one malloc arena (glibc)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, os, re, sys, tempfile, threading
from exogym.runtime.worker import _one_malloc_arena
if sys.argv[1] == "one":
    _one_malloc_arena()
alive = threading.Barrier(8)
keep = []
def work():
    keep.append([bytearray(4096) for _ in range(64)])  # allocated while all 8 threads live
    alive.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
fd, path = tempfile.mkstemp()
os.close(fd)
fp = ctypes.c_void_p(libc.fopen(path.encode(), b"w"))
libc.malloc_info(0, fp)
libc.fclose(fp)
print(len(re.findall(r'<heap nr="[0-9]+">', open(path).read())))
os.unlink(path)
"""


def _arenas(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout.strip())


@pytest.mark.timeout(120)
@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's"
)
def test_threads_of_a_virtual_node_worker_share_one_malloc_arena() -> None:
    assert _arenas("many") > 1  # glibc's default: concurrent threads get arenas of their own
    assert _arenas("one") == 1
