"""Seed statistics of the benchmark figures: means over seeds with a 95 % bootstrap interval,
ratios of two policies paired by seed, and the verdict a ratio's interval supports.

Pure and deterministic: the resampling uses its own seeded generator, so the same runs give
the same intervals on every machine (the committed result files can be checked by rerunning).
A ratio is `policy / baseline` of the means of the resampled seeds (the same seeds for both:
a seed is one workload on one fleet, so the pairing removes the workload's own variance).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

__all__ = [
    "BOOTSTRAP_SEED",
    "LEVEL",
    "RESAMPLES",
    "compare",
    "mean",
    "mean_ci",
    "ratio_ci",
    "summary",
    "verdict",
]

RESAMPLES = 2000
BOOTSTRAP_SEED = 0
LEVEL = 0.95


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the order statistics (numpy's default)."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _draws(n: int, resamples: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(n) for _ in range(n)] for _ in range(resamples)]


def mean_ci(
    values: Sequence[float], resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the mean of `values` (one per seed)."""
    if not values:
        raise ValueError("mean_ci needs at least one value")
    stats = sorted(mean([values[i] for i in draw]) for draw in _draws(len(values), resamples, seed))
    tail = (1 - LEVEL) / 2
    return _quantile(stats, tail), _quantile(stats, 1 - tail)


def ratio_ci(
    numerator: Sequence[float],
    denominator: Sequence[float],
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """mean(numerator) / mean(denominator) over paired seeds, and its 95 % bootstrap
    interval (seeds resampled together). Returns (ratio, low, high)."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError("ratio_ci needs two equally long, non-empty lists (paired by seed)")
    if any(d <= 0 for d in denominator) or any(v < 0 for v in numerator):
        raise ValueError("ratio_ci needs positive denominators and non-negative numerators")
    point = mean(numerator) / mean(denominator)
    stats = sorted(
        sum(numerator[i] for i in draw) / sum(denominator[i] for i in draw)
        for draw in _draws(len(numerator), resamples, seed)
    )
    tail = (1 - LEVEL) / 2
    return point, _quantile(stats, tail), _quantile(stats, 1 - tail)


def verdict(low: float, high: float) -> str:
    """`win` where the whole interval lies above 1.0, `loss` where below, else `tie`."""
    if low > 1.0:
        return "win"
    if high < 1.0:
        return "loss"
    return "tie"


def summary(values: Sequence[float | None], digits: int = 2) -> dict[str, object] | None:
    """Mean, its ci95, min, max and n of the values present (None where there are none)."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    low, high = mean_ci(present)
    return {
        "mean": round(mean(present), digits),
        "ci95": [round(low, digits), round(high, digits)],
        "min": round(min(present), digits),
        "max": round(max(present), digits),
        "n": len(present),
    }


def compare(
    ours: Sequence[float], theirs: Sequence[float], higher_is_better: bool = True
) -> dict[str, object]:
    """Ours over theirs as a speed-up (>1: ours is better): for a figure where lower is better
    (a makespan) the ratio is theirs / ours. With its ci95 and verdict."""
    num, den = (ours, theirs) if higher_is_better else (theirs, ours)
    point, low, high = ratio_ci(num, den)
    return {
        "ratio": round(point, 3),
        "ci95": [round(low, 3), round(high, 3)],
        "verdict": verdict(low, high),
        "n": len(ours),
    }
