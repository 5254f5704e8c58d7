"""Custom ops of the ``exogym`` library and the path that serves them.

Each op family lives in its own module (``exogym.ops.sparse``, ``exogym.ops.dct``) with three things
side by side: the typed wrapper over ``torch.ops.exogym.<op>``, its fake (meta) implementation for
``torch.compile``, and a pure-torch reference. The reference is the test oracle, the benchmark
baseline and the fallback where the compiled extension ``exogym._C`` is not available.

Set ``EXOGYM_FORCE_REFERENCE=1`` to use the references even when the extension is built.
[`backend`][exogym.ops.backend] says which path is in use and why.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import torch

logger = logging.getLogger(__name__)

_EXTENSION_ERROR: str | None = None
if os.environ.get("EXOGYM_FORCE_REFERENCE", "0") == "1":
    _EXTENSION_ERROR = "EXOGYM_FORCE_REFERENCE=1 is set"
else:
    try:
        from exogym import _C  # noqa: F401  (loading it registers torch.ops.exogym.*)
    except ImportError as e:  # not built: pure-torch references serve every op
        _EXTENSION_ERROR = f"exogym._C could not be imported ({e})"


_FORCED_REFERENCE = False


@contextlib.contextmanager
def force_reference() -> Iterator[None]:
    """Within the block, every op uses its pure-torch reference (for side-by-side benchmarks)."""
    global _FORCED_REFERENCE
    previous, _FORCED_REFERENCE = _FORCED_REFERENCE, True
    try:
        yield
    finally:
        _FORCED_REFERENCE = previous


def extension_loaded() -> bool:
    """True when the compiled extension is loaded and not disabled by the environment."""
    return _EXTENSION_ERROR is None


def backend() -> str:
    """A one-line description of the op path in use: the extension, or the reference and why."""
    if _EXTENSION_ERROR is None:
        return "extension (exogym._C)"
    return f"pure-torch reference: {_EXTENSION_ERROR}"


def use_kernel(op: str, device: torch.device) -> bool:
    """True when ``torch.ops.exogym.<op>`` has a kernel registered for ``device``'s type."""
    if _EXTENSION_ERROR is not None or _FORCED_REFERENCE:
        return False
    key = {"cpu": "CPU", "cuda": "CUDA"}.get(device.type)
    return key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(f"exogym::{op}", key)


from exogym.ops.dct import (  # noqa: E402
    chunk_shape,
    dct_decode,
    dct_decode_reference,
    dct_encode,
    dct_encode_reference,
)
from exogym.ops.sparse import (  # noqa: E402
    select_indices,
    select_indices_reference,
    sparse_gather,
    sparse_gather_reference,
    sparse_scatter_,
    sparse_scatter_reference_,
)

__all__ = [
    "backend",
    "chunk_shape",
    "dct_decode",
    "dct_decode_reference",
    "dct_encode",
    "dct_encode_reference",
    "extension_loaded",
    "force_reference",
    "use_kernel",
    "select_indices",
    "select_indices_reference",
    "sparse_gather",
    "sparse_gather_reference",
    "sparse_scatter_",
    "sparse_scatter_reference_",
]
