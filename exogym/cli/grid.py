"""A sweep's grid: which arguments it may vary, their values, and the runs they make.

A grid maps argument names to lists of values; several names make their product. A name is

* a *run* argument (``RUN_AXES``: ``nodes``, ``steps``, ...; the same for every strategy),
* a further ``Trainer.fit`` keyword whose default is a number, a string or a flag
  (``fit_axes``; ``log_interval``, ``minibatch_size``, ...), or
* a *strategy* parameter: a name in the signature of some strategy's factory (``lr``, ``H``,
  ``p_sparta``, ...; see ``exogym.strategy.registry.PRESETS``).

A strategy parameter applies only to the strategies whose factory takes it: the others are
run once for all its values (DDP for every ``H``).
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exogym.core.strategy import Strategy
from exogym.strategy.registry import PRESETS, parameters

__all__ = ["RUN_AXES", "Point", "fit_axes", "parse_grid", "parse_value", "points"]

#: Run arguments a grid may vary -> (type, smallest value). ``network`` is a preset or world
#: name (or world file); ``compute`` is ``flops``, ``measured`` or seconds per step;
#: ``malicious`` is the share of malicious nodes of the sweep's adversaries, in ``[0, 1)``.
RUN_AXES: dict[str, tuple[type, float | None]] = {
    "nodes": (int, 1),
    "steps": (int, 1),
    "batch_size": (int, 1),
    "val_size": (int, 0),
    "workers": (int, 1),
    "network": (str, None),
    "compute": (str, None),
    "malicious": (float, 0),
}

#: ``fit`` keywords that a sweep sets itself, or that are not a run's setting (files, loggers).
_NOT_FIT_AXES = frozenset(
    {
        "strategy", "num_nodes", "num_epochs", "max_steps", "batch_size", "device", "devices", "seed", "logger",
        "progress", "run_name", "network", "workers", "val_size", "checkpoint_dir", "checkpoint_interval",
        "resume_from", "resume", "faults", "dataloader_kwargs", "save_dir", "wandb_project", "torchrun_mode",
        "adversaries",
    }
)  # fmt: skip


def fit_axes() -> dict[str, Any]:
    """The further ``Trainer.fit`` keywords a grid may vary -> their defaults: those whose
    default is a number, a string, a flag or ``None``, less those a sweep sets itself."""
    from exogym.trainer import Trainer

    return {
        name: p.default
        for name, p in inspect.signature(Trainer.fit).parameters.items()
        if name not in _NOT_FIT_AXES and name != "self" and isinstance(p.default, (int, float, str, type(None)))
    }


def parse_value(text: str) -> int | float | bool | str:
    """A grid value from the command line: an integer, a number, ``true``/``false``, or the text."""
    text = text.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_grid(flags: Sequence[str]) -> dict[str, list[Any]]:
    """``["H=10,50", "nodes=4,8"]`` -> ``{"H": [10, 50], "nodes": [4, 8]}``.

    Raises:
        ValueError: for a flag without ``NAME=`` or values, or a name given twice.
    """
    grid: dict[str, list[Any]] = {}
    for flag in flags:
        name, sep, values = flag.partition("=")
        name = name.strip()
        items = [v for v in values.split(",") if v.strip()]
        if not sep or not name or not items:
            raise ValueError(f"{flag!r} is not NAME=VALUE[,VALUE...]; write e.g. --grid H=10,50,100")
        if name in grid:
            raise ValueError(f"{name} is given twice; list all its values in one --grid {name}=...")
        grid[name] = [parse_value(v) for v in items]
    return grid


@dataclass(frozen=True)
class Point:
    """One run of a sweep.

    Attributes:
        strategy: the strategy's label.
        axes: grid name -> value, for the grid names that apply to this strategy (in grid order).
        params: the strategy factory's arguments (``lr``, ``H``, ... those it takes).
        run: the run arguments (``RUN_AXES`` names) of this run.
        fit_args: the further ``fit`` keywords the grid sets.
        seed: the run's seed.
    """

    strategy: str
    axes: dict[str, Any]
    params: dict[str, Any]
    run: dict[str, Any]
    fit_args: dict[str, Any]
    seed: int

    def label(self) -> str:
        """``strategy name=value ... seed=N``, the run's name in logs and failures."""
        return " ".join([self.strategy, *(f"{k}={v}" for k, v in self.axes.items()), f"seed={self.seed}"])


def _check_value(name: str, value: Any, kind: type, low: float | None) -> Any:
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} takes integers, got {value!r}")
        if low is not None and value < low:
            raise ValueError(f"{name} must be >= {low:g}, got {value}")
    elif name == "compute" and not (value in ("flops", "measured") or _seconds(value)):
        raise ValueError(f"compute is 'flops', 'measured' or seconds per step >= 0, got {value!r}")
    elif name == "network" and not isinstance(value, str):
        raise ValueError(f"network takes names of networks or world files, got {value!r}")
    elif name == "malicious" and not (_seconds(value) and value < 1):
        raise ValueError(f"malicious is the share of malicious nodes, in [0, 1), got {value!r}")
    return value


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _like(name: str, value: Any, default: Any) -> Any:
    """``value`` as the type of ``default`` (an integer where a float is expected becomes a float)."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{name} takes true or false, got {value!r}")
    elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    elif isinstance(default, (int, float)) and not isinstance(value, (int, float)):
        raise ValueError(f"{name} takes numbers, got {value!r}")
    return value


def _finite(name: str, value: Any) -> Any:
    """A strategy parameter's number: finite, and ``lr`` > 0 (as ``--lr`` takes it)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if name == "lr" and not (math.isfinite(value) and value > 0):
            raise ValueError(f"lr must be a finite number > 0, got {value}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
    return value


def points(
    grid: Mapping[str, Sequence[Any]],
    factories: Mapping[str, Callable[..., Strategy]],
    base_params: Mapping[str, Any],
    base_run: Mapping[str, Any],
    seeds: Sequence[int],
) -> list[Point]:
    """Every run of the sweep, strategy by strategy, then in the grid's product order, then by
    seed: for each strategy, the product of the grid names that apply to it (run and ``fit``
    names apply to all; a strategy parameter to the strategies whose factory takes it).

    ``base_params`` (``lr``, ``H``) and ``base_run`` are the values where the grid has none.

    Raises:
        ValueError: naming an unknown grid name (and the names there are), a name that applies
            to no strategy, or a value of the wrong type or range.
    """
    taken = {label: parameters(f) for label, f in factories.items()}
    strategy_names = {n for names in taken.values() for n in names}
    fit_defaults = fit_axes()
    for name, values in grid.items():
        if not isinstance(values, (list, tuple)) or not values:
            raise ValueError(f"{name}: give a non-empty list of values, got {values!r}")
        if len(set(map(repr, values))) != len(values):
            raise ValueError(f"{name}: a value is listed twice in {list(values)}")
        if name in ("seed", "seeds"):
            raise ValueError(f"{name}: seeds are not a grid name; give them as --seeds 0,1,2 (sweep(seeds=[0, 1, 2]))")
        if name not in RUN_AXES and name not in fit_defaults and name not in strategy_names:
            takers = [preset for preset, (f, _) in PRESETS.items() if name in parameters(f)]
            taken_by = f" ({', '.join(takers)} take {name!r}; {', '.join(factories)} do not)" if takers else ""
            raise ValueError(
                f"unknown name {name!r}{taken_by}; a grid varies run arguments {sorted(RUN_AXES)}, the strategies' "
                f"parameters {sorted(strategy_names)} or fit keywords {sorted(fit_defaults)}"
            )
    checked: dict[str, list[Any]] = {}
    for name, values in grid.items():
        if name in RUN_AXES:
            checked[name] = [_check_value(name, v, *RUN_AXES[name]) for v in values]
        elif name in fit_defaults:
            checked[name] = [_like(name, v, fit_defaults[name]) for v in values]
        else:
            defaults = [d for names in taken.values() for n, d in names.items() if n == name]
            default = base_params.get(name, next((d for d in defaults if d is not inspect.Parameter.empty), None))
            checked[name] = [_finite(name, _like(name, v, default)) for v in values]
    out = []
    for label, names in taken.items():
        axes = [n for n in checked if n in RUN_AXES or n in fit_defaults or n in names]
        for combo in itertools.product(*(checked[n] for n in axes)):
            values = dict(zip(axes, combo, strict=True))
            params = {
                n: values[n] if n in values else base_params.get(n, default)
                for n, default in names.items()
                if n in values or n in base_params or default is not inspect.Parameter.empty
            }
            run = {**base_run, **{n: v for n, v in values.items() if n in RUN_AXES}}
            fit_args = {n: v for n, v in values.items() if n in fit_defaults and n not in RUN_AXES}
            out += [Point(label, values, params, run, fit_args, seed) for seed in seeds]
    return out
