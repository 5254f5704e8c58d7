"""Idle nodes' state in host memory: ``fit(offload_idle_nodes=True)``.

With client sampling, most virtual nodes of a worker sit most rounds out. Offloading keeps a
node's state on the CPU while it does, and on the worker's device only while it works: 1,000
FedAvg clients of a CNN then need device memory for the sampled few, not for all of them.

A node's *state* is every tensor its model and strategy hold between steps: the model's
parameters, their gradients and the buffers; the optimizer's state (``step`` counters stay where
the optimizer keeps them, as ``Optimizer.load_state_dict`` does); and the tensors of the
strategy, its communicators and their buffers (attributes, lists, tuples and dicts of them, and
the objects of strategy and communicator classes, dataclasses and ExoGym classes they hold).
Tensors kept inside other objects, e.g. a dataset a custom strategy holds, are not state and
stay where they are.

Tensors are moved in place (``t.data = moved``): every reference to them (the optimizer's
parameters, a communicator's list of parameters, a ``FlatBuffer``'s
views) stays valid, and a view is re-made over its moved base, so it still shares its memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from exogym.core.comm.comm import NodeComm
from exogym.core.pipeline import Communicator
from exogym.core.strategy import Strategy

#: Modules whose classes' objects the walk enters (besides strategies, communicators, dataclasses).
_OWN_PACKAGES = ("exogym.", "communicators.")


def node_state(model: torch.nn.Module, strategy: Strategy) -> list[torch.Tensor]:
    """Every tensor of a node's state (see the module docstring), each once: the tensors that
    own their memory first, then the views."""
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    _walk(model, found, seen)
    _walk(strategy, found, seen)
    tensors = list(found.values())
    return [t for t in tensors if t._base is None] + [t for t in tensors if t._base is not None]


def move_state(tensors: list[torch.Tensor], to: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Give each tensor of ``node_state`` the memory ``to`` makes of it (``to(t)`` returns a
    copy of ``t``'s data, e.g. ``t.to(device)``), in place; views are re-made over their moved
    bases."""
    offsets = {id(t): t.storage_offset() for t in tensors if t._base is None}
    with torch.no_grad():
        for t in tensors:
            if t._base is None:
                t.data = to(t)
        for t in tensors:
            base = t._base
            if base is not None:
                offset = base.storage_offset() + t.storage_offset() - offsets.get(id(base), base.storage_offset())
                t.data = base.data.as_strided(t.size(), t.stride(), offset)


def _walk(obj: Any, found: dict[int, torch.Tensor], seen: set[int]) -> None:
    if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        found[id(obj)] = obj
        for related in (obj.grad, obj._base):
            if related is not None:
                _walk(related, found, seen)
    elif isinstance(obj, torch.optim.Optimizer):
        hosted = {id(p): bool(g.get("capturable") or g.get("fused")) for g in obj.param_groups for p in g["params"]}
        for g in obj.param_groups:
            _walk(g["params"], found, seen)
        for p, state in obj.state.items():
            for key, value in state.items():
                if key != "step" or hosted.get(id(p), False):
                    _walk(value, found, seen)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for x in obj:
            _walk(x, found, seen)
    elif isinstance(obj, dict):
        for x in obj.values():
            _walk(x, found, seen)
    elif isinstance(obj, NodeComm) or not _enters(obj):  # (a comm leads to every node's state)
        return
    else:
        for x in _attributes(obj):
            _walk(x, found, seen)


def _enters(obj: Any) -> bool:
    """Whether the walk looks inside ``obj``: modules, strategies, communicators, dataclasses
    and objects of ExoGym's own classes (not datasets, loggers, comms)."""
    if isinstance(obj, (torch.nn.Module, Strategy, Communicator)):
        return True
    if isinstance(obj, type) or not (hasattr(obj, "__dict__") or hasattr(type(obj), "__slots__")):
        return False
    return dataclasses.is_dataclass(obj) or type(obj).__module__.startswith(_OWN_PACKAGES)


def _attributes(obj: Any) -> list[Any]:
    values = list(vars(obj).values()) if hasattr(obj, "__dict__") else []
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(obj, name):
                values.append(getattr(obj, name))
    return values


class Offloader:
    """Moves one node's state between the worker's device and host memory.

    Args:
        model: the node's model.
        strategy: its strategy, after ``_init_node`` (its optimizer and buffers exist).
        device: the worker's device, where the node works.

    The state is found again at every move (an optimizer makes its state at its first step;
    communicators may add tensors as they go).
    """

    def __init__(self, model: torch.nn.Module, strategy: Strategy, device: torch.device) -> None:
        self.model, self.strategy, self.device = model, strategy, device
        #: Whether the state is on ``device`` now.
        self.resident = next((t.device == device for t in model.parameters()), True)

    def to_device(self) -> None:
        """Bring the state to the device (no-op when it is there)."""
        if not self.resident:
            move_state(node_state(self.model, self.strategy), self._to_device)
            self.resident = True

    def to_host(self) -> None:
        """Send the state to host memory (no-op when it is there)."""
        if self.resident:
            move_state(node_state(self.model, self.strategy), _to_host)
            self.resident = False

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        return _to_device(t, self.device)


def _to_host(t: torch.Tensor) -> torch.Tensor:
    return t.to("cpu")


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t.to(device)
