"""CGAD, Cosine-Gated Adam-Decay (Shah & Sun 2026, "Cosine-Gated Adam-Decay: Drop-In
Staleness-Aware Outer Optimization for Decoupled DiLoCo", arXiv 2605.09126): an outer optimizer
that scales each incoming pseudo-gradient by its age before Adam sees it,

    sigma(tau) = gamma(tau) * exp(-alpha * tau),
    gamma(tau) = (1 + cos(pi * tau / cutoff)) / 2   for tau < cutoff,   0 beyond,

so that ``sigma(0) = 1`` (plain Adam on fresh pseudo-gradients), the exponential decays the
information of older ones and the cosine gate takes those ``cutoff`` or more merges old out
smoothly (``cutoff = inf``: no gate, the paper's Adam-Decay baseline). Per fragment (the paper's
partial-sync variant, PA-CGAD) its own ages, its own Adam moments and its own step count, so a
fragment's bias correction counts its own merges. The gate's shape and the defaults are
ExoGym's (see the Decoupled DiLoCo docs page): the paper's body was not read, only its abstract.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from communicators.checks import check_number, is_number


def cgad_scale(tau: int, alpha: float, cutoff: float) -> float:
    """``sigma(tau) = gamma(tau) exp(-alpha tau)``, the factor of a pseudo-gradient ``tau`` merges
    old: ``1`` at ``tau = 0``, ``0`` from ``tau = cutoff`` on (see the module docstring)."""
    if tau >= cutoff:
        return 0.0
    return 0.5 * (1.0 + math.cos(math.pi * tau / cutoff)) * math.exp(-alpha * tau)


def check_cgad(alpha: Any, cutoff: Any, betas: Any, eps: Any) -> None:
    """``ValueError`` naming the argument where a CGAD setting is not usable."""
    check_number("cgad_alpha", alpha, 0, why="the decay per merge of age")
    if cutoff != math.inf:
        why = "the age, in merges, from which a contribution is gated out; float('inf') for no gate"
        check_number("cgad_cutoff", cutoff, 0, why=why, above=True)
    if not (isinstance(betas, tuple) and len(betas) == 2 and all(is_number(b) and 0 <= b < 1 for b in betas)):
        raise ValueError(f"cgad_betas must be a tuple of two numbers in [0, 1) (Adam's betas), got {betas!r}")
    check_number("cgad_eps", eps, 0, why="Adam's epsilon", above=True)


class CGAD:
    """Adam on the fragments of a flat parameter tensor, one state per fragment.

    The caller scales each contribution by ``cgad_scale`` and sums them into the fragment's
    pseudo-gradient ``g``; ``step`` then makes one Adam step (``torch.optim.Adam``'s rule,
    no weight decay) on the fragment:

        t += 1;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        theta -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    Args:
        like: a tensor of the flat parameters' size, dtype and device (the moments are zeros like it).
        fragments: the number of fragments (each has its own step count).
        lr, betas, eps: Adam's step size, betas and epsilon.
    """

    def __init__(self, like: torch.Tensor, fragments: int, lr: float, betas: tuple[float, float], eps: float) -> None:
        self.lr, self.betas, self.eps = lr, betas, eps
        #: Adam's first and second moments over the flat parameters.
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(like), torch.zeros_like(like)
        #: Per fragment, the Adam steps made on it.
        self.steps = [0] * fragments

    @torch.no_grad()
    def step(self, p: int, bounds: tuple[int, int], theta: torch.Tensor, grad: torch.Tensor) -> None:
        """One Adam step on fragment ``p`` (entries ``bounds`` of the flat tensors): ``theta`` (that
        slice of the parameters) is updated in place from ``grad`` (its pseudo-gradient)."""
        (b1, b2), (a, b) = self.betas, bounds
        m, v = self.exp_avg[a:b], self.exp_avg_sq[a:b]
        self.steps[p] += 1
        t = self.steps[p]
        m.lerp_(grad, 1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(self.eps)
        theta.addcdiv_(m, denom, value=-self.lr / (1 - b1**t))

    def state_dict(self) -> dict[str, Any]:
        """The moments and the per-fragment step counts (a checkpoint's part)."""
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "steps": list(self.steps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s output in place."""
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.steps = [int(s) for s in state["steps"]]


__all__ = ["CGAD", "cgad_scale", "check_cgad"]
