"""Copies of the job's model for many nodes, made faster than ``copy.deepcopy``.

A worker that hosts hundreds of virtual nodes gives each its own copy of the model.
``copy.deepcopy`` walks the module tree in Python: about 0.5 ms for the three-layer benchmark
MLP, most of a virtual node's start-up. ``ModelReplicator`` pickles the tree once with its
tensors kept aside (the model reached the worker through ``cloudpickle``, so it pickles); a
replica unpickles that snapshot (C speed) and copies the tensors as ``deepcopy`` does: a
parameter becomes a new parameter of the same class holding a clone of its data (tied
parameters stay tied), any other tensor is deep-copied with one memo per replica (so buffers
that share storage still share it). About six times faster on the benchmark MLP.

The replicator checks its first replica against the model (class, parameters and their
``requires_grad``, the state dict's keys, dtypes and values, no memory shared); a model that
cannot be pickled this way, or that fails the check, is deep-copied for every node.
"""

from __future__ import annotations

import copy
import io
import logging
import pickle
import threading
from collections.abc import Callable
from typing import Any

import torch

from exogym.runtime import pickling

logger = logging.getLogger(__name__)


class _Snapshot(pickling.Pickler):
    """Pickles a module tree, keeping its tensors aside (``tensors``; the pickle holds indices);
    code sent by value keeps its file name, as in the job (``exogym.runtime.pickling``)."""

    def __init__(self, file: io.BytesIO, tensors: list[torch.Tensor]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors
        self._index: dict[int, int] = {}
        #: Classes met (tensors aside) that copy themselves in ``__deepcopy__``.
        self.custom: set[str] = set()

    def persistent_id(self, obj: Any) -> int | None:
        if not isinstance(obj, torch.Tensor):
            if hasattr(type(obj), "__deepcopy__"):
                self.custom.add(type(obj).__name__)
            return None
        k = self._index.get(id(obj))
        if k is None:
            k = self._index[id(obj)] = len(self.tensors)
            self.tensors.append(obj)
        return k


class _Replica(pickle.Unpickler):
    """Unpickles a snapshot, giving each tensor index a copy of that tensor (one per index)."""

    def __init__(self, data: bytes, tensors: list[torch.Tensor]) -> None:
        super().__init__(io.BytesIO(data))
        self.tensors = tensors
        self.made: dict[int, torch.Tensor] = {}
        self.deepcopy_memo: dict[int, Any] = {}  # (not `memo`: the unpickler's own)

    def persistent_load(self, k: int) -> torch.Tensor:
        t = self.made.get(k)
        if t is None:
            src = self.tensors[k]
            if type(src) is torch.nn.Parameter:  # what Parameter.__deepcopy__ makes
                t = torch.nn.Parameter(src.data.clone(memory_format=torch.preserve_format), src.requires_grad)
            else:
                t = copy.deepcopy(src, self.deepcopy_memo)
            self.made[k] = t
        return t


class Replicator:
    """Independent copies of ``obj``, equal to ``copy.deepcopy(obj)``.

    Args:
        obj: the object to copy; it must not change while replicas are made (the snapshot
            shares its tensors).
        check: ``check(replica, obj)``, what the first replica does not copy as
            ``copy.deepcopy`` would (``None``: nothing); otherwise every replica is deep-copied.
        what: the object, in the log line that says it is deep-copied.

    The first replica is made at construction and checked against ``obj`` (no extra copy is
    kept: ``replica`` hands it out first). Thread-safe: replicas may be made from several
    threads at once.
    """

    def __init__(self, obj: Any, check: Callable[[Any, Any], str | None], what: str) -> None:
        self.model = obj
        self._tensors: list[torch.Tensor] = []
        self._data: bytes | None = None
        self._first: Any = None
        try:
            buf = io.BytesIO()
            snapshot = _Snapshot(buf, self._tensors)
            snapshot.dump(obj)
            self._data = buf.getvalue()
            self._first = _Replica(self._data, self._tensors).load()
            problem = check(self._first, obj)
            if problem is None and snapshot.custom:
                problem = f"{', '.join(sorted(snapshot.custom))} copied by its own __deepcopy__"
        except Exception as e:  # noqa: BLE001 - any failure means: deep-copy instead
            problem = f"{type(e).__name__}: {e}"
        if problem is not None:
            logger.debug("the %s is deep-copied for every node (%s)", what, problem)
            self._data, self._tensors, self._first = None, [], None
        self._lock = threading.Lock()

    @property
    def fast(self) -> bool:
        """Whether replicas come from the snapshot (``False``: from ``copy.deepcopy``)."""
        return self._data is not None

    def replica(self) -> Any:
        """A new copy of the object: its own tensors, its own objects."""
        if self._data is None:
            return copy.deepcopy(self.model)
        with self._lock:
            first, self._first = self._first, None
        return first if first is not None else _Replica(self._data, self._tensors).load()


class ModelReplicator(Replicator):
    """Independent copies of ``model`` (``Replicator``), the first checked for what
    training reads of it (``_differs``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model, _differs, "model")


def _same_kind(replica: Any, obj: Any) -> str | None:
    """What a replica of a strategy does not share with it: its class and its attributes'
    names. (A snapshot copies as ``copy.deepcopy`` does wherever a class has no
    ``__deepcopy__`` of its own: both go through ``__reduce_ex__``.)"""
    if type(replica) is not type(obj):
        return f"class {type(replica).__name__} != {type(obj).__name__}"
    if list(vars(replica)) != list(vars(obj)):
        return "attributes differ"
    return None


def strategy_replicator(strategy: Any) -> Replicator:
    """Copies of a job's strategy for its nodes, equal to ``copy.deepcopy(strategy)``."""
    return Replicator(strategy, _same_kind, "strategy")


def _differs(replica: torch.nn.Module, model: torch.nn.Module) -> str | None:
    """What a replica of ``model`` does not copy as ``copy.deepcopy`` would (``None``: all that
    training reads is there: the class, the parameters, the state dict's entries, each in
    memory of its own)."""
    a, b = replica, model
    if type(a) is not type(b):
        return f"class {type(a).__name__} != {type(b).__name__}"
    pa, pb = list(a.named_parameters()), list(b.named_parameters())
    if [(n, type(p), p.requires_grad) for n, p in pa] != [(n, type(p), p.requires_grad) for n, p in pb]:
        return "parameters differ"
    sa, sb = a.state_dict(), b.state_dict()
    if list(sa) != list(sb):
        return "state dict keys differ"
    for k, v in sa.items():
        w = sb[k]
        if not isinstance(v, torch.Tensor) or not isinstance(w, torch.Tensor):
            if v != w:
                return f"state entry {k} differs"
        elif v.dtype != w.dtype or v.shape != w.shape or v.device != w.device or not torch.equal(v, w):
            return f"tensor {k} differs"
    if _shares_storage(a, b):
        return "a replica shares memory with the model"
    return None


def _shares_storage(replica: torch.nn.Module, model: torch.nn.Module) -> bool:
    """Whether a tensor of ``replica`` uses the memory of one of ``model``'s."""

    def storages(m: torch.nn.Module) -> list[int]:
        return [
            t.untyped_storage().data_ptr()
            for t in m.state_dict(keep_vars=True).values()
            if isinstance(t, torch.Tensor) and t.numel()
        ]

    return bool(set(storages(replica)) & set(storages(model)))
