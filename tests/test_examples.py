"""The example scripts run."""

import pytest

from exogym.examples import hybrid_diloco

pytestmark = pytest.mark.procs


@pytest.mark.timeout(120)
def test_hybrid_diloco_example_trains_and_sends_less() -> None:
    res = hybrid_diloco.run(nodes=4, steps=20, H=5)
    for r in res.values():
        assert r["val_loss"] < r["val_loss_first"]
    # islands of 2 and int8: about (2*(1/2)) / (2*(3/4)) * 1/4 of DiLoCo's bytes
    assert res["island_int8_diloco"]["bytes_sent"] < 0.2 * res["diloco"]["bytes_sent"]
    assert res["dct_diloco"]["bytes_sent"] < 0.2 * res["diloco"]["bytes_sent"]
