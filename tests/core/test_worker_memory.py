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


BUFFERS_PROBE = r"""
import ctypes, sys, threading
import torch
from exogym.runtime.idle import _release_thread_buffers
class MallInfo2(ctypes.Structure):
    names = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks")
    _fields_ = [(n, ctypes.c_size_t) for n in names]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.mallopt(-8, 1)  # one arena, as a worker of virtual nodes
torch.set_num_threads(1)
net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
x = torch.randn(8, 64)
def step():
    net(x).square().mean().backward()
step()
threads, trained, done = 64, threading.Barrier(65), threading.Event()
def node():
    step()  # a client's training step on its own thread
    if sys.argv[1] == "release":
        _release_thread_buffers()  # what it does when it starts sitting rounds out
    trained.wait()
    done.wait()
before = libc.mallinfo2().uordblks
ts = [threading.Thread(target=node) for _ in range(threads)]
for t in ts:
    t.start()
trained.wait()
print((libc.mallinfo2().uordblks - before) / threads)
done.set()
for t in ts:
    t.join()
"""


def _held_per_thread(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", BUFFERS_PROBE, mode], capture_output=True, text=True, timeout=60, check=True
    )
    return float(out.stdout.strip())


@pytest.mark.timeout(120)
@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="reads glibc's mallinfo2")
def test_a_node_that_starts_idling_gives_back_its_threads_mkl_buffers() -> None:
    from exogym.runtime.idle import _mkl_thread_free_buffers

    if _mkl_thread_free_buffers() is None:
        pytest.skip("this torch has no MKL: no per-thread buffers to give back")
    kept, released = _held_per_thread("keep"), _held_per_thread("release")
    assert kept - released > 100_000  # ~150 KB of the ~300 KB a thread holds after a step (torch 2.13, x86)
