"""``Faults``: what goes wrong in a run, as ``Trainer.fit(faults=...)`` takes it.

The faults section of a run's configuration: a description that checks itself when made. The
runtime binds it to a run as ``exogym.runtime.faults.FaultPlan``, which says who drops out
of which round and how slow each node is at each step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Faults:
    """What goes wrong in a run (``Trainer.fit(faults=...)``).

    Args:
        drop: ``{round: nodes}``: the nodes that drop out of that round (0-based rounds; one
            node or a list), e.g. ``{1: [2]}`` drops node 2 for round 1.
        drop_probability: each node drops out of each round with this probability,
            independently (in ``[0, 1)``). If the draws (with ``drop``) would take every node,
            the node with the largest draw among those ``drop`` does not name stays.
        slowdown: a ``torch.distributions.Distribution`` of positive scalars: the factor each
            node's compute time is multiplied by, drawn per node and step, e.g.
            ``torch.distributions.LogNormal(0.0, 0.5)``.
        seed: the seed of the draws; ``None`` uses the run's ``seed``.

    Example::

        faults = Faults(drop={3: [2]}, drop_probability=0.05, slowdown=LogNormal(0.0, 0.5))
        trainer.fit(DiLoCoStrategy(H=50), num_nodes=8, faults=faults)
    """

    drop: Mapping[int, int | Sequence[int]] = field(default_factory=dict)
    drop_probability: float = 0.0
    slowdown: torch.distributions.Distribution | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.drop, Mapping):
            raise TypeError(f"Faults(drop=...) must be a mapping {{round: nodes}}, e.g. {{1: [2]}}; got {self.drop!r}")
        for r, nodes in self.drop.items():
            if not isinstance(r, int) or isinstance(r, bool) or r < 0:
                raise ValueError(f"Faults(drop=...) keys are rounds (ints >= 0), got {r!r}")
            for n in node_list(nodes):
                if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                    raise ValueError(f"Faults(drop={{{r}: ...}}) must name nodes as ints >= 0, got {nodes!r}")
        p = self.drop_probability
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(f"Faults(drop_probability=...) must be in [0, 1), got {p!r}")
        d = self.slowdown
        if d is not None:
            if not isinstance(d, torch.distributions.Distribution):
                raise TypeError(
                    "Faults(slowdown=...) must be a torch.distributions.Distribution (e.g. "
                    f"torch.distributions.LogNormal(0.0, 0.5)), got {type(d).__name__}"
                )
            if tuple(d.batch_shape) or tuple(d.event_shape):
                raise ValueError(
                    f"Faults(slowdown=...) must draw scalars, got batch_shape={tuple(d.batch_shape)} "
                    f"event_shape={tuple(d.event_shape)}"
                )
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise TypeError(f"Faults(seed=...) must be an int or None, got {self.seed!r}")

    @property
    def drops(self) -> bool:
        """Whether any node can drop out."""
        return self.drop_probability > 0 or any(node_list(n) for n in self.drop.values())

    def to_dict(self) -> dict[str, Any]:
        """Plain values for logs and run configs."""
        return {
            "drop": {int(r): node_list(n) for r, n in self.drop.items()},
            "drop_probability": float(self.drop_probability),
            "slowdown": None if self.slowdown is None else repr(self.slowdown),
            "seed": self.seed,
        }


def node_list(nodes: int | Sequence[int]) -> list[int]:
    """One node or a sequence of nodes (a value of ``Faults.drop``) as a list."""
    return [nodes] if isinstance(nodes, int) and not isinstance(nodes, bool) else list(nodes)
