"""Worker processes kept between ``fit`` calls: successive runs reuse them, a run on them equals a
run on fresh processes, a failed run's workers are replaced, and none outlives the program
however it ends (normal exit, Ctrl-C, SIGTERM, SIGKILL, idle or mid-run)."""

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
import torch

import exogym
from exogym import Network, NodeFailedError, Trainer
from exogym.runtime import pool
from exogym.strategy import DiLoCoStrategy, OptimSpec, SimpleReduceStrategy, SPARTAStrategy
from tests.helpers import FIT_DEFAULTS, FailOnRank, TinyNet, regression_data

pytestmark = [pytest.mark.procs, pytest.mark.timeout(240)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Columns that measure this machine (time, memory) rather than the training: they differ
#: between any two runs.
MEASURED = {"wall_time", "compute_time", "comm_time", "peak_memory"}


def _fit(strategy=None, model=None, **kw) -> Trainer:
    trainer = Trainer(model or TinyNet(), regression_data(256), regression_data(64, seed=1))
    args = {**FIT_DEFAULTS, "num_nodes": 2, "max_steps": 6, "batch_size": 8, "val_size": 16, "val_interval": 3}
    args.update(log_interval=1, network=Network(1e9, 0.01, compute=0.01), **kw)
    trainer.fit(strategy or SimpleReduceStrategy(OptimSpec(torch.optim.SGD, lr=0.05)), **args)
    return trainer


def _outcome(trainer: Trainer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    rows = [{k: v for k, v in row.items() if k not in MEASURED} for row in trainer.history]
    return state, rows


def _assert_same(a: tuple, b: tuple) -> None:
    assert a[0].keys() == b[0].keys()
    for k in a[0]:
        assert torch.equal(a[0][k], b[0][k]), k
    assert a[1] == b[1]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone(pids: list[int], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


def test_successive_fits_reuse_the_workers_and_shutdown_ends_them() -> None:
    exogym.shutdown()
    _fit()
    first = pool.worker_pids()
    assert len(first) == 2 and all(_alive(p) for p in first)
    _fit()
    assert pool.worker_pids() == first
    exogym.shutdown()
    assert pool.worker_pids() == [] and _gone(first)
    _fit()  # a fit after shutdown starts fresh workers
    assert len(pool.worker_pids()) == 2 and not set(pool.worker_pids()) & set(first)


@pytest.mark.parametrize(
    ("strategy", "kw"),
    [
        (lambda: DiLoCoStrategy(H=2), {"num_nodes": 2}),
        (lambda: SPARTAStrategy(p_sparta=0.25), {"num_nodes": 4}),
        (lambda: DiLoCoStrategy(H=2), {"num_nodes": 6, "workers": 2}),
        (lambda: DiLoCoStrategy(H=2), {"num_nodes": 2, "transport": "gloo"}),
    ],
    ids=["diloco-processes", "sparta-4-processes", "diloco-virtual-nodes", "diloco-gloo"],
)
def test_a_run_on_reused_workers_equals_a_run_on_fresh_ones(strategy, kw) -> None:
    exogym.shutdown()
    cold = _outcome(_fit(strategy(), **kw))
    pids = pool.worker_pids()
    _fit(SimpleReduceStrategy(), num_nodes=kw["num_nodes"], workers=kw.get("workers"), max_steps=4)  # other work
    warm = _outcome(_fit(strategy(), **kw))
    assert pool.worker_pids() == pids  # the same processes ran all three
    _assert_same(warm, cold)


def test_a_failed_run_does_not_poison_the_next_its_workers_are_replaced() -> None:
    exogym.shutdown()
    reference = _outcome(_fit(DiLoCoStrategy(H=2)))
    used = pool.worker_pids()
    with pytest.raises(NodeFailedError, match="boom on rank 1"):
        _fit(DiLoCoStrategy(H=2), model=FailOnRank(1))
    assert pool.worker_pids() == [] and _gone(used)  # the failed run's workers were stopped
    after = _outcome(_fit(DiLoCoStrategy(H=2)))
    assert not set(pool.worker_pids()) & set(used)
    _assert_same(after, reference)


# -- the program ends, however it ends: no worker survives it ------------------------------
PROGRAM = """
import os, signal, sys, time
import exogym
from exogym import Trainer
from exogym.runtime import pool
from exogym.strategy import SimpleReduceStrategy
from tests.helpers import TinyNet, regression_data

class Marking(TinyNet):
    def forward(self, batch):
        open(os.path.join(sys.argv[1], f"node{os.getpid()}"), "w").close()  # a node is training
        time.sleep(0.01)
        return super().forward(batch)

if __name__ == "__main__":
    # Ctrl-C raises KeyboardInterrupt, as in a program started from a terminal (one started in the
    # background of a non-interactive shell inherits SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    kw = dict(num_nodes=2, batch_size=8, logger=False, progress=False, val_size=0)
    Trainer(TinyNet(), regression_data(64)).fit(SimpleReduceStrategy(), max_steps=2, **kw)
    print(" ".join(map(str, pool.worker_pids())), flush=True)
    if sys.argv[2] == "idle":
        time.sleep(120)
    elif sys.argv[2] == "mid-run":
        Trainer(Marking(), regression_data(4096)).fit(SimpleReduceStrategy(), max_steps=100000, **kw)
"""


def _tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries ``tag`` (the program, its fork server and workers)."""
    needle = f"EXOGYM_TEST_RUN={tag}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and _alive(int(pid)):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def _marked(folder) -> set[int]:
    """The processes that ran ``Marking.forward`` (the program itself checks the model first)."""
    return {int(p.name[4:]) for p in folder.glob("node*")}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the program's processes")
@pytest.mark.parametrize(
    ("when", "sig"),
    [
        ("exit", None),
        ("idle", signal.SIGINT),
        ("idle", signal.SIGTERM),
        ("idle", signal.SIGKILL),
        ("mid-run", signal.SIGINT),
        ("mid-run", signal.SIGKILL),
    ],
    ids=["exit", "idle-INT", "idle-TERM", "idle-KILL", "mid-run-INT", "mid-run-KILL"],
)
def test_no_worker_outlives_the_program_within_5s(tmp_path, when: str, sig: signal.Signals | None) -> None:
    tag = uuid.uuid4().hex
    script = tmp_path / "warm_program.py"
    script.write_text(PROGRAM)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), when],
        env={**os.environ, "PYTHONPATH": ROOT, "EXOGYM_TEST_RUN": tag},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert len(workers) == 2 and all(_alive(p) for p in workers), "the first fit kept no workers"
        if when == "mid-run":
            deadline = time.monotonic() + 60
            while not set(workers) <= _marked(tmp_path) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _marked(tmp_path) - {proc.pid} == set(workers), "the first fit's workers train the second"
        if sig is not None:
            os.kill(proc.pid, sig)
        proc.wait(30)
        assert _gone(_tagged_pids(tag)), f"processes left 5 s after the program ended: {_tagged_pids(tag)}"
    finally:
        for pid in _tagged_pids(tag):  # only this test's processes, by their tag
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
