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
