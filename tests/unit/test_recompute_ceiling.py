"""The router goal's ceiling: each row over the untiered router, paired by seed, and the
free tier that makes every recompute cost nothing (lab/recompute_ceiling.py)."""

from __future__ import annotations

from typing import Any

import pytest

from thunder_mw.lab.recompute_ceiling import BASELINE, GOAL, run_row, summarise


def _runs(rows: dict[str, list[float]]) -> dict[str, dict[int, dict[str, Any]]]:
    return {
        name: {
            seed: {"steps_per_min_steady": v, "recomputed_prefill_tokens": 10, "mean_batch": 2.0}
            for seed, v in enumerate(values)
        }
        for name, values in rows.items()
    }


def test_every_row_pairs_with_the_untiered_router_and_the_best_free_row_is_the_ceiling() -> None:
    runs = _runs(
        {
            BASELINE: [100.0, 200.0, 150.0],
            "thunder-mw": [95.0, 190.0, 142.5],
            "offload @free-tier": [130.0, 260.0, 195.0],
            f"{BASELINE} @free-tier": [110.0, 220.0, 165.0],
            "thunder-mw @free-tier": [120.0, 240.0, 180.0],
        }
    )
    entry = summarise(runs, [0, 1, 2])
    assert entry["thunder_mw_over_router"]["ratio"] == 0.95
    assert entry["thunder_mw_over_router"]["verdict"] == "loss"
    assert entry["ceiling"]["row"] == "offload @free-tier"
    assert entry["ceiling"]["ratio"] == 1.3
    assert entry["goal_within_ceiling"] is True
    assert entry["rows"][BASELINE]["over_router"]["ratio"] == 1.0


def test_a_goal_above_the_ceilings_interval_is_out_of_reach() -> None:
    runs = _runs(
        {
            BASELINE: [100.0, 200.0, 150.0],
            "thunder-mw": [100.0, 200.0, 150.0],
            "offload @free-tier": [105.0, 212.0, 156.0],  # ~1.05x, interval under GOAL
        }
    )
    entry = summarise(runs, [0, 1, 2])
    assert entry["ceiling"]["ci95"][1] < GOAL
    assert entry["goal_within_ceiling"] is False


@pytest.mark.slow
def test_the_free_tier_removes_every_recompute_and_nothing_else() -> None:
    # One engine of 96 ToolOrchestra programs whose contexts far outgrow its cache: plain
    # consistent hashing recomputes millions of tokens there, and none on the free tier.
    name, seed = "paper-toolorchestra-qwen3-8b", 0
    row, got_seed, untiered = run_row((name, "offload", False, seed))
    assert (row, got_seed) == ("offload", seed)
    free_row, _, free = run_row((name, "offload", True, seed))
    assert free_row == "offload @free-tier"
    assert untiered["recomputed_prefill_tokens"] > 1_000_000
    assert abs(free["recomputed_prefill_tokens"]) < 0.01 * untiered["recomputed_prefill_tokens"]
    assert free["steps_per_min_steady"] > 1.5 * untiered["steps_per_min_steady"]
