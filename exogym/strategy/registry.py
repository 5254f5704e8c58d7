"""Preset strategies by name, for the command line and the benchmarks.

Each entry builds a fresh strategy from the inner learning rate (AdamW inner optimizer).

The DiLoCo presets use outer Nesterov momentum 0.5 instead of the paper's 0.9 (outer lr 0.7 in
both): the paper tunes for hundreds of outer steps, while a comparison of a few hundred inner
steps has about ten. On ``exogym compare``'s default run (digits, 4 nodes, 200 steps, H=20)
momentum 0.9 ends at validation loss 0.47 (rising from 0.30 at step 80), 0.5 at 0.11 (DDP
0.105); the sweep is in docs/getting-started/first-comparison.md.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import exogym.strategy as S  # its names are imported when a preset is built, not here

if TYPE_CHECKING:
    from exogym.core.optim import OptimSpec
    from exogym.core.strategy import Strategy


def _adamw(lr: float) -> OptimSpec:
    """The inner optimizer of the presets (``torch.optim.AdamW``)."""
    return S.OptimSpec.from_string("adamw", lr=lr)


#: Outer Nesterov momentum of the DiLoCo presets (see the module docstring).
OUTER_MOMENTUM = 0.5

#: name -> (factory, one-line description). A factory's signature declares the parameters the
#: preset takes (``lr``, and ``H`` where it has a communication period, ...): a sweep varies a
#: preset along the parameters its factory names and runs it once for the others.
PRESETS: dict[str, tuple[Callable[..., Strategy], str]] = {
    "ddp": (
        lambda lr, aggregate="mean": S.SimpleReduceStrategy(_adamw(lr), aggregate=aggregate),
        "gradient all-reduce every step",
    ),
    "fedavg": (
        lambda lr, H=20, aggregate="mean": S.FedAvgStrategy(H=H, optim_spec=_adamw(lr), aggregate=aggregate),
        "model averaging every H steps",
    ),
    "diloco": (
        lambda lr, H=20, aggregate="mean": S.DiLoCoStrategy(
            H=H, outer_momentum=OUTER_MOMENTUM, optim_spec=_adamw(lr), aggregate=aggregate
        ),
        "Nesterov outer step (lr 0.7, momentum 0.5) on the mean pseudo-gradient every H steps",
    ),
    "sparta": (
        lambda lr, p_sparta=0.005: S.SPARTAStrategy(p_sparta=p_sparta, optim_spec=_adamw(lr)),
        "average 0.5% of the parameters every step",
    ),
    "demo": (
        lambda lr: S.DeMoStrategy(S.OptimSpec.from_string("sgd", lr=lr)),
        "DeMo: DCT top-32 of chunk 64 of the decoupled momentum, sign-SGD",
    ),
    "streaming_diloco": (
        lambda lr, H=20, aggregate="mean": S.StreamingDiLoCoStrategy(
            H=H,
            num_fragments=min(2, H),
            overlap_steps=min(1, H - 1),
            alpha=0.5,
            outer_momentum=OUTER_MOMENTUM,
            optim_spec=_adamw(lr),
            aggregate=aggregate,
        ),
        "Streaming DiLoCo: 2 fragments staggered over H steps, updates 1 step late, alpha 0.5",
    ),
    "sparta_diloco": (
        lambda lr, H=20, p_sparta=0.005, aggregate="mean": S.SPARTADiLoCoStrategy(
            p_sparta=p_sparta, H=H, outer_momentum=OUTER_MOMENTUM, optim_spec=_adamw(lr), aggregate=aggregate
        ),
        "SPARTA every step plus DiLoCo every H steps",
    ),
    "topk_ef": (
        lambda lr, k=0.01: S.TopKEFStrategy(k=k, optim_spec=_adamw(lr)),
        "top 1% of each gradient tensor (index + value) all-gathered every step, error feedback",
    ),
    "powersgd": (
        lambda lr, H=20: S.PowerSGDStrategy(rank=4, start_iter=H, optim_spec=_adamw(lr)),
        "PowerSGD: rank-4 gradient factors with error feedback and warm start, after H dense steps",
    ),
    "desloc": (
        lambda lr, H=20, aggregate="mean": S.DESLOCStrategy(Kx=H, optim_spec=_adamw(lr), aggregate=aggregate),
        "DES-LOC: local AdamW; parameters averaged every H steps, moments every 3H and 6H",
    ),
    "muloco": (
        lambda lr, H=20, aggregate="mean": S.MuLoCoStrategy(
            H=H, outer_momentum=OUTER_MOMENTUM, adamw_lr=lr, aggregate=aggregate
        ),
        "MuLoCo: DiLoCo's outer step every H steps, inner Muon (lr 0.02) on hidden matrices, AdamW (lr) on the rest",
    ),
    "noloco": (
        lambda lr, H=20: S.NoLoCoStrategy(H=H, outer_momentum=OUTER_MOMENTUM, optim_spec=_adamw(lr)),
        "NoLoCo: every H steps an outer step (lr 0.7, momentum 0.5) averaged with one random peer",
    ),
    "sparseloco": (
        lambda lr, H=20: S.SparseLoCoStrategy(H=H, chunk=64, k=128, optim_spec=_adamw(lr)),
        "SparseLoCo: every H steps top-128 of each 64x64 block (3%) of the error-feedback buffer, 2-bit values",
    ),
    "eager_diloco": (
        lambda lr, H=20, aggregate="mean": S.EagerDiLoCoStrategy(
            H=H, outer_momentum=OUTER_MOMENTUM, optim_spec=_adamw(lr), aggregate=aggregate
        ),
        "DiLoCo with eager updates: the all-reduce overlaps the next H steps; own share at once, others' a round late",
    ),
    "async_diloco": (
        lambda lr, H=20: S.AsyncDiLoCoStrategy(H=H, outer_momentum=OUTER_MOMENTUM, optim_spec=_adamw(lr)),
        "Async DiLoCo: each node pushes after H steps (fewer on slower nodes), delayed Nesterov on the server",
    ),
    "fedbuff": (
        lambda lr, H=20, aggregate="mean": S.FedBuffStrategy(
            local_steps=H, buffer_size=2, concurrency=None, optim_spec=_adamw(lr), aggregate=aggregate
        ),
        "FedBuff: half the clients train H steps at a time; the server steps every 2 staleness-scaled updates",
    ),
    "halos": (
        lambda lr, H=20: S.HALoSStrategy(H=H, optim_spec=_adamw(lr)),
        "HALoS: nodes push to their region's server after H steps; regional servers merge with a global one",
    ),
    "decoupled_diloco": (
        lambda lr, H=20, aggregate="mean": S.DecoupledDiLoCoStrategy(
            H=H, outer_momentum=OUTER_MOMENTUM, optim_spec=_adamw(lr), aggregate=aggregate
        ),
        "Decoupled DiLoCo: nodes never wait; a merge every H steps once half the nodes sent, within a grace window",
    ),
}


def parameters(factory: Callable[..., Strategy]) -> dict[str, Any]:
    """The parameters a strategy factory takes (its signature's names, in order) -> their
    defaults (``inspect.Parameter.empty`` where there is none)."""
    return {n: p.default for n, p in inspect.signature(factory).parameters.items()}


def call_factory(factory: Callable[..., Strategy], values: Mapping[str, Any]) -> Strategy:
    """``factory`` called with those of ``values`` that its signature names (a preset without a
    communication period is built without ``H``)."""
    return factory(**{n: values[n] for n in parameters(factory) if n in values})


def build(name: str, lr: float, H: int, params: Mapping[str, Any] | None = None) -> Strategy:
    """A fresh preset strategy from ``lr``, ``H`` and ``params`` (other parameters of its
    factory), each passed only where the preset takes it.

    Raises:
        ValueError: for an unknown name (naming the choices), or a name in ``params`` that the
            preset does not take (naming those it does).
    """
    try:
        factory = PRESETS[name][0]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {sorted(PRESETS)}") from None
    unknown = sorted(set(params or ()) - set(parameters(factory)))
    if unknown:
        raise ValueError(f"strategy {name!r} takes no {unknown}; it takes {list(parameters(factory))}")
    return call_factory(factory, {"lr": lr, "H": H, **(params or {})})
