"""``OptimSpec``: an optimizer described before the model exists, built inside each node."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch

from exogym.core.muon import MuonAdamW
from exogym.core.params import ModelParameters
from exogym.core.restarts import check_restart_every, restart_every

#: Names accepted by ``OptimSpec.from_string`` (case-insensitive). ``'muon'`` is
#: ``MuonAdamW``: ``torch.optim.Muon`` for the hidden matrices, AdamW for the rest.
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad,
    "nadam": torch.optim.NAdam,
    "radam": torch.optim.RAdam,
    "muon": MuonAdamW,
}


class OptimSpec:
    """An optimizer class plus its keyword arguments, e.g. ``OptimSpec(torch.optim.AdamW, lr=1e-3)``.

    Keywords are checked against the optimizer's constructor at once: a misspelled one raises
    ``TypeError`` here, not silently later inside a worker.

    ``restart_every=N`` (keyword, not passed to the optimizer) drops the built optimizer's
    per-parameter state before its steps ``N+1, 2N+1, ...`` (``exogym.core.restarts``): as the
    outer optimizer of the DiLoCo family, ``OptimSpec(torch.optim.SGD, lr=0.7, momentum=0.9,
    nesterov=True, restart_every=N)`` resets the outer momentum every ``N`` outer steps
    (outer-momentum restarts, arXiv 2605.28585).
    """

    def __init__(self, cls: type[torch.optim.Optimizer], *, restart_every: int | None = None, **kwargs: Any) -> None:
        if not (inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer)):
            raise TypeError(f"OptimSpec needs a torch.optim.Optimizer subclass, got {cls!r}")
        _check_kwargs(cls, kwargs)
        check_restart_every(restart_every)
        self.cls = cls
        self.kwargs = dict(kwargs)
        #: Steps between restarts of the optimizer's state (``None``: never).
        self.restart_every = restart_every

    @classmethod
    def from_string(cls, name: str, **kwargs: Any) -> OptimSpec:
        """Build a spec from a short name in ``OPTIMIZERS`` (``'adam'``, ``'adamw'``,
        ``'sgd'``...)."""
        try:
            opt = OPTIMIZERS[name.lower()]
        except KeyError:
            raise ValueError(
                f"unknown optimizer {name!r}; choose one of {sorted(OPTIMIZERS)} or pass an OptimSpec"
            ) from None
        return cls(opt, **kwargs)

    @classmethod
    def coerce(cls, spec: OptimSpec | str | None, default: OptimSpec) -> OptimSpec:
        """Accept an ``OptimSpec``, a name for
        [`from_string`][exogym.strategy.OptimSpec.from_string], or ``None`` (``default``)."""
        if spec is None:
            return default
        if isinstance(spec, OptimSpec):
            return spec
        if isinstance(spec, str):
            return cls.from_string(spec)
        raise TypeError(f"expected an OptimSpec, an optimizer name or None, got {spec!r}")

    def replace(self, **overrides: Any) -> OptimSpec:
        """A copy with some keyword arguments replaced (e.g. ``lr``, or ``restart_every``)."""
        merged = {"restart_every": self.restart_every, **self.kwargs, **overrides}
        return OptimSpec(self.cls, **merged)

    @property
    def lr(self) -> float | None:
        """The spec's learning rate, or ``None`` when it leaves the optimizer's default."""
        return self.kwargs.get("lr")

    def build(
        self, params: torch.nn.Module | Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]]
    ) -> torch.optim.Optimizer:
        """Construct the optimizer (with its restarts where ``restart_every`` is set).

        ``params`` is a model, whose ``parameters()`` the optimizer updates (``build(model)``, as
        the original exo gym's strategies call it; given with their model, as
        [`Strategy`][exogym.strategy.Strategy] builds its inner optimizer, so that
        [`MuonAdamW`][exogym.strategy.MuonAdamW] finds the embeddings and the output head), or
        what a torch optimizer takes: an iterable of parameters or of param groups (dicts with a
        ``'params'`` key and per-group options). Raises ``TypeError`` for anything else.
        """
        if isinstance(params, torch.nn.Module):
            params = ModelParameters(params)
        elif isinstance(params, torch.Tensor) or not isinstance(params, Iterable):
            raise TypeError(
                f"OptimSpec.build takes a model (torch.nn.Module) or an iterable of parameters or param groups, "
                f"got {type(params).__name__}; pass the model, model.parameters() or a list of param groups"
            )
        optimizer = self.cls(params, **self.kwargs)
        return optimizer if self.restart_every is None else restart_every(optimizer, self.restart_every)

    def __repr__(self) -> str:
        restarts = {} if self.restart_every is None else {"restart_every": self.restart_every}
        args = ", ".join(f"{k}={v!r}" for k, v in {**self.kwargs, **restarts}.items())
        return f"OptimSpec({self.cls.__name__}{', ' + args if args else ''})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OptimSpec) and vars(self) == vars(other)  # cls, kwargs, restart_every


def _check_kwargs(cls: type, kwargs: dict[str, Any]) -> None:
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(kwargs) - set(params) - {"self"})
    if unknown:
        valid = sorted(set(params) - {"self", "params"})
        raise TypeError(f"{cls.__name__} got unexpected keyword argument(s) {unknown}; valid: {valid}")
