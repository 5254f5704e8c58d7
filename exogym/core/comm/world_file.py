"""World files: a [`Network`][exogym.Network] of regions described in JSON or TOML.

The schema (every key but ``regions`` optional; a link is ``{"bandwidth": ..., "latency": ...}``
with numbers in bits/s and seconds or strings with units, see ``exogym.core.comm.links``; an
access link may add ``"upload"``, a link between two regions ``"shared": true``)::

    {
      "name": "two-datacenters",
      "regions": {"dc1": [0, 1, 2, 3], "dc2": [4, 5, 6, 7]},
      "intra": {"bandwidth": "100Gbit/s", "latency": "10us"},
      "inter": {"bandwidth": "1Gbit/s", "latency": "80ms", "shared": true},
      "links": [{"between": ["dc1", "dc2"], "bandwidth": "1Gbit/s", "latency": "80ms"}],
      "access": {"bandwidth": "500Mbit/s", "upload": "110Mbit/s", "latency": "20ms"},
      "traces": "crossing.csv",
      "availability": {"trace": "online.csv", "step_seconds": 0.5},
      "compute_slowdown": [1.0, 1.0, 2.0],
      "compute": 0.05
    }

``access`` is one link for every node or a list of one per node; ``traces`` a CSV file (relative
to the world file) or a list of rows (``exogym.core.comm.traces``); ``availability`` a CSV file
(relative to the world file), a list of rows, or ``{"trace": ..., "step_seconds": ...}``
(``exogym.core.comm.availability``); ``compute_slowdown`` a list of
factors or ``{"distribution": "LogNormal", "args": [0.0, 0.5]}`` (any class of
``torch.distributions``, drawn once per node from the run's seed); ``compute`` and
``flops_per_second`` as in [`Network`][exogym.Network].
"""

from __future__ import annotations

import inspect
import json
import os
import warnings
from typing import Any

import torch

from exogym.core.comm.availability import Availability
from exogym.core.comm.links import Link

_LINK_KEYS = ("bandwidth", "latency", "upload", "shared")
_SLOWDOWN_FIX = 'give a distribution of positive numbers and its args: {"distribution": "LogNormal", "args": [0, 0.5]}'


def _link(spec: Any, where: str, between: bool = False) -> Link:
    if not isinstance(spec, dict) or "bandwidth" not in spec:
        raise ValueError(f"{where} must be {{'bandwidth': ..., 'latency': ...}}, got {spec!r}")
    unknown = set(spec) - set(_LINK_KEYS) - ({"between"} if between else set())
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {sorted(unknown)}; a link has {list(_LINK_KEYS)} (upload for an access "
            "link, shared for a link between two regions)"
        )
    try:
        return Link(**{k: v for k, v in spec.items() if k != "between"})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _slowdown(spec: Any) -> Any:
    if isinstance(spec, list):
        return tuple(spec)
    if isinstance(spec, dict) and set(spec) <= {"distribution", "args"} and "distribution" in spec:
        cls = getattr(torch.distributions, str(spec["distribution"]), None)
        if not (isinstance(cls, type) and issubclass(cls, torch.distributions.Distribution)):
            raise ValueError(f"compute_slowdown: {spec['distribution']!r} is not a torch.distributions class")
        try:  # one draw (on a copy of the RNG) shows that it can draw node speeds
            with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
                warnings.simplefilter("ignore")  # (an abstract class warns of its missing arg_constraints)
                dist = cls(*[float(a) for a in spec.get("args", [])])
                dist.sample()
        except Exception as e:  # (any class of torch.distributions, with any arguments)
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise ValueError(
                f"compute_slowdown: torch.distributions.{cls.__name__} with args {spec.get('args', [])} cannot draw "
                f"node speeds ({why}); {_SLOWDOWN_FIX}"
            ) from None
        return dist
    raise ValueError(
        f"compute_slowdown must be a list of factors or {{'distribution': ..., 'args': [...]}}, got {spec!r}"
    )


def _relative(path: Any, source: str) -> Any:
    """A path in a world file, relative to the file; other values unchanged."""
    if isinstance(path, str) and not os.path.isabs(path):
        return os.path.join(os.path.dirname(os.path.abspath(source)), path)
    return path


def _availability(spec: Any, source: str) -> Availability | None:
    if spec is None:
        return None
    if isinstance(spec, dict):
        if set(spec) - {"trace", "step_seconds"} or "trace" not in spec:
            raise ValueError(
                f"{source}: availability must be a CSV file, a list of rows or {{'trace': ..., 'step_seconds': ...}}"
            )
        return Availability(_relative(spec["trace"], source), spec.get("step_seconds"))
    return Availability(_relative(spec, source))


def world_from_dict(spec: dict[str, Any], source: str = "world") -> Any:
    """The [`Network`][exogym.Network] a world file's contents describe
    (``source`` names it in errors)."""
    from exogym.core.comm.network import Network

    if not isinstance(spec, dict) or not isinstance(spec.get("regions"), dict):
        raise ValueError(
            f"{source}: a world needs 'regions', an object of region name -> list of ranks "
            f'(e.g. "regions": {{"us": [0, 1], "eu": [2, 3]}}), got {type(spec.get("regions")).__name__}'
        )
    keys = set(inspect.signature(Network.regions).parameters)  # a world file's keys are its arguments
    unknown = set(spec) - keys
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {sorted(unknown)}; a world has {sorted(keys)}")
    links = {}
    for i, entry in enumerate(spec.get("links", [])):
        between = entry.get("between") if isinstance(entry, dict) else None
        if not (isinstance(between, list) and len(between) == 2):
            raise ValueError(f"{source}: links[{i}] needs 'between': [region, region]")
        links[(str(between[0]), str(between[1]))] = _link(entry, f"{source}: links[{i}]", between=True)
    access = spec.get("access")
    if isinstance(access, list):
        access = [_link(a, f"{source}: access[{r}]") for r, a in enumerate(access)]
    elif access is not None:
        access = _link(access, f"{source}: access")
    extra = {k: spec[k] for k in ("compute", "flops_per_second") if k in spec}
    try:
        traces = _relative(spec.get("traces"), source)
        availability = _availability(spec.get("availability"), source)
        return Network.regions(
            spec["regions"],
            _link(spec["intra"], f"{source}: intra") if "intra" in spec else None,
            _link(spec["inter"], f"{source}: inter") if "inter" in spec else None,
            links=links,
            access=access,
            traces=traces,
            availability=availability,
            name=str(spec.get("name", os.path.splitext(os.path.basename(source))[0])),
            compute_slowdown=_slowdown(spec.get("compute_slowdown", [])),
            **extra,
        )
    except (TypeError, ValueError, OSError, OverflowError) as e:
        message = str(e)
        raise ValueError(message if message.startswith(f"{source}: ") else f"{source}: {message}") from None


def load_world(path: str | os.PathLike[str]) -> Any:
    """The [`Network`][exogym.Network] a ``.json`` or ``.toml`` world file describes
    (TOML with Python 3.11 or later)."""
    path = os.fspath(path)
    return world_from_dict(read_world_file(path), path)


def read_world_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A world file's contents as written (before they are checked)."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".toml"):
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise ValueError(f"{path}: TOML world files need Python 3.11 or later (tomllib); use JSON") from None
        try:
            return tomllib.loads(data.decode())
        except ValueError as e:  # (a key given twice too: TOML refuses it)
            raise ValueError(f"{path}: not a valid TOML world file: {e}; fix it there") from None
    try:
        return json.loads(data, object_pairs_hook=_unique)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}; fix it there") from None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's keys, refused when one is given twice (``json`` would keep only the last)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} is given twice in one object (only the last would count); give it once")
        out[key] = value
    return out


def is_world_file(name: str) -> bool:
    """Whether ``name`` is a path to a world file (``.json`` or ``.toml``) that exists."""
    return name.endswith((".json", ".toml")) and os.path.isfile(name)


__all__ = ["is_world_file", "load_world", "read_world_file", "world_from_dict"]
