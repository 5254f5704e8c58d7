"""The docs' error-feedback tutorial (docs/writing-algorithms/tutorial-error-feedback.md).

Its compressor is checked against a plain-PyTorch EF-SignSGD written from the paper's formulas
(Karimireddy et al. 2019, arXiv 1901.09847, Algorithm 1, on every node, the nodes' compressed
gradients averaged), its ledger against the payload formula, and its state against the
reference's residuals; its blocks, run in order as one script, print the table the page shows.
"""

from __future__ import annotations

import math
import os
import re

import pytest
import torch

from exogym.strategy import CommunicateOptimizeStrategy, OptimSpec
from tests.fake_world import train_ranks
from tests.helpers import TinyNet, node_batches, regression_data
from tests.test_docs import ROOT, one_script, run_one_script

PAGE = "writing-algorithms/tutorial-error-feedback.md"
STEPS = 10
SGD = OptimSpec(torch.optim.SGD, lr=0.05, momentum=0.9)


def _tutorial() -> dict:
    """The page's names (its script's ``__main__`` part does not run)."""
    namespace: dict = {"__name__": "tutorial"}
    exec(compile(one_script(PAGE), PAGE, "exec"), namespace)  # noqa: S102 - the docs' own code
    return namespace


def ef_sign_reference(ds, k: int, steps: int) -> tuple[list[list[torch.Tensor]], list[list[torch.Tensor]]]:
    """K model copies with SGD (momentum 0.9). Per step, node and tensor of d entries:
    p = g + e; delta = (||p||_1 / d) * sign(p) (sign(0) = +1); e = p - delta; every node
    applies (1/K) * sum over nodes of delta. Returns (parameters, residuals) per node."""
    models = [TinyNet() for _ in range(k)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
    data = [node_batches(ds, k, r) for r in range(k)]
    residuals = [[torch.zeros_like(p) for p in m.parameters()] for m in models]
    for _ in range(steps):
        deltas = []
        for r in range(k):
            models[r].zero_grad()
            models[r](next(data[r])).backward()
            mine = []
            for p, e in zip(models[r].parameters(), residuals[r], strict=True):
                corrected = p.grad + e
                delta = corrected.abs().sum() / corrected.numel() * torch.where(corrected >= 0, 1.0, -1.0)
                e.copy_(corrected - delta)
                mine.append(delta)
            deltas.append(mine)
        for r in range(k):
            for i, p in enumerate(models[r].parameters()):
                p.grad = sum(deltas[j][i] for j in range(k)) / k
            opts[r].step()
    return [[p.detach().clone() for p in m.parameters()] for m in models], residuals


@pytest.mark.parametrize("numel", [1, 7, 8, 9, 100])
def test_signs_pack_eight_to_a_byte_entry_8j_plus_i_in_bit_i_of_byte_j(numel: int) -> None:
    tutorial = _tutorial()
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    x[0] = 0.0  # sign(0) counts as +1
    packed = tutorial["pack_signs"](x)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(numel / 8)
    for j in range(packed.numel()):
        expected = sum(1 << i for i in range(8) if 8 * j + i < numel and x[8 * j + i] >= 0)
        assert int(packed[j]) == expected
    torch.testing.assert_close(tutorial["unpack_signs"](packed, numel), torch.where(x >= 0, 1.0, -1.0))


@pytest.mark.parametrize("k", [2, 4])
def test_the_tutorial_compressor_equals_ef_signsgd_written_from_the_paper_on_every_node(k: int) -> None:
    module = _tutorial()["EFSignCommunicator"]
    ds = regression_data(k * 8 * STEPS)
    out = train_ranks(k, lambda: CommunicateOptimizeStrategy([module()], optim_spec=SGD), STEPS, dataset=ds)
    params, residuals = ef_sign_reference(ds, k, STEPS)
    for rank in range(k):
        for a, b in zip(out[rank]["params"], params[rank], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        # The module's state is its residuals, and loading a state puts them back.
        comm = out[rank]["strategy"].pipeline.leaves()[0]
        for a, b in zip(comm.state_dict()["residuals"], residuals[rank], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        comm.load_state_dict({"residuals": [torch.full_like(e, 0.5) for e in residuals[rank]]})
        assert all(bool((e == 0.5).all()) for e in comm.state_dict()["residuals"])


def test_the_tutorial_compressor_is_charged_one_all_gather_of_a_scale_and_the_packed_signs_per_tensor() -> None:
    module = _tutorial()["EFSignCommunicator"]
    out = train_ranks(4, lambda: CommunicateOptimizeStrategy([module()], optim_spec=SGD), STEPS)
    payload = sum(4 + math.ceil(p.numel() / 8) for p in TinyNet().parameters())  # 20 + 6 + 6 + 5
    assert payload == 37
    for o in out:
        for records in o["records"]:
            assert [(r.kind, r.group_size, r.payload, r.sent) for r in records] == [("all_gather", 4, payload, 3 * 37)]


def _rows(text: str) -> dict[str, list[str]]:
    """strategy -> [val loss, accuracy, MB sent/node, sim time s, util] of a printed comparison table."""
    rows = re.findall(r"^(ddp|ef-sign|diloco) +(\S+) +(\S+) +(\S+) +(\S+) +(\S+) +\S+$", text, flags=re.M)
    return {r[0]: list(r[1:]) for r in rows}


@pytest.mark.procs
@pytest.mark.timeout(600)
def test_the_tutorial_runs_as_one_script_and_prints_the_table_the_page_shows(tmp_path) -> None:
    out = run_one_script(PAGE, tmp_path, timeout=580)
    ran = _rows(out.stdout)
    with open(os.path.join(ROOT, "docs", PAGE)) as f:
        shown = _rows(f.read())
    assert set(ran) == set(shown) == {"ddp", "ef-sign", "diloco"}
    # 85,002 float32 entries in six tensors: 10,650 bytes a step, sent to 3 nodes, 200 steps.
    sizes = [64 * 256, 256, 256 * 256, 256, 256 * 10, 10]
    assert ran["ef-sign"][2] == f"{3 * 200 * sum(4 + math.ceil(n / 8) for n in sizes) / 1e6:.2f}" == "6.39"
    for name in ran:
        assert ran[name][2:] == shown[name][2:], name  # bytes, simulated time and utilisation: exact
        for a, b in zip(ran[name][:2], shown[name][:2], strict=True):
            assert abs(float(a) - float(b)) < 0.005, (name, a, b)
