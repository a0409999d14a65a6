"""`bench --rerun`: rerun some policies, take every other run from the result file it
replaces (benchmarks/reuse.py). The document must be the one a full run writes."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest

from thunder_mw.benchmarks.bench_cli import run_scenario
from thunder_mw.benchmarks.reuse import ReuseError, check_config
from thunder_mw.benchmarks.reuse import recorded as recorded_rule
from thunder_mw.benchmarks.scenarios import SCENARIOS

# Two programs on one engine, two seeds, one client-side cap: every kind of run (the
# window, the fixed batch, a capped run at the chosen cap and at one not chosen) in seconds.
TINY = dataclasses.replace(
    SCENARIOS["test-swe-orchestra-mix"],
    engines=1,
    programs_per_engine=3,
    seeds=2,
    caps=(0.34, 0.67),
    targets=(),
)
POLICIES = ["session_affinity", "vllm_capped", "thunder-mw"]
# What differs between two runs of the same work: how long they took.
TIMINGS = ("wall_s", "run_wall_s", "reused", "machine")


def _without_timings(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k not in TIMINGS}


def _as_written(report: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(report))  # what the file holds
    return loaded


@pytest.fixture(scope="module")
def full() -> dict[str, Any]:
    return _as_written(run_scenario(TINY, POLICIES, sweep=False))


def test_a_rerun_writes_the_document_a_full_run_writes(full: dict[str, Any]) -> None:
    again = _as_written(run_scenario(TINY, POLICIES, sweep=False, reuse=full, rerun={"thunder-mw"}))
    assert _without_timings(again) == _without_timings(full)
    assert again["reused"]["policies"] == ["session_affinity", "vllm_capped"]


def test_a_reused_run_is_the_old_files_not_a_new_one(full: dict[str, Any]) -> None:
    # A marked old figure comes through untouched: the reused policy did not run again.
    old = copy.deepcopy(full)
    row = next(r for r in old["sweep"] if r["policy"] == "session_affinity" and not r["wave"])
    row["steps_per_min_steady"] = 12345.0
    again = run_scenario(TINY, POLICIES, sweep=False, reuse=old, rerun={"thunder-mw"})
    marked = [r for r in again["sweep"] if r.get("steps_per_min_steady") == 12345.0]
    assert [(r["policy"], r["seed"]) for r in marked] == [("session_affinity", row["seed"])]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(programs_per_engine=4), "programs_per_engine"),
        (lambda c: c["policies"].update(session_affinity=[{"round_robin": {}}]), "pipeline"),
        (lambda c: c["policies"].pop("vllm_capped"), "no runs of vllm_capped"),
        (lambda c: c.update(cluster_defaults={}), "cluster_defaults"),
    ],
)
def test_a_file_of_another_configuration_is_refused_with_what_differs(
    full: dict[str, Any], change: Any, message: str
) -> None:
    old = copy.deepcopy(full)
    change(old["config"])
    with pytest.raises(ReuseError, match=message):
        run_scenario(TINY, POLICIES, sweep=False, reuse=old, rerun={"thunder-mw"})


def test_a_run_the_file_lacks_is_refused(full: dict[str, Any]) -> None:
    old = copy.deepcopy(full)
    old["sweep"] = [
        r for r in old["sweep"] if not (r["policy"] == "session_affinity" and r["wave"])
    ]
    with pytest.raises(ReuseError, match=r"no run of session_affinity.*fixed batch"):
        run_scenario(TINY, POLICIES, sweep=False, reuse=old, rerun={"thunder-mw"})


def test_a_run_whose_pause_victim_default_changed_is_refused(full: dict[str, Any]) -> None:
    # The pipeline reads the same (`state_aware_pause: {}`) but resolved to another rule: a
    # file that records it, and one from before files did (the rule of that time).
    assert full["config"]["pause_victim"]["thunder-mw"] == "auto"
    recorded = copy.deepcopy(full)
    recorded["config"]["pause_victim"]["thunder-mw"] = "cost_benefit"
    legacy = copy.deepcopy(full)
    del legacy["config"]["pause_victim"]
    for old in (recorded, legacy):
        with pytest.raises(ReuseError, match="thunder-mw's pause victim resolved to cost_benefit"):
            run_scenario(TINY, POLICIES, sweep=False, reuse=old, rerun={"session_affinity"})
    # A rule a legacy file's pipeline names outright is the rule it ran.
    named = {"policies": {"p": [{"state_aware_pause": {"victim": "auto"}}], "q": []}}
    rules = (recorded_rule(named, "p", "pause_victim"), recorded_rule(named, "q", "pause_victim"))
    assert rules == ("auto", None)


def test_a_run_whose_queue_order_default_changed_is_refused(full: dict[str, Any]) -> None:
    # `migration: {}` orders by the host tier since 0.2.0: no tier here, so the order is the
    # one files written before it was recorded ran, and such a file is reused...
    assert full["config"]["queue_order"]["thunder-mw"] == "arrival"
    legacy = copy.deepcopy(full)
    del legacy["config"]["queue_order"]
    run_scenario(TINY, POLICIES, sweep=False, reuse=legacy, rerun={"session_affinity"})
    # ...while a file whose run resolved otherwise is not.
    recorded = copy.deepcopy(full)
    recorded["config"]["queue_order"]["thunder-mw"] = "started_first"
    with pytest.raises(ReuseError, match="thunder-mw's queue order resolved to started_first"):
        run_scenario(TINY, POLICIES, sweep=False, reuse=recorded, rerun={"session_affinity"})


def test_a_preset_that_now_names_the_old_queue_order_still_matches_its_old_runs() -> None:
    # The baselines' presets say `started_first: false` since the default moved; their
    # files of before say nothing, and ran the same order.
    then = [{"migration": {"placement": "mru"}}]
    now = [{"migration": {"placement": "mru", "started_first": False}}]
    config = {"policies": {"p": then}, "host_tier": {}}
    order = {"queue_order": {"p": "arrival"}, "resume_placement": {"p": "home_if_room"}}
    check_config(config, {**config, **order, "policies": {"p": now}}, ["p"])
    assert recorded_rule(config, "p", "queue_order") == "arrival"
    with pytest.raises(ReuseError, match="pipeline changed"):
        later = [{"migration": {"placement": "mru", "started_first": True}}]
        check_config(config, {**config, **order, "policies": {"p": later}}, ["p"])


def test_runs_of_another_resume_placement_or_cost_source_are_refused(
    full: dict[str, Any],
) -> None:
    # thunder-mw prices recompute from the engine's counters; the baselines price nothing.
    assert full["config"]["resume_placement"]["thunder-mw"] == "home_if_room"
    assert full["config"]["engine_counters"] == {"thunder-mw": True}
    # A file from before either was recorded ran `home_if_room` placement with no engine
    # counters (its cluster constants lack `engine_counters`: False then): its baselines are
    # reused, its thunder-mw is not.
    legacy = copy.deepcopy(full)
    del legacy["config"]["resume_placement"], legacy["config"]["engine_counters"]
    del legacy["config"]["cluster_defaults"]["engine_counters"]
    run_scenario(TINY, POLICIES, sweep=False, reuse=legacy, rerun={"thunder-mw"})
    with pytest.raises(ReuseError, match="thunder-mw learned its costs from call timings"):
        run_scenario(TINY, POLICIES, sweep=False, reuse=legacy, rerun={"session_affinity"})
    placed = copy.deepcopy(full)
    placed["config"]["resume_placement"]["thunder-mw"] = "tier_aware"
    with pytest.raises(ReuseError, match="thunder-mw's resume placement resolved to tier_aware"):
        run_scenario(TINY, POLICIES, sweep=False, reuse=placed, rerun={"session_affinity"})
    # --engine-counters turns them on for every policy: no run of the file is reused.
    every = dataclasses.replace(TINY, engine_counters=True)
    with pytest.raises(ReuseError, match="session_affinity learned its costs from call timings"):
        run_scenario(every, POLICIES, sweep=False, reuse=full, rerun={"thunder-mw"})


def test_a_run_from_before_an_idle_engine_admitted_is_refused(full: dict[str, Any]) -> None:
    # `admission: {}` admits onto an engine with no call in flight since 2026-12-05; a file
    # from before did not record the rule and held: its thunder-mw runs are not reused...
    assert full["config"]["idle_engine"] == {"thunder-mw": "admit"}
    legacy = copy.deepcopy(full)
    del legacy["config"]["idle_engine"]
    with pytest.raises(ReuseError, match="thunder-mw's idle-engine admission resolved to hold"):
        run_scenario(TINY, POLICIES, sweep=False, reuse=legacy, rerun={"session_affinity"})
    run_scenario(TINY, POLICIES, sweep=False, reuse=legacy, rerun={"thunder-mw"})
    # ...while a baseline's preset, which now names the rule off, matches its old runs.
    then = [{"admission": {"overflow": "hold"}}]
    now = [{"admission": {"overflow": "hold", "fill_idle_engine": False}}]
    config = {"policies": {"p": then}, "host_tier": {}}
    rules = {"idle_engine": {"p": "hold"}, "tier_reload": {"p": "off"}}
    rules |= {"recompute_overflow": {"p": "off"}}  # `hold` admits nothing past the limit
    check_config(config, {**config, **rules, "policies": {"p": now}}, ["p"])
    assert recorded_rule(config, "p", "idle_engine") == "hold"


def test_a_run_from_before_holding_at_the_limit_without_a_tier_is_refused(
    full: dict[str, Any],
) -> None:
    # `admission: {}` admits nothing past the limit to recompute on an engine without a host
    # tier since 2026-12-07; a file from before did not record the rule and overflowed: its
    # thunder-mw runs are not reused (the pipeline, `admission: {}`, reads the same)...
    assert full["config"]["recompute_overflow"] == {"thunder-mw": "off"}
    legacy = copy.deepcopy(full)
    del legacy["config"]["recompute_overflow"]
    with pytest.raises(ReuseError, match="thunder-mw's recompute overflow resolved to on"):
        run_scenario(TINY, POLICIES, sweep=False, reuse=legacy, rerun={"session_affinity"})
    run_scenario(TINY, POLICIES, sweep=False, reuse=legacy, rerun={"thunder-mw"})
    # ...while a preset that names the earlier rule matches the old runs that did not, and
    # a `hold` admission (a baseline's) reads `off` either way: nothing past the limit.
    then = [{"admission": {"overflow": "cost_aware"}}]
    now = [{"admission": {"overflow": "cost_aware", "recompute_overflow": True}}]
    config = {"policies": {"p": then}, "host_tier": {}}
    rules = {"idle_engine": {"p": "hold"}, "tier_reload": {"p": "off"}}
    check_config(
        config,
        {**config, **rules, "recompute_overflow": {"p": "on"}, "policies": {"p": now}},
        ["p"],
    )
    held = {"policies": {"p": [{"admission": {"overflow": "hold"}}]}}
    assert recorded_rule(held, "p", "recompute_overflow") == "off"


def test_a_file_from_before_the_waiting_gauge_read_the_queue(full: dict[str, Any]) -> None:
    # A file written before `waiting` was recorded read vLLM's waiting count as the engine's
    # queue, today's default: its runs are reused. A file that read the gauge is another
    # configuration.
    assert full["config"]["cluster_defaults"]["waiting"] == "queue"
    legacy = copy.deepcopy(full)
    del legacy["config"]["cluster_defaults"]["waiting"]
    run_scenario(TINY, POLICIES, sweep=False, reuse=legacy, rerun={"thunder-mw"})
    gauge = copy.deepcopy(full)
    gauge["config"]["cluster_defaults"]["waiting"] = "gauge"
    with pytest.raises(ReuseError, match="cluster_defaults"):
        run_scenario(TINY, POLICIES, sweep=False, reuse=gauge, rerun={"thunder-mw"})


# A scenario whose main point is TINY's, with a sweep point of its own (cluster-scaling's
# is paper-rollout-2node's): its main point's runs are taken from TINY's file.
SWEEP = dataclasses.replace(TINY, sweep=((2, 3),), main_point_of="tiny")


def _marked(doc: dict[str, Any], policy: str) -> dict[str, Any]:
    """A copy of `doc` with one main-point figure of `policy` marked."""
    marked = copy.deepcopy(doc)
    row = next(r for r in marked["sweep"] if r["policy"] == policy and not r["wave"])
    row["steps_per_min_steady"] = 12345.0
    return marked


def _marked_policies(report: dict[str, Any]) -> list[str]:
    return [r["policy"] for r in report["sweep"] if r.get("steps_per_min_steady") == 12345.0]


def test_a_shared_main_point_writes_the_document_a_full_run_writes(full: dict[str, Any]) -> None:
    whole = _as_written(run_scenario(SWEEP, POLICIES))
    shared = _as_written(run_scenario(SWEEP, POLICIES, shared=full))
    assert shared["main_point_from"] == {
        "scenario": "tiny",
        "policies": POLICIES,
        "wall_s": full["wall_s"],
    }
    del shared["main_point_from"]
    assert _without_timings(shared) == _without_timings(whole)
    assert "main_point_from" not in whole


def test_a_shared_main_point_is_the_other_files_and_the_sweep_is_run(full: dict[str, Any]) -> None:
    source = _marked(full, "session_affinity")
    report = run_scenario(SWEEP, POLICIES, shared=source)
    assert _marked_policies(report) == ["session_affinity"]
    # Its sweep point is this scenario's own (the other file has none to give).
    point = [r for r in report["sweep"] if r["engines"] == 2 and r["policy"] != "vllm_capped"]
    assert sorted(r["policy"] for r in point) == ["session_affinity", "thunder-mw"]


def test_a_shared_file_of_another_configuration_is_not_taken(
    full: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # Another workload size: nothing is taken, and stderr says why.
    other = _marked(full, "session_affinity")
    other["config"]["programs_per_engine"] = 4
    report = run_scenario(SWEEP, POLICIES, sweep=False, shared=other)
    assert _marked_policies(report) == []
    assert "main_point_from" not in report
    assert "programs_per_engine" in capsys.readouterr().err
    # One policy's pipeline changed there: that policy's runs are run, the others taken.
    changed = _marked(_marked(full, "session_affinity"), "thunder-mw")
    changed["config"]["policies"]["thunder-mw"] = [{"round_robin": {}}]
    report = run_scenario(SWEEP, POLICIES, sweep=False, shared=changed)
    assert _marked_policies(report) == ["session_affinity"]
    assert report["main_point_from"]["policies"] == ["session_affinity", "vllm_capped"]
    assert "thunder-mw runs its main point here" in capsys.readouterr().err
