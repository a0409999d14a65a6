"""A capped baseline's grid goes on down while its best cap is the lowest it ran
(benchmarks/bench_cli.py `lower_caps`): the cap a user tuning it would try next."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from thunder_mw.benchmarks import bench_cli
from thunder_mw.benchmarks.bench_cli import Job, lower_caps, run_scenario
from thunder_mw.benchmarks.scenarios import SCENARIOS

# One engine, six programs: the grid starts at cap 4 (0.67 of the concurrency).
SIX = dataclasses.replace(
    SCENARIOS["test-swe-orchestra-mix"],
    engines=1,
    programs_per_engine=6,
    seeds=2,
    caps=(0.67,),
    targets=(),
)
POLICIES = ["vllm", "vllm_capped", "thunder-mw"]
BEST = 2  # the cap the capped runs below are best at


def _row(
    cap: int | None, seed: int, wave: bool, value: float, policy: str = "vllm_capped"
) -> dict[str, Any]:
    metric = "makespan_s" if wave else "steps_per_min_steady"
    return {
        "policy": policy, "cap": cap, "seed": seed, "wave": wave, "engines": 1,
        "programs_per_engine": 6, "programs": 6 if wave else 33, "main": True, metric: value,
    }  # fmt: skip


def _sweep(caps: list[int], best: int) -> list[dict[str, Any]]:
    """Both figures of every seed at each cap, best at `best` (the uncapped engine worst)."""
    rows = []
    for seed in range(2):
        rows += [_row(None, seed, False, 1.0, "vllm")]
        rows += [_row(None, seed, True, 1e6, "vllm")]
        for cap in caps:
            rows += [_row(cap, seed, False, 100.0 - abs(cap - best))]
            rows += [_row(cap, seed, True, 100.0 + abs(cap - best))]
    return rows


def test_the_best_cap_at_the_lowest_asks_for_half_of_it_on_both_figures() -> None:
    jobs = lower_caps(SIX, POLICIES, _sweep([4], best=BEST))
    assert {(j.cap, j.seed, j.wave) for j in jobs} == {
        (2, seed, wave) for seed in range(2) for wave in (False, True)
    }
    assert {(j.programs, j.wave) for j in jobs} == {(33, False), (6, True)}
    assert all(j.policy == "vllm_capped" and j.main for j in jobs)


def test_a_best_cap_inside_the_grid_or_at_one_program_per_engine_asks_for_nothing() -> None:
    assert lower_caps(SIX, POLICIES, _sweep([1, 2, 4], best=BEST)) == []
    assert lower_caps(SIX, POLICIES, _sweep([1, 4], best=1)) == []
    # Best on one figure only is enough: the window here, the batch uncapped.
    rows = [r for r in _sweep([4], best=4) if not r["wave"] or r["policy"] != "vllm_capped"]
    rows += [_row(4, seed, True, 2e6) for seed in range(2)]
    assert {j.cap for j in lower_caps(SIX, POLICIES, rows)} == {2}


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[Job]:
    """run_job, its capped runs' figures made best at BEST (the engine's own are kept for
    every other figure); the jobs it ran."""
    ran: list[Job] = []
    real = bench_cli.run_job

    def run_job(scenario: Any, job: Job, trace: Path | None, seed: int) -> Any:
        ran.append(job)
        job, out = real(scenario, job, trace, seed)
        if job.cap is not None:
            key = "makespan_s" if job.wave else "steps_per_min_steady"
            # Ahead of the uncapped engine on both figures.
            off = abs(job.cap - BEST)
            out["metrics"][key] = 1.0 + off if job.wave else 1e6 - off
        return job, out

    monkeypatch.setattr(bench_cli, "run_job", run_job)
    return ran


def test_a_scenario_runs_down_its_grid_until_the_best_cap_is_inside_it(counted: list[Job]) -> None:
    report = json.loads(json.dumps(run_scenario(SIX, POLICIES, sweep=False)))  # as written
    caps = report["vllm_capped"]
    assert [s["cap"] for s in caps["sweep"]] == [1, 2, 4, 6]  # 6: the uncapped engine
    assert (caps["batch_cap"], caps["window_cap"]) == (BEST, BEST)
    assert sorted({j.cap for j in counted if j.cap}) == [1, 2, 4]
    # A rerun of another policy takes the lower caps from the file as it takes the rest.
    counted.clear()
    again = run_scenario(SIX, POLICIES, sweep=False, reuse=report, rerun={"thunder-mw"})
    assert {j.policy for j in counted} == {"thunder-mw"}
    assert again["vllm_capped"]["sweep"] == caps["sweep"]
    # Rerunning none runs nothing a file already has.
    counted.clear()
    run_scenario(SIX, POLICIES, sweep=False, reuse=report, rerun=set())
    assert counted == []
