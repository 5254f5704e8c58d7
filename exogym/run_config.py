"""The sections of a run's configuration: [`exogym.Trainer.fit`][exogym.Trainer.fit]'s keywords by
concept.

=============================  ==========================================================
section                        ``fit`` keywords
=============================  ==========================================================
``RunConfig``             ``num_nodes``, ``num_epochs``, ``max_steps``, ``batch_size``,
                               ``minibatch_size``, ``gradient_accumulation``, ``device``,
                               ``devices``, ``autocast``, ``seed``, ``max_memory_usage``,
                               ``network``, ``scale``, ``stop_on_nonfinite_loss``
``DataConfig``            ``val_size``, ``val_interval``, ``shuffle``, ``dataloader_kwargs``
``TransportConfig``       ``transport``, ``collective_timeout``, ``shm_slot_mb``,
                               ``workers``, ``torchrun_mode``
``CheckpointConfig``      ``checkpoint_dir``, ``checkpoint_interval``, ``resume_from``,
                               ``resume``
``Faults``        ``faults``
``Adversaries``   ``adversaries``
``LoggingConfig``         ``logger``, ``log_interval``, ``progress``, ``run_name``
=============================  ==========================================================

Each section checks its values when it is made and raises ``TypeError``/``ValueError`` naming
the ``fit`` argument and the fix. What needs the machine, the datasets or the strategy (is the
device there, does the batch fit the shard, can the strategy leave a node out) is checked by
the run's plan (``exogym.runtime.plan``), which turns the sections into the
``FitConfig`` every node reads.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from exogym.adversaries import Adversaries
from exogym.config import positive_int
from exogym.core.comm.network import Network, resolve_network
from exogym.core.comm.plan import DEFAULT_SLOT_MB, DEFAULT_TIMEOUT_S, check_settings
from exogym.data import check_loader_kwargs
from exogym.faults_config import Faults
from exogym.logger import Logger, resolve_logger
from exogym.runs import check_name
from exogym.scale import Scale, as_scale, format_count

logger = logging.getLogger(__name__)


@dataclass
class RunConfig:
    """What trains: how many nodes, for how long, on which device, from which seed."""

    num_nodes: int
    """K, the number of simulated nodes (>= 1)."""
    num_epochs: int = 1
    """Passes over each node's shard, when ``max_steps`` is not given."""
    max_steps: int | None = None
    """Optimizer steps per node (overrides ``num_epochs``)."""
    batch_size: int = 32
    """Examples per node per optimizer step."""
    minibatch_size: int | None = None
    """Examples per forward/backward (must divide ``batch_size``); ``None`` picks the largest
    divisor that fits in memory (see ``exogym.runtime.memory``)."""
    gradient_accumulation: int | None = None
    """The other way to say ``minibatch_size = batch_size / N``."""
    device: str | torch.device | None = None
    """``'cpu'``, ``'cuda'`` or ``'mps'``; ``None`` picks the best available."""
    devices: list[int] | None = None
    """CUDA device indices to spread the nodes over (round-robin)."""
    autocast: bool | torch.dtype = False
    """``True`` (bfloat16), a dtype, or ``False``."""
    seed: int = 42
    """The shared seed (data order, communicator randomness)."""
    max_memory_usage: float = 0.8
    """Fraction of device memory the automatic minibatch may use."""
    network: Network | str | None = None
    """The network that simulated time is computed for: a
    [`Network`][exogym.Network] (also a world: ``Network.regions(...)``) or a
    preset name (``'datacenter'``, ``'ethernet'`` (default), ``'internet'``, or the worlds
    ``'two-datacenters'`` and ``'volunteers'``)."""
    stop_on_nonfinite_loss: bool = True
    """End the run with an error naming the node and step when a training loss is NaN or
    infinite (``False``: train on)."""
    scale: Scale | str | float | None = None
    """The model and hardware whose time is simulated ([`Scale`][exogym.Scale]; a parameter
    count such as ``"10B"`` is ``Scale("10B")``): collectives carry the target's bytes and a step
    lasts the scale's compute seconds where it gives them; ``None``: the proxy's own."""
    network_model: Network = field(init=False, repr=False)
    """The [`Network`][exogym.Network] that ``network`` names (with the scale's compute)."""

    def __post_init__(self) -> None:
        positive_int(self.num_nodes, "num_nodes")
        positive_int(self.num_epochs, "num_epochs")
        positive_int(self.max_steps, "max_steps", allow_none=True)
        positive_int(self.batch_size, "batch_size")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise TypeError(f"seed must be an int (it seeds every node's generators), got {self.seed!r}")
        if not 0.0 < self.max_memory_usage <= 1.0:
            raise ValueError(f"max_memory_usage must be in (0, 1], got {self.max_memory_usage}")
        self._check_minibatch()
        self.network_model = resolve_network(self.network, num_nodes=self.num_nodes, seed=self.seed)
        if self.scale is not None:
            self.scale = as_scale(self.scale)
        seconds = self.scale.seconds_per_step() if self.scale is not None else None
        if seconds is not None:
            self.network_model = dataclasses.replace(self.network_model, compute=seconds)
        elif self.scale is not None:
            logger.warning(
                "scale %s gives no step time: a step's compute is the network's (%s), the trained model's, not the "
                "scale's; give Scale(step_seconds=...) or tokens_per_step and peak_flops (exogym compare: "
                "--step-seconds)",
                format_count(self.scale.num_params),
                self.network_model.describe_compute(),
            )

    def _check_minibatch(self) -> None:
        batch, mb, acc = self.batch_size, self.minibatch_size, self.gradient_accumulation
        positive_int(mb, "minibatch_size", allow_none=True)
        positive_int(acc, "gradient_accumulation", allow_none=True)
        if acc is not None:
            if batch % acc:
                raise ValueError(f"gradient_accumulation={acc} must divide batch_size={batch}")
            if mb is not None and mb * acc != batch:
                raise ValueError(
                    f"minibatch_size={mb} and gradient_accumulation={acc} disagree for batch_size={batch}; "
                    "give one of them"
                )
        elif mb is not None and (mb > batch or batch % mb):
            raise ValueError(f"minibatch_size={mb} must divide batch_size={batch}")

    @property
    def given_minibatch_size(self) -> int | None:
        """Examples per forward/backward as ``minibatch_size`` or ``gradient_accumulation`` say;
        ``None`` when neither is given (the plan probes the memory)."""
        if self.gradient_accumulation is not None:
            return self.batch_size // self.gradient_accumulation
        return self.minibatch_size


@dataclass
class DataConfig:
    """How the nodes read data and how often they validate."""

    val_size: int = 256
    """Validation examples per evaluation, split across nodes."""
    val_interval: int | None = None
    """Validate every this many steps (``None``: about 10 times per run); the last step is
    always validated."""
    shuffle: bool = True
    """Reshuffle the training data every epoch."""
    dataloader_kwargs: dict[str, Any] | None = None
    """Extra ``torch.utils.data.DataLoader`` arguments for every node's training and validation
    loaders (``num_workers``, ``pin_memory``, ``collate_fn``, ...); ExoGym sets batch size,
    sampler, shuffling and ``drop_last`` itself."""
    loader_kwargs: dict[str, Any] = field(init=False, repr=False)
    """``dataloader_kwargs`` as a dict (empty for ``None``)."""

    def __post_init__(self) -> None:
        positive_int(self.val_interval, "val_interval", allow_none=True)
        if not isinstance(self.val_size, int) or self.val_size < 0:
            raise ValueError(f"val_size must be an int >= 0, got {self.val_size!r}")
        self.loader_kwargs = check_loader_kwargs(self.dataloader_kwargs)


@dataclass
class TransportConfig:
    """How the nodes are hosted and how they exchange tensors."""

    transport: str = "auto"
    """``'auto'`` (shared memory for CPU and MPS nodes on x86-64, else the process group),
    ``'shm'``, ``'gloo'`` or ``'nccl'`` (one GPU per node). Results do not depend on it (up to
    float summation order); speed does."""
    collective_timeout: float = DEFAULT_TIMEOUT_S
    """Seconds a node waits in one collective (for a peer that is stuck, dead, or calling
    another collective) before the run fails with an error naming the operation and the ranks.
    Workers hosting several nodes wait this long per hosted node
    (``collective_timeout * ceil(K / W)``), since a peer runs all its nodes in turn."""
    shm_slot_mb: float = DEFAULT_SLOT_MB
    """MiB per worker of the shared-memory transport's buffer; larger payloads are streamed
    through it in pieces."""
    workers: int | None = None
    """W, the number of worker processes that host the K nodes (``K / W`` virtual nodes each,
    taking turns). Default: ``min(K, usable CPU cores)``, or ``min(K, GPUs)`` with
    ``device='cuda'``; ``workers=num_nodes`` gives every node a process of its own."""
    torchrun_mode: str | None = None
    """Only under ``torchrun`` (see ``exogym.runtime.cluster``): ``'deploy'`` (one node per
    torchrun process), ``'simulate'`` (virtual nodes spread over the processes), or ``None`` to
    infer it from ``num_nodes``."""

    def __post_init__(self) -> None:
        check_settings(self.transport, self.collective_timeout, self.shm_slot_mb)
        positive_int(self.workers, "workers", allow_none=True)


@dataclass
class CheckpointConfig:
    """Where the run's checkpoints go and which one it continues from."""

    checkpoint_dir: str | None = None
    """Write checkpoints of the whole run here (every node's model, optimizer, scheduler,
    strategy and communicator state, RNG streams, data position, ledger and metrics; see
    ``exogym.runtime.checkpoint``): after the last step, and every ``checkpoint_interval``
    steps when given. Only the newest complete checkpoint is kept; writes are atomic."""
    checkpoint_interval: int | None = None
    """Steps between checkpoints (needs ``checkpoint_dir``)."""
    resume_from: str | None = None
    """Continue the run from a checkpoint: a ``step-N`` folder, or a ``checkpoint_dir`` (its
    newest). The strategy, node count, model, batch size and seed must match the checkpoint's;
    ``max_steps`` may be larger."""
    resume: bool = False
    """Continue from the newest checkpoint in ``checkpoint_dir`` when it holds one, else start
    at step 0: one script for the first start and every restart."""

    def __post_init__(self) -> None:
        positive_int(self.checkpoint_interval, "checkpoint_interval", allow_none=True)
        if self.resume:
            if self.checkpoint_dir is None:
                raise ValueError("resume=True continues from checkpoint_dir's newest checkpoint: give checkpoint_dir")
            if self.resume_from is not None:
                raise ValueError("give resume=True (the newest checkpoint in checkpoint_dir) or resume_from, not both")


@dataclass
class LoggingConfig:
    """What rank 0 reports, and how often."""

    logger: Logger | str | None | bool = None
    """``None`` (a [`CSVLogger`][exogym.logger.CSVLogger]), ``'csv'``, ``'wandb'``,
    ``'tensorboard'``, a logger object, or ``False`` for none."""
    log_interval: int = 10
    """Aggregate train metrics every this many steps."""
    progress: bool = True
    """A progress bar on rank 0."""
    run_name: str | None = None
    """Folder name for the logs, one name without path separators (default: the strategy's class
    name); each run gets a new ``version_N`` folder under it."""
    sink: Logger | None = field(init=False, repr=False)
    """The logger object ``logger`` names (``None``: no logging)."""

    def __post_init__(self) -> None:
        positive_int(self.log_interval, "log_interval")
        if self.run_name is not None:
            check_name(self.run_name, "run_name")
        self.sink = resolve_logger(self.logger)


@dataclass
class FitArgs:
    """One ``fit`` call's arguments, a section each (the strategy and the datasets aside)."""

    run: RunConfig
    """Nodes, steps, batch, device, seed, network."""
    data: DataConfig = field(default_factory=DataConfig)
    """Validation and data loading."""
    transport: TransportConfig = field(default_factory=TransportConfig)
    """Workers and the transport between them."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints and resuming."""
    faults: Faults | None = None
    """Injected dropouts and stragglers, or ``None``."""
    adversaries: Adversaries | None = None
    """Malicious nodes, or ``None``."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Logger, intervals, progress bar, run name."""

    def __post_init__(self) -> None:
        if self.faults is not None and not isinstance(self.faults, Faults):
            raise TypeError(
                f"faults must be an exogym.Faults (e.g. Faults(drop={{1: [2]}})), got {type(self.faults).__name__}"
            )
        if self.adversaries is not None and not isinstance(self.adversaries, Adversaries):
            raise TypeError(
                "adversaries must be an exogym.Adversaries (e.g. Adversaries('sign_flip', fraction=0.25)), got "
                f"{type(self.adversaries).__name__}"
            )


def check_keywords(keywords: dict[str, Any]) -> None:
    """Make the sections that ``keywords`` (``fit``'s, ``num_nodes`` among them) fill, as ``fit``
    makes them (``logger`` aside: none is made): raises the ``TypeError``/``ValueError`` that
    ``fit`` would, naming the keyword, and starts nothing. A sweep checks every run's keywords
    so before its first run. Keywords that no section holds are left to ``fit``."""
    for section in (RunConfig, DataConfig, TransportConfig, CheckpointConfig, LoggingConfig):
        names = {f.name for f in dataclasses.fields(section) if f.init}
        given = {k: v for k, v in keywords.items() if k in names}
        if section is LoggingConfig:
            given["logger"] = False
        section(**given)
