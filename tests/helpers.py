"""Models, data and probes shared by the tests (module level, so spawned nodes can import them)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from exogym.core.comm import comm as node_comm
from exogym.core.pipeline import Communicator
from exogym.strategy import SimpleReduceStrategy


def _node_rank() -> int | None:
    """The rank of the node running in this thread (``None`` outside a run)."""
    try:
        return node_comm.current().rank
    except RuntimeError:
        return None


FIT_DEFAULTS: dict[str, Any] = {"logger": False, "progress": False, "val_size": 0}


def regression_data(n: int = 256, d: int = 8, seed: int = 0) -> TensorDataset:
    """A noisy linear-regression dataset of ``n`` examples ``(x [d], y [1])``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 1, generator=g)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(n, 1, generator=g))


def node_batches(ds: TensorDataset, k: int, rank: int, batch_size: int = 8, seed: int = 0) -> Any:
    """Node ``rank``'s training batches in order, as a plain loop would draw them: its
    ``DistributedSampler`` shard (shuffled with ``seed``, epoch 0) in batches of ``batch_size``."""
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(ds, num_replicas=k, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(0)
    idx = list(sampler)
    for i in range(0, len(idx) - batch_size + 1, batch_size):
        yield ds[idx[i : i + batch_size]]


class TinyNet(nn.Module):
    """A two-layer MLP returning the batch-mean MSE: ``forward((x, y)) -> scalar``."""

    def __init__(self, d: int = 8, hidden: int = 16, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, 1)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.fc2(torch.tanh(self.fc1(x))), y)


class VectorLossNet(TinyNet):
    """Returns per-example losses: not a valid ExoGym model."""

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return ((self.fc2(torch.tanh(self.fc1(x))) - y) ** 2).squeeze(-1)


class FailOnRank(TinyNet):
    """Raises ``ValueError('boom on rank R')`` on rank ``fail_rank`` from its ``fail_call``-th forward."""

    def __init__(self, fail_rank: int = 1, fail_call: int = 3) -> None:
        super().__init__()
        self.fail_rank, self.fail_call, self.calls = fail_rank, fail_call, 0

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        self.calls += 1
        if _node_rank() == self.fail_rank and self.calls >= self.fail_call:
            raise ValueError(f"boom on rank {self.fail_rank}")
        return super().forward(batch)


class SaveParams(Communicator):
    """Test probe: after the last step's optimizer update, every rank saves its parameters to
    ``<folder>/rank<r>.pt`` (a list of tensors). Costs no communication."""

    space: ClassVar[str] = "param"

    def __init__(self, folder: str) -> None:
        super().__init__(H=1)
        self.folder = folder

    def communicate(self, step: int) -> None:
        if step + 1 == self.ctx.max_steps:
            params = [p.detach().cpu().clone() for p in self.ctx.model.parameters()]
            torch.save(params, os.path.join(self.folder, f"rank{self.ctx.rank}.pt"))


def load_rank_params(folder: str, num_nodes: int) -> list[list[torch.Tensor]]:
    """What ``SaveParams`` wrote, indexed by rank."""
    return [torch.load(os.path.join(folder, f"rank{r}.pt")) for r in range(num_nodes)]


def child_pids() -> list[int]:
    """PIDs of this process's live (non-zombie) children, read from /proc.

    The stdlib's multiprocessing helpers, the resource tracker and the fork server (one each
    per program, started with the first node process and ended with the program), are not
    nodes and are left out.
    """
    me = os.getpid()
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
                if b"resource_tracker" in cmd or b"forkserver" in cmd:
                    continue
            out.append(int(pid))
    return out


class ExitOnRank(TinyNet):
    """Kills its process with ``os._exit(3)`` on rank ``rank`` at the third forward (a hard crash)."""

    def __init__(self, rank: int = 1) -> None:
        super().__init__()
        self.crash_rank, self.calls = rank, 0

    def forward(self, batch):
        self.calls += 1
        if _node_rank() == self.crash_rank and self.calls >= 3:
            os._exit(3)
        return super().forward(batch)


def collective_node(rank: int, fn: Any, plan: Any) -> Any:
    """Node body for transport tests: connect ``plan``'s transport and return ``fn(comm)``."""
    from exogym.core.comm.comm import NodeComm

    torch.set_num_threads(1)
    transport = plan.connect(rank)
    try:
        return fn(NodeComm(rank, plan.world_size, transport))
    finally:
        transport.close()


def run_collectives(
    fn: Any, world: int, transport: str, payload_hint: int = 1 << 16, timeout_s: float = 60.0, slot_mb: float = 16
) -> list[Any]:
    """Run ``fn(comm)`` on ``world`` node processes over ``transport``; results by rank."""
    from exogym.core.comm.plan import TransportPlan
    from exogym.runtime.launch import run_nodes

    plan = TransportPlan.create(transport, "cpu", world, payload_hint, timeout_s=timeout_s, slot_mb=slot_mb)
    try:
        out = run_nodes(collective_node, world, fn, (plan,))
    finally:
        plan.close()
    return [out[r] for r in range(world)]


class EnvCheck(TinyNet):
    """Raises unless the node sees ``EXOGYM_TEST_MARK == expected`` in its environment."""

    def __init__(self, expected: str) -> None:
        super().__init__()
        self.expected = expected

    def forward(self, batch):
        if os.environ.get("EXOGYM_TEST_MARK") != self.expected:
            raise RuntimeError(f"node environment has EXOGYM_TEST_MARK={os.environ.get('EXOGYM_TEST_MARK')!r}")
        return super().forward(batch)


class RaisingStrategy(SimpleReduceStrategy):
    """DDP whose ``step`` raises ``RuntimeError('strategy broke at step N')`` on rank 1 at
    step ``at`` (a strategy that fails mid-run)."""

    def __init__(self, at: int = 3) -> None:
        super().__init__()
        self.at = at

    def step(self) -> None:
        if self.rank == 1 and self.local_step == self.at:
            raise RuntimeError(f"strategy broke at step {self.at}")
        super().step()


def write_cifar10(data_dir: str, per_batch: int = 8, seed: int = 0, archive: bool = True) -> dict[str, Any]:
    """A tiny CIFAR-10 in its python-pickle format: five training batches and a test batch of
    ``per_batch`` random images each, as ``cifar-10-python.tar.gz`` (or, with ``archive=False``,
    the unpacked ``cifar-10-batches-py/``) under ``data_dir``; returns ``{file name: (data
    [n, 3072] uint8, labels)}``."""
    import io
    import pickle
    import tarfile

    import numpy as np

    rng = np.random.default_rng(seed)
    batches = {
        name: (rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8), rng.integers(0, 10, per_batch).tolist())
        for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]
    }
    os.makedirs(data_dir, exist_ok=True)
    blobs = {n: pickle.dumps({b"data": d, b"labels": y, b"batch_label": n.encode()}) for n, (d, y) in batches.items()}
    if archive:
        with tarfile.open(os.path.join(data_dir, "cifar-10-python.tar.gz"), "w:gz") as tar:
            for name, blob in blobs.items():
                info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    else:
        os.makedirs(os.path.join(data_dir, "cifar-10-batches-py"), exist_ok=True)
        for name, blob in blobs.items():
            with open(os.path.join(data_dir, "cifar-10-batches-py", name), "wb") as f:
                f.write(blob)
    return batches


class RecordsTrainedSteps:
    """A mixin for a strategy class: each node records in ``trained`` the steps it trains
    (``class S(RecordsTrainedSteps, FedAvgStrategy)``)."""

    def _init_node(self, model, rank, num_nodes):
        super()._init_node(model, rank, num_nodes)  # type: ignore[misc]
        self.trained: list[int] = []

    def step(self) -> None:
        self.trained.append(self.local_step)  # type: ignore[attr-defined]
        super().step()  # type: ignore[misc]
