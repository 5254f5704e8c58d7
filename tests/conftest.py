import logging

import pytest


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="exogym")


@pytest.fixture(autouse=True)
def _no_process_left_behind(request: pytest.FixtureRequest):
    """A test that starts node processes must leave none running when it ends."""
    yield
    if request.node.get_closest_marker("procs") is None:
        return
    import time

    from tests.helpers import child_pids

    deadline = time.monotonic() + 5.0
    while child_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child_pids() == [], "node processes outlived the test"
