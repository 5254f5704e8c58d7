"""``--attack``, ``--malicious``, ``--attack-strength`` and ``--grid aggregate=...`` on the
command line: bad values are parser errors naming their flag, before anything starts."""

from __future__ import annotations

import argparse

import pytest

from exogym.cli.attack import adversaries_from_args
from tests.test_resilience import _cli_error, nothing_starts  # noqa: F401 (a fixture)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--nodes", "4", "--attack", "sign_flip", "--malicious", "0.1"], "argument --malicious: "),
        (["--nodes", "4", "--attack", "sign_flip", "--malicious", "0.1"], "give at least 0.25 (one node)"),
        (["--attack", "sign_flip", "--malicious", "1.5"], "argument --malicious: "),
        (["--attack", "free_rider", "--malicious", "0.25", "--attack-strength", "2"], "free_rider takes no strength"),
        (["--attack", "sign_flip", "--malicious", "0.25", "--attack-strength", "-2"], "argument --attack-strength: "),
    ],
)
def test_a_bad_attack_value_is_a_parser_error_naming_its_flag(argv, says, tmp_path, nothing_starts, capsys) -> None:  # noqa: F811
    err = _cli_error(["compare", "--strategies", "ddp", *argv, "--out", str(tmp_path)], capsys)
    assert says in err


def test_a_sweep_whose_rule_a_server_s_buffer_cannot_take_is_refused_before_anything_starts(
    tmp_path,
    nothing_starts,  # noqa: F811
    capsys,
) -> None:
    argv = ["compare", "--nodes", "4", "--strategies", "fedbuff", "--grid", "aggregate=multi_krum", "--seeds", "0"]
    err = _cli_error([*argv, "--attack", "ipm", "--malicious", "0.25", "--out", str(tmp_path)], capsys)
    assert "aggregate of FedBuffStrategy: its rule cannot combine the 2 updates" in err


@pytest.mark.parametrize(("task", "classes"), [("digits", 10), ("chars", 256)])
def test_label_flip_on_the_command_line_flips_within_the_task_s_labels(task: str, classes: int) -> None:
    args = argparse.Namespace(
        attack="label_flip", malicious=[0.25], attack_start=0, attack_strength=None, task=task, nodes=4
    )
    assert adversaries_from_args(argparse.ArgumentParser(), args).num_classes == classes
