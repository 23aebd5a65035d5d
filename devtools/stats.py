"""Small statistics shared by the demo and the benchmarks."""

from __future__ import annotations

import statistics


def percentile(values: list[float], q: int) -> float | None:
    """The ``q``-th percentile (1-99) of ``values``, inclusive method; None when there are none."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]
