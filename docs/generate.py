"""Write the pages of the docs site that live beside the code; run it before building the site.

``benchmarks/README.md`` becomes ``docs/benchmarks/figures.md``, and ``benchmarks/fidelity/report.md``
with its plots ``docs/benchmarks/fidelity/``: the benchmarks keep the one copy that is edited, and
the site's copies are rewritten here (git ignores them)::

    python docs/generate.py && zensical build
"""

from __future__ import annotations

import glob
import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pages(root: str = ROOT) -> dict[str, str]:
    """The generated files: their path under ``docs/`` -> the file they copy."""
    out = {"benchmarks/figures.md": os.path.join(root, "benchmarks", "README.md")}
    report = os.path.join(root, "benchmarks", "fidelity")
    for path in [os.path.join(report, "report.md"), *sorted(glob.glob(os.path.join(report, "*", "*.png")))]:
        out["benchmarks/fidelity/" + os.path.relpath(path, report).replace(os.sep, "/")] = path
    return out


def generate(root: str = ROOT) -> list[str]:
    """Write the generated files under ``root/docs`` (the fidelity folder is rewritten whole, so a
    plot removed from the benchmarks leaves the site too); returns the paths written."""
    docs = os.path.join(root, "docs")
    shutil.rmtree(os.path.join(docs, "benchmarks", "fidelity"), ignore_errors=True)
    written = []
    for uri, path in pages(root).items():
        target = os.path.join(docs, *uri.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(path, target)
        written.append(target)
    return written


if __name__ == "__main__":
    for path in generate():
        print(os.path.relpath(path, ROOT))
