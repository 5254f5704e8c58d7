"""The soak's quick form (``benchmarks/soak.py --quick``): 1,000 FedAvg clients with client
sampling and stragglers (sampled FedAvg as a server on the clock, each client's speed drawn from
a log-normal), SIGKILLed after a checkpoint and resumed, end with the parameters of a run that
never stopped, and no process of the killed run outlives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.procs
@pytest.mark.timeout(400)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the killed run's processes")
def test_a_thousand_client_run_killed_and_resumed_ends_with_the_uninterrupted_runs_parameters(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "soak.py"), "--quick", "--out", str(tmp_path)],
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    whole = torch.load(tmp_path / "whole.pt")
    resumed = torch.load(tmp_path / "resumed.pt")
    assert len(whole) == len(resumed) == 4  # the MLP 64-32-10's weights and biases
    assert all(torch.equal(a, b) for a, b in zip(whole, resumed, strict=True))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["whole"]["rounds"] == 100  # a round is 1 + 10 (H - 1) ticks
    assert 30 <= report["resume_round"] < 100  # killed after its first checkpoint, before its end
    assert report["processes_below"] >= 2  # at least the two workers were running when it was killed
    assert report["left_after_5s"] == []
