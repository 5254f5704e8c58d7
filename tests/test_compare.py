"""`exogym compare` end to end, plots and loggers."""

import csv
import os
import re
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


def test_compare_command_prints_the_table_on_stdout_and_writes_csvs_and_plots(tmp_path) -> None:
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
    table = proc.stdout.split("MB sent/node")[1]  # the results on stdout, the logs on stderr
    assert "ddp" in table and "diloco" in table and "MB sent/node" not in proc.stderr
    assert f"wrote {out / 'version_0'}/summary.csv" in proc.stdout
    with open(out / "latest" / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == SUMMARY_COLUMNS and [r["strategy"] for r in rows] == ["ddp", "diloco"]
    ddp, dil = (float(r["bytes_sent_per_node"]) for r in rows)
    assert dil == pytest.approx(ddp / 10)
    for name in ("ddp", "diloco"):
        with open(out / "latest" / name / "metrics.csv") as f:
            reader = csv.DictReader(f)
            assert tuple(reader.fieldnames) == tuple(c for c in COLUMNS if c != "nodes_alive")  # no faults
            assert any(r["val_loss_global"] for r in reader)
    for metric in ("val_loss", "val_accuracy"):  # digits is a classifier: accuracy plots too
        for axis in ("step", "bytes", "sim_time"):
            assert _is_png(str(out / "latest" / f"{metric}_vs_{axis}.png"))
    # Every node's simulated time, per strategy: its parts add up to its clock.
    with open(out / "latest" / "utilisation.csv") as f:
        nodes = list(csv.DictReader(f))
    assert [(r["strategy"], int(r["rank"])) for r in nodes] == [(s, k) for s in ("ddp", "diloco") for k in range(4)]
    for r in nodes:
        parts = float(r["compute"]) + float(r["comm"]) + float(r["wait"])
        assert parts == pytest.approx(float(r["clock"])) and 0 < float(r["utilisation"]) <= 1
    assert _is_png(str(out / "latest" / "utilisation.png"))
    # The caption names the settings; the log reports the one-off start-up on its own line.
    assert "4 nodes x 30 steps, batch 16/node, inner lr 0.001, H=10" in proc.stderr
    assert "start-up" in proc.stderr and "not in wall s" in proc.stderr


def _small_compare(out, strategies=("ddp", "fedavg", "sparta"), **kw):
    from exogym.cli.compare import compare

    return compare(
        "digits",
        list(strategies),
        nodes=2,
        # One intra-op thread per worker, as the default comparison has on 2 cores: with two
        # threads in one worker, 1 run in 3 differed in the last digits of a validation loss.
        workers=2,
        steps=12,
        batch_size=8,
        H=4,
        out_dir=str(out),
        progress=False,
        val_size=64,
        **kw,
    )


def _files(folder) -> dict[str, bytes]:
    """Every file under ``folder``: relative path -> contents."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_comparison_writes_its_own_folder_leaving_the_first_as_it_was(tmp_path) -> None:
    first = _small_compare(tmp_path)
    assert first.out_dir == str(tmp_path / "version_0")
    written = _files(tmp_path / "version_0")
    assert "summary.csv" in written and "ddp/metrics.csv" in written and "val_loss_vs_step.png" in written
    second = _small_compare(tmp_path)
    assert second.out_dir == str(tmp_path / "version_1")
    assert _files(tmp_path / "version_0") == written
    assert os.readlink(tmp_path / "latest") == "version_1"
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]  # summaries and plots were renamed into place
    # the same arguments give the same summary, but for the wall time
    tables = []
    for run in ("version_0", "version_1"):
        with open(tmp_path / run / "summary.csv") as f:
            rows = list(csv.DictReader(f))
        assert [r["strategy"] for r in rows] == ["ddp", "fedavg", "sparta"]
        assert all(float(r["sim_time"]) > 0 and float(r["wall_time"]) > 0 for r in rows)
        tables.append([{k: v for k, v in r.items() if k != "wall_time"} for r in rows])
    assert tables[0] == tables[1]


def test_a_non_iid_comparison_trains_every_strategy_on_the_partition_and_plots_its_labels(tmp_path) -> None:
    from exogym.cli.compare import compare
    from exogym.partition import partition
    from exogym.tasks import load

    task = load("digits")
    split = partition(task.train, 2, "shards", shards_per_node=2, seed=0)
    result = compare(
        task, ["ddp", "fedavg"], nodes=2, workers=2, steps=6, batch_size=8, H=3, out_dir=str(tmp_path),
        progress=False, val_size=64, partition=split,
    )  # fmt: skip
    assert [r["strategy"] for r in result.summary] == ["ddp", "fedavg"] and not result.failures
    assert "data shards(shards_per_node=2, seed=0)" in result.caption
    histogram = os.path.join(result.out_dir, "label_histogram.png")
    assert histogram in result.plots and _is_png(histogram)
    with pytest.raises(ValueError, match="partition was made for 2 nodes, the comparison has nodes=3"):
        compare(task, ["ddp"], nodes=3, steps=2, out_dir=str(tmp_path), partition=split)


def _with_a_broken_preset(monkeypatch) -> None:
    """``compare``'s preset ``broken`` raises on rank 1 at step 3."""
    import exogym.cli.compare as cmp
    from tests.helpers import RaisingStrategy

    real_build = cmp.build
    monkeypatch.setattr(
        cmp, "build", lambda name, lr, H: RaisingStrategy(at=3) if name == "broken" else real_build(name, lr, H)
    )


def test_a_failing_strategy_is_logged_with_its_traceback_and_keeps_the_others_results(
    tmp_path, monkeypatch, caplog
) -> None:
    from exogym import NodeFailedError

    _with_a_broken_preset(monkeypatch)
    result = _small_compare(tmp_path, ("ddp", "broken", "fedavg"))
    assert [r["strategy"] for r in result.summary] == ["ddp", "fedavg"]
    assert list(result.failures) == ["broken"] and isinstance(result.failures["broken"], NodeFailedError)
    assert "strategy broke at step 3" in str(result.failures["broken"])
    assert "broken failed (the other strategies go on)" in caplog.text and "Traceback" in caplog.text
    failed = (tmp_path / "latest" / "broken" / "FAILED").read_text()  # beside the rows written before
    assert failed.startswith("NodeFailedError: ") and "strategy broke at step 3" in failed
    assert [p.parent.name for p in (tmp_path / "latest").glob("*/FAILED")] == ["broken"]
    with open(tmp_path / "latest" / "summary.csv") as f:
        assert [r["strategy"] for r in csv.DictReader(f)] == ["ddp", "fedavg"]
    assert _is_png(str(tmp_path / "latest" / "val_loss_vs_step.png"))
    assert len(result.plots) == 7  # loss and accuracy against 3 axes, and the nodes' utilisation
    assert list(result.nodes) == ["ddp", "fedavg"]


def test_raise_on_failure_raises_the_first_failure_after_writing_the_finished_results(tmp_path, monkeypatch) -> None:
    from exogym import NodeFailedError

    _with_a_broken_preset(monkeypatch)
    with pytest.raises(NodeFailedError, match="strategy broke at step 3"):
        _small_compare(tmp_path, ("ddp", "broken", "fedavg"), raise_on_failure=True)
    with open(tmp_path / "latest" / "summary.csv") as f:
        assert [r["strategy"] for r in csv.DictReader(f)] == ["ddp"]  # fedavg never ran


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
    acc = EventAccumulator(str(tmp_path / "logged" / "latest"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train_loss")] == [1, 2, 3, 4]
    assert "val_loss_global" in acc.Tags()["scalars"]


def _help_commands() -> list[list[str]]:
    """``--help`` of ``exogym``, each subcommand, the examples and the benchmark scripts."""
    import argparse

    from exogym.__main__ import _parser

    top, _ = _parser()
    subs = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    commands = [["-m", "exogym"]] + [["-m", "exogym", name] for a in subs for name in a.choices]
    examples = (
        "cifar10",
        "federated_mnist",
        "hybrid_diloco",
        "mnist",
        "nanogpt",
        "tutorial_custom_algorithm",
        "tutorial_production",
    )
    commands += [["-m", f"exogym.examples.{name}"] for name in examples]
    benchmarks = ("allreduce", "e2e", "fidelity", "robustness", "virtual_nodes", "gpu_virtual_nodes")
    commands += [[f"benchmarks/{name}.py"] for name in benchmarks]
    return commands


@pytest.mark.parametrize("command", _help_commands(), ids=lambda c: " ".join(c))
def test_help_exits_zero_at_once_in_plain_text(command: list[str]) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, *command, "--help"], capture_output=True, text=True, cwd=root, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage:") and "options:" in out.stdout
    assert not re.search(r"``|\]\[[\w.]+\]", out.stdout)  # no literals, no cross-references


def test_version_prints_the_package_version() -> None:
    import exogym

    out = subprocess.run([sys.executable, "-m", "exogym", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"exogym {exogym.__version__}"


def test_plot_comparison_draws_only_the_metrics_asked_for_and_names_a_wrong_one(tmp_path) -> None:
    from exogym.cli.plots import plot_comparison

    rows = [{"step": s, "bytes_sent": 1e6 * s, "sim_time": 0.5 * s} for s in range(5)]
    for s, row in enumerate(rows):
        row.update(val_loss_global=2 / (s + 1), val_accuracy_global=s / 9)
    paths = plot_comparison({"a": rows, "b": rows[:3]}, str(tmp_path), metrics=("val_loss",))
    assert sorted(os.path.basename(p) for p in paths) == [f"val_loss_vs_{x}.png" for x in ("bytes", "sim_time", "step")]
    assert len(plot_comparison({"a": rows}, str(tmp_path / "all"))) == 6  # loss and accuracy by default
    with pytest.raises(ValueError, match=r"metrics: unknown \['val_acc'\]; choose from \['val_loss', 'val_accuracy'\]"):
        plot_comparison({"a": rows}, str(tmp_path), metrics=("val_acc",))


def _python_processes() -> set[int]:
    """PIDs of every live Python process on the machine started from this venv's interpreter."""
    pids = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(sys.executable.encode()):
                    pids.add(int(pid))
        except OSError:
            continue
    return pids


@pytest.mark.procs
@pytest.mark.timeout(120)
def test_ctrl_c_ends_compare_with_status_130_one_line_no_process_left_and_the_rows_kept(tmp_path) -> None:
    import signal
    import time

    from exogym.cli.compare import compare

    out = tmp_path / "cmp"
    compare("digits", ["ddp"], nodes=2, workers=2, steps=4, out_dir=str(out), progress=False, val_size=64)
    complete = _files(out / "version_0")  # a complete comparison, which the interrupted one leaves as it was
    cmd = [sys.executable, "-m", "exogym", "compare", "--strategies", "fedavg,ddp", "--steps", "100000", "--H", "2"]
    cmd += ["--out", str(out)]  # with the progress bar, which Ctrl-C leaves mid-line
    before = _python_processes()
    # A shell's background job ignores SIGINT; the terminal's Ctrl-C reaches a process that does not.
    default_int = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=default_int)
    deadline = time.monotonic() + 60
    while not (out / "version_1" / "fedavg" / "metrics.csv").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # fedavg is training: some rows are written
    proc.send_signal(signal.SIGINT)
    raw, _ = proc.communicate(timeout=60)
    output = raw.decode()  # bytes: a bar's "\r" stays "\r"
    assert proc.returncode == 130, output
    assert "\ninterrupted (Ctrl-C): every node was stopped\n" in output and "Traceback" not in output
    assert f"comparison interrupted during fedavg: its partial results are in {out / 'version_1'}" in output
    with open(out / "version_1" / "fedavg" / "metrics.csv") as f:
        assert len(list(csv.DictReader(f))) > 1  # the rows written before Ctrl-C stay
    assert _files(out / "version_0") == complete and os.readlink(out / "latest") == "version_1"
    deadline = time.monotonic() + 10  # the command's fork server and workers end with it
    while _python_processes() - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _python_processes() - before == set()


def test_compare_network_accepts_world_names_and_world_files_and_names_the_choices(capsys) -> None:
    import os

    from exogym.__main__ import _parser

    _, parser = _parser()
    world = os.path.join(os.path.dirname(__file__), "..", "exogym", "examples", "worlds", "two-datacenters.json")
    assert parser.parse_args(["--network", "two-datacenters"]).network == "two-datacenters"
    assert parser.parse_args(["--network", "volunteers"]).network == "volunteers"
    assert parser.parse_args(["--network", world]).network == world
    with pytest.raises(SystemExit):
        parser.parse_args(["--network", "wifi"])
    assert "or give a world file (.json or .toml)" in capsys.readouterr().err


def test_compare_on_a_named_world_prices_ddp_on_the_crossing(tmp_path) -> None:
    from exogym.cli.compare import compare

    result = compare(
        "digits", ["ddp"], nodes=2, workers=2, steps=4, batch_size=8, H=4, out_dir=str(tmp_path),
        progress=False, val_size=64, network="two-datacenters", compute=0.0,
    )  # fmt: skip
    assert "network two-datacenters (2 region(s), 2 nodes" in result.caption
    last = [r for r in result.histories["ddp"] if "sim_comm_time" in r][-1]
    # the digits MLP 64-256-256-10: 85,002 float32 parameters, 340,008 bytes; 2 nodes in two
    # regions: 2 steps of a 170,004-byte chunk over 1 Gbit/s, 80 ms -> 2 * (0.08 + 1,360,032 / 1e9)
    assert last["sim_comm_time"] == pytest.approx(4 * 2 * (0.08 + 170_004 * 8 / 1e9), rel=1e-9)


def test_compare_refuses_a_world_of_another_size_before_starting() -> None:
    world = os.path.join(os.path.dirname(__file__), "..", "exogym", "examples", "worlds", "two-datacenters.json")
    proc = subprocess.run(
        [sys.executable, "-m", "exogym", "compare", "--network", world, "--nodes", "4", "--task", "digits"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "argument --network: network 'two-datacenters' describes 8 nodes but the run has 4" in proc.stderr


def test_compare_on_a_world_with_an_availability_trace_runs_every_strategy_and_logs_nodes_alive(tmp_path) -> None:
    from exogym.__main__ import main

    # Node 3 leaves at 0.05 s and returns at 0.15 s: steps 5-14 at 0.01 s a step, rounds 1-3 of H=4.
    (tmp_path / "av.csv").write_text("time,node,available\n0.05,3,0\n0.15,3,1\n")
    world = tmp_path / "w.json"
    world.write_text(
        '{"regions": {"us": [0, 1], "eu": [2, 3]}, "intra": {"bandwidth": "100Gbit/s", "latency": "10us"},'
        ' "inter": {"bandwidth": "1Gbit/s", "latency": "80ms"}, "availability": "av.csv", "compute": 0.01}'
    )
    out = tmp_path / "cmp"
    main([
        "compare", "--strategies", "fedavg,diloco", "--network", str(world), "--nodes", "4", "--workers", "2",
        "--steps", "20", "--H", "4", "--batch-size", "8", "--out", str(out), "--no-progress",
    ])  # fmt: skip
    with open(out / "latest" / "summary.csv") as f:
        assert [r["strategy"] for r in csv.DictReader(f)] == ["fedavg", "diloco"]
    for name in ("fedavg", "diloco"):
        with open(out / "latest" / name / "metrics.csv") as f:
            alive = [int(r["nodes_alive"]) for r in csv.DictReader(f) if r["nodes_alive"]]
        assert alive and min(alive) == 3  # rows cover steps in which node 3 is away


def test_compare_with_a_target_loss_writes_where_the_first_validation_below_it_was(tmp_path) -> None:
    # Every loss of the digits classifier is below 100: the first validation reaches it.
    result = _small_compare(tmp_path, ("ddp",), target_loss=100.0)
    first = next(r for r in result.histories["ddp"] if "val_loss_global" in r)
    with open(tmp_path / "latest" / "summary.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["target_steps"]) == first["step"]
    assert float(row["target_sim_time"]) == pytest.approx(first["sim_time"])
    assert float(row["target_mb_per_node"]) == pytest.approx(first["bytes_sent"] / 1e6)
    assert _is_png(str(tmp_path / "latest" / "val_loss_vs_sim_time.png"))


def test_the_caption_names_lr_and_H_for_presets_only() -> None:
    from exogym.cli.compare import settings_caption
    from exogym.core.comm.network import resolve_network

    net = resolve_network("internet", num_nodes=4)
    presets = settings_caption("digits", 4, 200, 32, 1e-3, 20, net, 42)
    assert presets.startswith(
        "digits: 4 nodes x 200 steps, batch 32/node, inner lr 0.001, H=20, seed 42; network internet"
    )
    own = settings_caption("digits", 4, 200, 32, None, None, net, 42)  # strategies with their own lr and H
    assert own.startswith("digits: 4 nodes x 200 steps, batch 32/node, seed 42; network internet")


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_the_2024_2026_presets_run_side_by_side_with_ddp_and_diloco(tmp_path) -> None:
    names = ("ddp", "diloco", "sparseloco", "muloco", "eager_diloco", "noloco", "desloc", "powersgd", "topk_ef")
    result = _small_compare(tmp_path, names, raise_on_failure=True)
    assert [r["strategy"] for r in result.summary] == list(names) and not result.failures
    with open(tmp_path / "latest" / "summary.csv") as f:
        assert [r["strategy"] for r in csv.DictReader(f)] == list(names)
    for axis in ("step", "bytes", "sim_time"):
        assert _is_png(str(tmp_path / "latest" / f"val_loss_vs_{axis}.png"))
    # every low-communication preset sends less than DDP
    sent = {r["strategy"]: r["bytes_sent_per_node"] for r in result.summary}
    assert all(sent[n] < sent["ddp"] for n in names if n != "ddp")
