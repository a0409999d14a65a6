"""The admission controller (policies/operating_point.py) against a synthetic engine whose
goodput peaks at a known working-set limit, the clock injected: it climbs to the peak, stays
there, follows the peak when it moves, and comes down to what runs where no limit binds."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable

import pytest

from thunder_mw.policies.operating_point import Bounds, OperatingPoint

TICK_S = 1.0
CYCLE_S = 10.0  # each phase: two cycles, 20 s
DEMAND = 10.0


def peaked(best: float, width: float = 1.0) -> Callable[[float], float]:
    """Goodput per call, highest at `best` (log-symmetric: a limit twice too high costs as
    much as one half too low), falling by a quarter one `width` of ln off it."""
    return lambda m: max(0.05, 1.0 - 0.25 * (math.log(m / best) / width) ** 2)


def run(
    point: OperatingPoint,
    goodput: Callable[[float, float], float],
    seconds: float,
    *,
    start: float = 0.0,
    noise: float = 0.1,
    seed: int = 0,
    use: Callable[[float], float] | None = None,
    tokens: float = 0.0,
) -> tuple[float, float, list[float]]:
    """Ticks the controller for `seconds`: output tokens accrue at goodput(limit, t) per call
    x DEMAND, with `noise` (relative, per tick); returns the clock, the token counter and the
    limits applied."""
    rng = random.Random(seed)
    now = start
    factor = point.factor()
    applied = []
    while now < start + seconds:
        rate = goodput(factor, now) * DEMAND * (1.0 + rng.gauss(0.0, noise))
        tokens += max(0.0, rate) * TICK_S
        now += TICK_S
        in_use = use(factor) if use is not None else factor
        factor = point.tick(now, tokens, DEMAND, in_use, use is None, CYCLE_S)
        applied.append(factor)
    return now, tokens, applied


def settled(applied: list[float]) -> float:
    """The limit the controller spent the second half of a run around (its median: near a
    flat peak it keeps probing, and noise walks it a step or two either way)."""
    return statistics.median(applied[len(applied) // 2 :])


@pytest.mark.parametrize(
    ("start", "best", "min_moves"),
    [
        (1.0, 3.0, 4),  # it climbs to the best working set and stays there
        (6.0, 1.2, 0),  # it comes down from too large a one
    ],
)
def test_it_settles_at_the_best_working_set(start: float, best: float, min_moves: int) -> None:
    curve = peaked(best)
    point = OperatingPoint(start, Bounds(floor=0.9, ceiling=8.0))
    _, _, applied = run(point, lambda m, t: curve(m), 6 * 3600)
    assert best / 1.2 <= settled(applied) <= best * 1.2
    assert best / 1.3 <= point.point <= best * 1.3
    assert point.moves >= min_moves


def test_it_follows_the_best_point_when_the_regime_shifts() -> None:
    # Recompute turns dear at t = 6 h (the peak moves from 4x to 1.2x capacity), then cheap
    # again at 12 h: the controller is near each peak before the next shift.
    peaks = [(0.0, 4.0), (6 * 3600.0, 1.2), (12 * 3600.0, 4.0)]

    def goodput(m: float, t: float) -> float:
        best = [b for since, b in peaks if t >= since][-1]
        return peaked(best)(m)

    point = OperatingPoint(2.0, Bounds(floor=0.9, ceiling=8.0))
    tokens = 0.0
    for since, best in peaks:
        _, tokens, _ = run(point, goodput, 6 * 3600, start=since, tokens=tokens)
        assert best / 1.3 <= point.point <= best * 1.3, (since, best, point.point)


def test_on_a_flat_curve_it_stays_near_where_it_started() -> None:
    # Pure noise, no gradient: moves are rare and small (the evidence test), the point stays.
    point = OperatingPoint(2.0, Bounds(floor=0.9, ceiling=8.0))
    _, _, applied = run(point, lambda m, t: 1.0, 6 * 3600, noise=0.3)
    assert 2.0 / 1.5 <= point.point <= 2.0 * 1.5
    assert max(applied) <= 2.0 * 2.0 and min(applied) >= 2.0 / 2.0


def test_where_no_limit_binds_the_point_comes_down_to_just_above_what_runs() -> None:
    # Nothing is held at 8x: the programs use 1.5x. The point follows them down, so that the
    # probes stay where a limit would bind if recompute turned dear.
    point = OperatingPoint(8.0, Bounds(floor=0.9, ceiling=8.0))
    run(point, lambda m, t: 1.0, 2 * 3600, use=lambda m: min(m, 1.5))
    assert 1.5 <= point.point <= 1.5 * 1.3
    assert point.decided == 0  # no probe was ever judged: nothing was learned from them


@pytest.mark.parametrize("start", [0.1, 100.0])
def test_the_point_stays_within_its_bounds(start: float) -> None:
    point = OperatingPoint(start, Bounds(floor=0.9, ceiling=8.0))
    assert point.point in (0.9, 8.0)
    curve = peaked(50.0 if start > 1 else 0.01)
    _, _, applied = run(point, lambda m, t: curve(m), 3 * 3600)
    assert all(0.9 <= f <= 8.0 for f in applied)


@pytest.mark.parametrize(("start", "best"), [(0.9, 0.3), (8.0, 24.0)])
def test_pinned_at_a_bound_its_probes_stay_close(start: float, best: float) -> None:
    # The peak lies beyond the bound: every judged round says "further", which the bound
    # forbids. Those are stays, not repeated moves: the step stays small, so the probes do
    # not reach twice the floor (a limit far above the working set: the engine thrashes).
    point = OperatingPoint(start, Bounds(floor=0.9, ceiling=8.0))
    curve = peaked(best)
    _, _, applied = run(point, lambda m, t: curve(m), 6 * 3600)
    assert point.point == start
    assert point.step <= math.log(1.05) + 1e-12
    assert max(applied) / min(applied) <= 1.05 * 1.05 + 1e-9


def test_two_phases_at_the_start_then_rounds_of_four_phases_of_two_cycles_each() -> None:
    point = OperatingPoint(2.0, Bounds(floor=0.9, ceiling=8.0))
    phase = int(2 * CYCLE_S / TICK_S)
    _, _, applied = run(point, lambda m, t: 1.0, 6 * 2 * CYCLE_S + TICK_S)
    # A run shorter than the warm-up keeps the starting point (the rules of 0.2.0).
    assert set(applied[: 2 * phase - 1]) == {2.0}
    assert point.rounds == 1
    # then up, down, down, up: the probes straddle the point
    assert applied[2 * phase + 5] > 2.0 > applied[3 * phase + 5]
