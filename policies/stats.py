"""The one percentile rule every report of thunder-mw uses (benchmarks, conformance, tests)."""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["percentile"]


def percentile(values: Iterable[float], q: float) -> float:
    """The `q`-th percentile (0 < q <= 100) of `values` by the nearest-rank rule.

    Nearest rank: sort the n values and take the one at rank ceil(q / 100 * n) (1-based), so
    the answer is always an observed value (a p99 latency is one request's latency) and at
    least q % of the values are at or below it. Raises ValueError on no values, as
    `statistics.median` does.
    """
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 < q <= 100:
        raise ValueError(f"percentile {q} is outside (0, 100]")
    rank = math.ceil(q / 100 * len(ordered))
    return ordered[max(rank, 1) - 1]
