"""``MuonAdamW``: Muon for the hidden matrices, AdamW for every other parameter, as one optimizer.

``torch.optim.Muon`` (Jordan et al. 2024) orthogonalizes the momentum of a 2-D parameter with
Newton-Schulz iterations and takes only 2-D parameters. [`MuonAdamW`][exogym.strategy.MuonAdamW]
gives it the hidden layers' matrices and AdamW the rest inside one ``torch.optim.Optimizer``, so
an ``OptimSpec`` can name it (``OptimSpec(MuonAdamW, lr=0.02)`` or
``OptimSpec.from_string("muon")``) wherever an inner optimizer goes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

import torch

from exogym.core.params import ModelParameters

#: The values of ``muon_params`` that name a rule (any other value is a collection of names).
MUON_RULES = ("hidden", "matrices")


def check_muon_params(muon_params: Any) -> None:
    """Raise ``ValueError``/``TypeError`` naming ``muon_params`` unless it is ``"hidden"``,
    ``"matrices"`` or a collection (set, tuple, list) of parameter names."""
    if isinstance(muon_params, str):
        if muon_params not in MUON_RULES:
            raise ValueError(
                f"muon_params must be 'hidden' (every matrix but the embeddings and the output head), 'matrices' "
                f"(every parameter with two dimensions) or a set of parameter names, got {muon_params!r}"
            )
    elif not isinstance(muon_params, Collection) or not all(isinstance(n, str) for n in muon_params):
        raise TypeError(
            f"muon_params must be 'hidden', 'matrices' or a set of parameter names (as model.named_parameters() "
            f"gives them, e.g. {{'fc1.weight'}}), got {muon_params!r}"
        )


def output_head(model: torch.nn.Module) -> torch.nn.Parameter | None:
    """The weight of ``model``'s last ``torch.nn.Linear`` in ``model.modules()`` order (an
    embedding's weight where the head is tied to it), or ``None`` without one."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return linears[-1].weight if linears else None


def muon_parameters(model: torch.nn.Module, muon_params: str | Collection[str]) -> list[torch.nn.Parameter]:
    """The parameters of ``model`` that Muon takes, in the model's order.

    ``"hidden"``: every parameter with exactly two dimensions but the embeddings (the weight of
    every ``torch.nn.Embedding``) and the output head (``output_head``); ``"matrices"``:
    every parameter with exactly two dimensions; a collection of names: the parameters of those
    names (as ``model.named_parameters(remove_duplicate=False)`` gives them: a tied parameter by
    any of its names).

    Raises:
        ValueError: a name the model has no parameter of, or of a parameter that does not have
            exactly two dimensions (``torch.optim.Muon`` takes no other).
    """
    check_muon_params(muon_params)
    params = list(model.parameters())
    if muon_params == "matrices":
        return [p for p in params if p.ndim == 2]
    if muon_params == "hidden":
        adamw = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        head = output_head(model)
        if head is not None:
            adamw.add(id(head))
        return [p for p in params if p.ndim == 2 and id(p) not in adamw]
    named = dict(model.named_parameters(remove_duplicate=False))
    matrices = sorted(n for n, p in named.items() if p.ndim == 2)
    for name in sorted(muon_params):
        if name not in named:
            raise ValueError(f"muon_params names {name!r}, a parameter the model lacks; its matrices: {matrices}")
        if named[name].ndim != 2:
            raise ValueError(
                f"muon_params names {name!r}, of {named[name].ndim} dimension(s); torch.optim.Muon takes only "
                f"parameters with two: {matrices}"
            )
    chosen = {id(named[n]) for n in muon_params}
    return [p for p in params if id(p) in chosen]


class MuonAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` over the hidden layers' matrices, ``torch.optim.AdamW`` over the
    others (the embeddings, the output head, 1-D biases and gains, 0-D scalars, convolution
    kernels of 3 or more dimensions); one optimizer to the outside.

    Which parameters Muon takes is ``muon_params`` (``exogym.core.muon.muon_parameters``). The
    default, ``"hidden"``, is Muon's convention and MuLoCo's (Therien et al. 2025, arXiv
    2505.23725): every parameter with exactly two dimensions except the weights of the
    ``torch.nn.Embedding`` modules and the output head, the weight of the last ``torch.nn.Linear``
    in ``model.modules()`` order (a head tied to an embedding is that embedding's weight: AdamW's
    too). A model whose last ``Linear`` is not its head names its Muon parameters instead. It
    needs the model: a strategy builds its inner optimizer over the model's ``ModelParameters``;
    by hand, pass the model itself (``MuonAdamW(model)``).

    ``param_groups`` holds Muon's group (if any 2-D parameter) then AdamW's (if any other); each
    group's ``lr`` is that optimizer's and a scheduler scales both. ``state_dict`` holds both
    optimizers' state dicts. Needs a torch with ``torch.optim.Muon`` (tested with torch 2.13).

    Args:
        params: the model (``torch.nn.Module``, or its ``ModelParameters`` as a strategy gives
            it), or with ``muon_params="matrices"`` an iterable of its parameters
            (parameter-group dicts are not taken).
        lr: Muon's learning rate (default 0.02, the original Muon's; torch's is 1e-3).
        momentum: Muon's momentum (default 0.95).
        nesterov: Muon's Nesterov momentum (default True).
        weight_decay: Muon's decoupled weight decay (default 0.1, torch's).
        ns_steps: Newton-Schulz iterations (default 5).
        adjust_lr_fn: Muon's learning-rate scaling per matrix shape: ``None`` (torch's default,
            ``'original'``) or ``'match_rms_adamw'``.
        adamw_lr: AdamW's learning rate (default 1e-3).
        adamw_betas: AdamW's betas (default ``(0.9, 0.999)``).
        adamw_eps: AdamW's epsilon (default 1e-8).
        adamw_weight_decay: AdamW's weight decay (default 0.01).
        muon_params: the parameters Muon takes: ``"hidden"`` (default), ``"matrices"`` (every
            parameter with two dimensions, the embeddings and the head included), or a set of
            parameter names (as ``model.named_parameters()`` gives them), each a matrix.

    Raises:
        TypeError: ``params`` is an iterable of parameters while ``muon_params`` needs the
            model, or a bad ``muon_params``.
        ValueError: ``muon_params`` names a parameter the model lacks or that is not a matrix.

    ``state`` is a view of both optimizers' per-parameter state (Muon's ``momentum_buffer``,
    AdamW's ``exp_avg``, ``exp_avg_sq`` and ``step``), as ExoGym's modules and device moves read
    an optimizer's state; ``state.pop(p)`` drops a parameter's state (restarts do).
    """

    def __init__(
        self,
        params: torch.nn.Module | ModelParameters | Iterable[torch.Tensor],
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        weight_decay: float = 0.1,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        adamw_lr: float = 1e-3,
        adamw_betas: tuple[float, float] = (0.9, 0.999),
        adamw_eps: float = 1e-8,
        adamw_weight_decay: float = 0.01,
        muon_params: str | Collection[str] = "hidden",
    ) -> None:
        muon_cls = getattr(torch.optim, "Muon", None)
        if muon_cls is None:
            raise RuntimeError(
                f"MuonAdamW needs torch.optim.Muon, which torch {torch.__version__} lacks; install a torch that has it"
            )
        check_muon_params(muon_params)
        model = params.model if isinstance(params, ModelParameters) else params
        if isinstance(model, torch.nn.Module):
            params, chosen = list(model.parameters()), muon_parameters(model, muon_params)
        else:
            params = list(params)
            if any(isinstance(p, dict) for p in params):
                raise TypeError("MuonAdamW takes a model or a plain iterable of parameters, not parameter-group dicts")
            if muon_params != "matrices":
                raise TypeError(
                    f"MuonAdamW(muon_params={muon_params!r}) reads the model to find the embeddings and the output "
                    "head (or the parameters named): pass the model, MuonAdamW(model, ...), not its parameters; or "
                    "muon_params='matrices' to give Muon every parameter with two dimensions"
                )
            chosen = [p for p in params if p.ndim == 2]
        muon_ids = {id(p) for p in chosen}
        matrices = [p for p in params if id(p) in muon_ids]
        others = [p for p in params if id(p) not in muon_ids]
        self.muon = (
            muon_cls(
                matrices,
                lr=lr,
                momentum=momentum,
                nesterov=nesterov,
                weight_decay=weight_decay,
                ns_steps=ns_steps,
                adjust_lr_fn=adjust_lr_fn,
            )
            if matrices
            else None
        )
        self.adamw = (
            torch.optim.AdamW(others, lr=adamw_lr, betas=adamw_betas, eps=adamw_eps, weight_decay=adamw_weight_decay)
            if others
            else None
        )
        # The base class takes the two optimizers' group dicts as they are (no defaults added):
        # a scheduler that sets a group's lr sets it where the optimizer reads it.
        super().__init__([g for opt in self._parts() for g in opt.param_groups], {})

    def _parts(self) -> list[torch.optim.Optimizer]:
        return [opt for opt in (self.muon, self.adamw) if opt is not None]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """One Muon step over the matrices and one AdamW step over the others."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self._parts():
            opt.step()
        return loss

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """``{"muon": ..., "adamw": ...}``: each optimizer's own state dict (``None`` where it has
        no parameters)."""
        return {
            "muon": None if self.muon is None else self.muon.state_dict(),
            "adamw": None if self.adamw is None else self.adamw.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Restore what [`state_dict`][exogym.strategy.MuonAdamW.state_dict] returned (the same
        parameters, split the same way)."""
        for name, opt in (("muon", self.muon), ("adamw", self.adamw)):
            if (opt is None) != (state_dict.get(name) is None):
                raise ValueError(f"MuonAdamW state dict: {name!r} does not match this optimizer's parameters")
            if opt is not None:
                opt.load_state_dict(state_dict[name])
        # load_state_dict gives each optimizer new group dicts: share them again
        self.param_groups = [g for opt in self._parts() for g in opt.param_groups]

    @property  # type: ignore[override]
    def state(self) -> Mapping[torch.Tensor, dict[str, Any]]:
        """Both optimizers' per-parameter state, read live (a checkpoint's load replaces them)."""
        return _States([opt.state for opt in self._parts()])

    @state.setter
    def state(self, value: Any) -> None:
        """The base class's own state dict is not used: the two optimizers hold the state."""


class _States(Mapping):
    """A view of several optimizers' ``state`` dicts (disjoint parameters); ``pop`` removes a
    parameter's entry from the dict that holds it."""

    def __init__(self, states: list[Any]) -> None:
        self.states = states

    def __getitem__(self, p: torch.Tensor) -> dict[str, Any]:
        for state in self.states:
            if p in state:
                return state[p]
        raise KeyError(p)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for state in self.states:
            yield from state

    def __len__(self) -> int:
        return sum(len(s) for s in self.states)

    def pop(self, p: torch.Tensor, default: Any = None) -> Any:
        """Remove and return ``p``'s state (``default`` where none holds it)."""
        for state in self.states:
            if p in state:
                return state.pop(p)
        return default


__all__ = ["MuonAdamW"]
