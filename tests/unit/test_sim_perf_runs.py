"""lab/sim_perf.py's timed scenario runs (issue 43): one small run's record, and `--part runs`
keeping the decode-only figures already in the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thunder_mw.benchmarks.scenarios import POLICIES, SCENARIOS
from thunder_mw.lab import sim_perf

# The smallest published DES scenario: about half a second.
SMALL = "chat-control:offload"


def test_a_run_record_counts_engine_steps_per_wall_second() -> None:
    record = sim_perf.time_run(SMALL)
    assert set(record) >= {
        "scenario",
        "policy",
        "seed",
        "wall_s",
        "engine_steps",
        "steps_per_s",
        "load_1m_before",
        "load_1m_after",
    }
    assert (record["scenario"], record["policy"], record["seed"]) == (
        "chat-control",
        "offload",
        0,
    )
    assert record["engine_steps"] > 0 and record["wall_s"] > 0
    # wall_s is rounded to 0.01 s; steps/s is computed from the unrounded time.
    low = record["engine_steps"] / (record["wall_s"] + 0.005)
    high = record["engine_steps"] / max(record["wall_s"] - 0.005, 1e-9)
    assert low - 1 <= record["steps_per_s"] <= high + 1


def test_runs_part_keeps_the_decode_figures_and_judges_the_target(tmp_path: Path) -> None:
    out = tmp_path / "sim-perf.json"
    out.write_text(json.dumps({"engine_steps_per_s_256_running": 44931, "runs": 3}))
    assert sim_perf.main(["--part", "runs", "--runs", SMALL, "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["engine_steps_per_s_256_running"] == 44931
    part = result["scenario_runs"]
    assert [r["scenario"] for r in part["runs"]] == ["chat-control"]
    per_run = part["targets"][0]
    assert per_run["goal_s"] == 60.0
    assert per_run["met"] is (part["slowest_run"]["wall_s"] <= 60.0)


def test_default_runs_name_published_des_scenarios() -> None:
    for spec in sim_perf.DEFAULT_RUNS:
        name, policy = spec.split(":")[:2]
        assert name in SCENARIOS and name not in ("vllm-cpu-real", "live-small")
        assert policy in POLICIES


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises((KeyError, ValueError)):
        sim_perf.time_run("chat-control:no-such-policy")


def test_keep_adds_runs_to_those_in_the_file(tmp_path: Path) -> None:
    out = tmp_path / "sim-perf.json"
    earlier = {"scenario": "x", "policy": "y", "seed": 0, "wall_s": 99.0}
    rerun = {"scenario": "chat-control", "policy": "offload", "seed": 0, "wall_s": 1e6}
    out.write_text(json.dumps({"scenario_runs": {"runs": [earlier, rerun]}}))
    args = ["--part", "runs", "--keep", "--runs", SMALL, "--output", str(out)]
    assert sim_perf.main(args) == 0
    part = json.loads(out.read_text())["scenario_runs"]
    assert [r["scenario"] for r in part["runs"]] == ["x", "chat-control"]
    assert part["runs"][1]["wall_s"] < 1e6
    assert part["slowest_run"]["scenario"] == "x" and part["targets"][0]["met"] is False
