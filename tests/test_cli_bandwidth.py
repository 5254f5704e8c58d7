"""``exogym bandwidth`` (and ``compare``'s scale flags): the logged table against the clock's formula
by hand, and bad flags refused with exit status 2 naming the flag."""

import logging

import pytest

from exogym.__main__ import main

ARGS = ["bandwidth", "--scale", "1B", "--layers", "24", "--step-seconds", "0.1"]


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "exogym.cli"]


def _cells(lines: list[str], name: str) -> list[str]:
    row = next(line for line in lines if line.strip().startswith(f"{name}:"))
    return row.split(":", 1)[1].split()


def test_bandwidth_table_ddp_cell_at_fifty_percent_is_the_hand_value(caplog) -> None:
    caplog.set_level(logging.INFO, logger="exogym.cli")
    main([*ARGS, "--strategies", "ddp,diloco", "--utilisation", "50,90"])
    lines = _lines(caplog)
    assert lines[0] == "scale 1B parameters (bf16 on the wire, 0.1 s/step), 2 nodes, latency 0 ms"
    assert lines[1].split() == ["Gbit/s", "for", "50%", "90%"]
    ddp, diloco = _cells(lines, "ddp"), _cells(lines, "diloco")
    # DDP on 2 nodes: C = 8 * 2e9 / B; c / (c + C - 2c/3) = 0.5 at C = 5c/3 = 0.1667 s: B = 96 Gbit/s;
    # 0.9 at C = 7c/9 = 0.07778 s: B = 205.7 Gbit/s (3 significant digits logged)
    assert float(ddp[0]) == pytest.approx(96.0, rel=2e-3)
    assert float(ddp[1]) == pytest.approx(16.0 / (0.7 / 9), rel=3e-3)
    # DiLoCo (--H 100) over its 600-step schedule with 6 syncs: 600c / (600c + 6(C - 2c/3)) = 0.5
    # at C = 100c + 2c/3 = 10.0667 s: B = 16 / 10.0667 = 1.589 Gbit/s
    assert float(diloco[0]) == pytest.approx(16.0 / (100 * 0.1 + 0.2 / 3), rel=5e-3)


def test_bandwidth_utilisation_and_hours_at_a_given_bandwidth(caplog) -> None:
    caplog.set_level(logging.INFO, logger="exogym.cli")
    main([*ARGS, "--strategies", "ddp", "--bandwidth", "1Gbit/s", "--tokens", "1e9", "--tokens-per-step", "1e6"])
    row = next(line for line in _lines(caplog) if line.strip().startswith("ddp:"))
    # C = 8 * 2e9 / 1e9 = 16 s: utilisation 0.1 / (0.1 + 16 - 0.0667) = 0.6237%;
    # 1e9 / 1e6 = 1000 steps of 0.1 s at that utilisation: 100 / 0.006237 / 3600 = 4.454 h
    util = 0.1 / (0.1 + 16 - 0.2 / 3)
    assert f"utilisation {100 * util:.1f}% at 1 Gbit/s" in row
    assert f"{1000 * 0.1 / util / 3600:.1f} h for 1e+09 tokens" in row
    assert "0.6%" in row and "4.5 h" in row


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["bandwidth", "--scale", "nonsense", "--step-seconds", "0.1"], "argument --scale: params: 'nonsense'"),
        ([*ARGS, "--utilisation", "0,150"], "argument --utilisation: percentages in (0, 100]"),
        ([*ARGS, "--utilisation", "fifty"], "argument --utilisation"),
        ([*ARGS, "--tokens", "1e12"], "argument --tokens: needs --bandwidth"),
        (
            [*ARGS, "--bandwidth", "1Gbit/s", "--tokens", "1e12"],
            "argument --tokens: needs --bandwidth and --tokens-per",
        ),
        (["bandwidth", "--layers", "24", "--step-seconds", "0.1"], "the following arguments are required: --scale"),
        (["bandwidth", "--scale", "1B"], "argument --scale: give the step's compute: --step-seconds"),
        ([*ARGS, "--bandwidth", "fast"], "argument --bandwidth"),
        ([*ARGS, "--strategies", "ddp,nosuch"], "--strategies"),
        (["compare", "--layers", "24"], "argument --layers: needs --scale"),
        (["compare", "--step-seconds", "0.1"], "argument --step-seconds: needs --scale"),
        (["compare", "--scale", "lots", "--step-seconds", "0.1"], "argument --scale: params: 'lots'"),
        (["compare", "--mfu", "0.5"], "argument --mfu: needs --scale"),
        (["compare", "--wire", "fp16"], "argument --wire: needs --scale"),
        ([*ARGS, "--strategies", "ddp,fedbuff"], "argument --strategies: fedbuff: server algorithms"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(argv, says, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err


def test_scale_too_small_for_its_layers_exits_2_naming_the_flag(capsys) -> None:
    # 24 blocks of the narrowest width, 64: 12 * 24 * 64^2 + (4 * 24 + 2) * 64 = 1,185,920 > 1M parameters
    with pytest.raises(SystemExit) as exit_:
        main(["bandwidth", "--scale", "1M", "--layers", "24", "--step-seconds", "0.1", "--strategies", "ddp"])
    assert exit_.value.code == 2
    assert "--layers" in capsys.readouterr().err


def test_bad_mfu_exits_2_naming_the_mfu_flag(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*ARGS, "--mfu", "1.5"])
    assert exit_.value.code == 2
    assert "argument --mfu" in capsys.readouterr().err


def test_a_level_no_bandwidth_reaches_is_a_dash_and_the_table_says_why(caplog) -> None:
    # 4 nodes 80 ms apart: a ring all-reduce pays 2 (n-1) = 6 latencies, 0.48 s, more than the
    # backward pass of a 0.5 s step hides (0.333 s): DDP cannot reach 99% at any bandwidth
    caplog.set_level(logging.INFO, logger="exogym.cli")
    argv = ["bandwidth", "--scale", "1B", "--step-seconds", "0.5", "--nodes", "4", "--latency", "80ms"]
    main([*argv, "--strategies", "ddp", "--utilisation", "99"])
    lines = _lines(caplog)
    assert _cells(lines, "ddp") == ["-"]
    assert any(line.startswith("(-: no bandwidth reaches it") for line in lines)
