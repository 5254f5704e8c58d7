"""`exogym compare` end to end, plots and loggers."""

import csv
import os
import subprocess
import sys

import pytest

from exogym.cli.compare import SUMMARY_COLUMNS
from exogym.metrics import COLUMNS

pytestmark = [pytest.mark.procs, pytest.mark.timeout(180)]


def _is_png(path: str) -> bool:
    import matplotlib.image

    with open(path, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            return False
    img = matplotlib.image.imread(path)
    return img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def test_compare_command_writes_table_csvs_and_plots(tmp_path) -> None:
    out = tmp_path / "cmp"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "exogym",
            "compare",
            "--strategies",
            "ddp,diloco",
            "--nodes",
            "4",
            "--workers",
            "2",
            "--steps",
            "30",
            "--H",
            "10",
            "--batch-size",
            "16",
            "--out",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "strategy" in proc.stderr and "ddp" in proc.stderr and "diloco" in proc.stderr
    with open(out / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == SUMMARY_COLUMNS and [r["strategy"] for r in rows] == ["ddp", "diloco"]
    ddp, dil = (float(r["bytes_sent_per_node"]) for r in rows)
    assert dil == pytest.approx(ddp / 10)
    for name in ("ddp", "diloco"):
        with open(out / name / "metrics.csv") as f:
            reader = csv.DictReader(f)
            assert tuple(reader.fieldnames) == COLUMNS
            assert any(r["val_loss_global"] for r in reader)
    for stem in ("val_loss_vs_step", "val_loss_vs_bytes", "val_loss_vs_sim_time"):
        assert _is_png(str(out / f"{stem}.png"))


def test_unknown_strategy_is_rejected_before_training() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exogym", "compare", "--strategies", "ddp,adam"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "unknown strategies ['adam']" in proc.stderr


def test_more_workers_than_nodes_is_rejected_before_training() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exogym", "compare", "--nodes", "2", "--workers", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--workers must be between 1 and --nodes=2, got 3" in proc.stderr


def _fit_with(logger) -> None:
    from exogym import Trainer
    from exogym.strategy import SimpleReduceStrategy
    from tests.helpers import TinyNet, regression_data

    ds = regression_data(64)
    Trainer(TinyNet(), ds, ds).fit(
        SimpleReduceStrategy(),
        num_nodes=2,
        max_steps=4,
        batch_size=8,
        logger=logger,
        run_name="logged",
        log_interval=1,
        progress=False,
        val_size=16,
    )


def test_wandb_offline_writes_its_files(tmp_path, monkeypatch) -> None:
    pytest.importorskip("wandb", reason="the [wandb] extra is not installed")
    from exogym.logger import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _fit_with(WandbLogger(project="exogym-test", experiment_name="offline-run", save_dir=str(tmp_path)))
    runs = [d for d in os.listdir(tmp_path / "wandb") if d.startswith("offline-run-")]
    assert runs and any(f.endswith(".wandb") for f in os.listdir(tmp_path / "wandb" / runs[0]))


def test_tensorboard_writes_event_files(tmp_path) -> None:
    pytest.importorskip("tensorboard", reason="the [tensorboard] extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from exogym.logger import TensorBoardLogger

    _fit_with(TensorBoardLogger(str(tmp_path)))
    acc = EventAccumulator(str(tmp_path / "logged"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train_loss")] == [1, 2, 3, 4]
    assert "val_loss_global" in acc.Tags()["scalars"]


def _subcommands() -> list[list[str]]:
    """``[]`` (the top level) and every subcommand the parser defines."""
    import argparse

    from exogym import __main__ as cli

    seen: list[list[str]] = [[]]
    original = argparse.ArgumentParser.parse_args

    def capture(self, args=None, namespace=None):  # the parser main() builds, before it parses
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                seen.extend([name] for name in action.choices)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = capture
    try:
        with pytest.raises(SystemExit):
            cli.main([])
    finally:
        argparse.ArgumentParser.parse_args = original
    return seen


@pytest.mark.parametrize("command", _subcommands(), ids=lambda c: " ".join(c) or "exogym")
def test_every_subcommand_help_exits_zero(command: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "exogym", *command, "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout
