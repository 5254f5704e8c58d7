"""A stopped fidelity run starts again where it stopped: finished sections are read, not trained again."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

fidelity = pytest.importorskip("fidelity", reason="the benchmarks need the dev extra (matplotlib)")


def stub_training(monkeypatch: pytest.MonkeyPatch, trained: list[str]) -> None:
    """Replace every run of the report by a record of which section it belongs to."""
    monkeypatch.setattr(fidelity, "over_seeds", lambda seeds, run, runs, suffix="": trained.append(suffix.strip()))
    monkeypatch.setattr(fidelity.fidelity_async, "run_async", lambda *a: trained.append("async"))
    monkeypatch.setattr(fidelity.fidelity_rosenbrock, "run_toy", lambda *a: trained.append("rosenbrock"))
    monkeypatch.setattr(fidelity.bandwidth_table, "measure", lambda models: ({}, {}))
    monkeypatch.setattr(fidelity, "eager_at_scale", lambda: {})


def test_run_all_trains_only_the_sections_a_stopped_run_of_the_same_scale_did_not_finish(tmp_path, monkeypatch) -> None:
    scale = fidelity.SCALES["quick"]
    saved = fidelity.resumed(str(tmp_path / "runs.partial.json"), scale)
    saved.exact["sections"] = ["gpt-K2", "gpt-M1", "fedavg-iid"]
    saved.rows["ddp K=2"] = [{"strategy": "ddp", "val_loss": 3.0}]
    saved.wall = 60.0
    saved.save(str(tmp_path / "runs.partial.json"))
    trained: list[str] = []
    stub_training(monkeypatch, trained)
    runs = fidelity.run_all(scale, str(tmp_path), progress=False)
    assert trained == ["K=4", "M=2", "dirichlet", "async", "rosenbrock"]
    assert runs.rows["ddp K=2"] == [{"strategy": "ddp", "val_loss": 3.0}]
    assert runs.wall >= 60.0
    assert runs.exact["sections"][-2:] == ["async", "rosenbrock"]


def test_run_all_starts_afresh_when_the_saved_sections_are_of_another_scale(tmp_path, monkeypatch) -> None:
    saved = fidelity.resumed(str(tmp_path / "runs.partial.json"), fidelity.SCALES["full"])
    saved.exact["sections"] = ["gpt-K4", "gpt-K8"]
    saved.save(str(tmp_path / "runs.partial.json"))
    trained: list[str] = []
    stub_training(monkeypatch, trained)
    fidelity.run_all(fidelity.SCALES["quick"], str(tmp_path), progress=False)
    assert trained == ["K=2", "K=4", "M=1", "M=2", "iid", "dirichlet", "async", "rosenbrock"]
