"""Chaos: a worker killed inside a collective, a full disk while a checkpoint is written, a
damaged ``latest`` pointer or checkpoint file. Each ends as documented in
docs/user-guide/checkpoints.md and docs/user-guide/running.md: a clear error or a warned
fall-back, the previous checkpoint usable, no process left."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import threading
import time
from typing import Any

import pytest
import torch

from exogym import NodeFailedError, Trainer
from exogym.core.comm.network import Network
from exogym.runtime import checkpoint as ckpt
from exogym.strategy import DiLoCoStrategy, SimpleReduceStrategy
from tests.helpers import TinyNet, _node_rank, regression_data

STEPS = 16


def _fit(model: torch.nn.Module | None = None, **kw: Any) -> list[torch.Tensor]:
    args = {
        "num_nodes": 2,
        "max_steps": STEPS,
        "batch_size": 8,
        "transport": "shm",
        "logger": False,
        "progress": False,
        "val_size": 0,
        "network": Network(1e9, 1e-3, compute=0.01),  # deterministic simulated time
        **kw,
    }
    trainer = Trainer(model or TinyNet(), regression_data(1024))
    out = trainer.fit(DiLoCoStrategy(H=4), **args)
    return [p.detach().clone() for p in out.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live (non-zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class KilledInCollective(TinyNet):
    """Records each node process's pid in ``folder``. At the third forward, node ``victim``
    arms a timer that SIGKILLs its own process 0.3 s later while node 0 sleeps 2 s before its
    backward: the victim's process dies waiting in the step's all-reduce for node 0."""

    def __init__(self, folder: str, victim: int) -> None:
        super().__init__()
        self.folder, self.victim, self.calls = folder, victim, 0

    def forward(self, batch):
        self.calls += 1
        open(os.path.join(self.folder, f"pid-{os.getpid()}"), "w").close()
        if self.calls == 3 and _node_rank() == self.victim:
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
        if self.calls == 3 and _node_rank() == 0:
            time.sleep(2.0)
        return super().forward(batch)


@pytest.mark.procs
@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "gloo"])
def test_a_worker_sigkilled_in_a_collective_ends_the_run_naming_it_and_its_nodes(transport: str, tmp_path) -> None:
    t0 = time.monotonic()
    with pytest.raises(NodeFailedError) as info:
        Trainer(KilledInCollective(str(tmp_path), victim=2), regression_data(1024)).fit(
            SimpleReduceStrategy(), num_nodes=4, workers=2, max_steps=50, batch_size=8, transport=transport,
            logger=False, progress=False, val_size=0, collective_timeout=60,
        )  # fmt: skip
    assert time.monotonic() - t0 < 30  # the parent saw the death, not a collective's 60 s deadline
    assert "worker 1 of 2 (hosting nodes 2-3 of 4) exited with code -9 (SIGKILL)" in str(info.value)
    pids = [int(p.name.removeprefix("pid-")) for p in tmp_path.glob("pid-*")]
    pids.remove(os.getpid())  # this process ran the model once, on a probe batch
    assert len(pids) == 2  # the two workers
    deadline = time.monotonic() + 5.0
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if _alive(p)] == []


class FullDisk(TinyNet):
    """On node ``rank``'s process, ``torch.save`` to the temporary file of ``name`` inside the
    checkpoint of step ``step`` writes 100 bytes and raises ``OSError(ENOSPC)``, as a write to a
    full disk does; every other save is untouched."""

    def __init__(self, rank: int, step: int, name: str) -> None:
        super().__init__()
        self.rank, self.step, self.name, self.armed = rank, step, name, False

    def forward(self, batch):
        if not self.armed and _node_rank() == self.rank:
            self.armed = True
            save, marker, name = torch.save, f"step-{self.step:08d}", self.name

            def full(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
                path = str(f)
                if marker in path and os.path.basename(path).split(".tmp")[0] == f".{name}":
                    with open(path, "wb") as out:
                        out.write(b"\0" * 100)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
                save(obj, f, *args, **kwargs)

            torch.save = full
        return super().forward(batch)


@pytest.mark.procs
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("rank", "name"), [(1, "node-00001.pt"), (0, "meta.pt")], ids=["node-file", "meta"])
def test_a_full_disk_while_a_checkpoint_is_written_fails_clearly_and_keeps_the_previous_one(
    rank: int, name: str, tmp_path
) -> None:
    whole = _fit()
    root = tmp_path / "ckpt"
    with pytest.raises(NodeFailedError) as info:
        _fit(FullDisk(rank, STEPS, name), checkpoint_dir=str(root), checkpoint_interval=STEPS // 2)
    message = str(info.value)
    assert f"node {rank} of 2 failed: OSError: [Errno {errno.ENOSPC}] writing the checkpoint after step 16" in message
    assert f"failed at {root}/.step-00000016.partial/{name}: No space left on device" in message
    assert f"the previous checkpoint {root}/step-00000008 is untouched" in message
    assert "Free space on that disk or pass another checkpoint_dir" in message
    assert (root / "latest").read_text() == "step-00000008"
    # the failed write's space is freed (the other node, stopped by the failure, may have been
    # in the middle of its own file)
    assert not list((root / ".step-00000016.partial").glob(f".{name}.tmp*"))
    resumed = _fit(resume_from=str(root))
    assert _same(whole, resumed)


@pytest.fixture(scope="module")
def _written(tmp_path_factory) -> tuple[str, list[torch.Tensor]]:
    """A checkpoint directory holding DiLoCo's checkpoint after 8 of 16 steps (copy it before
    changing it), and the parameters of the 16 steps run without stopping."""
    root = tmp_path_factory.mktemp("ckpt")
    _fit(max_steps=STEPS // 2, checkpoint_dir=str(root))
    return str(root), _fit()


def _copy(root: str, tmp_path) -> str:
    return str(shutil.copytree(root, tmp_path / "ckpt"))


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_a_latest_naming_a_missing_folder_resumes_from_the_newest_complete_checkpoint_with_a_warning(
    _written: tuple[str, list[torch.Tensor]], tmp_path, caplog
) -> None:
    root = _copy(_written[0], tmp_path)
    with open(os.path.join(root, ckpt.LATEST), "w") as f:
        f.write("step-00000099")
    resumed = _fit(resume_from=root)
    assert _same(_written[1], resumed)
    assert f"{root}/latest names 'step-00000099', which is not a complete checkpoint folder" in caplog.text
    assert f"using the newest complete checkpoint, {root}/step-00000008, instead" in caplog.text


@pytest.mark.parametrize(
    "content",
    [b"", b"\xff\xfe\x00garbage", b"../../elsewhere", b"/etc", b"step-00000008/../../x", b".step-00000016.partial"],
    ids=["empty", "binary", "relative-escape", "absolute", "traversal", "partial"],
)
def test_a_damaged_latest_is_never_followed_and_the_fall_back_is_warned(content: bytes, tmp_path, caplog) -> None:
    root = tmp_path / "ckpt"
    for step in (4, 8):  # two complete checkpoints (an interrupted clean-up leaves the older one)
        (root / f"step-0000000{step}").mkdir(parents=True)
        torch.save({"step": step}, root / f"step-0000000{step}" / ckpt.META)
    (root / ".step-00000016.partial").mkdir()
    torch.save({"step": 16}, root / ".step-00000016.partial" / ckpt.META)
    (root / ckpt.LATEST).write_bytes(content)
    assert ckpt.resolve(str(root)) == str(root / "step-00000008")
    assert (
        f"{root}/latest " in caplog.text
        and f"using the newest complete checkpoint, {root}/step-00000008" in caplog.text
    )


def test_a_latest_naming_a_complete_checkpoint_is_followed_without_a_warning(tmp_path, caplog) -> None:
    for step in (4, 8):
        (tmp_path / f"step-0000000{step}").mkdir()
        torch.save({"step": step}, tmp_path / f"step-0000000{step}" / ckpt.META)
    (tmp_path / ckpt.LATEST).write_text("step-00000004")
    assert ckpt.newest(str(tmp_path)) == str(tmp_path / "step-00000004")
    assert caplog.text == ""


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_latest_that_is_not_a_regular_file_is_refused_naming_it_without_opening_it(kind: str, tmp_path) -> None:
    (tmp_path / "step-00000008").mkdir()
    torch.save({"step": 8}, tmp_path / "step-00000008" / ckpt.META)
    latest, raised = tmp_path / ckpt.LATEST, []
    if kind == "fifo":
        os.mkfifo(latest)  # opening it for reading blocks until a writer comes
    else:
        (tmp_path / "elsewhere").write_text("step-00000008")
        latest.symlink_to(tmp_path / "elsewhere")

    def resume() -> None:
        try:
            ckpt.resolve(str(tmp_path))
        except ValueError as e:
            raised.append(str(e))

    reader = threading.Thread(target=resume, daemon=True)
    reader.start()
    reader.join(5)
    hung = reader.is_alive()
    if hung:  # release the reader blocked in open()
        os.close(os.open(latest, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not hung, "resuming blocked on latest"
    assert len(raised) == 1, raised
    kind = "named pipe (FIFO)" if kind == "fifo" else "symbolic link"
    assert f"{latest} is a {kind}, not a regular file" in raised[0]
    assert "remove it" in raised[0]


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_a_step_folder_linked_to_another_runs_checkpoint_is_refused_naming_both_steps_before_any_process_starts(
    _written: tuple[str, list[torch.Tensor]], tmp_path
) -> None:
    other = _copy(_written[0], tmp_path)  # another run's directory, at step 8
    root = tmp_path / "run"
    root.mkdir()
    (root / "step-00000016").symlink_to(os.path.join(other, "step-00000008"), target_is_directory=True)
    (root / ckpt.LATEST).write_text("step-00000016")
    with pytest.raises(ValueError) as info:
        _fit(max_steps=24, resume_from=str(root))
    message = str(info.value)
    assert f"{root}/step-00000016" in message and f"{other}/step-00000008" in message
    assert "named for step 16" in message and "records step 8" in message


@pytest.mark.procs
@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["truncated", "not-a-dict"])
def test_a_damaged_meta_pt_is_refused_naming_it_and_the_fix_before_any_process_starts(
    damage: str, _written: tuple[str, list[torch.Tensor]], tmp_path
) -> None:
    root = _copy(_written[0], tmp_path)
    meta = os.path.join(root, "step-00000008", ckpt.META)
    if damage == "truncated":
        data = open(meta, "rb").read()
        with open(meta, "wb") as f:
            f.write(data[: len(data) // 2])
    else:
        torch.save([1, 2, 3], meta)
    with pytest.raises(ValueError, match=r"meta\.pt.*the checkpoint is damaged: restore .*step-00000008 from a copy"):
        _fit(resume_from=root)
