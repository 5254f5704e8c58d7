"""``fit`` under torchrun: the same results as ExoGym's own launcher, as one or two machines."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import torch

from exogym.runtime import cluster
from tests.torchrun_script import ASYNC, ASYNC_NETWORK, PRESETS, fit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "torchrun_script.py")


def _torchrun(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in cluster.TORCHRUN_ENV}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
    )


def _params(path: str) -> list[torch.Tensor]:
    return torch.load(path, weights_only=True)


def _assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _no_process_left() -> bool:
    """No process runs the torchrun test script any more."""
    out = subprocess.run(["pgrep", "-f", SCRIPT], capture_output=True, text=True)
    return out.stdout.strip() == ""


@pytest.mark.procs
@pytest.mark.timeout(400)
def test_the_2024_2026_presets_under_torchrun_give_the_parameters_of_a_local_fit(tmp_path) -> None:
    out = str(tmp_path / "presets")
    proc = _torchrun("--standalone", "--nproc_per_node=2", SCRIPT, "presets", "2", out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for preset in PRESETS:
        local, _ = fit(preset, 2)
        _assert_same(_params(f"{out}.{preset}.0"), [p.detach() for p in local.parameters()])
        _assert_same(_params(f"{out}.{preset}.1"), _params(f"{out}.{preset}.0"))
    assert _no_process_left()


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_the_asynchronous_presets_under_torchrun_simulate_give_the_parameters_of_a_local_fit(tmp_path) -> None:
    # 4 nodes on 2 ranks (simulate mode): the same timeline, the same values as a local fit
    out = str(tmp_path / "async")
    proc = _torchrun("--standalone", "--nproc_per_node=2", SCRIPT, "async", "4", out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for preset in ASYNC:
        local, _ = fit(preset, 4, network=ASYNC_NETWORK)
        _assert_same(_params(f"{out}.{preset}.0"), [p.detach() for p in local.parameters()])
        _assert_same(_params(f"{out}.{preset}.1"), _params(f"{out}.{preset}.0"))
    assert _no_process_left()


@pytest.mark.procs
@pytest.mark.timeout(200)
@pytest.mark.parametrize("strategy", ["ddp", "diloco"])
def test_torchrun_standalone_two_ranks_give_the_parameters_of_a_local_fit(strategy: str, tmp_path) -> None:
    out = str(tmp_path / strategy)
    proc = _torchrun("--standalone", "--nproc_per_node=2", SCRIPT, strategy, "2", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    local, trainer = fit(strategy, 2)  # ExoGym's own launcher, same seed and data order
    _assert_same(_params(f"{out}.0"), [p.detach() for p in local.parameters()])
    _assert_same(_params(f"{out}.1"), _params(f"{out}.0"))  # every rank returns the averaged model
    saved = torch.load(f"{out}.history", weights_only=False)
    assert (saved["launcher"], saved["workers"]) == ("torchrun", 2)
    history = saved["history"]
    strip = ("wall_time", "comm_time", "compute_time", "sim_time", "peak_memory")  # measured, not modelled
    assert [{k: v for k, v in r.items() if k not in strip} for r in history] == [
        {k: v for k, v in r.items() if k not in strip} for r in trainer.history
    ]


@pytest.mark.procs
@pytest.mark.timeout(200)
def test_simulate_mode_spreads_four_virtual_nodes_over_two_ranks_as_a_local_fit(tmp_path) -> None:
    out = str(tmp_path / "sim")
    proc = _torchrun("--standalone", "--nproc_per_node=2", SCRIPT, "diloco", "4", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = torch.load(f"{out}.history", weights_only=False)
    assert (saved["launcher"], saved["workers"]) == ("torchrun", 2)  # 2 virtual nodes per rank
    local, _ = fit("diloco", 4, workers=2)
    _assert_same(_params(f"{out}.0"), [p.detach() for p in local.parameters()])
    _assert_same(_params(f"{out}.1"), _params(f"{out}.0"))


@pytest.mark.procs
@pytest.mark.timeout(200)
def test_every_rank_starts_from_rank_zeros_model(tmp_path) -> None:
    out = str(tmp_path / "unseeded")
    proc = _torchrun("--standalone", "--nproc_per_node=2", SCRIPT, "ddp", "2", out, "unseeded")
    assert proc.returncode == 0, proc.stderr[-3000:]
    local, _ = fit("ddp", 2)  # rank 0 built TinyNet(seed=0), the local run's model
    _assert_same(_params(f"{out}.0"), [p.detach() for p in local.parameters()])
    _assert_same(_params(f"{out}.1"), _params(f"{out}.0"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.procs
@pytest.mark.timeout(200)
def test_two_torchrun_agents_behave_as_two_machines(tmp_path) -> None:
    out = str(tmp_path / "two")
    env = {k: v for k, v in os.environ.items() if k not in cluster.TORCHRUN_ENV}
    rdzv = [
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=127.0.0.1:{_free_port()}",
        "--rdzv_id=exogym-test",
    ]
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *rdzv, SCRIPT, "diloco", "2", out],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        logs = [a.communicate(timeout=150)[0] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
    assert [a.returncode for a in agents] == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    local, _ = fit("diloco", 2)
    _assert_same(_params(f"{out}.0"), [p.detach() for p in local.parameters()])
    _assert_same(_params(f"{out}.1"), _params(f"{out}.0"))


@pytest.mark.procs
@pytest.mark.timeout(200)
def test_a_rank_that_raises_makes_torchrun_exit_nonzero_with_its_error(tmp_path) -> None:
    t0 = time.monotonic()
    proc = _torchrun("--standalone", "--nproc_per_node=2", SCRIPT, "ddp", "2", str(tmp_path / "x"), "fail")
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert "ValueError: boom on rank 1" in proc.stderr
    assert elapsed < 60, f"torchrun took {elapsed:.0f} s to give up"  # start-up included; a hang is 300 s
    assert _no_process_left()


@pytest.mark.procs
@pytest.mark.timeout(200)
def test_ranks_that_disagree_on_num_nodes_raise_before_training(tmp_path) -> None:
    proc = _torchrun("--standalone", "--nproc_per_node=2", SCRIPT, "ddp", "2", str(tmp_path / "x"), "mismatch")
    assert proc.returncode != 0
    assert "the torchrun ranks called fit with different num_nodes (rank 0: 2, rank 1: 3)" in proc.stderr
    assert _no_process_left()


# Without processes: how the launcher's environment and fit's arguments are read.


def test_detect_reads_torchrun_variables(monkeypatch) -> None:
    for k in (*cluster.TORCHRUN_ENV, "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert cluster.detect() is None
    env = {"RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "h", "MASTER_PORT": "1", "LOCAL_RANK": "1"}
    env["LOCAL_WORLD_SIZE"] = "4"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cluster.detect() == cluster.LaunchEnv(rank=3, world_size=8, local_rank=1, local_world_size=4)
    assert not cluster.reporting()
    assert cluster.worker_device("cuda", (4, 5), cluster.detect()) == (5,)
    assert cluster.worker_device("cpu", None, cluster.detect()) is None


@pytest.mark.parametrize(
    ("mode", "nodes", "workers", "match"),
    [
        ("deploy", 4, None, "torchrun_mode='deploy' runs one node per torchrun process"),
        ("simulate", 2, None, "torchrun_mode='simulate' spreads more nodes than processes"),
        (None, 1, None, "num_nodes=1 is smaller than torchrun's world size 2"),
        (None, 4, 3, "workers=3 under torchrun"),
        ("local", 2, None, "torchrun_mode must be one of"),
    ],
)
def test_resolve_mode_names_the_argument(mode, nodes, workers, match) -> None:
    with pytest.raises(ValueError, match=match):
        cluster.resolve_mode(mode, nodes, 2, workers)


def test_resolve_mode_infers_deploy_and_simulate() -> None:
    assert cluster.resolve_mode(None, 2, 2, None) == "deploy"
    assert cluster.resolve_mode(None, 64, 2, 2) == "simulate"


def test_shared_memory_is_refused_under_torchrun() -> None:
    with pytest.raises(ValueError, match="transport='shm' needs ExoGym's own launcher"):
        cluster.resolve_transport("shm", "cpu")
    assert cluster.resolve_transport("auto", "cpu") == "gloo"
    assert cluster.resolve_transport("auto", "cuda") == "nccl"


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_exogym_compare_under_torchrun_writes_the_summary_of_a_local_comparison(tmp_path) -> None:
    import csv

    from exogym.cli.compare import compare

    args = ["--strategies", "ddp,diloco", "--nodes", "4", "--steps", "12", "--H", "4", "--batch-size", "8"]
    proc = _torchrun(
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "exogym",
        "compare",
        *args,
        "--out",
        str(tmp_path / "tr"),
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("strategy          val loss") == 1  # rank 0 alone prints the table
    compare(
        "digits",
        ["ddp", "diloco"],
        nodes=4,
        workers=2,
        steps=12,
        H=4,
        batch_size=8,
        out_dir=str(tmp_path / "local"),
        progress=False,
    )
    tables = []
    for run in ("tr", "local"):
        with open(tmp_path / run / "latest" / "summary.csv") as f:
            tables.append([{k: v for k, v in r.items() if k != "wall_time"} for r in csv.DictReader(f)])
    assert tables[0] == tables[1] and len(tables[0]) == 2
