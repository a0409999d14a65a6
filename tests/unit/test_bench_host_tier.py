"""thunder-mw on offload's engines over offload, paired by seed across a scenario's two
result files (lab/host_tier.py)."""

from __future__ import annotations

from typing import Any

from thunder_mw.lab.host_tier import caps, pair, tiered_baselines


def _report(policy: str, seeds: dict[int, tuple[float, float]]) -> dict[str, Any]:
    """A result file at one point: per seed (window steps/min, batch makespan)."""
    rows = []
    for seed, (steady, makespan) in seeds.items():
        point = {"policy": policy, "engines": 1, "programs_per_engine": 8, "main": True}
        rows += [
            {**point, "seed": seed, "wave": False, "steps_per_min_steady": steady},
            {**point, "seed": seed, "wave": True, "makespan_s": makespan},
        ]
    rows.append({**rows[0], "programs_per_engine": 4, "steps_per_min_steady": 1.0})  # a sweep point
    return {"config": {"engines": 1, "programs_per_engine": 8}, "sweep": rows}


def test_the_two_files_pair_on_the_seeds_both_ran() -> None:
    offload = _report("offload", {0: (100.0, 1000.0), 1: (110.0, 1100.0), 2: (90.0, 900.0)})
    ours = _report("thunder-mw/host-tier", {0: (120.0, 800.0), 1: (132.0, 880.0), 7: (1.0, 1.0)})
    paired = pair(offload, ours)
    assert paired["steps_per_min_steady"]["seeds"] == [0, 1]
    assert paired["steps_per_min_steady"]["ratio"] == 1.2
    assert paired["makespan_s"]["ratio"] == 1.25  # theirs / ours: a shorter batch is better
    assert paired["makespan_s"]["verdict"] == "win"


def test_fewer_than_two_common_seeds_give_no_ratio() -> None:
    offload = _report("offload", {0: (100.0, 1000.0)})
    assert pair(offload, _report("thunder-mw/host-tier", {0: (120.0, 800.0)})) == {}


def test_each_tiered_row_pairs_with_offload_behind_its_best_cap() -> None:
    main = _report("offload", {0: (100.0, 1000.0), 1: (110.0, 1100.0)})
    capped = _report("offload_capped", {0: (125.0, 900.0), 1: (121.0, 1000.0)})
    for r in capped["sweep"]:
        r["cap"] = 96 if r["wave"] else 72
    main["sweep"] += capped["sweep"]
    ours = _report("thunder-mw/tier-fixed-rules", {0: (125.0, 900.0), 1: (132.0, 880.0)})
    paired = pair(main, ours, "thunder-mw/tier-fixed-rules", "offload_capped")
    assert paired["steps_per_min_steady"]["ratio"] == 1.045  # 128.5 / 123: mean over mean
    assert paired["makespan_s"]["seeds"] == [0, 1]
    assert caps(main) == {"makespan_s": [96], "steps_per_min_steady": [72]}


def test_only_baselines_whose_engines_had_the_tier_are_paired() -> None:
    main = {
        "config": {
            "host_tier": {
                "offload": {"host_kv_tokens": 1000},
                "offload_capped": {"host_kv_tokens": 1000},
                "continuum": {"program_fcfs": True},  # its own option, no tier
                "thunder-mw/host-tier": {"host_kv_tokens": 1000},  # ours, not a baseline
            }
        }
    }
    assert tiered_baselines(main) == ["offload", "offload_capped"]
