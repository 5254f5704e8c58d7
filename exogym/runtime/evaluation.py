"""A node's measurements of the models: validation of its own model and of the all-node
average, how far the nodes' models have drifted apart, and the averaged final state.

Every node runs the same calls (no rank evaluates for the others); rank 0 alone makes the
validation row. The collectives here are measurements, not part of the algorithm: none is
charged to the ledger.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch

from exogym import data as D
from exogym.core.comm.comm import NodeComm
from exogym.core.comm.flat import dtype_buckets, group_by_dtype
from exogym.metrics import MetricsBuffer


class Evaluator:
    """Validation and model averaging for one node.

    Args:
        comm: the node's comm (uncharged collectives only).
        model: the node's model; read, never written.
        device: where the model and the validation batches live.
        val_loader: this node's validation share (``None``: nothing to validate).
        forward: ``forward(batch, model)``, the scalar loss (the node's checked forward pass).
        autocast: a fresh autocast context for a forward pass (the run's setting).
        rank, num_nodes: the node's and the run's.
    """

    def __init__(
        self,
        comm: NodeComm,
        model: torch.nn.Module,
        device: torch.device,
        val_loader: Any,
        forward: Callable[[Any, torch.nn.Module], torch.Tensor],
        autocast: Callable[[], contextlib.AbstractContextManager],
        rank: int,
        num_nodes: int,
    ) -> None:
        self.comm, self.model, self.device, self.val_loader = comm, model, device, val_loader
        self._forward, self._autocast = forward, autocast
        self.rank, self.num_nodes = rank, num_nodes
        #: The scratch copy holding the all-node average (made at the first validation).
        self._avg_model: torch.nn.Module | None = None
        self._avg_buckets: list[Any] = []

    def validate(self, metrics: MetricsBuffer) -> dict[str, Any] | None:
        """Validation of the local models (mean over nodes) and of the all-node average, and how
        far the nodes' models have drifted apart (``divergence``): the row on rank 0,
        ``None`` elsewhere. Collective."""
        local = self.evaluate(self.model)
        avg = self.average_model()
        glob = self.evaluate(avg)
        distance, correlation = self.divergence(avg)
        stats = torch.tensor([*local, *glob, distance], dtype=torch.float64)
        if self.rank != 0:  # only rank 0 makes the row
            self.comm.all_reduce_contribute(stats, "sum")
            return None
        self.comm.all_reduce(stats, op="sum", charge=False)
        v = stats.tolist()
        row = metrics.validation_row(tuple(v[:4]), tuple(v[4:8]))
        row["param_distance"] = v[8] / self.num_nodes
        if correlation is not None:
            row["model_correlation"] = correlation
        return row

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> tuple[float, float, float, float]:
        """``(loss sum, examples, correct, labelled)`` of ``model`` on this node's validation share.

        Accuracy is counted when the model has ``logits(inputs)`` and batches are
        ``(inputs, integer labels)``. ``model`` is left in the train/eval mode it was in.
        """
        was_training = model.training
        model.eval()
        total = count = correct = labelled = 0.0
        with_logits = callable(getattr(model, "logits", None))
        for batch in self.val_loader or []:
            batch = D.to_device(batch, self.device)
            n = D.batch_len(batch)
            with self._autocast():
                total += self._forward(batch, model).item() * n
                labels = batch[1] if isinstance(batch, (tuple, list)) and len(batch) == 2 else None
                if with_logits and labels is not None and not labels.is_floating_point():
                    correct += (model.logits(batch[0]).argmax(-1) == labels).sum().item()
                    labelled += labels.numel()
            count += n
        model.train(was_training)
        return total, count, correct, labelled

    @torch.no_grad()
    def divergence(self, avg: torch.nn.Module) -> tuple[float, float | None]:
        """``(this node's L2 distance to the all-node average, the mean pairwise Pearson
        correlation of the nodes' models)`` over the floating-point state, flattened in
        ``state_dict`` order. The correlation costs one uncharged all-reduce of the model's
        size, whatever the number of nodes: with ``z_i`` node ``i``'s standardised vector (zero
        mean, unit norm), ``corr(i, j) = z_i . z_j``, so the mean over pairs is
        ``(|sum_i z_i|^2 - K) / (K (K - 1))``. ``None`` with one node, and on ranks other than
        0 (they only send their share). Collective."""
        mine = [t for t in self.model.state_dict().values() if t.is_floating_point()]
        theirs = [t for t in avg.state_dict().values() if t.is_floating_point()]
        x = torch.cat([t.reshape(-1).float() for t in mine])
        distance = float(torch.linalg.vector_norm(x - torch.cat([t.reshape(-1).float() for t in theirs])))
        k = self.num_nodes
        if k < 2:
            return distance, None
        z = x - x.mean()
        norm = torch.linalg.vector_norm(z)
        z = z / norm if norm > 0 else torch.full_like(z, float("nan"))  # a constant model has no correlation
        if self.rank != 0:
            self.comm.all_reduce_contribute(z, "sum")
            return distance, None
        self.comm.all_reduce(z, op="sum", charge=False)
        return distance, (float(z.double().square().sum()) - k) / (k * (k - 1))

    @torch.no_grad()
    def average_model(self) -> torch.nn.Module:
        """A scratch copy of the model holding the mean of all nodes' floating-point state (the
        same copy at every call, overwritten). Collective."""
        if self._avg_model is None:
            self._avg_model = copy.deepcopy(self.model)
            floats = [t for t in self._avg_model.state_dict().values() if t.is_floating_point()]
            self._avg_buckets = dtype_buckets(floats)
        self._avg_model.load_state_dict(self.model.state_dict())
        self._average_in_place(self._avg_buckets)
        return self._avg_model

    @torch.no_grad()
    def averaged_state(self, needed: bool = True) -> dict[str, torch.Tensor] | None:
        """The all-node average of the final state (floating-point entries; others are this
        node's), on CPU. A node that does not ``need`` it only sends its share (``None``: on
        virtual nodes it does not wait for the others). Collective."""
        if not needed:
            floats = [t.detach() for t in self.model.state_dict().values() if t.is_floating_point()]
            for idx in group_by_dtype(floats):  # the buckets' layout, in one copy each
                self.comm.all_reduce_contribute(torch.cat([floats[i].reshape(-1) for i in idx]), "sum")
            return None
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self._average_in_place(dtype_buckets([t for t in state.values() if t.is_floating_point()]))
        return {k: v.cpu() for k, v in state.items()}

    def _average_in_place(self, buckets: list[Any]) -> None:
        """Replace each bucket's tensors by their mean over all nodes (uncharged). Collective."""
        for bucket in buckets:
            self.comm.all_reduce(bucket.buffer.pack(bucket.tensors), op="mean", charge=False)
            bucket.buffer.unpack(bucket.tensors)


__all__ = ["Evaluator"]
