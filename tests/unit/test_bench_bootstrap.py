"""The seed statistics of the benchmark figures (benchmarks/bootstrap.py)."""

from __future__ import annotations

import pytest

from thunder_mw.benchmarks.bootstrap import compare, mean_ci, ratio_ci, summary, verdict


def test_the_interval_of_identical_seeds_is_a_point() -> None:
    assert mean_ci([5.0, 5.0, 5.0, 5.0, 5.0]) == (5.0, 5.0)


def test_the_interval_holds_the_mean_and_lies_within_the_values() -> None:
    values = [10.0, 12.0, 9.0, 14.0, 11.0]
    low, high = mean_ci(values)
    assert 9.0 <= low < sum(values) / 5 < high <= 14.0


def test_the_bootstrap_is_deterministic() -> None:
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0]
    assert mean_ci(values) == mean_ci(list(values))
    assert ratio_ci(values, [2.0] * 6) == ratio_ci(values, [2.0] * 6)


def test_a_paired_ratio_is_the_ratio_of_means_and_pairing_removes_the_workloads_spread() -> None:
    # Each seed's workload moves both policies alike: ours is always 1.2x theirs.
    theirs = [50.0, 100.0, 80.0, 120.0, 60.0]
    ours = [1.2 * x for x in theirs]
    point, low, high = ratio_ci(ours, theirs)
    assert point == pytest.approx(1.2) and low == pytest.approx(1.2)
    assert high == pytest.approx(1.2)
    assert compare(ours, theirs)["verdict"] == "win"


def test_verdicts_follow_the_interval() -> None:
    assert verdict(1.01, 1.3) == "win"
    assert verdict(0.7, 0.99) == "loss"
    assert verdict(0.95, 1.05) == "tie"
    assert verdict(1.0, 1.2) == "tie"  # touching 1.0 is not above it


def test_a_seed_that_flips_the_sign_makes_a_tie() -> None:
    theirs = [100.0, 100.0, 100.0, 100.0, 100.0]
    ours = [130.0, 125.0, 70.0, 128.0, 60.0]
    result = compare(ours, theirs)
    assert result["ci95"][0] < 1.0 < result["ci95"][1]  # type: ignore[index]
    assert result["verdict"] == "tie"


def test_for_a_makespan_the_speed_up_is_theirs_over_ours() -> None:
    ours = [80.0, 90.0, 85.0, 82.0, 88.0]
    theirs = [100.0, 110.0, 105.0, 101.0, 108.0]
    result = compare(ours, theirs, higher_is_better=False)
    ratio = result["ratio"]
    assert isinstance(ratio, float)
    assert ratio > 1.0 and result["verdict"] == "win"


def test_bad_input_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="paired"):
        ratio_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        ratio_ci([1.0], [0.0])
    with pytest.raises(ValueError, match="at least one"):
        mean_ci([])


def test_a_summary_skips_missing_values_and_reports_the_interval() -> None:
    s = summary([10.0, None, 12.0, 11.0])
    assert s is not None and s["n"] == 3 and s["mean"] == 11.0
    assert s["min"] == 10.0 and s["max"] == 12.0
    ci = s["ci95"]
    assert isinstance(ci, list)
    low, high = ci
    assert 10.0 <= low <= 11.0 <= high <= 12.0
    assert summary([None, None]) is None
