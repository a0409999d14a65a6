"""The one percentile rule (nearest rank) that every benchmark and report uses."""

from __future__ import annotations

import pytest

from thunder_mw.policies.stats import percentile


def test_the_percentile_is_the_value_at_the_nearest_rank() -> None:
    values = list(range(1, 21))  # 1..20
    assert percentile(values, 50) == 10
    assert percentile(values, 95) == 19
    assert percentile(values, 99) == 20


def test_the_percentile_is_always_an_observed_value() -> None:
    assert percentile([0.1, 0.5], 50) == 0.1
    assert percentile([0.1, 0.5], 51) == 0.5


def test_unsorted_values_are_sorted_first() -> None:
    assert percentile([5, 1, 4, 2, 3], 40) == 2


def test_the_hundredth_percentile_is_the_maximum() -> None:
    assert percentile([3, 9, 1], 100) == 9


def test_a_tiny_percentile_is_the_minimum() -> None:
    assert percentile([3, 9, 1], 0.001) == 1


def test_no_values_have_no_percentile() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


@pytest.mark.parametrize("q", [0, -1, 100.5])
def test_a_percentile_outside_0_to_100_is_refused(q: float) -> None:
    with pytest.raises(ValueError, match="outside"):
        percentile([1, 2, 3], q)
