"""TransportPlan: the one place a run's transport is chosen, sized and checked."""

import pickle

import pytest
import torch

from exogym.core.comm import shm
from exogym.core.comm.plan import TransportPlan, resolve_kind


def test_auto_picks_shared_memory_for_cpu_nodes_and_gloo_for_cuda_without_enough_gpus() -> None:
    assert resolve_kind("auto", "cpu", 0, 4) == ("shm" if shm.supported() else "gloo")
    assert resolve_kind("auto", "cuda", 1, 4) == "gloo"
    assert resolve_kind("auto", "cuda", 4, 4) == "nccl"


@pytest.mark.parametrize(
    ("kind", "device", "gpus", "match"),
    [
        ("nccl", "cpu", 0, r"transport='nccl' needs device='cuda', got device='cpu' \(\d+ GPUs here\)"),
        ("nccl", "cuda", 1, "transport='nccl' needs one GPU per worker process: 2 workers, 1 GPU"),
        ("shm", "cuda", 2, "transport='shm' moves CPU tensors"),
        ("tcp", "cpu", 0, "transport must be one of"),
    ],
)
def test_impossible_transports_are_refused_naming_the_argument(kind: str, device: str, gpus: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_kind(kind, device, gpus, 2)


def test_a_plan_pickles_without_its_store_and_sizes_its_slot_from_the_hint() -> None:
    plan = TransportPlan.create("auto", "cpu", 3, payload_hint=100_000)
    try:
        copy = pickle.loads(pickle.dumps(plan))
        assert copy._store is None and plan._store is not None
        assert copy.store_port == plan.store_port and copy.world_size == 3
        if plan.kind == "shm":
            assert plan.slot == shm.round_slot(100_000)
            assert plan.segment.numel() == shm.segment_bytes(3, plan.slot)
            big = TransportPlan.create("shm", "cpu", 2, payload_hint=10**9, slot_mb=4)
            assert big.slot == 4 << 20  # fixed size: larger payloads are streamed
            big.close()
    finally:
        plan.close()


def test_bad_timeouts_and_slot_sizes_name_the_fit_argument() -> None:
    with pytest.raises(ValueError, match="collective_timeout must be > 0"):
        TransportPlan.create("gloo", "cpu", 2, timeout_s=0)
    with pytest.raises(ValueError, match="shm_slot_mb must be > 0"):
        TransportPlan.create("gloo", "cpu", 2, slot_mb=-1)


def test_a_full_dev_shm_is_reported_with_the_fix(tmp_path) -> None:
    with pytest.raises(RuntimeError, match=r"--shm-size.*shm_slot_mb.*transport='gloo'"):
        shm.check_room(1 << 62, str(tmp_path))


def test_a_transport_refuses_a_segment_made_for_another_world() -> None:
    seg = shm.create_segment(2, 1 << 16)
    with pytest.raises(ValueError, match="create_segment"):
        shm.ShmTransport(seg, 0, 3, 1 << 16, 1.0)
    assert seg.is_shared() and int(seg[:64].sum()) == 0  # zeroed, shared pages


def test_the_barrier_kernel_and_its_reference_agree_on_mismatch_reports() -> None:
    from exogym.ops import sync

    for fn in (sync.shm_barrier_reference, sync.shm_barrier):
        flags = torch.zeros(2, sync.WORDS, dtype=torch.int64)
        flags[1, 1] = (1 << 48) | 80  # rank 1 arrived at generation 1 with tag 7, 80 bytes
        flags[1, 0] = (1 << 32) | (7 << 16)
        assert fn(flags, 0, 1, 5, 0, 40, 0.5) == 1  # rank 0 came with tag 5: rank 1 disagrees
        assert flags[0, 2:5].tolist() == [1, int(flags[1, 0]), int(flags[1, 1])]
        flags = torch.zeros(2, sync.WORDS, dtype=torch.int64)
        assert fn(flags, 0, 1, 5, 0, 40, 0.2) == sync.TIMED_OUT  # rank 1 never came


def test_a_shm_transport_tells_whether_its_peers_wait_for_its_next_collective() -> None:
    # two ranks on one segment, rank 1 on a thread: before rank 1 calls anything rank 0 sees no
    # peer waiting; once rank 1 sits in its next barrier, rank 0 does; after both passed it,
    # none again
    import threading
    import time

    seg = shm.create_segment(2, 1 << 16)
    t0 = shm.ShmTransport(seg, 0, 2, 1 << 16, 10.0)
    t1 = shm.ShmTransport(seg, 1, 2, 1 << 16, 10.0)
    assert not t0.peers_waiting()
    peer = threading.Thread(target=t1.barrier)
    peer.start()
    deadline = time.monotonic() + 10.0
    while not t0.peers_waiting() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert t0.peers_waiting()
    t0.barrier()
    peer.join(10.0)
    assert not peer.is_alive()
    assert not t0.peers_waiting() and not t1.peers_waiting()
