"""What a node writes to a checkpoint and reads back when the run resumes.

A node's state: its model, strategy (inner optimizer, LR scheduler, step, communicator state,
handles in flight), torch RNG streams, data position, training batches drawn, the FLOPs of a
training step, ledger totals, its own simulated clock, metric totals and, on rank 0, the metric
history. The files, folders and RNG streams themselves are ``exogym.runtime.checkpoint``'s.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from exogym.runtime import checkpoint as ckpt

if TYPE_CHECKING:
    from exogym.runtime.node import TrainNode

logger = logging.getLogger(__name__)

#: Ledger totals a checkpoint keeps (per-step records are empty between steps).
_LEDGER_TOTALS = ("total_sent", "total_received", "total_payload", "total_collectives")
#: What a node's file holds (``save``).
_KEYS = "step model strategy rng data batches_drawn step_flops ledger clock metrics history".split()


def save(node: TrainNode, done: int) -> None:
    """Write ``node``'s state after ``done`` steps; rank 0 completes the checkpoint once every
    node has written. Collective (one uncharged barrier)."""
    root, ledger = node.cfg.checkpoint_dir, node.comm.ledger
    assert root is not None
    # The state is freed before the barrier, where the virtual nodes of a worker wait for each
    # other (they would hold every node's state at once).
    state = {
        "step": done,
        "model": node.model.state_dict(),
        "strategy": node.strategy.state_dict(),
        "rng": ckpt.rng_state(node.device),
        "data": node.batches.state_dict(),
        "batches_drawn": node.batches_drawn,
        "step_flops": node.step_flops,
        "ledger": {k: getattr(ledger, k) for k in _LEDGER_TOTALS},
        "clock": node.comm.clock.state_dict(),
        "metrics": node.meter.metrics.state_dict(),
        "history": node.history if node.rank == 0 else None,
    }
    ckpt.write_node(root, done, node.rank, state)
    del state
    node.comm.barrier()  # every node's file is written
    if node.rank == 0:
        folder = ckpt.finalize(root, done, node.checkpoint_meta or {})
        logger.info("checkpoint after step %d: %s", done, folder)


def restore(node: TrainNode, folder: str) -> int:
    """Load ``node``'s state (its data position and metric totals too) from a checkpoint folder,
    in place; return the step it was taken at."""
    state = ckpt.load_node(folder, node.rank, _KEYS)
    node.model.load_state_dict(state["model"])
    node.strategy.load_state_dict(state["strategy"])
    ckpt.set_rng_state(state["rng"], node.device)
    node.batches.load_state_dict(state["data"])
    node.batches_drawn, node.step_flops = state["batches_drawn"], state["step_flops"]
    for k, v in state["ledger"].items():
        setattr(node.comm.ledger, k, v)
    node.comm.clock.load_state_dict(state["clock"])
    node.meter.metrics.load_state_dict(state["metrics"])
    step = int(state["step"])
    if node.rank == 0:
        # Rows the stopped run wrote only because it ended at `step` (a validation or a
        # train row off their intervals) are not rows of this longer run.
        cfg = node.cfg
        node.history = [
            r
            for r in state["history"]
            if r["step"] != step or node.due(step, cfg.log_interval if "train_loss" in r else cfg.val_interval)
        ]
    return step


__all__ = ["restore", "save"]
