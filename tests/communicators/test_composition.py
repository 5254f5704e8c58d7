"""The 2024-2026 presets are compositions: each is a list of at most three small communicator
modules around the inner optimizer, with no step of its own, and the runtime names none of them."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from exogym.core.communicator import Communicator
from exogym.core.pipeline import CommunicateOptimizeStrategy
from exogym.strategy import (
    DESLOCStrategy,
    EagerDiLoCoStrategy,
    MuLoCoStrategy,
    NoLoCoStrategy,
    PowerSGDStrategy,
    SparseLoCoStrategy,
    TopKEFStrategy,
)

PRESETS = {
    "sparseloco": SparseLoCoStrategy,
    "muloco": MuLoCoStrategy,
    "eager_diloco": EagerDiLoCoStrategy,
    "noloco": NoLoCoStrategy,
    "desloc": DESLOCStrategy,
    "powersgd": PowerSGDStrategy,
    "topk_ef": TopKEFStrategy,
}
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_preset_is_a_list_of_at_most_three_small_modules_and_defines_nothing_but_its_constructor(
    name: str,
) -> None:
    cls = PRESETS[name]
    assert issubclass(cls, CommunicateOptimizeStrategy)
    own = {n for n in vars(cls) if not n.startswith("_")} | {n for n in ("step", "_init_node") if n in vars(cls)}
    assert own == set()  # no step, no node set-up, no state of its own
    leaves = cls().pipeline.leaves()
    assert 1 <= len(leaves) <= 3 and all(isinstance(m, Communicator) for m in leaves)
    for module in leaves:
        source = inspect.getsourcefile(type(module))
        assert source is not None and len(Path(source).read_text().splitlines()) <= 300, source


def test_the_runtime_and_the_core_name_none_of_the_presets_or_their_modules() -> None:
    """No special case for one algorithm: the runtime, the collectives and the pipeline import
    no communicator module and name no preset (the core's Muon optimizer and the documentation
    of ``optimizer_state`` may cite the papers that use them)."""
    names = {cls.__name__ for cls in PRESETS.values()}
    names |= {type(m).__name__ for cls in PRESETS.values() for m in cls().pipeline.leaves()}
    pattern = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b|^\s*(from|import) communicators\b", re.M)
    files = [*ROOT.glob("exogym/runtime/*.py"), *ROOT.glob("exogym/core/**/*.py"), *ROOT.glob("exogym/*.py")]
    assert len(files) > 20
    hits = [f"{f.relative_to(ROOT)}: {m.group(0)}" for f in files for m in pattern.finditer(f.read_text())]
    assert hits == []


@pytest.mark.parametrize("name", list(PRESETS))
def test_exogym_compare_knows_each_preset_by_its_name(name: str) -> None:
    from exogym.strategy import registry

    assert type(registry.build(name, lr=1e-3, H=5)) is PRESETS[name]


PAGES = {
    "sparseloco": "sparseloco.md",
    "muloco": "muloco.md",
    "eager_diloco": "eager-diloco.md",
    "noloco": "noloco.md",
    "desloc": "desloc.md",
    "powersgd": "powersgd.md",
    "topk_ef": "topk-ef.md",
}


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_preset_s_page_gives_the_paper_update_rule_bytes_choices_fidelity_and_many_clients(name: str) -> None:
    page = (ROOT / "docs" / "algorithms" / PAGES[name]).read_text()
    assert PRESETS[name].__name__ in page.splitlines()[0] and "**Paper.**" in page and "arXiv" in page
    for section in ("## Update rule", "## Bytes", "## ExoGym's choices", "## Fidelity", "## Many clients"):
        assert f"\n{section}\n" in page, section
