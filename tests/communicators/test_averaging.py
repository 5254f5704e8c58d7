"""Averaging: rounds leave ranks identical, islands, client sampling, and their bytes."""

import pytest
import torch

from communicators import AveragingCommunicator, draw_islands, draw_participants
from exogym.strategy import FedAvgStrategy, OptimSpec, SimpleReduceStrategy
from tests.fake_world import train_ranks
from tests.helpers import TinyNet

SGD = OptimSpec(torch.optim.SGD, lr=0.05)
PARAM_BYTES = sum(p.numel() * 4 for p in TinyNet().parameters())


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("steps", [6, 7])
def test_ranks_identical_after_each_round_and_only_then(steps: int) -> None:
    out = train_ranks(3, lambda: FedAvgStrategy(H=3, optim_spec=SGD), steps)
    same = all(_equal(out[0]["params"], o["params"]) for o in out[1:])
    assert same == (steps % 3 == 0)


def test_fedavg_bytes_are_ddp_bytes_once_per_h() -> None:
    k, h, steps = 4, 5, 20
    fed = train_ranks(k, lambda: FedAvgStrategy(H=h, optim_spec=SGD), steps)
    ddp = train_ranks(k, lambda: SimpleReduceStrategy(optim_spec=SGD), steps)
    fed_sent = sum(r.sent for recs in fed[0]["records"] for r in recs)
    ddp_sent = sum(r.sent for recs in ddp[0]["records"] for r in recs)
    assert fed_sent == pytest.approx(ddp_sent / h)
    assert fed_sent == pytest.approx(steps // h * 2 * (k - 1) / k * PARAM_BYTES)
    assert [bool(recs) for recs in fed[0]["records"]] == [(s + 1) % h == 0 for s in range(steps)]


def test_island_size_k_equals_plain_averaging() -> None:
    plain = train_ranks(4, lambda: FedAvgStrategy(H=2, optim_spec=SGD), 6)
    island = train_ranks(4, lambda: FedAvgStrategy(H=2, island_size=4, optim_spec=SGD), 6)
    for a, b in zip(plain, island, strict=True):
        assert _equal(a["params"], b["params"])


def test_islands_average_within_and_are_charged_at_island_size() -> None:
    k, size, seed, steps = 4, 2, 0, 2
    out = train_ranks(k, lambda: FedAvgStrategy(H=steps, island_size=size, optim_spec=SGD), steps, seed=seed)
    islands = draw_islands(k, size, seed, round_=0)
    for isl in islands:
        assert _equal(out[isl[0]]["params"], out[isl[1]]["params"])
    assert not _equal(out[islands[0][0]]["params"], out[islands[1][0]]["params"])
    rec = out[0]["records"][-1][0]
    assert (
        rec.kind == "all_reduce"
        and rec.group_size == size
        and rec.sent == pytest.approx(2 * (size - 1) / size * PARAM_BYTES)
    )


def test_draws_are_shared_and_vary_by_round() -> None:
    a = [draw_islands(8, 3, seed=5, round_=r) for r in range(6)]
    assert a == [draw_islands(8, 3, seed=5, round_=r) for r in range(6)]
    assert len({str(x) for x in a}) > 1
    for islands in a:
        assert sorted(sum(islands, [])) == list(range(8)) and [len(i) for i in islands] == [3, 3, 2]
    assert draw_islands(4, 9, 0, 0) == [[0, 1, 2, 3]]
    p = draw_participants(list(range(10)), 0.3, seed=1, round_=2)
    assert len(p) == 3 and p == draw_participants(list(range(10)), 0.3, seed=1, round_=2)


def test_bad_arguments_are_refused_naming_the_argument_and_client_sampling_names_the_server() -> None:
    with pytest.raises(ValueError, match="target"):
        AveragingCommunicator(target="weights")
    with pytest.raises(ValueError, match=r"client sampling runs as a server.*FedAvgStrategy\(H, client_sampling=0.1\)"):
        AveragingCommunicator(client_sampling=0.1)
    with pytest.raises(TypeError, match="H"):
        FedAvgStrategy(H=2, local_epochs=1)
    with pytest.raises(TypeError, match="unexpected keyword"):
        FedAvgStrategy(H=2, island=3)
