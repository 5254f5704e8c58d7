"""Time to target: where the average model first reached a validation loss, interpolated by
hand between validations, and how ``compare`` reports it."""

import csv
import math

import pytest

from exogym.cli.compare import SUMMARY_COLUMNS, Comparison, _write_summary, format_table, report
from exogym.cli.target import TARGET_COLUMNS, Reached, target_columns, time_to_target

# Training rows (no val_loss_global) between validation rows, as Trainer.history holds them.
ROWS = [
    {"step": 0, "val_loss_global": 2.0, "sim_time": 0.0, "bytes_sent": 0.0},
    {"step": 5, "train_loss": 1.0, "sim_time": 5.0, "bytes_sent": 5e6},
    {"step": 10, "val_loss_global": 1.5, "sim_time": 12.0, "bytes_sent": 10e6},
    {"step": 20, "val_loss_global": 0.9, "sim_time": 30.0, "bytes_sent": 20e6},
    {"step": 30, "val_loss_global": 0.4, "sim_time": 50.0, "bytes_sent": 40e6},
]


def test_the_crossing_is_interpolated_linearly_between_the_two_validations_around_it() -> None:
    # 1.2 lies between 1.5 (step 10, 12 s, 10 MB) and 0.9 (step 20, 30 s, 20 MB): half way
    # (f = (1.5 - 1.2) / (1.5 - 0.9) = 0.5): step 15, 21 s, 15 MB.
    got = time_to_target(ROWS, 1.2)
    assert got == pytest.approx(Reached(sim_time=21.0, steps=15.0, mb_per_node=15.0))
    # 0.5: f = (0.9 - 0.5) / (0.9 - 0.4) = 0.8 of the way from step 20 to 30: step 28, 46 s, 36 MB.
    got = time_to_target(ROWS, 0.5)
    assert (got.steps, got.sim_time, got.mb_per_node) == pytest.approx((28.0, 46.0, 36.0))
    # exactly a validation's loss: that validation
    assert time_to_target(ROWS, 0.9) == Reached(30.0, 20.0, 20.0)


def test_a_target_met_at_the_first_validation_is_its_values_and_one_never_met_is_none() -> None:
    assert time_to_target(ROWS, 3.0) == Reached(0.0, 0.0, 0.0)
    assert time_to_target(ROWS, 0.1) is None
    assert time_to_target([], 1.0) is None
    assert target_columns(ROWS, 0.1) == dict.fromkeys(TARGET_COLUMNS)
    assert target_columns(ROWS, 1.2) == pytest.approx(dict(zip(TARGET_COLUMNS, (21.0, 15.0, 15.0), strict=True)))


def test_rows_read_back_from_a_metrics_csv_give_the_same_crossing(tmp_path) -> None:
    path = tmp_path / "metrics.csv"
    columns = ["step", "train_loss", "val_loss_global", "sim_time", "bytes_sent"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(ROWS)
    with open(path) as f:
        rows = list(csv.DictReader(f))  # strings, and "" where a row has no validation
    assert time_to_target(rows, 1.2) == pytest.approx(Reached(21.0, 15.0, 15.0))


def test_a_target_that_is_not_a_finite_number_is_refused() -> None:
    for bad in (math.nan, math.inf, "1.0", True):
        with pytest.raises(ValueError, match="target loss must be a finite number"):
            time_to_target(ROWS, bad)


def _summary(name: str, target: float) -> dict:
    row = {"strategy": name, "val_loss": 0.4, "val_accuracy": None, "bytes_sent_per_node": 40e6}
    return {**row, "sim_time": 50.0, "wall_time": 1.0, "steps": 30, **target_columns(ROWS, target)}


def test_summary_csv_and_table_carry_the_target_columns_and_say_never_reached(tmp_path, capsys) -> None:
    summary = [_summary("fast", 1.2), {**_summary("slow", 0.1), "strategy": "slow"}]
    _write_summary(summary, str(tmp_path))
    with open(tmp_path / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == SUMMARY_COLUMNS + TARGET_COLUMNS
    assert [rows[0][c] for c in TARGET_COLUMNS] == ["21.0", "15.0", "15.0"]
    assert [rows[1][c] for c in TARGET_COLUMNS] == ["", "", ""]  # never reached: empty cells
    table = format_table(summary, target_loss=1.2)
    assert "to 1.2: sim s" in table
    fast, slow = table.splitlines()[2:]
    assert fast.split()[-3:] == ["21.00", "15.0", "15.00"] and slow.endswith("not reached")
    report(Comparison(str(tmp_path), summary, target_loss=1.2))
    assert "never reached validation loss 1.2: slow" in capsys.readouterr().out


def test_the_compare_command_takes_a_target_loss_and_refuses_one_that_is_not_a_number(capsys) -> None:
    from exogym.__main__ import _parser

    _, parser = _parser()
    assert parser.parse_args(["--target-loss", "0.35"]).target_loss == 0.35
    assert parser.parse_args([]).target_loss is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--target-loss", "low"])
    assert "argument --target-loss: must be a number, got 'low'" in capsys.readouterr().err


def test_a_strategy_name_longer_than_the_column_keeps_a_space_before_the_next_column() -> None:
    from exogym.cli.aggregate import format_sweep_table

    long = "decoupled_diloco_with_a_long_name"
    row = {**_summary(long, 1.2), "utilisation": None}
    assert format_table([row]).splitlines()[2].split()[:2] == [long, "0.4000"]
    sweep_row = {"strategy": long, "aggregate": "median", "seeds": 1, "val_loss_mean": 0.4}
    line = format_sweep_table([sweep_row], ["aggregate"], target=False).splitlines()[2]
    assert line.split()[:4] == [long, "median", "1", "0.4000"]
