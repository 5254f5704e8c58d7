"""The 2024-2026 presets with many virtual nodes on two workers, against the plain-PyTorch
references of their own test modules (written from the papers) at the same number of nodes.

Where many clients make sense (each node's bytes do not grow with K: all-reduces, NoLoCo's
pairs), 1,000 virtual nodes train in two worker processes and the model ``fit`` returns (the
mean of the nodes' final parameters) equals the mean of the reference's 1,000 nodes. SparseLoCo
and top-k with error feedback all-gather: each node receives and decodes every other node's
payload, so their bytes per node grow as ``K - 1`` payloads (past about ``1 / k`` nodes top-k
sends more than DDP, past about 290 nodes SparseLoCo's defaults more than DiLoCo; see their docs
pages) and 32 virtual nodes on two workers are the test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from exogym import Trainer
from exogym.strategy import DESLOCStrategy
from tests.communicators import test_desloc as desloc
from tests.communicators import test_eager_diloco as eager
from tests.communicators import test_muloco as muloco
from tests.communicators import test_noloco as noloco
from tests.communicators import test_powersgd as powersgd
from tests.communicators import test_sparseloco as sparseloco
from tests.communicators import test_topk_ef as topk_ef
from tests.fake_world import train_ranks
from tests.helpers import FIT_DEFAULTS, TinyNet, regression_data

STEPS = 6  # two rounds of H=3 (DES-LOC: Kx=2, Ku=3, Kv=6 all end on the last step; PowerSGD: 3 compressed steps)
#: MuLoCo's run is one round: two rounds took about a minute on a quiet 2-core machine, past 7 on a loaded one.
ROUNDS_OF = {"muloco": 1}
CLIENTS = 1000


def _mean(nodes: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    return [torch.stack(ts).mean(0) for ts in zip(*nodes, strict=True)]


# name -> (strategy, model, the reference's nodes' final parameters for (dataset, K, steps))
MANY: dict[str, tuple[Callable[[], Any], Callable[[], torch.nn.Module], Callable[..., list[list[torch.Tensor]]]]] = {
    "noloco": (noloco._make(0.3), TinyNet, lambda ds, k, s: noloco.noloco_reference(ds, k, s, 0.3)),
    "powersgd": (
        lambda: powersgd._strategy(2),
        powersgd.DeepNet,
        lambda ds, k, s: powersgd.powersgd_reference(ds, k, s, 2, powersgd.START),
    ),
    "desloc": (
        lambda: DESLOCStrategy(Kx=2, Ku=3, Kv=6, optim_spec=desloc.ADAM),
        TinyNet,
        lambda ds, k, s: desloc.desloc_reference(ds, k, s, 2, 3, 6),
    ),
    "eager_diloco": (eager._make, TinyNet, eager.eager_reference),
    "muloco": (
        muloco._muloco(muloco.H, muloco.OUTER_LR, muloco.OUTER_MOMENTUM),
        TinyNet,
        lambda ds, k, s: [muloco.muloco_reference(ds, k, s, muloco.H, muloco.OUTER_LR, muloco.OUTER_MOMENTUM)],
    ),
}


@pytest.mark.procs
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(MANY))
def test_1000_virtual_nodes_on_two_workers_end_at_the_mean_of_the_reference_s_1000_nodes(name: str) -> None:
    """Tolerance: the mean of 1,000 nodes summed in another order (the workers' local sums, then
    one transport call) than the reference's, after float32 training (MuLoCo's outer Nesterov
    momentum then Muon's orthogonalisation carry it on): rtol 1e-4, atol 1e-5."""
    make_strategy, make_model, reference = MANY[name]
    steps = 3 * ROUNDS_OF.get(name, 2)
    ds = regression_data(CLIENTS * 8 * steps)
    model = Trainer(make_model(), ds).fit(
        make_strategy(), num_nodes=CLIENTS, workers=2, max_steps=steps, batch_size=8, seed=0, **FIT_DEFAULTS
    )
    expected = _mean(reference(ds, CLIENTS, steps))
    start = [p.detach() for p in make_model().parameters()]
    for p, e, s in zip(model.parameters(), expected, start, strict=True):
        torch.testing.assert_close(p.detach(), e, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(e, s)  # the run moved the parameters


GATHERED = {
    "sparseloco": (
        sparseloco._make(16, 2, 2),
        lambda ds, k, s: sparseloco.sparseloco_reference(ds, k, s, 16, 2, 2),
    ),
    "topk_ef": (
        lambda: topk_ef.TopKEFStrategy(k=0.1, optim_spec=topk_ef.SGD),
        lambda ds, k, s: topk_ef.topk_ef_reference(ds, k, s, 0.1),
    ),
}


@pytest.mark.parametrize("name", list(GATHERED))
def test_all_gather_presets_on_32_virtual_nodes_equal_the_reference_and_send_k_minus_1_payloads(name: str) -> None:
    make_strategy, reference = GATHERED[name]
    k = 32
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(k, make_strategy, STEPS, dataset=ds, workers=2)
    ref = reference(ds, k, STEPS)
    for rank in range(k):
        for a, b in zip(out[rank]["params"], ref[rank], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for o in out:
        records = [r for step in o["records"] for r in step]
        assert records and all(r.kind == "all_gather" and r.sent == (k - 1) * r.payload for r in records)


def test_top_k_sends_about_k_times_k_of_ddp_s_bytes_so_more_than_ddp_past_one_over_k_nodes() -> None:
    """The docs' break-even: TinyNet's 161 entries at ``k=0.25`` send 32 + 4 + 4 + 1 = 41 pairs
    per step (0.255 of the entries), so top-k sends ``K * 41 / 161`` times DDP's bytes: less than
    DDP at 3 nodes, more at 5 (past ``1 / k = 4``)."""
    ratios = {}
    for k in (3, 5):
        sent = {}
        for name, make in (
            ("topk", lambda: topk_ef.TopKEFStrategy(k=0.25, optim_spec=topk_ef.SGD)),
            ("ddp", lambda: topk_ef.SimpleReduceStrategy(optim_spec=topk_ef.SGD)),
        ):
            out = train_ranks(k, make, 2)
            sent[name] = sum(r.sent for step in out[0]["records"] for r in step)
        ratios[k] = sent["topk"] / sent["ddp"]
    assert ratios == pytest.approx({3: 3 * 41 / 161, 5: 5 * 41 / 161})
    assert ratios[3] < 1 < ratios[5]
