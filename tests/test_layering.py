"""The package's layers import downwards only: the core (protocol, collectives, transports) knows
nothing of the runtime, the trainer or the command line, and the configuration sections know
nothing of the runtime that reads them."""

from __future__ import annotations

import ast
import os
from collections import deque

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "exogym")

#: What no module under exogym/core may import, at module level or inside a function.
ABOVE_CORE = ("exogym.runtime", "exogym.trainer", "exogym.cli", "exogym.config", "exogym.__main__")
#: The run-wide configuration: the sections fit's keywords make, and what the nodes read.
CONFIG = ("exogym.config", "exogym.run_config", "exogym.faults_config")


def _modules() -> dict[str, str]:
    """Every Python module of the package: dotted name -> file."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _imports(module: str) -> list[tuple[str, int]]:
    """``(imported module, line)`` for every import in ``module``, at any depth, relative ones
    made absolute; ``from package import name`` counts as ``package.name`` when that is a module."""
    path = MODULES[module]
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in MODULES else base, node.lineno))
    return found


def _is_under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_core_imports_nothing_from_the_layers_above_it() -> None:
    core = [m for m in MODULES if _is_under(m, ("exogym.core",))]
    assert "exogym.core.comm.plan" in core and "exogym.core.pipeline" in core
    upward = [
        f"{os.path.relpath(MODULES[m], ROOT)}:{line} imports {name}"
        for m in core
        for name, line in _imports(m)
        if _is_under(name, ABOVE_CORE) or name == "exogym"  # the package root re-exports the Trainer
    ]
    assert upward == [], "\n".join(upward)


def _reachable(start: str) -> dict[str, str]:
    """Every package module ``start`` imports, directly or through others: module -> the module
    that imports it on the way (the package root's own imports aside: importing a submodule
    runs it, whoever imports what)."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for name, _ in _imports(module):
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != "exogym" and name != start and name not in parent:
                parent[name] = module
                queue.append(name)
    return parent


def test_the_configuration_does_not_import_the_runtime_so_they_form_no_cycle() -> None:
    runtime_reads_config = {name for name, _ in _imports("exogym.runtime.node")}
    assert "exogym.config" in runtime_reads_config  # the other direction, which stays
    for start in CONFIG:
        parent = _reachable(start)
        runtime = sorted(m for m in parent if _is_under(m, ("exogym.runtime",)))
        paths = []
        for module in runtime:
            chain = [module]
            while chain[-1] != start:
                chain.append(parent[chain[-1]])
            paths.append(" <- ".join(chain))
        assert paths == [], f"{start} reaches the runtime:\n" + "\n".join(paths)


def test_the_import_scanner_sees_function_level_and_relative_imports(tmp_path) -> None:
    MODULES["exogym.core._probe"] = str(tmp_path / "probe.py")
    (tmp_path / "probe.py").write_text(
        "def f():\n    from exogym.runtime import cluster\n    from ..trainer import Trainer\n    import exogym.cli\n"
    )
    try:
        names = [name for name, _ in _imports("exogym.core._probe")]
    finally:
        del MODULES["exogym.core._probe"]
    assert names == ["exogym.runtime.cluster", "exogym.trainer", "exogym.cli"]
    assert all(_is_under(n, ABOVE_CORE) for n in names)


#: The engine's folders: what a module of them may hold at most, in lines.
ENGINE = ("exogym/runtime", "exogym/core", "communicators")
MODULE_LINES = 450


def test_no_module_of_the_runtime_the_core_or_the_communicators_is_over_450_lines() -> None:
    long = []
    for folder in ENGINE:
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(base, name)
                    with open(path) as f:
                        n = sum(1 for _ in f)
                    if n > MODULE_LINES:
                        long.append(f"{os.path.relpath(path, ROOT)}: {n} lines")
    assert not long, f"split these modules (one concept each, at most {MODULE_LINES} lines): {long}"
