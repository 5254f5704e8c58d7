"""Top-k gradient sparsification with error feedback, the classic compressed-gradient baseline.

Every step each node adds its residual to its gradient, keeps the ``k`` largest-magnitude
entries of each tensor, sends them as (index, value) pairs, and keeps the rest as its residual
for the next step (gradient dropping with residual accumulation: Aji & Heafield 2017, arXiv
1704.05021, Section 2; Deep Gradient Compression, Lin et al. 2018, arXiv 1712.01887, Algorithm 1
without its momentum correction, local clipping, masking and warm-up). The gradient the inner
optimizer applies is the mean over the nodes of their sparse tensors (entries a node did not
send count as zeros in its tensor).

Per tensor of ``n`` entries a node sends ``k_t = min(n, max(1, round(k * n)))`` pairs, chosen
per tensor (layer-wise, as DGC). All tensors of a step travel in **one** all-gather of a byte
buffer: per tensor the values (the tensor's dtype) then the indices (int32; int64 for a tensor
of 2^31 entries or more). Bytes per node and step (ledger): an all-gather of payload
``sum_t k_t * (4 + value bytes)``, i.e. ``(K-1)`` such payloads sent per node.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from communicators.bitpack import all_gather_bytes
from communicators.checks import check_number
from exogym.core.pipeline import Communicator, NodeContext


def topk_count(numel: int, fraction: float) -> int:
    """Entries a tensor of ``numel`` entries sends: ``min(numel, max(1, round(fraction * numel)))``."""
    return min(numel, max(1, round(fraction * numel)))


def index_dtype(numel: int) -> torch.dtype:
    """int32 where it can address every entry, else int64."""
    return torch.int32 if numel < 2**31 else torch.int64


class TopKCommunicator(Communicator):
    """Every step: residual += gradient; send each tensor's top-``k`` fraction (by magnitude) of
    the residual and remove it from the residual; the gradient becomes the mean of every node's
    sparse tensor.

    The residuals (one per parameter, the parameter's shape) are the module's state. The payload
    is an all-gather, which cannot leave a node out of a round: faults that drop nodes are
    refused with this module. The payload is coded bytes (values and indices in one buffer,
    ``payloads = "coded"``), so a quantizing wire transform is refused with it too.

    Args:
        k: fraction of each tensor's entries sent per step, in ``(0, 1]`` (``1`` is DDP).
    """

    space: ClassVar[str] = "grad"
    #: Values and indices travel in one byte buffer: a quantizing wire is refused.
    payloads: ClassVar[str] = "coded"

    def __init__(self, k: float = 0.01) -> None:
        super().__init__(H=1)
        check_number("k", k, 0, 1, "the fraction of each tensor's entries sent", above=True, upto=True)
        self.k = float(k)

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        # contiguous (whatever the parameter's strides), so that a flat view selects entries
        self.residuals = [torch.zeros(p.shape, dtype=p.dtype, device=p.device) for p in self.params]
        self.counts = [topk_count(p.numel(), self.k) for p in self.params]

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        sent = []
        for p, residual, k in zip(self.params, self.residuals, self.counts, strict=True):
            if p.grad is not None:
                residual.add_(p.grad)
            flat = residual.view(-1)
            idx = flat.abs().topk(k, sorted=False).indices
            sent += [flat[idx], idx.to(index_dtype(p.numel()))]
            flat[idx] = 0  # sent: it leaves the residual
        received = all_gather_bytes(self.ctx.comm, sent, tag="topk_ef")  # per tensor: [nodes, k]
        for p, all_values, all_index in zip(self.params, received[::2], received[1::2], strict=True):
            mean = torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
            for values, index in zip(all_values, all_index.long(), strict=True):  # node by node
                mean.index_add_(0, index, values)
            p.grad = mean.div_(all_values.shape[0]).view(p.shape)

    def state_dict(self) -> dict[str, Any]:
        return {"residuals": list(self.residuals)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for r, t in zip(self.residuals, state["residuals"], strict=True):
            r.copy_(t)

    def describe(self) -> str:
        return f"TopK(k={self.k}, error feedback)"


__all__ = ["TopKCommunicator", "index_dtype", "topk_count"]
