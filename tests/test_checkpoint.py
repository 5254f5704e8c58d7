"""Checkpoints: bit-exact resume, atomic writes, Ctrl-C, determinism."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
import torch

from communicators.averaging import AveragingCommunicator
from communicators.quantize import QuantizeCommunicator
from exogym import Faults, Trainer
from exogym.core.comm.network import Network
from exogym.runtime import checkpoint as ckpt
from exogym.strategy import (
    CommunicateOptimizeStrategy,
    DeMoStrategy,
    DESLOCStrategy,
    DiLoCoStrategy,
    EagerDiLoCoStrategy,
    FedAvgStrategy,
    MuLoCoStrategy,
    NoLoCoStrategy,
    OptimSpec,
    PowerSGDStrategy,
    SimpleReduceStrategy,
    SparseLoCoStrategy,
    SPARTAStrategy,
    StreamingDiLoCoStrategy,
    TopKEFStrategy,
)
from tests.core.test_launch import _env, _tagged_pids, _wait_until
from tests.helpers import TinyNet, regression_data

pytestmark = [pytest.mark.procs, pytest.mark.timeout(180)]

STRATEGIES = {
    "ddp": SimpleReduceStrategy,
    "fedavg": lambda: FedAvgStrategy(H=3),
    "diloco": lambda: DiLoCoStrategy(H=4),
    "sparta": lambda: SPARTAStrategy(p_sparta=0.1),
    "sparta_async": lambda: SPARTAStrategy(p_sparta=0.1, async_sparta_delay=2),  # averages in flight
    "demo": DeMoStrategy,
    # an update in flight (sent after step 7, applied after step 8) lives in the checkpoint at 8
    "streaming_diloco": lambda: StreamingDiLoCoStrategy(H=4, num_fragments=2, overlap_steps=1, alpha=0.5),
    # on the clock: the fragment sent after step 7 arrives during step 8, its handle in the checkpoint at 8
    "streaming_diloco_auto": lambda: StreamingDiLoCoStrategy(H=4, num_fragments=2, overlap_steps="auto", alpha=0.5),
    # on the clock: the round sent after step 7 is in flight in the checkpoint at 8
    "sparta_auto": lambda: SPARTAStrategy(p_sparta=0.1, async_sparta_delay="auto"),
    # gradients all-reduced as int8 with error feedback (the residuals live in the checkpoint)
    "int8_ef": lambda: CommunicateOptimizeStrategy(
        [QuantizeCommunicator(AveragingCommunicator(target="grads"), "int8", error_feedback=True)]
    ),
    "topk_ef": lambda: TopKEFStrategy(k=0.1),  # every node's residual lives in the checkpoint
    # compressing since step 4: the errors and the warm-start Q live in the checkpoint at 8
    "powersgd": lambda: PowerSGDStrategy(rank=1, start_iter=4),
    # the moments, last averaged after step 5, differ per node in the checkpoint at step 8
    "desloc": lambda: DESLOCStrategy(Kx=2, Ku=3, Kv=6),
    # every node's own outer weights and momentum (they differ between nodes) live in the checkpoint
    "noloco": lambda: NoLoCoStrategy(H=3, gamma=0.3),
    # every node's error buffer (they differ between nodes) lives in the checkpoint
    "sparseloco": lambda: SparseLoCoStrategy(H=3, chunk=16, k=2),
    # every node's outer parameters and the others' shares still to apply live in the checkpoint
    "eager_diloco": lambda: EagerDiLoCoStrategy(H=3),
    # Muon's momentum buffers and AdamW's moments, in one inner optimizer's state
    "muloco": lambda: MuLoCoStrategy(H=3),
    # outer momentum reset every 3 outer steps: the checkpoint at 8 (outer step 4) is mid-cycle
    "diloco_restarts": lambda: DiLoCoStrategy(
        H=2, outer_optim=OptimSpec(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True, restart_every=3)
    ),
}
#: Columns measured on this machine (wall clock, memory); every other column is modelled.
MEASURED = ("wall_time", "comm_time", "peak_memory")
STEPS = 16


def _fit(name: str, k: int, transport: str, steps: int, **kw: Any) -> tuple[list[torch.Tensor], list[dict]]:
    trainer = Trainer(TinyNet(), regression_data(1024), regression_data(64, seed=1))
    model = trainer.fit(
        STRATEGIES[name](),
        num_nodes=k,
        max_steps=steps,
        batch_size=8,
        transport=transport,
        logger=False,
        progress=False,
        val_size=32,
        val_interval=5,
        log_interval=2,
        network=Network(1e9, 1e-3, compute=0.01),  # deterministic simulated time
        **kw,
    )
    rows = [{k: v for k, v in r.items() if k not in MEASURED} for r in trainer.history]
    return [p.detach().clone() for p in model.parameters()], rows


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(("transport", "k"), [("shm", 2), ("gloo", 4)])
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_run_stopped_and_resumed_equals_one_that_never_stopped(name: str, transport: str, k: int, tmp_path) -> None:
    whole, whole_rows = _fit(name, k, transport, STEPS)
    _fit(name, k, transport, STEPS // 2, checkpoint_dir=str(tmp_path))  # ends with a checkpoint at 8
    resumed, resumed_rows = _fit(name, k, transport, STEPS, resume_from=str(tmp_path))
    assert _same(whole, resumed)
    assert resumed_rows == whole_rows  # losses, bytes, simulated time, examples: every row


def test_a_run_with_faults_resumes_bit_identically(tmp_path) -> None:
    faults = Faults(drop_probability=0.3, slowdown=torch.distributions.LogNormal(0.0, 0.5))
    whole, whole_rows = _fit("diloco", 4, "shm", STEPS, faults=faults)
    assert any(r.get("nodes_alive", 4) < 4 for r in whole_rows)  # someone did drop out
    _fit("diloco", 4, "shm", STEPS // 2, checkpoint_dir=str(tmp_path), faults=faults)
    resumed, resumed_rows = _fit("diloco", 4, "shm", STEPS, resume_from=str(tmp_path), faults=faults)
    assert _same(whole, resumed)
    assert resumed_rows == whole_rows


def test_resume_true_starts_fresh_without_a_checkpoint_and_continues_from_one(tmp_path) -> None:
    whole, whole_rows = _fit("fedavg", 2, "shm", STEPS)
    first, _ = _fit("fedavg", 2, "shm", STEPS // 2, checkpoint_dir=str(tmp_path), resume=True)  # nothing there yet
    short, _ = _fit("fedavg", 2, "shm", STEPS // 2)
    assert _same(first, short)
    resumed, resumed_rows = _fit("fedavg", 2, "shm", STEPS, checkpoint_dir=str(tmp_path), resume=True)
    assert _same(whole, resumed)
    assert resumed_rows == whole_rows


def test_resume_true_needs_checkpoint_dir_and_excludes_resume_from(tmp_path) -> None:
    trainer = Trainer(TinyNet(), regression_data(256))
    with pytest.raises(ValueError, match="resume=True continues from checkpoint_dir's newest checkpoint"):
        trainer.fit(SimpleReduceStrategy(), num_nodes=2, max_steps=4, batch_size=8, resume=True)
    with pytest.raises(ValueError, match="give resume=True .* or resume_from, not both"):
        trainer.fit(
            SimpleReduceStrategy(), 2, max_steps=4, batch_size=8, checkpoint_dir=str(tmp_path), resume=True,
            resume_from=str(tmp_path),
        )  # fmt: skip


def test_checkpoints_every_interval_keep_only_the_newest_complete_one(tmp_path) -> None:
    _fit("diloco", 2, "shm", 12, checkpoint_dir=str(tmp_path), checkpoint_interval=5)
    assert sorted(os.listdir(tmp_path)) == ["latest", "step-00000012"]  # 5 and 10 were replaced
    assert ckpt.resolve(str(tmp_path)) == str(tmp_path / "step-00000012")
    meta = ckpt.load_meta(str(tmp_path / "step-00000012"))
    assert (meta["step"], meta["num_nodes"], meta["strategy"]) == (12, 2, "DiLoCoStrategy")
    assert sorted(os.listdir(tmp_path / "step-00000012")) == ["meta.pt", "node-00000.pt", "node-00001.pt"]


_KILLED_WRITER = """
import os, signal, sys, torch
from exogym.runtime import checkpoint as ckpt
root = sys.argv[1]
ckpt.write_node(root, 16, 0, {"model": torch.zeros(10)})         # node 0 finished its file
folder = ckpt.partial_dir(root, 16)
with open(os.path.join(folder, ".node-00001.pt.tmp1"), "wb") as f:  # node 1 is half-way through
    f.write(b"PK\\x03\\x04 half a zip")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_checkpoint_killed_mid_write_leaves_the_previous_one_usable(tmp_path) -> None:
    whole, _ = _fit("diloco", 2, "shm", STEPS)
    _fit("diloco", 2, "shm", STEPS // 2, checkpoint_dir=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(tmp_path)], env=_env(), timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / ".step-00000016.partial").is_dir()  # the interrupted write is left behind...
    assert ckpt.resolve(str(tmp_path)) == str(tmp_path / "step-00000008")  # ...and never read
    resumed, _ = _fit("diloco", 2, "shm", STEPS, resume_from=str(tmp_path))
    assert _same(whole, resumed)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"name": "ddp"}, "strategy: checkpoint 'DiLoCoStrategy', this run 'SimpleReduceStrategy'"),
        ({"k": 3}, "num_nodes: checkpoint 2, this run 3"),
        ({"steps": 8}, "is at step 8, and this run has max_steps=8"),
    ],
)
def test_resuming_a_different_run_names_the_mismatch(change: dict, match: str, tmp_path) -> None:
    _fit("diloco", 2, "shm", 8, checkpoint_dir=str(tmp_path))
    args = {"name": "diloco", "k": 2, "transport": "shm", "steps": 16, **change}
    with pytest.raises(ValueError, match=match):
        _fit(args.pop("name"), args.pop("k"), args.pop("transport"), args.pop("steps"), resume_from=str(tmp_path))


def test_resuming_a_different_model_or_a_missing_checkpoint_is_refused(tmp_path) -> None:
    _fit("ddp", 2, "shm", 8, checkpoint_dir=str(tmp_path))
    trainer = Trainer(TinyNet(hidden=32), regression_data(1024))
    with pytest.raises(ValueError, match=r"model state \(shapes or dtypes\) differs in \['fc1.bias', 'fc1.weight'"):
        trainer.fit(SimpleReduceStrategy(), num_nodes=2, max_steps=16, batch_size=8, resume_from=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="resume_from='/nonexistent'"):
        trainer.fit(SimpleReduceStrategy(), num_nodes=2, max_steps=16, batch_size=8, resume_from="/nonexistent")


def test_the_same_seed_gives_the_same_run(tmp_path) -> None:
    first, first_rows = _fit("diloco", 2, "shm", 12)
    second, second_rows = _fit("diloco", 2, "shm", 12)
    assert _same(first, second) and first_rows == second_rows


_LONG_RUN = """
import sys, time
from exogym import Faults, Trainer
from exogym.strategy import SimpleReduceStrategy
from tests.helpers import TinyNet, regression_data

class Slow(TinyNet):
    def forward(self, batch):
        time.sleep(0.01)
        return super().forward(batch)

if __name__ == "__main__":
    Trainer(Slow(), regression_data(4096)).fit(
        SimpleReduceStrategy(), num_nodes=2, max_steps=100000, batch_size=8, logger=False, progress=False,
        val_size=0, checkpoint_dir=sys.argv[1], checkpoint_interval=10)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the run's processes")
def test_ctrl_c_raises_keyboard_interrupt_within_5s_and_leaves_a_usable_checkpoint(tmp_path) -> None:
    tag = uuid.uuid4().hex
    script = tmp_path / "long_run.py"
    script.write_text(_LONG_RUN)
    root = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root)],
        env={**_env(), "EXOGYM_TEST_RUN": tag},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a shell may have ignored it
    )
    try:
        assert _wait_until(lambda: (root / "latest").exists(), 90), "no checkpoint was written"
        os.kill(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < 5.0
        assert "KeyboardInterrupt" in err and proc.returncode != 0
        assert _wait_until(lambda: _tagged_pids(tag) == [], 5.0), f"left: {_tagged_pids(tag)}"
    finally:
        for pid in _tagged_pids(tag):  # only this test's processes, by their tag
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
    folder = ckpt.resolve(str(root))
    step = ckpt.load_meta(folder)["step"]
    assert step % 10 == 0 and step >= 10
    trainer = Trainer(TinyNet(), regression_data(4096))  # the same state shapes as Slow
    model = trainer.fit(
        SimpleReduceStrategy(),
        num_nodes=2,
        max_steps=step + 2,
        batch_size=8,
        logger=False,
        progress=False,
        val_size=0,
        resume_from=str(root),
    )
    assert trainer.history[-1]["step"] == step + 2 and all(torch.isfinite(p).all() for p in model.parameters())


class _CreatesFile:
    """Unpickled by a loader that runs code, this creates the file at ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def _written(tmp_path_factory) -> str:
    """A checkpoint of DDP on 2 nodes after 8 steps (copy it before changing it)."""
    root = tmp_path_factory.mktemp("ckpt")
    _fit("ddp", 2, "shm", 8, checkpoint_dir=str(root))
    return ckpt.resolve(str(root))


def _copy(folder: str, tmp_path) -> str:
    import shutil

    return shutil.copytree(folder, tmp_path / "step-00000008")


def test_a_meta_pt_that_would_run_code_is_refused_and_runs_nothing(_written: str, tmp_path) -> None:
    import pickle

    control = tmp_path / "control"
    pickle.loads(pickle.dumps(_CreatesFile(str(control))))  # an unsafe loader would run it...
    assert control.exists()
    folder, target = _copy(_written, tmp_path), tmp_path / "created"
    with open(os.path.join(folder, ckpt.META), "wb") as f:
        pickle.dump(_CreatesFile(str(target)), f)
    with pytest.raises(ValueError, match=r"refusing to load .*meta\.pt: it holds objects the safe loader"):
        _fit("ddp", 2, "shm", 16, resume_from=str(folder))
    assert not target.exists()  # ...the checkpoint loader did not


def test_a_node_file_that_would_run_code_is_refused_even_with_its_digest_recorded(_written: str, tmp_path) -> None:
    import pickle

    from exogym import NodeFailedError

    folder, target = _copy(_written, tmp_path), tmp_path / "created"
    node = ckpt.node_file(str(folder), 1)
    with open(node, "wb") as f:
        pickle.dump(_CreatesFile(str(target)), f)
    meta = ckpt.load_meta(str(folder))  # whoever swapped the file also rewrote the digest
    meta[ckpt.FILES]["node-00001.pt"] = ckpt.sha256(node)
    torch.save(meta, os.path.join(folder, ckpt.META))
    with pytest.raises(NodeFailedError, match=r"refusing to load .*node-00001\.pt"):
        _fit("ddp", 2, "shm", 16, resume_from=str(folder))
    assert not target.exists()


@pytest.mark.parametrize("damage", ["truncated", "modified"])
def test_a_truncated_or_modified_node_file_is_refused_naming_it(damage: str, _written: str, tmp_path) -> None:
    folder = _copy(_written, tmp_path)
    node = ckpt.node_file(str(folder), 1)
    data = bytearray(open(node, "rb").read())
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    with open(node, "wb") as f:
        f.write(data)
    with pytest.raises(ValueError, match=r"node-00001\.pt does not match the SHA-256 that meta\.pt recorded"):
        _fit("ddp", 2, "shm", 16, resume_from=str(folder))


def test_a_checkpoint_written_without_digests_resumes_bit_exactly_with_a_warning(
    _written: str, tmp_path, caplog
) -> None:
    folder = _copy(_written, tmp_path)
    meta = ckpt.load_meta(str(folder))
    assert sorted(meta[ckpt.FILES]) == ["node-00000.pt", "node-00001.pt"]
    del meta[ckpt.FILES]  # meta.pt as ExoGym wrote it before it recorded digests
    torch.save(meta, os.path.join(folder, ckpt.META))
    whole, whole_rows = _fit("ddp", 2, "shm", STEPS)
    resumed, resumed_rows = _fit("ddp", 2, "shm", STEPS, resume_from=str(folder))
    assert _same(whole, resumed) and resumed_rows == whole_rows
    assert "records no SHA-256 of its files" in caplog.text


def test_a_node_file_missing_keys_is_refused_naming_it_and_the_keys_even_with_its_digest_recorded(
    _written: str, tmp_path
) -> None:
    from exogym import NodeFailedError

    folder = _copy(_written, tmp_path)
    node = ckpt.node_file(str(folder), 1)
    state = torch.load(node, weights_only=True)
    del state["model"], state["rng"]
    torch.save(state, node)
    meta = ckpt.load_meta(str(folder))  # whoever rewrote the file also rewrote the digest
    meta[ckpt.FILES]["node-00001.pt"] = ckpt.sha256(node)
    torch.save(meta, os.path.join(folder, ckpt.META))
    with pytest.raises(NodeFailedError) as info:
        _fit("ddp", 2, "shm", 16, resume_from=str(folder))
    assert f"{node}: not a node file of an ExoGym checkpoint: it lacks 'model', 'rng'" in str(info.value)


class _RunsShell:
    """Unpickled by a loader that runs code, this runs a shell command (``posix.system``)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_a_file_that_would_run_a_shell_command_is_refused_as_not_exogyms_without_advising_to_allow_it(
    writer: str, tmp_path
) -> None:
    import pickle

    path, target = tmp_path / "node-00000.pt", tmp_path / "created"
    if writer == "pickle":
        with open(path, "wb") as f:
            pickle.dump(_RunsShell(f"touch {target}"), f, protocol=2)  # GLOBAL posix.system
    else:
        torch.save({"model": _RunsShell(f"touch {target}")}, path)
    with pytest.raises(ValueError) as info:
        ckpt.load_safe(str(path))
    message = str(info.value)
    assert f"refusing to load {path}" in message and "posix.system" in message
    assert "not a checkpoint ExoGym wrote" in message
    assert "add_safe_globals" not in message and "allow" not in message
    assert not target.exists()
