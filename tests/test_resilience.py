"""What a comparison or a sweep leaves when its files are damaged or edited, when it is stopped
(SIGTERM, SIGKILL) and when a setting cannot work: each case of
docs/user-guide/resilience.md."""

from __future__ import annotations

import csv
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import pytest

import exogym.cli.compare
import exogym.cli.sweep
import exogym.runtime.plan
from exogym import Trainer
from exogym.__main__ import main
from exogym.cli.compare import compare
from exogym.cli.sweep import _write_csv, sweep
from exogym.cli.sweep_store import RunStore
from exogym.core.comm.network import Network
from exogym.strategy import SimpleReduceStrategy
from exogym.strategy.registry import build
from tests.helpers import TinyNet, regression_data


def _no_start(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a run started")


@pytest.fixture
def nothing_starts(monkeypatch) -> None:
    """Any comparison, sweep or process server that starts fails the test."""
    monkeypatch.setenv("EXOGYM_PRESTART", "0")
    monkeypatch.setattr(exogym.cli.compare, "compare", _no_start)
    monkeypatch.setattr(exogym.cli.sweep, "start_processes_server", _no_start)
    monkeypatch.setattr(exogym.runtime.plan, "start_processes_server", _no_start)


def _cli_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "Traceback" not in err
    return err


# A damaged or edited sweep


def _stored(tmp_path) -> tuple[RunStore, str]:
    store = RunStore(str(tmp_path))
    store.save("k", {"seed": 0, "params": {"lr": 1e-3}}, {"val_loss": 1.5}, [{"step": 1, "val_loss_global": 1.5}])
    return store, str(tmp_path / "runs" / "k" / "run.json")


def _truncate(path: str) -> None:
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text[: len(text) // 2])


def _edit_val_loss(path: str) -> None:
    doc = json.load(open(path))
    doc["row"]["val_loss"] = 0.1
    json.dump(doc, open(path, "w"))


def _drop_digest(path: str) -> None:
    doc = json.load(open(path))
    del doc["digest"]
    json.dump(doc, open(path, "w"))


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (_truncate, "is not valid JSON"),
        (_edit_val_loss, "does not match its digest"),
        (_drop_digest, "has no digest"),
        (lambda p: open(p, "w").write("[1, 2]"), "is not a finished run's record"),
    ],
    ids=["truncated", "edited", "no-digest", "not-a-record"],
)
def test_a_damaged_or_edited_run_is_named_set_aside_and_not_reused(damage, problem, tmp_path, caplog) -> None:
    store, path = _stored(tmp_path)
    assert store.load("k")["row"] == {"val_loss": 1.5}
    damage(path)
    damaged = open(path).read()
    assert store.load("k") is None  # to train again
    aside = tmp_path / "runs" / "k.damaged-0"
    assert not (tmp_path / "runs" / "k").exists() and (aside / "run.json").read_text() == damaged  # moved, kept
    assert f"{path} {problem}" in caplog.text and f"moved to {aside}; the run trains again" in caplog.text
    _stored(tmp_path)
    damage(path)
    assert store.load("k") is None and (tmp_path / "runs" / "k.damaged-1" / "run.json").exists()


def test_a_summary_rewritten_with_fewer_rows_than_it_had_says_both_counts(tmp_path, caplog) -> None:
    path = str(tmp_path / "summary.csv")
    _write_csv(path, ["a"], [{"a": 1}, {"a": 2}, {"a": 3}])
    _write_csv(path, ["a"], [{"a": 1}, {"a": 2}, {"a": 3}, {"a": 4}])
    assert caplog.text == ""
    _write_csv(path, ["a"], [{"a": 1}])
    assert f"{path} had 4 rows; it is rewritten with 1" in caplog.text
    with open(path) as f:
        assert list(csv.DictReader(f)) == [{"a": "1"}]


SMALL = {"nodes": 2, "workers": 2, "steps": 4, "val_size": 64, "progress": False}


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_a_sweep_with_a_cut_short_and_an_edited_run_trains_them_again_and_keeps_every_row(tmp_path, caplog) -> None:
    first = sweep("digits", ["ddp"], seeds=[0, 1, 2], out_dir=str(tmp_path), **SMALL)
    assert first.executed == 3 and not first.failures
    runs = tmp_path / "runs"
    cut, edited = (str(runs / r["key"] / "run.json") for r in first.runs[:2])
    _truncate(cut)
    _edit_val_loss(edited)
    again = sweep("digits", ["ddp"], seeds=[0, 1, 2], out_dir=str(tmp_path), **SMALL)
    assert (again.executed, again.reused, again.failures) == (2, 1, {})
    assert f"{cut} is not valid JSON" in caplog.text and f"{edited} " in caplog.text
    assert "does not match its digest" in caplog.text
    assert sorted(p.name for p in runs.iterdir() if ".damaged-" in p.name) == sorted(
        f"{r['key']}.damaged-0" for r in first.runs[:2]
    )
    assert [r["val_loss"] for r in again.runs] == [r["val_loss"] for r in first.runs]  # the edit moved nothing
    for name in ("runs.csv", "summary.csv"):
        with open(tmp_path / name) as f:
            assert len(list(csv.DictReader(f))) == (3 if name == "runs.csv" else 1)
    assert "rewritten with" not in caplog.text


# Pre-emption


def _left_in(tmp: str) -> list[str]:
    """What a run left in its temporary folder (torch's compile cache aside, which is meant to stay)."""
    return sorted(n for n in os.listdir(tmp) if not n.startswith("torchinductor"))


def _terminate_when(cmd: list[str], ready, tmp: str) -> tuple[int, str]:
    """Start ``cmd`` with ``TMPDIR=tmp``, send it SIGTERM once ``ready()`` holds; its exit status and output."""
    env = {**os.environ, "TMPDIR": tmp}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 200
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[0].decode()
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60), proc.stdout.read().decode()


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_sigterm_to_compare_writes_the_finished_strategies_summary_and_leaves_no_temporary_folder(tmp_path) -> None:
    out, tmp = tmp_path / "cmp", str(tmp_path / "tmp")
    os.mkdir(tmp)
    cmd = [sys.executable, "-m", "exogym", "compare", "--strategies", "ddp,fedavg", "--nodes", "2", "--workers", "2"]
    cmd += ["--steps", "1500", "--no-progress", "--out", str(out)]
    ddp_done = lambda: (out / "version_0" / "fedavg" / "metrics.csv").exists()  # noqa: E731
    code, output = _terminate_when(cmd, ddp_done, tmp)
    assert code == 128 + signal.SIGTERM, output
    assert "\ninterrupted (SIGTERM): every node was stopped\n" in output and "Traceback" not in output
    assert f"comparison interrupted during fedavg: its partial results are in {out / 'version_0'}" in output
    with open(out / "version_0" / "summary.csv") as f:
        assert [r["strategy"] for r in csv.DictReader(f)] == ["ddp"]
    assert _left_in(tmp) == []


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_sigterm_to_a_sweep_writes_its_summary_and_runs_csv_and_leaves_no_temporary_folder(tmp_path) -> None:
    out, tmp = tmp_path / "sweep", str(tmp_path / "tmp")
    os.mkdir(tmp)
    cmd = [sys.executable, "-m", "exogym", "compare", "--strategies", "ddp", "--seeds", "0,1,2", "--nodes", "2"]
    cmd += ["--workers", "2", "--steps", "600", "--no-progress", "--out", str(out)]
    one_done = lambda: any((out / "runs").glob("*/run.json"))  # noqa: E731
    code, output = _terminate_when(cmd, one_done, tmp)
    assert code == 128 + signal.SIGTERM, output
    assert "\ninterrupted (SIGTERM): every node was stopped\n" in output and "Traceback" not in output
    kept = len(list((out / "runs").glob("*/run.json")))
    assert 1 <= kept < 3 and f"{kept} of 3 runs finished and are kept in {out / 'runs'}" in output
    with open(out / "runs.csv") as f:
        assert len(list(csv.DictReader(f))) == kept
    with open(out / "summary.csv") as f:
        assert [int(r["seeds"]) for r in csv.DictReader(f)] == [kept]
    assert _left_in(tmp) == []


_HOLD_A_TEMP_DIR = """
import multiprocessing.util, sys, time
from exogym.runtime import forkserver
forkserver.ensure_server()
print(multiprocessing.util.get_temp_dir(), flush=True)
time.sleep(float(sys.argv[1]))
"""


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_the_temporary_folder_of_a_process_killed_with_sigkill_is_removed_by_the_next_one(tmp_path) -> None:
    tmp = str(tmp_path)
    env = {**os.environ, "TMPDIR": tmp}
    cmd = [sys.executable, "-c", _HOLD_A_TEMP_DIR]
    holder = subprocess.Popen([*cmd, "60"], stdout=subprocess.PIPE, env=env, text=True)
    used = holder.stdout.readline().strip()
    marker = os.path.join(tmp, f"exogym-{socket.gethostname()}-{holder.pid}")
    assert os.path.dirname(used) == tmp and os.listdir(used)  # the fork server's socket is there
    assert open(marker).read() == used
    holder.kill()
    holder.wait()
    assert os.path.isdir(used)  # a process killed with SIGKILL removes nothing
    kept = {}  # the folders of a live process and of another machine's: not judged here
    for owner in (f"{socket.gethostname()}-{os.getpid()}", f"elsewhere-{holder.pid}"):
        kept[f"exogym-{owner}"] = tempfile.mkdtemp(prefix="pymp-", dir=tmp)
        with open(os.path.join(tmp, f"exogym-{owner}"), "w") as f:
            f.write(kept[f"exogym-{owner}"])
    nxt = subprocess.run([*cmd, "0"], env=env, capture_output=True, text=True)
    assert nxt.returncode == 0, nxt.stderr
    expected = [*kept, *(os.path.basename(p) for p in kept.values())]
    assert sorted(os.listdir(tmp)) == sorted(expected)  # the killed one's gone, and the next one's own


# Errors found before anything starts


@pytest.fixture
def read_only(monkeypatch, tmp_path):
    """A folder in which creating a file fails as on a read-only filesystem."""
    made = str(tmp_path / "read-only")
    os.mkdir(made)
    real = tempfile.mkstemp

    def refuse(*args: Any, **kwargs: Any) -> Any:
        if os.path.abspath(kwargs.get("dir") or "").startswith(made):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), kwargs["dir"])
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    return made


def _outs(tmp_path, read_only: str) -> dict[str, tuple[str, str]]:
    (tmp_path / "a-file").write_text("x")
    return {
        "file": (str(tmp_path / "a-file"), "is a file"),
        "under-a-file": (str(tmp_path / "a-file" / "out"), "is a file"),
        "empty": ("", "is empty"),
        "dev-null": ("/dev/null", "is not a folder"),
        "read-only": (os.path.join(read_only, "out"), "Read-only file system"),
    }


@pytest.mark.parametrize("case", ["file", "under-a-file", "empty", "dev-null", "read-only"])
@pytest.mark.parametrize("sweep_flags", [[], ["--seeds", "0,1"]], ids=["compare", "sweep"])
def test_an_out_that_cannot_be_written_is_a_parser_error_naming_out(
    case, sweep_flags, tmp_path, read_only, nothing_starts, capsys
) -> None:
    out, says = _outs(tmp_path, read_only)[case]
    err = _cli_error(["compare", "--strategies", "ddp", "--out", out, *sweep_flags], capsys)
    assert "argument --out: " in err and says in err


def test_compare_and_sweep_refuse_an_out_dir_that_cannot_be_written_before_anything_starts(
    tmp_path, read_only, nothing_starts
) -> None:
    out = os.path.join(read_only, "out")
    with pytest.raises(ValueError, match=r"out_dir .*Read-only file system"):
        sweep("digits", ["ddp"], seeds=[0], out_dir=out)
    with pytest.raises(ValueError, match=r"out_dir '/dev/null' is not a folder"):
        compare("digits", ["ddp"], out_dir="/dev/null")


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("transport=../../evil", "transport must be one of"),
        ("log_interval=0", "log_interval"),
        ("val_interval=0", "val_interval"),
        ("lr=inf", "lr must be a finite number > 0, got inf"),
        ("lr=0", "lr must be a finite number > 0, got 0.0"),
        ("lr=nan", "lr must be a finite number > 0, got nan"),
    ],
)
def test_every_grid_value_is_checked_before_any_process_starts(flag, says, tmp_path, nothing_starts, capsys) -> None:
    err = _cli_error(["compare", "--strategies", "ddp,diloco", "--grid", flag, "--out", str(tmp_path)], capsys)
    assert "argument --grid: " in err and says in err


def test_a_checkpoint_dir_that_cannot_be_written_is_refused_before_any_process_starts(
    tmp_path, read_only, nothing_starts
) -> None:
    (tmp_path / "a-file").write_text("x")
    for folder, says in [(str(tmp_path / "a-file"), "is a file"), (read_only, "Read-only file system")]:
        with pytest.raises(ValueError, match=rf"checkpoint_dir '{folder}'.*{says}"):
            Trainer(TinyNet(), regression_data(64)).fit(
                SimpleReduceStrategy(), num_nodes=2, max_steps=2, batch_size=8, checkpoint_dir=folder, logger=False,
                progress=False, val_size=0,
            )  # fmt: skip


def test_measured_compute_with_an_asynchronous_strategy_is_refused_naming_the_flag(
    tmp_path, nothing_starts, capsys
) -> None:
    argv = ["compare", "--strategies", "ddp,async_diloco", "--out", str(tmp_path)]
    err = _cli_error([*argv, "--compute", "measured"], capsys)
    assert "argument --compute: async_diloco follows a simulated clock" in err and "fit(" not in err
    err = _cli_error([*argv, "--grid", "compute=flops,measured"], capsys)
    assert "argument --grid: async_diloco compute=measured seed=42: " in err and "follows a simulated clock" in err
    with pytest.raises(ValueError, match="needs modelled compute: the network has compute='measured'"):
        Trainer(TinyNet(), regression_data(64)).fit(
            build("async_diloco", 1e-3, 2), num_nodes=2, max_steps=2, batch_size=8, logger=False, progress=False,
            val_size=0, network=Network(1e9, 1e-3, compute="measured"),
        )  # fmt: skip


KEY_OF_PARTIAL = """
import functools, sys
sys.path.insert(0, {root!r})
from communicators.aggregation import trimmed_mean
from exogym.cli.sweep_store import run_key
print(run_key({{"params": {{"aggregate": functools.partial(trimmed_mean, beta=0.1)}}}}))
"""


def test_a_run_key_of_a_partial_rule_is_the_same_in_another_process_and_differs_with_its_arguments() -> None:
    import functools
    import subprocess
    import sys

    from communicators.aggregation import median, trimmed_mean
    from exogym.cli.sweep_store import run_key, stable_str

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    mine = run_key({"params": {"aggregate": functools.partial(trimmed_mean, beta=0.1)}})
    other = subprocess.run(
        [sys.executable, "-c", KEY_OF_PARTIAL.format(root=root)], capture_output=True, text=True, timeout=120
    )
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == mine
    assert run_key({"params": {"aggregate": functools.partial(trimmed_mean, beta=0.2)}}) != mine
    assert "0x" not in stable_str(functools.partial(trimmed_mean, beta=0.1)) + stable_str(median)
    assert stable_str(lambda u: u.mean(0)) != stable_str(lambda u: u.median(0).values)  # two lambdas differ
