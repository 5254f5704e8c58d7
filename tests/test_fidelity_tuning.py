"""The fidelity report tunes each method on a held-out seed, then every run of that method uses the choice."""

import dataclasses
import os
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

fidelity = pytest.importorskip("fidelity", reason="the benchmarks need the dev extra (matplotlib)")

SCALE = dataclasses.replace(fidelity.SCALES["quick"], lr_factors=(0.5, 1.0, 2.0), momenta=(0.5, 0.9))


def test_grid_tries_every_learning_rate_and_momenta_only_for_methods_with_an_outer_step() -> None:
    assert [(h.lr_factor, h.momentum) for h in fidelity.grid("ddp", SCALE)] == [
        (0.5, fidelity.OUTER_MOMENTUM),
        (1.0, fidelity.OUTER_MOMENTUM),
        (2.0, fidelity.OUTER_MOMENTUM),
    ]
    assert len(fidelity.grid("diloco", SCALE)) == 6
    assert {h.momentum for h in fidelity.grid("eager_diloco", SCALE)} == {0.5, 0.9}


def test_best_takes_the_lowest_loss_and_never_a_failed_or_diverged_run() -> None:
    label = fidelity.hyper_label
    losses = {
        label("ddp", fidelity.Hyper(0.5)): 3.0,
        label("ddp", fidelity.Hyper(1.0)): float("nan"),  # diverged
        # lr x2 failed: no row
    }
    assert fidelity.best(losses, "ddp", SCALE) == fidelity.Hyper(0.5)
    losses[label("ddp", fidelity.Hyper(2.0))] = 2.5
    assert fidelity.best(losses, "ddp", SCALE) == fidelity.Hyper(2.0)
    # a tie goes to the first setting tried
    tie = {label("ddp", fidelity.Hyper(f)): 2.0 for f in SCALE.lr_factors}
    assert fidelity.best(tie, "ddp", SCALE) == fidelity.Hyper(0.5)


def test_tune_trains_on_the_held_out_seed_and_every_run_then_uses_its_choice(tmp_path, monkeypatch) -> None:
    calls: list[dict] = []

    def fake_compare(task, strategies, *, seed, **kwargs):
        """A comparison whose loss is lowest at the learning rate x2 and momentum 0.9."""
        calls.append({"seed": seed, "labels": list(strategies), "nodes": kwargs["nodes"]})
        rows = [{"strategy": lb, "val_loss": 1.0 if "x2" in lb and "m=0.5" not in lb else 2.0} for lb in strategies]
        return SimpleNamespace(summary=rows)

    monkeypatch.setattr(fidelity, "compare", fake_compare)
    runs = fidelity.Runs({}, {}, {}, exact={"sections": []})
    gpt = fidelity.gpt_task(SCALE)
    for name in ("ddp", "diloco", "muloco"):
        fidelity.tune(gpt, SCALE, name, str(tmp_path), runs, progress=False)
    assert [c["seed"] for c in calls] == [SCALE.tune_seed] * 3
    assert SCALE.tune_seed not in SCALE.seeds
    assert [c["nodes"] for c in calls] == [SCALE.nodes[0], SCALE.nodes[0], max(SCALE.nodes)]
    assert len(calls[1]["labels"]) == 6
    tuned = fidelity.tuned_of(runs)
    assert tuned["ddp"] == fidelity.Hyper(2.0, fidelity.OUTER_MOMENTUM)
    assert tuned["diloco"] == fidelity.Hyper(2.0, 0.9)
    assert tuned["sparta"] == fidelity.Hyper()  # not tuned: the base settings
    # the report's runs are built from the choice, at every H
    ddp = fidelity.method("ddp", tuned["ddp"], SCALE)
    assert ddp.optim_spec.kwargs["lr"] == pytest.approx(2 * fidelity.LR)
    muloco = fidelity.algorithm_runs(SCALE, max(SCALE.nodes), tuned)[f"muloco H={min(SCALE.H)}"]
    assert muloco.optim_spec.kwargs == pytest.approx({"lr": fidelity.MUON_LR * 2, "adamw_lr": fidelity.LR * 2})
    diloco = fidelity.method("diloco", tuned["diloco"], SCALE, H=max(SCALE.H))
    assert diloco.optim_spec.kwargs["lr"] == pytest.approx(2 * fidelity.LR)
    assert runs.exact["tuned"]["diloco"]["losses"][fidelity.hyper_label("diloco", fidelity.Hyper(2.0, 0.9))] == 1.0


def test_a_grid_of_one_setting_trains_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(fidelity, "compare", lambda *a, **k: pytest.fail("a grid of one setting trained"))
    runs = fidelity.Runs({}, {}, {}, exact={"sections": []})
    fidelity.tune(None, fidelity.SCALES["quick"], "diloco", str(tmp_path), runs, progress=False)
    assert fidelity.tuned_of(runs)["diloco"] == fidelity.Hyper()
