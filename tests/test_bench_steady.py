"""Specification of the steady-state figure, the baselines' engine features in the harness, and
the published figures next to the measured ones (benchmarks/des.py, reproduction.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from thunder_mw.benchmarks.bench_cli import add_bench_arguments, engine_options, run_bench
from thunder_mw.benchmarks.des import Arrivals, ClusterConfig, Simulation, simulate
from thunder_mw.benchmarks.reproduction import best_baseline, summarise_runs
from thunder_mw.benchmarks.scenarios import POLICIES, SCENARIOS, Published
from thunder_mw.benchmarks.workloads import PRESETS, LogNormal, generate

TINY_SWE = dataclasses.replace(
    PRESETS["swe-agent"],
    name="tiny-swe",
    output_tokens=LogNormal(40, 0.5, 8, 200),
    tool_result_tokens=LogNormal(250, 0.8, 10, 1500),
    start_s=None,
)
SMALL = ClusterConfig(engines=2, kv_tokens=12_288, max_model_len=8192)


def swe(n: int):
    return generate(TINY_SWE, n, seed=1, max_context_tokens=8192)


def test_a_closed_loop_reports_throughput_over_the_window_after_warm_up():
    m = simulate(swe(40), POLICIES["thunder-mw"], SMALL, Arrivals("closed", 8)).metrics
    assert m["warmup_s"] > 0 and m["steady_window_s"] > 0
    assert m["steady_programs_done"] > 0 and m["steps_per_min_steady"] > 0
    # The window ends when the last program starts, before the run drains.
    assert m["warmup_s"] + m["steady_window_s"] < m["makespan_s"]


def test_one_wave_has_no_steady_state():
    m = simulate(swe(8), POLICIES["thunder-mw"], SMALL, Arrivals("closed", 8)).metrics
    assert m["steps_per_min_steady"] is None and m["steady_window_s"] == 0.0


def test_the_warm_up_lasts_until_a_concurrencys_worth_of_programs_finished():
    short = simulate(swe(40), POLICIES["sticky"], SMALL, Arrivals("closed", 8, 2)).metrics
    default = simulate(swe(40), POLICIES["sticky"], SMALL, Arrivals("closed", 8)).metrics
    assert short["warmup_s"] < default["warmup_s"]


def test_continuums_ttl_reaches_the_engine_as_pins():
    sim = Simulation(swe(6), POLICIES["continuum"], SMALL, Arrivals("closed", 6))
    sim.run()
    assert sum(b.engine.stats.pins_created for b in sim.backends.values()) > 0
    plain = Simulation(swe(6), POLICIES["session_affinity"], SMALL, Arrivals("closed", 6))
    plain.run()
    assert sum(b.engine.stats.pins_created for b in plain.backends.values()) == 0


def test_only_the_offload_baseline_brings_a_host_tier_unless_the_scenario_has_one():
    scenario = SCENARIOS["paper-rollout-2node"]
    assert dict(engine_options(scenario, "offload"))["host_kv_tokens"] > 0
    assert engine_options(scenario, "kv_aware") == ()
    tiered = SCENARIOS["hicache-batch192"]
    assert all(engine_options(tiered, p) for p in tiered.policies)


def test_the_offload_baselines_engines_load_evicted_blocks_from_the_host():
    tier = (("host_kv_tokens", 48_000),)
    cluster = dataclasses.replace(SMALL, engine_options=tier)
    sim = Simulation(swe(16), POLICIES["offload"], cluster, Arrivals("closed", 16))
    sim.run()
    assert sum(b.engine.stats.kv_load_tokens for b in sim.backends.values()) > 0


def _row(policy, seed, value, engines=1, per=96, wave=False):
    return {
        "policy": policy,
        "seed": seed,
        "engines": engines,
        "programs_per_engine": per,
        "wave": wave,
        "steps_per_min_steady": value,
    }


def test_the_published_ratio_is_compared_with_the_seed_paired_simulated_one():
    scenario = dataclasses.replace(
        SCENARIOS["paper-swe-glm46"],
        published=(Published("fig", "src", 2.0), Published("fig2", "src", 1.0, policy="continuum")),
    )
    rows = [
        _row("vllm", 0, 100), _row("vllm", 1, 50), _row("vllm", 2, 100),
        _row("thunderagent", 0, 180), _row("thunderagent", 1, 100), _row("thunderagent", 2, 150),
        _row("continuum", 0, 100), _row("continuum", 1, 50), _row("continuum", 2, 100),
        _row("thunder-mw", 0, 200), _row("thunder-mw", 1, 100), _row("thunder-mw", 2, 200),
        _row("vllm", 0, 999, wave=True),  # the one-wave run is not a steady figure
    ]  # fmt: skip
    out = summarise_runs(scenario, ["vllm", "continuum", "thunderagent", "thunder-mw"], rows)
    first, second = out["reproduction"]
    assert first["measured_ratio"] == 1.8  # median of 1.8, 2.0, 1.5
    assert (first["measured_ratio_min"], first["measured_ratio_max"]) == (1.5, 2.0)
    assert first["gap"] == -0.1 and first["reproduced"]
    assert first["thunder_mw_ratio"] == 2.0
    assert second["measured_ratio"] == 1.0 and second["reproduced"]
    vllm = next(r for r in out["steady"] if r["policy"] == "vllm")
    assert vllm["steps_per_min_steady"] == {"min": 50, "median": 100, "max": 100, "n": 3}
    assert [w["policy"] for w in out["wave"]] == ["vllm"]


def test_a_ratio_off_by_more_than_30_percent_is_not_reproduced():
    scenario = dataclasses.replace(
        SCENARIOS["paper-swe-glm46"], published=(Published("fig", "src", 2.65),)
    )
    rows = [_row("vllm", 0, 100), _row("thunderagent", 0, 120)]
    (entry,) = summarise_runs(scenario, ["vllm", "thunderagent"], rows)["reproduction"]
    assert entry["gap"] == round(1.2 / 2.65 - 1, 3) and not entry["reproduced"]


def test_a_figure_for_one_fleet_size_is_read_at_that_size():
    scenario = SCENARIOS["cluster-scaling"]
    per = scenario.programs_per_engine
    rows = [
        _row("kv_aware", 0, 100, engines=2, per=per),
        _row("thunderagent", 0, 150, engines=2, per=per),
        _row("kv_aware", 0, 400, engines=8, per=per),
        _row("thunderagent", 0, 960, engines=8, per=per),
    ]
    out = summarise_runs(scenario, ["kv_aware", "thunderagent"], rows)
    by_size = {r["engines"]: r["measured_ratio"] for r in out["reproduction"]}
    assert by_size == {2: 1.5, 8: 2.4}


def test_the_strongest_baseline_excludes_thunder_mw_and_the_originals_rules():
    report = {
        "config": {"engines": 1, "programs_per_engine": 96},
        "steady": [
            {"policy": p, "engines": 1, "programs_per_engine": 96, "steps_per_min_steady": s}
            for p, s in (
                ("vllm", {"median": 100}),
                ("continuum", {"median": 120}),
                ("thunderagent", {"median": 300}),
                ("thunder-mw", {"median": 310}),
            )
        ],
    }
    assert best_baseline(report) == "continuum"


def test_a_published_scenario_writes_the_figures_beside_the_measured_ones(tmp_path):
    out = tmp_path / "r.json"
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    args = parser.parse_args(
        [
            "--scenario", "paper-swe-glm46", "--workload", "swe-agent",
            "--programs-per-engine", "3", "--kv-tokens", "16384", "--seeds", "2",
            "--policies", "vllm,thunderagent", "--no-sweep", "--no-plots",
            "--jobs", "1", "--output", str(out),
        ]
    )  # fmt: skip
    assert run_bench(args) == 0
    report = json.loads(out.read_text())
    assert report["config"]["seeds"] == [0, 1]
    (entry,) = [r for r in report["reproduction"] if r["policy"] == "thunderagent"]
    assert entry["published_ratio"] == 2.65 and entry["measured_ratio"] is not None
    assert {w["policy"] for w in report["wave"]} == {"vllm", "thunderagent"}
    steady = {r["policy"]: r for r in report["steady"]}
    assert steady["vllm"]["steps_per_min_steady"]["n"] == 2


def test_a_run_stopped_when_the_window_closes_counts_open_programs_as_unfinished():
    arrivals = Arrivals("closed", 8, stop_at_window_end=True)
    m = simulate(swe(40), POLICIES["sticky"], SMALL, arrivals).metrics
    full = simulate(swe(40), POLICIES["sticky"], SMALL, Arrivals("closed", 8)).metrics
    assert m["steps_per_min_steady"] == full["steps_per_min_steady"]
    assert m["programs_unfinished"] > 0 and m["programs_failed"] == 0
    assert m["makespan_s"] < full["makespan_s"]
