"""The live gateway and the discrete-event harness agree on the same small scenario.

Both run the same programs on the same simulated fleet with the same scheduler code; the
live run sends every call through `thunder-mw serve` over HTTP, time-scaled."""

from __future__ import annotations

import pytest

from thunder_mw.benchmarks.bench_cli import run_live_scenario
from thunder_mw.benchmarks.scenarios import SCENARIOS


@pytest.mark.slow
def test_live_and_simulated_runs_agree_within_ten_percent() -> None:
    report = run_live_scenario(
        SCENARIOS["live-small"], ["round_robin", "thunder-mw"], repeats=1, time_scale=5.0
    )
    assert [r["programs_completed"] for r in report["results"]] == [12, 12]
    for row in report["live_vs_des"]:
        assert abs(row["steps_per_min_ratio"] - 1) <= 0.10, row
        assert abs(row["jct_mean_ratio"] - 1) <= 0.10, row
