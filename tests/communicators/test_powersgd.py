"""PowerSGD against a plain-PyTorch reference written from the paper (Vogels et al. 2019, arXiv
1905.13727, Algorithms 1 and 2) and against PyTorch's own ``powerSGD_hook`` under DDP on two gloo
processes; its bytes, dropped nodes, and the ``During`` window it is composed with."""

from __future__ import annotations

import gc
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from communicators import AveragingCommunicator, During
from communicators.powersgd import _Q_SALT
from exogym.core.seeding import derive_seed, generator
from exogym.faults_config import Faults
from exogym.strategy import OptimSpec, PowerSGDStrategy, SimpleReduceStrategy
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, node_batches, regression_data

STEPS, START = 12, 3
SGD = OptimSpec(torch.optim.SGD, lr=0.05, momentum=0.9)


class DeepNet(nn.Module):
    """8 -> 32 -> 32 -> 1: at rank 2 its 32x8 and 32x32 weights are compressed, at rank 4 only
    the 32x32 one (PyTorch's min_compression_rate test)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.fc3 = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 1)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x))))), y)


def _compressed(p: torch.Tensor, rank: int) -> bool:
    n, m = p.shape[0], p.numel() // p.shape[0]
    return p.dim() > 1 and (n + m) * min(n, m, rank) * 2 < n * m


def powersgd_reference(
    ds, k: int, steps: int, rank: int, start: int, make=DeepNet, dropped: dict[int, list[int]] | None = None
) -> list[list[torch.Tensor]]:
    """K model copies with SGD (momentum 0.9). Steps before ``start``: the mean gradient. After:
    per compressed matrix (the paper's Algorithm 1 with Algorithm 2's error feedback), M_k = G_k +
    E_k; P = sum_k M_k Q; P = QR(P).Q; Q = mean_k M_k^T P; every node applies P Q^T and keeps
    E_k = M_k - P Q^T; Q carries over (warm start, orthogonalized by QR before use). Other tensors:
    the mean. The first Q is the shared-seed draw (standard normal, matrices in parameter order).
    ``dropped[s]``: nodes that draw no batch at step s and are left out of its means; after the
    step they take the lowest survivor's error (its whole state, as a rejoining node does)."""
    dropped = dropped or {}
    models = [make() for _ in range(k)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
    data = [node_batches(ds, k, r) for r in range(k)]
    params = [list(m.parameters()) for m in models]
    squeeze = [i for i, p in enumerate(params[0]) if _compressed(p, rank)]
    shape = {i: (params[0][i].shape[0], params[0][i].numel() // params[0][i].shape[0]) for i in squeeze}
    errors = [{i: torch.zeros(shape[i]) for i in squeeze} for _ in range(k)]
    gen = generator(0, _Q_SALT)
    qs = {i: torch.randn(shape[i][1], min(*shape[i], rank), generator=gen) for i in squeeze}
    for s in range(steps):
        alive = [r for r in range(k) if r not in dropped.get(s, [])]
        for r in alive:
            models[r].zero_grad()
            models[r](next(data[r])).backward()
        mean = {i: sum(params[r][i].grad for r in alive) / len(alive) for i in range(len(params[0]))}
        if s >= start:
            for i in squeeze:
                ms = {r: params[r][i].grad.reshape(shape[i]) + errors[r][i] for r in alive}
                q = torch.linalg.qr(qs[i]).Q
                p = torch.linalg.qr(sum(ms[r] @ q for r in alive)).Q
                qs[i] = sum(ms[r].T @ p for r in alive) / len(alive)
                mean[i] = (p @ qs[i].T).view_as(params[0][i])
                for r in alive:
                    errors[r][i] = ms[r] - p @ qs[i].T
        for r in range(k):
            for i, p in enumerate(params[r]):
                p.grad = mean[i].clone()
            opts[r].step()
        for r in dropped.get(s, []):
            errors[r] = {i: e.clone() for i, e in errors[alive[0]].items()}
    return [[p.detach().clone() for p in m.parameters()] for m in models]


def _strategy(rank: int, start: int = START) -> PowerSGDStrategy:
    return PowerSGDStrategy(rank=rank, start_iter=start, optim_spec=SGD)


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("rank", [1, 2, 4])
def test_powersgd_matches_the_reference_on_every_node(k: int, rank: int) -> None:
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(k, lambda: _strategy(rank), STEPS, make_model=DeepNet, dataset=ds)
    ref = powersgd_reference(ds, k, STEPS, rank, START)
    for r in range(k):
        for a, b in zip(out[r]["params"], ref[r], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_with_nodes_dropped_the_survivors_compress_among_themselves_and_the_dropped_rejoin() -> None:
    k, dropped = 4, {1: [3], 5: [0, 2], 6: [1]}
    ds = regression_data(k * 8 * STEPS)
    faults = Faults(drop=dropped)
    out = train_ranks(k, lambda: _strategy(2), STEPS, make_model=DeepNet, dataset=ds, faults=faults)
    ref = powersgd_reference(ds, k, STEPS, 2, START, dropped=dropped)
    for r in range(k):
        for a, b in zip(out[r]["params"], ref[r], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    whole = powersgd_reference(ds, k, STEPS, 2, START)
    assert not torch.allclose(whole[0][2], ref[0][2])  # the faults changed the result


@pytest.mark.parametrize("k", [2, 4])
def test_bytes_are_ddp_s_before_the_start_then_n_plus_m_times_r_floats_per_matrix(k: int) -> None:
    out = train_ranks(k, lambda: _strategy(2), STEPS, make_model=DeepNet)
    params = list(DeepNet().parameters())
    dense = sum(4 * p.numel() for p in params if not _compressed(p, 2))  # the biases and the 1x32 weight
    assert dense == 4 * (32 + 32 + 1 + 32)
    p_bytes, q_bytes = 4 * (32 * 2 + 32 * 2), 4 * (8 * 2 + 32 * 2)  # P: n*r per matrix, Q: m*r
    ring = 2 * (k - 1) / k
    for s, records in enumerate(out[0]["records"]):
        got = [(r.kind, r.group_size, r.payload, r.tag) for r in records]
        if s < START:
            assert got == [("all_reduce", k, sum(4 * p.numel() for p in params), "average_grads")]
        else:
            assert got == [
                ("all_reduce", k, dense, "powersgd_dense"),
                ("all_reduce", k, p_bytes, "powersgd_p"),
                ("all_reduce", k, q_bytes, "powersgd_q"),
            ]
            assert sum(r.sent for r in records) == pytest.approx(ring * (dense + (32 + 8 + 32 + 32) * 2 * 4))


def test_virtual_nodes_end_as_nodes_on_their_own_threads() -> None:
    alone = train_ranks(4, lambda: _strategy(2), STEPS, make_model=DeepNet)
    virtual = train_ranks(4, lambda: _strategy(2), STEPS, make_model=DeepNet, workers=2)
    for a, b in zip(alone, virtual, strict=True):
        for p, q in zip(a["params"], b["params"], strict=True):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)


def test_a_start_past_the_run_is_ddp_and_the_window_is_in_the_description() -> None:
    powersgd = train_ranks(2, lambda: _strategy(1, start=STEPS), STEPS)
    ddp = train_ranks(2, lambda: SimpleReduceStrategy(optim_spec=SGD), STEPS)
    for a, b in zip(powersgd[0]["params"], ddp[0]["params"], strict=True):
        assert torch.equal(a, b)
    assert _strategy(1).pipeline.describe() == "Averaging(grads, H=1)[steps 0:3] -> PowerSGD(rank=1)[steps 3:]"
    assert [m.describe() for m in PowerSGDStrategy(start_iter=0).pipeline.leaves()] == ["PowerSGD(rank=1)[steps 0:]"]


def test_during_refuses_a_pipeline_and_a_window_that_ends_before_it_starts() -> None:
    from exogym.core.pipeline import Pipeline

    with pytest.raises(TypeError, match="During wraps one module"):
        During(Pipeline([AveragingCommunicator(), AveragingCommunicator()]))
    with pytest.raises(ValueError, match="stop must be None or an int >= start=5"):
        During(AveragingCommunicator(), start=5, stop=2)


class _SharedSeed:
    """Stands in for the hook's ``state.rng``: the seed of its first Q draw is the one ExoGym
    derives from the run's shared seed, so both start from the same Q."""

    def randint(self, high: int) -> int:
        return derive_seed(0, _Q_SALT)


def _ddp_hook_worker(rank: int, folder: str, make: type[nn.Module], matrix_rank: int, ds) -> None:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as hook
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2)
    try:
        model = DistributedDataParallel(make())
        state = hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=matrix_rank,
            start_powerSGD_iter=START,
            min_compression_rate=2,
            use_error_feedback=True,
            warm_start=True,
        )
        state.rng = _SharedSeed()
        model.register_comm_hook(state, hook.powerSGD_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for batch in list(node_batches(ds, 2, rank))[:STEPS]:
            opt.zero_grad()
            model(batch).backward()
            opt.step()
        torch.save([p.detach().clone() for p in model.module.parameters()], os.path.join(folder, f"rank{rank}.pt"))
        dist.barrier()  # both ranks are done before either closes its gloo pairs
    finally:
        # DDP's reducer and the hook's state go before their process group: torch's threads
        # destroyed at the interpreter's exit after it can abort the process
        model = state = opt = None  # noqa: F841
        gc.collect()
        dist.destroy_process_group()


@pytest.mark.procs
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("make", "rank"), [(TinyNet, 1), (DeepNet, 4)], ids=["tinynet_rank1", "deepnet_rank4_qr"])
def test_powersgd_matches_pytorchs_powersgd_hook_under_ddp_on_two_gloo_processes(tmp_path, make, rank) -> None:
    """One compressed matrix each (the hook orders a bucket's matrices its own way); at rank 4 the
    hook orthogonalizes by QR, ExoGym by Gram-Schmidt: the results agree all the same."""
    ds = regression_data(2 * 8 * STEPS)
    torch.multiprocessing.spawn(_ddp_hook_worker, args=(str(tmp_path), make, rank, ds), nprocs=2, join=True)
    out = train_ranks(2, lambda: _strategy(rank), STEPS, make_model=make, dataset=ds)
    for r in range(2):
        hooked = torch.load(tmp_path / f"rank{r}.pt")
        for a, b in zip(out[r]["params"], hooked, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"rank": 0}, ValueError, r"rank must be an int >= 1 .*, got 0"),
        ({"rank": 1.5}, ValueError, r"rank must be an int >= 1 .*, got 1.5"),
        ({"start_iter": -1}, ValueError, r"start_iter \(dense steps before compressing\) must be an int >= 0"),
        ({"min_compression_rate": 0.5}, ValueError, r"min_compression_rate must be >= 1, got 0.5"),
        ({"min_compression_rate": "2"}, TypeError, r"min_compression_rate must be a number >= 1"),
    ],
)
def test_settings_out_of_range_are_refused_naming_the_argument(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        PowerSGDStrategy(**kwargs)
