import pytest

from exogym import ops


@pytest.fixture(params=["extension", "reference"])
def op_path(request):
    """Run a test on the compiled kernels and again on the pure-torch references."""
    if request.param == "reference":
        with ops.force_reference():
            yield request.param
    else:
        if not ops.extension_loaded():
            pytest.skip(f"extension not in use: {ops.backend()}")
        yield request.param
