"""The README's code is runnable as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _use_snippet() -> str:
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    section = readme.split("## Use", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_the_use_snippet_trains_as_written(tmp_path) -> None:
    script = tmp_path / "use.py"
    script.write_text(_use_snippet())
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=110)
    assert out.returncode == 0, out.stderr[-3000:]
    last = eval(out.stdout.strip().splitlines()[-1], {"nan": float("nan")})  # noqa: S307 - our own output
    assert last["step"] == 64 and last["val_loss_global"] < 1.0  # 4 classes: chance is ln 4 = 1.39


def _strategy_blocks() -> list[tuple[int, str]]:
    """(line, code) of every README python block that builds a strategy on its own (defines
    ``strategy`` or a ``Strategy`` subclass and refers to no object of an earlier block)."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    out = []
    for m in re.finditer(r"```python\n(.*?)```", readme, re.DOTALL):
        code = m.group(1)
        if ("strategy = " in code or "(Strategy):" in code) and "trainer." not in code:
            out.append((readme[: m.start()].count("\n") + 1, code))
    return out


@pytest.mark.parametrize("line,code", _strategy_blocks(), ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_every_strategy_block_of_the_readme_trains_and_its_nodes_agree_at_the_round_end(line, code) -> None:
    """Each block that builds a strategy runs as written; its strategy trains 4 nodes on threads
    for two rounds, is charged, and (without islands) every node holds the same parameters."""
    import torch

    from exogym.core.strategy import Strategy
    from tests.fake_world import train_ranks

    namespace: dict = {}
    exec(compile(code, f"README.md:{line}", "exec"), namespace)  # noqa: S102 - the README's own code
    if "strategy" in namespace:
        built = namespace["strategy"]
        make = lambda: __import__("copy").deepcopy(built)  # noqa: E731
    else:
        cls = next(
            v for v in namespace.values() if isinstance(v, type) and issubclass(v, Strategy) and v is not Strategy
        )
        make = lambda: cls(optim_spec="sgd", lr=0.05)  # noqa: E731
    leaves = make().pipeline.leaves() if make().pipeline is not None else []
    period = max([m.H for m in leaves] or [1])
    # Two rounds or more, ending at a step where every module communicates.
    steps = next(n for n in range(2 * period, 4 * period + 1) if all(m.is_due(n - 1) for m in leaves))
    out = train_ranks(4, make, steps)
    assert all(bool(torch.isfinite(p).all()) for o in out for p in o["params"])
    assert any(step for step in out[0]["records"])  # it communicated, and was charged
    if not any(getattr(m, "island_size", None) for m in leaves):  # (islands agree within themselves)
        for rank in range(1, 4):
            for a, b in zip(out[0]["params"], out[rank]["params"], strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


#: What the README's table promises across machines: bytes and simulated times exactly (to the
#: digits printed); losses and accuracies within these bounds (they repeat exactly run to run on
#: one kind of CPU and kernel path, and move in the third decimal across CPU kinds).
LOSS_TOLERANCE, ACCURACY_TOLERANCE = 0.01, 0.02


def _table(text: str) -> dict[str, list[str]]:
    """The rows of a ``compare`` table: strategy -> its cells."""
    rows, inside = {}, False
    for line in text.splitlines():
        if line.startswith("strategy "):
            inside = True
        elif inside and line.startswith("---"):
            continue
        elif inside and line.strip():
            name, *cells = line.split()
            rows[name] = cells
        elif inside:
            break
    return rows


@pytest.mark.procs
@pytest.mark.timeout(400)
def test_the_main_command_repeats_the_readme_table_within_its_stated_tolerance(tmp_path) -> None:
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    promised = _table(re.search(r"```text\n(.*?)```", readme, re.DOTALL).group(1))
    assert f"within {LOSS_TOLERANCE} in loss and {ACCURACY_TOLERANCE} in accuracy" in " ".join(readme.split())
    out = subprocess.run(
        [sys.executable, "-m", "exogym", "compare", "--no-progress", "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=380,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = _table(out.stdout)
    assert list(got) == list(promised)
    for name, cells in promised.items():
        loss, accuracy, mb, sim, util = cells[:5]
        assert got[name][2:5] == [mb, sim, util], name  # bytes and simulated time: exact
        assert abs(float(got[name][0]) - float(loss)) <= LOSS_TOLERANCE, (name, got[name][0], loss)
        assert abs(float(got[name][1]) - float(accuracy)) <= ACCURACY_TOLERANCE, (name, got[name][1], accuracy)


@pytest.mark.procs
@pytest.mark.timeout(400)
def test_the_scaled_command_repeats_the_readme_table_and_learns_as_the_unscaled_one(tmp_path) -> None:
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    blocks = re.findall(r"```text\n(.*?)```", readme, re.DOTALL)
    plain, promised = _table(blocks[0]), _table(blocks[1])
    command = "exogym compare --scale 1B --step-seconds 1 --network two-datacenters"
    assert command in " ".join(readme.split())
    out = subprocess.run(
        [sys.executable, "-m", *command.split(), "--no-progress", "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=380,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = _table(out.stdout)
    assert list(got) == list(promised) == list(plain)
    for name, cells in promised.items():
        assert got[name][2:5] == cells[2:5], name  # bytes, simulated time, utilisation at the scale: exact
        assert cells[:2] == plain[name][:2], name  # the scale prices the run; the learning is the same
        assert abs(float(got[name][0]) - float(cells[0])) <= LOSS_TOLERANCE, (name, got[name][0], cells[0])
        assert abs(float(got[name][1]) - float(cells[1])) <= ACCURACY_TOLERANCE, (name, got[name][1], cells[1])


def _tests_table_count(readme: str) -> int:
    """The number of tests the README's Tests table gives for the full suite."""
    row = next(line for line in readme.splitlines() if line.startswith("| full |"))
    return int(re.search(r"([0-9][0-9,]*) tests", row).group(1).replace(",", ""))


def test_the_readme_gives_the_suites_test_count_within_ten_percent() -> None:
    with open(os.path.join(ROOT, "README.md")) as f:
        promised = _tests_table_count(f.read())
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        capture_output=True, text=True, cwd=ROOT, timeout=110,
    )  # fmt: skip
    collected = int(re.search(r"(\d+) tests? collected", out.stdout).group(1))
    assert abs(collected - promised) <= 0.1 * collected, (collected, promised)
