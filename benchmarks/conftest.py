"""Pairs each benchmark group's reference and fast path and prints their ratio at the end."""

from __future__ import annotations

from collections import defaultdict

import pytest

_RESULTS: dict[str, dict[str, float]] = defaultdict(dict)


@pytest.fixture
def record(benchmark):
    """``record(group, path)`` after ``benchmark(...)``: keep the median for the ratio table."""

    def _record(group: str, path: str) -> None:
        _RESULTS[group][path] = benchmark.stats.stats.median

    return _record


def pytest_terminal_summary(terminalreporter) -> None:
    if not _RESULTS:
        return
    tr = terminalreporter
    tr.section("fast path vs baselines (median seconds; ratio = baseline / extension)")
    for group, paths in sorted(_RESULTS.items()):
        ext = paths.get("extension")
        cells = [f"{p}={t * 1e3:.2f} ms" for p, t in sorted(paths.items())]
        ratios = [f"{p}/extension={t / ext:.1f}x" for p, t in sorted(paths.items()) if ext and p != "extension"]
        tr.write_line(f"{group}: " + ", ".join(cells + ratios))
