"""Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512): DiLoCo's outer step on fragments
of the model, in a staggered schedule, with the outer update applied ``tau`` steps late.

The trainable parameters of each dtype, flattened in model order, are cut into ``F`` contiguous
fragments of (almost) equal size. Fragment ``f`` synchronises every ``H`` steps, after local
steps ``s`` with ``(s + 1) % H == floor((f + 1) * H / F) % H`` (so the last fragment keeps
DiLoCo's schedule, and the others are spread evenly before it, as torchft's fragments are).

At a fragment's sync step each rank starts the all-reduce of ``delta_f = theta_global_f -
theta_local_f`` (its mean over the ranks) without waiting for it
(``exogym.core.comm.handles``). ``tau = overlap_steps`` steps later, while training went on,
every rank waits for it and applies it: the outer optimizer steps ``theta_global_f`` with the mean
``delta_f`` as its gradient, and the local fragment becomes
``alpha * theta_local_f + (1 - alpha) * theta_global_f`` (``alpha = 0``: the new global values,
discarding the local progress of the ``tau`` steps, as torchft does; the paper suggests 0.5
with ``tau > 0``). With ``F = 1``, ``tau = 0`` and ``alpha = 0`` this is DiLoCo. An update still
in flight when the run ends (sent in its last ``tau`` steps) is not applied, as it would land
after training; a checkpoint keeps it, so a run resumed for more steps applies it on time.

Per step, at most one fragment travels: the peak bytes per step are ``1/F`` of DiLoCo's, the
total is the same. A fragment's transfer runs on the simulated clock while the next ``tau``
steps compute: the wait after them stalls the node only for what they did not cover (all of
it with ``tau = 0``).

``overlap_steps="auto"`` applies each update at the first step at which its transfer has
arrived on the node's clock (``is_completed()``), so how many steps the overlap hides follows
the link speed: on a link fast enough to deliver it within a step's compute it lands one step
later, on a slow one several. It lands at the latest before its fragment is sent again (a wait
there stalls the node). This needs modelled compute (``Network(compute=<seconds per step>)``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from communicators.aggregation import Rule, aggregate_all_reduce, describe_rule, resolve
from communicators.checks import check_int, check_number
from communicators.diloco import DEFAULT_OUTER
from exogym.core.comm.entries import Entries
from exogym.core.comm.flat import dtype_buckets
from exogym.core.comm.handles import AUTO, CollectiveHandle, check_modelled_compute
from exogym.core.optim import OptimSpec
from exogym.core.pipeline import Communicator, NodeContext


class StreamingDiLoCoCommunicator(Communicator):
    """DiLoCo on ``num_fragments`` staggered fragments with ``overlap_steps`` of delay.

    Args:
        H: inner steps between two synchronisations of the same fragment.
        num_fragments: F, the number of fragments (``1 <= F <= H``).
        overlap_steps: tau, the steps between sending a fragment's pseudo-gradient and applying
            its outer update (``0 <= tau < H``), or ``"auto"``: when its transfer has arrived on
            the simulated clock (see the module docstring).
        alpha: the share of the local values kept when the update is applied (``[0, 1]``).
        outer_optim: the outer optimizer (default Nesterov SGD, lr 0.7, momentum 0.9).
        aggregate: how the nodes' fragment pseudo-gradients become one
            ([`communicators.aggregation`][communicators.aggregation]; ``"mean"``, the default,
            is the paper's all-reduce; another rule gathers the fragment, and its aggregate
            lands ``tau`` steps later as the mean would).
    """

    space: ClassVar[str] = "param"
    #: Each payload says which entries (its fragment's) it carries: error feedback per entry.
    payloads: ClassVar[str] = "located"

    def __init__(
        self,
        H: int = 100,
        num_fragments: int = 2,
        overlap_steps: int | str = 0,
        alpha: float = 0.0,
        outer_optim: OptimSpec | None = None,
        aggregate: str | Rule = "mean",
    ) -> None:
        super().__init__(H)
        #: The aggregation rule (``aggregate``), applied through ``aggregate_all_reduce``.
        self.rule = resolve(aggregate)
        check_int("num_fragments", num_fragments, 1, H, "at most H: one fragment syncs at a time")
        if overlap_steps != AUTO and (
            not isinstance(overlap_steps, int) or isinstance(overlap_steps, bool) or not 0 <= overlap_steps < H
        ):
            raise ValueError(
                f"overlap_steps must be an int in [0, H={H}) (a fragment's update lands before its next sync) or "
                f"'auto' (when its transfer arrives on the simulated clock), got {overlap_steps!r}"
            )
        check_number("alpha", alpha, 0, 1, "the share of local values kept", upto=True)
        self.outer_spec = outer_optim if outer_optim is not None else DEFAULT_OUTER
        if not isinstance(self.outer_spec, OptimSpec):
            raise TypeError(f"outer_optim must be an OptimSpec, got {outer_optim!r}")
        self.num_fragments, self.overlap_steps, self.alpha = num_fragments, overlap_steps, float(alpha)
        #: Fragment f syncs after steps s with (s + 1) % H == offsets[f].
        self.offsets = [math.floor((f + 1) * H / num_fragments) % H for f in range(num_fragments)]
        #: "auto" asks the clock whether a transfer has arrived while the step runs: with
        #: compute="flops", the run turns FLOPs into seconds per step before it starts.
        self.needs_step_seconds = overlap_steps == AUTO  # type: ignore[misc]

    def setup(self, ctx: NodeContext) -> None:
        super().setup(ctx)
        if self.overlap_steps == AUTO:
            check_modelled_compute(ctx.network, "overlap_steps='auto'")
        self.params = [p for p in ctx.model.parameters() if p.requires_grad]
        self.buckets = dtype_buckets(self.params)
        F = self.num_fragments
        #: bounds[b][f]: fragment f's slice of bucket b's flat parameters.
        self.bounds: list[list[tuple[int, int]]] = []
        #: global_[f][b]: theta_global of fragment f in bucket b (a leaf the outer optimizer steps).
        self.global_: list[list[torch.Tensor]] = [[] for _ in range(F)]
        for bucket in self.buckets:
            flat = bucket.buffer.pack(bucket.tensors)
            n = flat.numel()
            cuts = [round(i * n / F) for i in range(F + 1)]
            self.bounds.append(list(zip(cuts, cuts[1:], strict=False)))
            for f, (lo, hi) in enumerate(self.bounds[-1]):
                self.global_[f].append(flat[lo:hi].detach().clone())
        self.outer = [self.outer_spec.build(g) for g in self.global_]
        #: Sent, not yet applied: (step to apply after, -1 with "auto"; fragment; one handle per
        #: bucket, whose wait gives the mean delta).
        self.pending: list[tuple[int, int, list[CollectiveHandle]]] = []

    def fragments_due(self, step: int) -> list[int]:
        """The fragments whose pseudo-gradient is sent after local step ``step``."""
        return [f for f, off in enumerate(self.offsets) if (step + 1) % self.H == off]

    def is_due(self, step: int) -> bool:
        """Whether a fragment is sent, or a sent one may be applied, after ``step`` (with
        ``"auto"``, at every step while one is in flight)."""
        if self.fragments_due(step):
            return True
        return bool(self.pending) if self.overlap_steps == AUTO else any(p[0] == step for p in self.pending)

    @torch.no_grad()
    def communicate(self, step: int) -> None:
        for f in self.fragments_due(step):
            if self.overlap_steps == AUTO:  # its previous update lands before it is sent again
                self._land([p for p in self.pending if p[1] == f])
            self._send(step, f)
        if self.overlap_steps == AUTO:
            self._land([p for p in self.pending if all(h.is_completed() for h in p[2])])
        else:
            self._land([p for p in self.pending if p[0] == step])

    def _land(self, ready: list[tuple[int, int, list[CollectiveHandle]]]) -> None:
        """Wait for the ``ready`` updates and apply them."""
        for item in ready:
            self.pending.remove(item)
            self._apply(item[1], [h.wait() for h in item[2]])

    def _send(self, step: int, f: int) -> None:
        handles = []
        for b, bucket in enumerate(self.buckets):
            lo, hi = self.bounds[b][f]
            local = bucket.buffer.pack(bucket.tensors)[lo:hi]
            delta = self.global_[f][b] - local
            entries = Entries.of_range(bucket.tensors, lo, hi)
            handle = aggregate_all_reduce(
                self.ctx, delta, self.rule, step, "streaming_diloco", entries=entries, async_op=True
            )
            handles.append(handle)
        land = -1 if self.overlap_steps == AUTO else step + self.overlap_steps
        self.pending.append((land, f, handles))

    def _apply(self, f: int, deltas: list[torch.Tensor]) -> None:
        for g, d in zip(self.global_[f], deltas, strict=True):
            g.grad = d
        self.outer[f].step()
        for b, bucket in enumerate(self.buckets):
            g = self.global_[f][b]
            g.grad = None
            lo, hi = self.bounds[b][f]
            flat = bucket.buffer.pack(bucket.tensors)
            flat[lo:hi].mul_(self.alpha).add_(g, alpha=1.0 - self.alpha)
            bucket.buffer.unpack(bucket.tensors)

    def state_dict(self) -> dict[str, Any]:
        return {
            "global": [list(g) for g in self.global_],
            "outer": [o.state_dict() for o in self.outer],
            "pending": [(s, f, [h.state_dict() for h in hs]) for s, f, hs in self.pending],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for mine, saved in zip(self.global_, state["global"], strict=True):
            for g, t in zip(mine, saved, strict=True):
                g.copy_(t)
        for o, s in zip(self.outer, state["outer"], strict=True):
            o.load_state_dict(s)
        clock = self.ctx.comm.clock
        self.pending = [(int(s), int(f), [clock.resume(h) for h in hs]) for s, f, hs in state["pending"]]

    def describe(self) -> str:
        return (
            f"StreamingDiLoCo(H={self.H}, fragments={self.num_fragments}, overlap={self.overlap_steps}, "
            f"alpha={self.alpha}, outer={self.outer_spec!r}" + describe_rule(self.rule) + ")"
        )
