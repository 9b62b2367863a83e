"""The one timer of the package and its benchmarks: the median wall time of a call over repeats.

Pure Python on purpose: benchmarks/peer_speculators.py imports it inside speculators' own virtual
environment, where none of this package's dependencies are installed."""

from __future__ import annotations

import time
from collections.abc import Callable


def median_seconds(
    fn: Callable[[], object], repeats: int, warmup: int = 1, after_warmup: Callable[[], object] | None = None
) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after ``warmup`` untimed calls (then
    ``after_warmup()``, e.g. to reset a peak-memory counter)."""
    for _ in range(warmup):
        fn()
    if after_warmup is not None:
        after_warmup()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
