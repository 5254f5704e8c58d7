"""The fidelity report's smoke-test scale runs over seeds and writes its table, verdicts and plots."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [pytest.mark.procs, pytest.mark.slow]


@pytest.mark.timeout(660)
def test_fidelity_quick_runs_every_algorithm_s_findings_over_two_seeds_and_its_exact_findings_agree(tmp_path) -> None:
    out, runs = tmp_path / "report", tmp_path / "runs"
    cmd = [
        sys.executable,
        "benchmarks/fidelity.py",
        "--quick",
        "--no-progress",
        "--out",
        str(out),
        "--runs-dir",
        str(runs),
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=600, capture_output=True)
    report = (out / "report.md").read_text()
    for title in (
        "DiLoCo against DDP",
        "DiLoCo's scaling laws and DDP's bytes",
        "Streaming DiLoCo against DiLoCo",
        "SPARTA alone and with DiLoCo",
        "DeMo against DDP-AdamW",
        "FedAvg: IID",
        "SparseLoCo and eager DiLoCo against DiLoCo",
        "PowerSGD, top-k",
        "DES-LOC's Rosenbrock toy",
        "Async DiLoCo against DiLoCo",
        "FedBuff against FedAvg",
        "HALoS against flat asynchronous local SGD",
        "Decoupled DiLoCo against DiLoCo",
    ):
        assert f"## {title}" in report
    assert "seeds [0, 1]" in report and "quick scale: 2 seeds only" in report
    # the first line after the title counts the verdicts, and the summary table has one row per finding
    first = report.splitlines()[2]
    counts = re.search(
        r"\*\*(\d+) of (\d+) findings agree, (\d+) do not, and at this scale we cannot tell for (\d+)", first
    )
    assert counts, report[:400]
    agree, total, disagree, cannot = map(int, counts.groups())
    rows = [
        line for line in report.splitlines() if re.search(r"\| (agrees|does not agree|cannot tell at this scale)", line)
    ]
    assert total == len(rows) == 33 and agree + disagree + cannot == total
    # every algorithm ExoGym ships has a finding: the summary table names its paper
    for paper in (
        "DiLoCo (2311.08105)", "DiLoCo scaling laws", "DDP (ring all-reduce)", "Streaming DiLoCo", "SPARTA",
        "DeMo", "FedAvg", "SparseLoCo", "Eager updates", "PowerSGD", "Top-k with error feedback", "DES-LOC",
        "NoLoCo", "MuLoCo", "Async DiLoCo", "FedBuff", "HALoS", "Decoupled DiLoCo",
    ):  # fmt: skip
        assert any(row.startswith(f"| {paper}") for row in rows), paper
    # The findings about bytes follow from the algorithms' definitions: exact, and they agree at any scale
    for claim in (
        "DiLoCo communicates H times less",
        "sends p of DDP's bytes",
        "DeMo sends a small fraction",
        "a ring all-reduce of the gradients sends",
        "divides the peak bandwidth",
        "hides its communication",
    ):
        row = next(line for line in rows if claim in line)
        assert row.rstrip().endswith("| agrees (exact) |"), row
    # a finding that does not agree says why, in the same cell
    for row in rows:
        if "| does not agree" in row or "| cannot tell at this scale" in row:
            assert re.search(r"\| (does not agree|cannot tell at this scale): \S", row), row
    # a loss is given as the mean over seeds with its 95% interval: mean [low, high]
    assert re.search(r"\| ddp \| \d\.\d{4} \[\d\.\d{4}, \d\.\d{4}\] \|", report)
    images = re.findall(r"\]\(([^)]+\.png)\)", report)
    assert len(images) == 13 * 3 + 2 * 3  # loss vs step, bytes, simulated time per study; accuracy for FedAvg, FedBuff
    for image in images:
        assert (out / image).stat().st_size > 10_000, image
    for seed in (0, 1):
        assert (runs / "gpt-K2" / f"seed{seed}" / "latest" / "ddp" / "metrics.csv").exists()
        assert (runs / "fedavg-dirichlet" / f"seed{seed}" / "latest" / "summary.csv").exists()
        assert (runs / "rosenbrock" / f"seed{seed}" / "latest" / "summary.csv").exists()
