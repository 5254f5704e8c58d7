"""The server-algorithm tutorial (``docs/writing-algorithms/servers.md``): its ``FedAsync`` equals
an event-driven reference written from the paper (``tests/references/fedasync.py``), and the
page runs as a script."""

from __future__ import annotations

import os

import pytest
import torch

from exogym.core.comm.network import Network
from exogym.core.server import ServerStrategy
from exogym.strategy import OptimSpec
from tests.fake_world import train_server
from tests.helpers import regression_data
from tests.references.fedasync import reference_fedasync
from tests.test_docs import one_script, run_one_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = "writing-algorithms/servers.md"


def _fedasync_class():
    namespace: dict = {}
    script = one_script(PAGE)
    exec(compile(script.split('if __name__ == "__main__":')[0], PAGE, "exec"), namespace)  # noqa: S102
    return namespace["FedAsync"]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize(("latency", "a"), [(0.0, 0.0), (0.3, 0.5), (0.3, 2.0)])
def test_the_tutorials_fedasync_equals_its_event_driven_reference(latency, a, workers) -> None:
    FedAsync = _fedasync_class()
    slowdown, steps = (1.0, 1.0, 0.5, 0.25), 24
    ds = regression_data(4 * 8 * steps)
    net = Network(1e8, latency, compute=1.0, compute_slowdown=slowdown)
    sgd = OptimSpec(torch.optim.SGD, lr=0.05)
    make = lambda: ServerStrategy(FedAsync(local_steps=2, concurrency=3, alpha=0.6, a=a), optim_spec=sgd)  # noqa: E731
    out = train_server(4, make, steps, dataset=ds, network=net, workers=workers)
    ref = reference_fedasync(
        ds, 4, steps, slowdown=slowdown, step_seconds=1.0, bandwidth=1e8, latency=latency, concurrency=3,
        local_steps=2, client_lr=0.05, alpha=0.6, a=a,
    )  # fmt: skip
    assert max(s for _, _, s in ref["updates"]) >= 1  # stale results happen
    ours = out[0]["server"].updates
    assert [(r, s) for _, r, s in ours] == [(r, s) for _, r, s in ref["updates"]]
    assert [t for t, _, _ in ours] == pytest.approx([t for t, _, _ in ref["updates"]], abs=1e-9)
    assert out[0]["summary"]["steps"] == ref["steps"]
    assert out[0]["summary"]["end_time"] == pytest.approx(ref["end_time"], abs=1e-9)
    for x, y in zip(out[0]["params"], ref["params"], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


@pytest.mark.procs
@pytest.mark.timeout(300)
def test_the_tutorial_page_runs_as_a_script_and_prints_both_servers(tmp_path) -> None:
    out = run_one_script(PAGE, tmp_path, timeout=280)
    lines = [line for line in out.stdout.splitlines() if line.startswith(("fedasync", "fedbuff"))]
    assert [line.split()[0] for line in lines] == ["fedasync", "fedbuff"]
