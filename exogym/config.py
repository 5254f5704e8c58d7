"""``FitConfig``: the validated settings of one ``Trainer.fit`` call, shipped to every node."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from exogym.adversaries import Adversaries
from exogym.core.comm.network import Network
from exogym.faults_config import Faults


@dataclass(frozen=True)
class FitConfig:
    """Resolved arguments of [`exogym.Trainer.fit`][exogym.Trainer.fit], made by
    ``exogym.runtime.plan.plan_run`` from the sections of ``exogym.run_config`` (see there for their
    meaning).

    Attributes:
        num_nodes: K, the number of simulated nodes.
        workers: W, the number of worker processes that host the nodes (``K / W`` virtual
            nodes each, contiguous blocks of ranks; see ``exogym.runtime.virtual``).
        max_steps: optimizer steps per node; ``None`` until a dataset factory's length is known
            inside the nodes (they then agree on the minimum over ranks).
        num_epochs: epochs, used when ``max_steps`` is not given.
        batch_size: examples per node per optimizer step.
        minibatch_size: examples per forward/backward; ``batch_size / minibatch_size`` minibatches
            are accumulated per step.
        device: device type of every node: ``cpu``, ``cuda`` or ``mps``.
        devices: CUDA device indices; worker ``w`` (and every node it hosts) uses
            ``devices[w % len(devices)]``.
        transport: the resolved transport: ``shm``, ``gloo`` or ``nccl`` (see
            ``exogym.core.comm.plan.TransportPlan``; every node also joins a gloo or nccl
            process group, which raw ``torch.distributed`` calls in user code use).
        collective_timeout: seconds a worker waits in one collective before it raises (the
            argument times the nodes per worker).
        val_size: validation examples per evaluation (split across nodes).
        val_interval: evaluate every this many steps (and after the last step).
        autocast: dtype for ``torch.autocast``, or ``None``.
        seed: shared seed: data order, communicator randomness; node ``r`` seeds torch with
            ``seed + r`` for its own randomness (dropout).
        log_interval: aggregate and log train metrics every this many steps.
        shuffle: shuffle the training data each epoch.
        progress: show a progress bar on rank 0.
        threads_per_worker: intra-op threads in each worker process.
        log_level: ``logging`` level for the nodes.
        network: the network model that prices communication and compute.
        stop_on_nonfinite_loss: a NaN or infinite training loss ends the run with an error.
        launcher: ``'exogym'`` (``fit`` started the workers) or ``'torchrun'`` (each torchrun
            rank is a worker; see ``exogym.runtime.cluster``).
        checkpoint_dir: where checkpoints go (``None``: none are written).
        checkpoint_interval: a checkpoint every this many steps (and after the last step).
        resume_from: the complete checkpoint folder the run continues from, or ``None``.
        faults: injected dropouts and stragglers ([`exogym.faults_config.Faults`][exogym.Faults]),
            with the rounds the network's availability trace takes nodes away from added to its
            ``drop`` (the run's whole plan: what the logger and ``result["faults"]`` read), or ``None``.
        fault_round_steps: steps per round of the dropouts (the strategy's slowest period).
        dataloader_kwargs: extra ``DataLoader`` arguments (``num_workers``, ``pin_memory``, ...).
        projection: with a scale, the target's payloads for the proxy's
            ([`exogym.projection.Projection`][exogym.projection.Projection]), which every node's
            ledger records; ``None``: the proxy's own.
    """

    num_nodes: int
    workers: int
    max_steps: int | None
    num_epochs: int
    batch_size: int
    minibatch_size: int
    device: str
    devices: tuple[int, ...] | None
    transport: str
    collective_timeout: float
    val_size: int
    val_interval: int | None
    autocast: torch.dtype | None
    seed: int
    log_interval: int
    shuffle: bool
    progress: bool
    threads_per_worker: int
    log_level: int
    network: Network
    stop_on_nonfinite_loss: bool = True
    launcher: str = "exogym"
    checkpoint_dir: str | None = None
    checkpoint_interval: int | None = None
    resume_from: str | None = None
    faults: Faults | None = None
    fault_round_steps: int = 1
    adversaries: Adversaries | None = None
    dataloader_kwargs: dict[str, Any] = field(default_factory=dict)
    projection: Any = None

    @property
    def accumulation(self) -> int:
        """Minibatches accumulated per optimizer step."""
        return self.batch_size // self.minibatch_size

    def worker_device(self, worker: int) -> torch.device:
        """The device worker ``worker`` (and every node it hosts) trains on."""
        if self.device == "cuda":
            devs = self.devices or (0,)
            return torch.device("cuda", devs[worker % len(devs)])
        return torch.device(self.device)

    def to_dict(self) -> dict[str, Any]:
        """Plain values for logs."""
        d = asdict(self)
        d["autocast"] = None if self.autocast is None else str(self.autocast)
        n = self.network
        d["network"] = {"name": n.name, "bandwidth": n.bandwidth, "latency": n.latency, "compute": n.compute}
        if n.counts_flops:
            d["network"]["flops_per_second"] = n.flops_per_second
        d["faults"] = None if self.faults is None else self.faults.to_dict()
        d["adversaries"] = None if self.adversaries is None else self.adversaries.to_dict()
        d["projection"] = None if self.projection is None else self.projection.to_dict()
        return d


def positive_int(value: Any, name: str, allow_none: bool = False) -> None:
    """Raise a ``TypeError``/``ValueError`` naming ``name`` unless ``value`` is an int >= 1."""
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def resolve_device(device: str | torch.device | None) -> str:
    """``None`` picks cuda, then mps, then cpu; an unavailable device raises ``ValueError``."""
    if device is None:
        if torch.cuda.is_available():
            return "cuda"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if isinstance(device, str) and device.split(":")[0] not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'mps' (or 'cuda:N'), got {device!r}")
    kind = torch.device(device).type
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was requested but torch.cuda.is_available() is False; use device='cpu'")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device='mps' was requested but torch.backends.mps.is_available() is False; use device='cpu'")
    if kind not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'mps', got {device!r}")
    return kind


def resolve_autocast(autocast: bool | torch.dtype | None, device: str) -> torch.dtype | None:
    """``True`` means bfloat16 (float16 on CUDA without bf16 support); ``False``/``None`` off."""
    if autocast is None or autocast is False:
        return None
    if autocast is True:
        if device == "cuda" and not torch.cuda.is_bf16_supported():
            return torch.float16
        return torch.bfloat16
    if isinstance(autocast, torch.dtype) and autocast in (torch.bfloat16, torch.float16):
        return autocast
    raise ValueError(f"autocast must be a bool, torch.bfloat16 or torch.float16, got {autocast!r}")
