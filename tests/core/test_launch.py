"""The launcher as a new user meets it: objects defined anywhere train, scripts from stdin run,
start-up failures name their cause, and no process outlives the parent however it ends."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import torch

from exogym import NodeFailedError, Trainer
from exogym.strategy import OptimSpec, SimpleReduceStrategy
from tests.helpers import FIT_DEFAULTS, TinyNet, child_pids, regression_data

pytestmark = [pytest.mark.procs, pytest.mark.timeout(120)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SGD = OptimSpec(torch.optim.SGD, lr=0.05)


def _fit(train_dataset, model=None, **kw):
    args = {**FIT_DEFAULTS, "num_nodes": 2, "max_steps": 3, "batch_size": 8, **kw}
    return Trainer(model or TinyNet(), train_dataset).fit(SimpleReduceStrategy(SGD), **args)


def test_a_closure_dataset_factory_trains() -> None:
    data = regression_data(64)

    def factory(rank, num_nodes, train):  # a closure over `data`: not importable by reference
        return torch.utils.data.Subset(data, range(rank, len(data), num_nodes))

    model = _fit(factory)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_lambda_dataset_factory_trains() -> None:
    data = regression_data(64)
    model = _fit(lambda rank, n, train: torch.utils.data.Subset(data, range(rank, 64, n)))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_an_unpicklable_job_fails_before_any_process_starts() -> None:
    import threading

    model = TinyNet()
    model.lock = threading.Lock()  # an attribute no pickler can send
    with pytest.raises(TypeError, match="cannot be sent to the nodes.*lock"):
        _fit(regression_data(64), model=model)
    assert child_pids() == []


PROGRAM = """
import torch, torch.nn.functional as F
from torch import nn
from exogym import Trainer
from exogym.strategy import SimpleReduceStrategy

class Net(nn.Module):  # defined in __main__ of a program with no file
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)
    def forward(self, batch):
        x, y = batch
        return F.mse_loss(self.fc(x), y)

x = torch.randn(64, 4)
data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
model = Trainer(Net(), lambda r, n, train: torch.utils.data.Subset(data, range(r, 64, n))).fit(
    SimpleReduceStrategy(), num_nodes=2, max_steps=3, batch_size=8, logger=False, progress=False, val_size=0)
print("TRAINED", type(model).__name__)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": ROOT}


def test_a_model_class_defined_in_python_c_trains() -> None:
    proc = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=90, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert "TRAINED Net" in proc.stdout


def test_a_script_read_from_stdin_trains() -> None:
    proc = subprocess.run([sys.executable, "-"], input=PROGRAM, capture_output=True, text=True, timeout=90, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert "TRAINED Net" in proc.stdout


def test_an_import_error_in_the_script_is_reported_as_the_nodes_error(tmp_path) -> None:
    """The nodes re-import the script; an error there comes back with its own exception."""
    script = tmp_path / "flaky.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            if os.environ.get("EXOGYM_TEST_IN_NODE"):
                import a_module_that_does_not_exist  # noqa
            os.environ["EXOGYM_TEST_IN_NODE"] = "1"  # the nodes get the parent's environment
            if __name__ == "__main__":
                from exogym import Trainer
                from exogym.strategy import SimpleReduceStrategy
                from tests.helpers import TinyNet, regression_data
                Trainer(TinyNet(), regression_data(64)).fit(
                    SimpleReduceStrategy(), num_nodes=2, max_steps=1, batch_size=8, logger=False, progress=False)
            """
        )
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90, env=_env())
    assert proc.returncode != 0
    assert "failed: ModuleNotFoundError: No module named 'a_module_that_does_not_exist'" in proc.stderr, proc.stderr


def test_a_failed_node_reports_its_exception_type() -> None:
    from tests.helpers import FailOnRank

    with pytest.raises(NodeFailedError) as info:
        _fit(regression_data(64), model=FailOnRank(fail_rank=1, fail_call=1))
    assert info.value.rank == 1 and info.value.error_type == "ValueError"


RAISING_SCRIPT = """
import os, sys
import torch
from torch import nn
from exogym import NodeFailedError, Trainer
from exogym.strategy import SimpleReduceStrategy
from tests.helpers import regression_data

class Raising(nn.Module):  # defined in the script's __main__: it reaches the nodes by value
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 1)
        self.parent = os.getpid()  # fit's own check of the loss, in the parent, passes

    def forward(self, batch):
        x, y = batch
        if os.getpid() != self.parent:
            raise ValueError("raised in a node's forward")
        return ((self.fc(x) - y) ** 2).mean()

if __name__ == "__main__":
    try:
        Trainer(Raising(), regression_data(64)).fit(SimpleReduceStrategy(), num_nodes=2, workers=int(sys.argv[1]),
            max_steps=2, batch_size=8, logger=False, progress=False, val_size=0)
    except NodeFailedError as e:
        print(e)
"""


@pytest.mark.parametrize("workers", [2, 1], ids=["processes", "virtual-nodes"])
def test_a_nodes_traceback_names_the_scripts_file_line_and_source(tmp_path, workers: int) -> None:
    script = tmp_path / "raising_model.py"
    script.write_text(RAISING_SCRIPT)
    source = 'raise ValueError("raised in a node\'s forward")'
    line = next(i for i, text in enumerate(RAISING_SCRIPT.splitlines(), 1) if source in text)
    proc = subprocess.run(
        [sys.executable, str(script), str(workers)], capture_output=True, text=True, timeout=90, env=_env()
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    where = f'  File "{script}", line {line}, in forward'
    assert where in lines, proc.stdout
    assert lines[lines.index(where) + 1].strip() == source, proc.stdout


# -- the parent dies or is stopped: nothing of the run survives ------------------------------
LONG_RUN = """
import os, sys, time, torch
from exogym import Trainer
from exogym.strategy import SimpleReduceStrategy
from tests.helpers import TinyNet, regression_data

class Marking(TinyNet):
    def forward(self, batch):
        open(os.path.join(sys.argv[1], f"node{os.getpid()}"), "w").close()  # a node is training
        time.sleep(0.01)
        return super().forward(batch)

if __name__ == "__main__":
    Trainer(Marking(), regression_data(4096)).fit(
        SimpleReduceStrategy(), num_nodes=2, max_steps=100000, batch_size=8, logger=False, progress=False,
        val_size=0)
"""


def _tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries ``tag`` (the run's parent, fork server and nodes)."""
    needle = f"EXOGYM_TEST_RUN={tag}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open(f"/proc/{pid}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(pid))
        except OSError:
            continue
    return found


def _start_run(tmp_path) -> tuple[subprocess.Popen, str]:
    tag = uuid.uuid4().hex
    script = tmp_path / "long_run.py"
    script.write_text(LONG_RUN)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        env={**_env(), "EXOGYM_TEST_RUN": tag},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, tag


def _wait_until(cond, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the run's processes")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
@pytest.mark.parametrize("when", ["start-up", "mid-run"])
def test_signal_to_the_parent_leaves_no_process_within_5s(tmp_path, sig: signal.Signals, when: str) -> None:
    proc, tag = _start_run(tmp_path)
    try:
        if when == "mid-run":
            assert _wait_until(lambda: len(list(tmp_path.glob("node*"))) >= 2, 60), "the nodes never trained"
        else:
            assert _wait_until(lambda: len(_tagged_pids(tag)) >= 2, 30), "no process of the run appeared"
        os.kill(proc.pid, sig)
        gone = _wait_until(lambda: _tagged_pids(tag) == [], 5.0)
        left = _tagged_pids(tag)
        assert gone, f"processes left 5 s after {sig.name} ({when}): {left}"
        proc.wait(5)
        if sig == signal.SIGTERM:
            assert proc.returncode == -signal.SIGTERM  # re-delivered after the teardown
    finally:
        for pid in _tagged_pids(tag):  # only this test's processes, by their tag
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the run's processes")
def test_the_sigterm_message_starts_a_line_of_its_own_after_the_progress_bar(tmp_path) -> None:
    tag = uuid.uuid4().hex
    script = tmp_path / "long_run.py"
    script.write_text(LONG_RUN.replace("progress=False", "progress=True"))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        env={**_env(), "EXOGYM_TEST_RUN": tag},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _wait_until(lambda: len(list(tmp_path.glob("node*"))) >= 2, 60), "the nodes never trained"
        time.sleep(1.0)  # the bar has drawn
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        for pid in _tagged_pids(tag):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
    lines = err.split("\n")
    assert any("train" in line and "step" in line for line in lines), err[-2000:]  # the bar was drawn
    assert any(line.startswith("SIGTERM: every node was stopped") for line in lines), err[-2000:]
