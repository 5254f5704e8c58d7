"""The code passes the project's linter and formatter (configured in pyproject.toml)."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATHS = ["exogym", "communicators", "tests", "benchmarks", "setup.py"]


@pytest.mark.skipif(
    shutil.which("ruff") is None and not os.path.exists(os.path.join(os.path.dirname(sys.executable), "ruff")),
    reason="ruff is not installed (it comes with the [dev] extra)",
)
@pytest.mark.parametrize("args", [["check"], ["format", "--check"]])
def test_ruff(args) -> None:
    ruff = os.path.join(os.path.dirname(sys.executable), "ruff")
    ruff = ruff if os.path.exists(ruff) else "ruff"
    proc = subprocess.run([ruff, *args, *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
