"""``TransportPlan``: the one owner of how a run's nodes talk, made once in the parent.

::

    plan = TransportPlan.create("auto", device="cpu", world_size=4, payload_hint=model_bytes)
    ...                                # the plan travels to the nodes (it pickles)
    transport = plan.connect(rank)     # in each node: join the process group, open the transport
    ...
    plan.close()                       # in the parent, after the run

The parent serves the rendezvous store on a loopback port the OS picks (no guessing, no retry
loop; nothing of a local run listens beyond 127.0.0.1, see ``rendezvous``) and,
for shared memory, creates the segment; the nodes only connect. Every node also joins a
``torch.distributed`` process group (gloo, or nccl for GPU nodes), so raw ``torch.distributed``
calls in user code keep working whatever the transport.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from exogym.core.comm import rendezvous, shm
from exogym.core.comm.transport import TorchDistTransport, Transport

#: Transport names ``fit(transport=...)`` accepts.
KINDS = ("auto", "shm", "gloo", "nccl")
#: Default seconds a node waits in one collective before it raises.
DEFAULT_TIMEOUT_S = 300.0
#: Default and bounds of the shared-memory slot (payloads beyond it are streamed in pieces).
DEFAULT_SLOT_MB = 16
_MIN_SLOT = 64 << 10


def check_settings(kind: str, timeout_s: float = DEFAULT_TIMEOUT_S, slot_mb: float = DEFAULT_SLOT_MB) -> None:
    """Raise ``ValueError`` naming ``fit``'s ``transport``, ``collective_timeout`` or
    ``shm_slot_mb`` when its value cannot be a transport setting anywhere."""
    if kind not in KINDS:
        raise ValueError(f"transport must be one of {KINDS}, got {kind!r}")
    if not timeout_s > 0:
        raise ValueError(f"collective_timeout must be > 0 seconds, got {timeout_s!r}")
    if not slot_mb > 0:
        raise ValueError(f"shm_slot_mb must be > 0, got {slot_mb!r}")


def resolve_kind(kind: str, device: str, gpus: int, world_size: int) -> str:
    """The concrete transport (``'shm'``, ``'gloo'`` or ``'nccl'``) for ``fit(transport=kind)``.

    ``'auto'`` picks shared memory for CPU and MPS nodes, nccl for CUDA nodes with one GPU each,
    else gloo. Raises ``ValueError`` naming ``transport`` when the choice cannot work here.
    """
    check_settings(kind)
    nccl_ok = device == "cuda" and gpus >= world_size
    if kind == "nccl" and not nccl_ok:
        if device != "cuda":
            raise ValueError(
                f"transport='nccl' needs device='cuda', got device={device!r} "
                f"({torch.cuda.device_count()} GPUs here); use transport='auto' (or 'gloo')"
            )
        raise ValueError(
            f"transport='nccl' needs one GPU per worker process: {world_size} workers, {gpus} GPU(s) here; "
            "use transport='gloo' (or 'auto'), or fewer workers"
        )
    if kind == "shm":
        if device == "cuda":
            raise ValueError("transport='shm' moves CPU tensors; with device='cuda' use 'auto', 'nccl' or 'gloo'")
        if not shm.supported():
            raise ValueError(
                f"transport='shm' needs the compiled extension on {platform.machine()} (build it with "
                "`pip install --no-build-isolation -e .`); use transport='gloo'"
            )
        return "shm"
    if kind == "auto":
        if device != "cuda" and shm.supported():
            return "shm"
        return "nccl" if nccl_ok else "gloo"
    return kind


@dataclass
class TransportPlan:
    """A picklable description of a run's transport, made in the parent.

    Attributes:
        kind: ``'shm'``, ``'gloo'`` or ``'nccl'``.
        world_size: the number of nodes.
        store_port: the parent's rendezvous store (loopback); 0 for an outside launcher's
            process group (``for_launcher``).
        timeout_s: seconds any node waits in one collective before raising.
        slot: bytes per shared-memory slot (``kind == 'shm'``), else 0.
        segment: the shared-memory segment (``kind == 'shm'``), else ``None``.
    """

    kind: str
    world_size: int
    store_port: int
    timeout_s: float = DEFAULT_TIMEOUT_S
    slot: int = 0
    segment: torch.Tensor | None = None
    _store: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def create(
        cls,
        kind: str,
        device: str,
        world_size: int,
        payload_hint: int = 0,
        gpus: int = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        slot_mb: float = DEFAULT_SLOT_MB,
    ) -> TransportPlan:
        """Resolve ``kind`` (see ``resolve_kind``), start the store and, for shared memory,
        create a segment whose slots hold ``min(payload_hint, slot_mb MiB)`` bytes (at least
        64 KiB) after checking that ``/dev/shm`` has room. Raises ``ValueError``/``RuntimeError``
        before any node starts."""
        check_settings(kind, timeout_s, slot_mb)
        resolved = resolve_kind(kind, device, gpus, world_size)
        slot, segment = 0, None
        if resolved == "shm":
            slot = shm.round_slot(min(max(payload_hint, _MIN_SLOT), int(slot_mb * 2**20)))
            shm.check_room(shm.segment_bytes(world_size, slot))
            segment = shm.create_segment(world_size, slot)
        store = rendezvous.serve_store()
        return cls(resolved, world_size, store.port, float(timeout_s), slot, segment, store)

    @classmethod
    def for_launcher(cls, kind: str, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> TransportPlan:
        """A plan over an outside launcher's process group (``torchrun``; ``kind`` is
        ``'gloo'`` or ``'nccl'``): no store of its own (``store_port`` 0), the ranks rendezvous
        through the launcher's environment (``env://``)."""
        if kind not in ("gloo", "nccl"):
            raise ValueError(f"a launcher's transport is 'gloo' or 'nccl', got {kind!r}")
        return cls(kind, world_size, 0, float(timeout_s))

    @property
    def backend(self) -> str:
        """The ``torch.distributed`` backend every node joins."""
        return "nccl" if self.kind == "nccl" else "gloo"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_store"] = None  # the server stays in the parent
        return state

    def connect(self, rank: int) -> Transport:
        """In node ``rank``: join the process group and open the transport. Collective: every
        rank must call it."""
        if self.store_port == 0:  # an outside launcher's group (exogym.runtime.cluster)
            rendezvous.join(self.backend, self.timeout_s)
            return TorchDistTransport(rendezvous.default_store(), self.timeout_s, owns_group=False)
        store = rendezvous.connect_store(self.store_port)
        with rendezvous.loopback_gloo():
            dist.init_process_group(
                self.backend,
                store=store,
                rank=rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=self.timeout_s),
            )
        if self.kind == "shm":
            assert self.segment is not None
            return shm.ShmTransport(self.segment, rank, self.world_size, self.slot, self.timeout_s)
        return TorchDistTransport(store, self.timeout_s)

    def close(self) -> None:
        """In the parent, after the run: stop the store and drop the segment."""
        self._store = None
        self.segment = None
