"""The docs site builds without warnings, and its runnable code runs as written.

The site is built with Zensical (``mkdocs.yml``, the ``[docs]`` extra) in strict mode, after
``docs/generate.py`` has written the pages kept beside the benchmarks: a broken link, a link to a
missing heading, a cross-reference of a docstring to nothing, or a docstring the API reference
cannot read fails the build. A docstring's cross-reference renders as a link, and no page shows
a Sphinx role (the convention: ``docs/internals/contributing.md``). A python block of a docs page
is runnable when it builds a strategy on its own (it defines ``strategy`` or a ``Strategy``
subclass and uses no ``trainer``), the same convention as the README's blocks
(``tests/test_readme.py``). A tutorial whose blocks make one script together says so
(``ONE_SCRIPT``) and is run whole by its own test.
"""

from __future__ import annotations

import glob
import importlib
import inspect
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zlib
from html.parser import HTMLParser

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The packages and modules a user imports; every name of their ``__all__`` is in the API reference.
API_PACKAGES = [
    "exogym",
    "exogym.strategy",
    "communicators",
    "exogym.ops",
    "exogym.tasks",
    "exogym.cli.compare",
    "exogym.partition",
    "exogym.logger",
    "exogym.core.seeding",
]


#: What the site is built from: its config, its pages, the packages the API reference reads and
#: the benchmarks' notes that ``docs/generate.py`` copies. Zensical writes the site inside the
#: folder of its config, so the tests build a copy of these.
SITE_SOURCES = ["mkdocs.yml", "docs", "exogym", "communicators", "benchmarks/README.md", "benchmarks/fidelity"]
#: A Sphinx role (``class``, ``meth``, ... between colons, before the name in backticks): the
#: docstrings cross-reference in Markdown instead, and a role would reach the page as text.
SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj|const):")


def _copy_site_sources(project: str) -> None:
    for name in SITE_SOURCES:
        src, dst = os.path.join(ROOT, name), os.path.join(project, name)
        if os.path.isdir(src):
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.so", "site", ".cache"))
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(src, dst)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """The docs site, built once in strict mode (the build's output is the failure message)."""
    pytest.importorskip("zensical", reason="the docs need the [docs] extra: pip install -e .[docs]")
    pytest.importorskip("mkdocstrings", reason="the docs need the [docs] extra: pip install -e .[docs]")
    project = str(tmp_path_factory.mktemp("docs") / "project")
    _copy_site_sources(project)
    env = {**os.environ, "NO_COLOR": "1"}
    for command in (["docs/generate.py"], ["-m", "zensical", "build", "--strict"]):
        out = subprocess.run(
            [sys.executable, *command], cwd=project, capture_output=True, text=True, env=env, timeout=110
        )
        log = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
        assert out.returncode == 0, log[-6000:]
    # Strict mode stops on broken links and cross-references; what griffe cannot read in a
    # docstring it only prints.
    unread = [line for line in log.splitlines() if line.startswith(("griffe:", "mkdocstrings:"))]
    assert not unread, "\n".join(unread)
    return os.path.join(project, "site")


def test_the_docs_site_builds_in_strict_mode(site) -> None:
    for page in ("index.html", "api/communicators/index.html", "benchmarks/fidelity/report/index.html"):
        assert os.path.exists(os.path.join(site, page)), page
    assert os.path.exists(os.path.join(site, "benchmarks", "fidelity", "diloco", "val_loss_vs_step.png"))


class _Text(HTMLParser):
    """The text a reader sees of an HTML page (scripts and styles left out), and its links."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.links: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag, attrs) -> None:
        self._hidden += tag in ("script", "style")
        if tag == "a":
            self.links.append(dict(attrs).get("href") or "")

    def handle_endtag(self, tag) -> None:
        self._hidden -= tag in ("script", "style")

    def handle_data(self, data) -> None:
        if not self._hidden:
            self.text.append(data)


def _read(site: str, page: str) -> _Text:
    parsed = _Text()
    with open(os.path.join(site, page), encoding="utf-8") as f:
        parsed.feed(f.read())
    return parsed


def test_a_cross_reference_of_a_docstring_is_a_link_to_its_target(site) -> None:
    """``Trainer``'s docstring names ``fit`` (on its own page) and ``Strategy.run_summary`` (on
    the strategy page): both are links to the target's heading."""
    links = _read(site, "api/exogym/index.html").links
    assert "./#exogym.Trainer.fit" in links
    assert "../strategy/#exogym.strategy.Strategy.run_summary" in links


def test_no_page_of_the_site_shows_a_sphinx_role(site) -> None:
    shown = {}
    for path in sorted(glob.glob(os.path.join(site, "**", "*.html"), recursive=True)):
        found = SPHINX_ROLE.findall("".join(_read(site, os.path.relpath(path, site)).text))
        if found:
            shown[os.path.relpath(path, site)] = len(found)
    assert not shown, f"raw Sphinx roles on the built pages: {shown}"


def test_no_docstring_or_comment_uses_a_sphinx_role() -> None:
    """The sources follow the docstring convention of ``docs/internals/contributing.md``."""
    found = []
    for folder in ("exogym", "communicators", "benchmarks", "tests", "docs"):
        for path in sorted(glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True)):
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if SPHINX_ROLE.search(line):
                        found.append(f"{os.path.relpath(path, ROOT)}:{number}")
    assert not found, f"Sphinx roles (write [`name`][full.path] or `name`): {found}"


def _public(package: str) -> list[str]:
    return [n for n in importlib.import_module(package).__all__ if not n.startswith("__")]


def _inventory(site: str) -> set[str]:
    """The objects the API reference renders: the names of mkdocstrings' ``objects.inv`` (a
    Sphinx inventory: four header lines, then zlib-compressed lines ``name domain:role ...``)."""
    with open(os.path.join(site, "objects.inv"), "rb") as f:
        body = f.read().split(b"\n", 4)[4]
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines()}


def _missing_from_reference(package: str, rendered: set[str]) -> list[str]:
    """Public names of ``package`` the reference does not render, neither under that name nor
    (for another name of one object, like ``LocalTrainer`` for ``Trainer``) under another."""
    module = importlib.import_module(package)
    names = _public(package)
    shown = {id(getattr(module, n)) for n in names if f"{package}.{n}" in rendered}
    return [f"{package}.{n}" for n in names if f"{package}.{n}" not in rendered and id(getattr(module, n)) not in shown]


@pytest.mark.parametrize("package", API_PACKAGES)
def test_every_public_name_of_the_api_packages_is_rendered_in_the_api_reference(package: str, site) -> None:
    missing = _missing_from_reference(package, _inventory(site))
    assert not missing, f"add them to a page of docs/api/ (a ::: line): {missing}"


def test_a_public_name_left_out_of_the_reference_is_reported(site) -> None:
    rendered = _inventory(site) - {"exogym.Network"}
    assert _missing_from_reference("exogym", rendered) == ["exogym.Network"]


@pytest.mark.parametrize("package", API_PACKAGES)
def test_every_public_name_of_the_api_packages_has_a_docstring(package: str) -> None:
    module = importlib.import_module(package)
    missing = [
        name
        for name in _public(package)
        if (inspect.isclass(getattr(module, name)) or inspect.isfunction(getattr(module, name)))
        and not (getattr(module, name).__doc__ or "").strip()
    ]
    assert not missing, f"{package}: public names without a docstring: {missing}"


#: A page whose python blocks are one script, run in order (a tutorial), says so with this line;
#: its blocks are run by a test of their own instead of one by one.
ONE_SCRIPT = "<!-- the python blocks of this page run in order as one script -->"


def one_script(page: str) -> str:
    """The python blocks of ``page`` (a path under docs/), in order, as one script."""
    with open(os.path.join(ROOT, "docs", page)) as f:
        text = f.read()
    assert ONE_SCRIPT in text, page
    return "\n".join(re.findall(r"```python\n(.*?)```", text, re.DOTALL))


def run_one_script(page: str, folder: pathlib.Path, timeout: float) -> subprocess.CompletedProcess:
    """Run ``one_script(page)`` as a script in ``folder`` (with this checkout importable); what it
    printed, after checking that it exited 0."""
    script = folder / "page.py"
    script.write_text(one_script(page))
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=folder, env=env, timeout=timeout
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _runnable_blocks() -> list[tuple[str, str]]:
    """(page:line, code) of every python block of docs/ that builds a strategy on its own."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)):
        with open(path) as f:
            text = f.read()
        if ONE_SCRIPT in text:
            continue
        for m in re.finditer(r"```python\n(.*?)```", text, re.DOTALL):
            code = m.group(1)
            if ("strategy = " in code or "(Strategy):" in code) and "trainer." not in code:
                where = f"{os.path.relpath(path, ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
                out.append((where, code))
    return out


def test_the_docs_have_runnable_blocks() -> None:
    assert len(_runnable_blocks()) >= 15


@pytest.mark.parametrize("where,code", _runnable_blocks(), ids=lambda v: v if ":" in str(v) else "")
def test_every_strategy_block_of_the_docs_trains_and_its_nodes_agree_at_the_round_end(where, code) -> None:
    """As for the README: the block runs, its strategy trains 4 nodes on threads for two rounds
    or more, is charged, and every node ends with the same parameters, except where the
    algorithm keeps them apart (islands, NoLoCo's pairs, SPARTA's fraction, Streaming DiLoCo's
    mixing); a server strategy trains, moves the server's model and charges its transfers."""
    import copy

    import torch

    from exogym.core.strategy import Strategy
    from tests.fake_world import train_ranks

    namespace: dict = {}
    exec(compile(code, where, "exec"), namespace)  # noqa: S102 - the docs' own code
    if "strategy" in namespace:
        built = namespace["strategy"]
        make = lambda: copy.deepcopy(built)  # noqa: E731
    else:
        cls = next(
            v for v in namespace.values() if isinstance(v, type) and issubclass(v, Strategy) and v is not Strategy
        )
        make = lambda: cls(optim_spec="sgd", lr=0.05)  # noqa: E731
    from exogym.core.server import ServerStrategy

    if isinstance(make(), ServerStrategy):  # a server and tasks: it trains, moves the server's model, and charges
        from exogym.core.comm.network import Network
        from tests.fake_world import train_server

        network = Network(1e9, 1e-3, compute=0.01, compute_slowdown=(1.0, 1.0, 0.5, 0.25))
        out = train_server(4, make, 24, network=network)
        assert all(bool(torch.isfinite(p).all()) for p in out[0]["params"])
        assert out[0]["summary"]["updates"] > 0 and out[0]["history"][-1]["bytes_sent"] > 0
        return
    leaves = make().pipeline.leaves() if make().pipeline is not None else []
    period = max([m.H for m in leaves] or [1])
    # Two rounds or more, ending at a step where every module communicates (modules confined to
    # windows of the run, like PowerSGD's dense start, are never due together: four rounds).
    steps = next((n for n in range(2 * period, 4 * period + 1) if all(m.is_due(n - 1) for m in leaves)), 4 * period)
    network = None
    if make().needs_step_seconds:  # a module that reads the clock during a step: modelled compute
        from exogym.core.comm.network import Network

        network = Network(1e9, 1e-3, compute=0.01, compute_slowdown=(1.0, 1.0, 0.5, 0.25))
    out = train_ranks(4, make, steps, network=network)
    assert all(bool(torch.isfinite(p).all()) for o in out for p in o["params"])
    assert any(step for step in out[0]["records"])  # it communicated, and was charged
    apart = any(
        getattr(m, "island_size", None)  # islands agree within themselves
        or type(m).__name__ in ("NoLoCoCommunicator", "SparseCommunicator")  # pairs; a fraction of the entries
        or getattr(m, "alpha", 0)
        or getattr(m, "overlap_steps", 0)  # Streaming DiLoCo keeps local progress
        for m in leaves
    )
    if not apart:
        for rank in range(1, 4):
            for a, b in zip(out[0]["params"], out[rank]["params"], strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_every_other_python_block_of_the_docs_compiles() -> None:
    """Blocks that need a user's model or data (``trainer.fit(...)``) are at least valid Python."""
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)):
        with open(path) as f:
            text = f.read()
        for m in re.finditer(r"```python\n(.*?)```", text, re.DOTALL):
            compile(m.group(1), f"{path}:{text[: m.start()].count(chr(10)) + 1}", "exec")


def test_the_readme_is_at_most_250_lines_and_its_links_exist() -> None:
    """The README is short and points into the docs; every relative link names a file that exists."""
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert readme.count("\n") <= 250
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    assert links and all(os.path.exists(os.path.join(ROOT, link)) for link in links), links


def _script_blocks() -> list[tuple[str, str]]:
    """(page:line, code) of every python block of docs/ that is a whole script (it has the
    ``if __name__ == "__main__":`` guard that node processes need)."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)):
        with open(path) as f:
            text = f.read()
        if ONE_SCRIPT in text:
            continue
        for m in re.finditer(r"```python\n(.*?)```", text, re.DOTALL):
            if 'if __name__ == "__main__":' in m.group(1):
                out.append((f"{os.path.relpath(path, ROOT)}:{text[: m.start()].count(chr(10)) + 1}", m.group(1)))
    return out


@pytest.mark.procs
@pytest.mark.timeout(120)
@pytest.mark.parametrize("where,code", _script_blocks(), ids=lambda v: v if ":" in str(v) else "")
def test_every_script_block_of_the_docs_runs_as_a_script(where, code, tmp_path) -> None:
    script = tmp_path / "script.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=110
    )
    assert out.returncode == 0, f"{where}:\n{out.stderr[-3000:]}"
