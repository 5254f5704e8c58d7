"""The 2024-2026 presets are compositions: each is a list of at most three small communicator
modules around the inner optimizer, with no step of its own, and the runtime names none of them;
``exogym compare`` builds each by its name; each has its docs page; a quantizing wire applies to
the ones whose payloads are float all-reduces."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

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
from tests.fake_world import train_ranks

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


@pytest.mark.parametrize("name", ["noloco", "powersgd", "desloc", "eager_diloco", "muloco"])
def test_an_int8_wire_with_error_feedback_charges_every_payload_of_the_all_reduce_presets_at_int8_size(
    name: str,
) -> None:
    """The wire applies to every preset whose payloads are float all-reduces, unchanged: each
    collective is charged ``n + 4 * ceil(n / 256)`` bytes for the ``n`` float32 entries it
    carries without the wire (one byte per entry, one float32 scale per 256)."""
    from communicators.quantize import Int8

    presets = {
        "noloco": lambda: NoLoCoStrategy(H=3, gamma=0.3),
        "powersgd": lambda: PowerSGDStrategy(rank=1, start_iter=2),
        "desloc": lambda: DESLOCStrategy(Kx=2, Ku=3, Kv=6),
        "eager_diloco": lambda: EagerDiLoCoStrategy(H=3),
        "muloco": lambda: MuLoCoStrategy(H=3),
    }

    def make(wire: Int8 | None):
        def strategy() -> CommunicateOptimizeStrategy:
            preset = presets[name]()
            return CommunicateOptimizeStrategy(preset.pipeline.modules, optim_spec=preset.optim_spec, wire=wire)

        return strategy

    plain, wired = train_ranks(2, make(None), 6), train_ranks(2, make(Int8(error_feedback=True)), 6)
    for a, b in zip(plain, wired, strict=True):
        pairs = [(r, q) for s, t in zip(a["records"], b["records"], strict=True) for r, q in zip(s, t, strict=True)]
        assert pairs and len(pairs) == sum(len(s) for s in b["records"])
        for r, q in pairs:
            n = r.payload // 4
            assert (q.kind, q.payload, q.tag) == (r.kind, n + 4 * -(-n // 256), f"{r.tag}+int8")
    # the values travelled quantized too: the run moved off the unquantized one, not far
    pa, pb = (torch.cat([p.flatten() for p in o[0]["params"]]) for o in (plain, wired))
    assert not torch.equal(pa, pb) and torch.allclose(pa, pb, atol=0.05)
