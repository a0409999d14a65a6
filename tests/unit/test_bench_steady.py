"""Specification of the steady-state figure, the baselines' engine features in the harness, and
the published figures next to the measured ones (benchmarks/des.py, reproduction.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from thunder_mw.benchmarks.bench_cli import (
    add_bench_arguments,
    cluster_for,
    engine_options,
    run_bench,
)
from thunder_mw.benchmarks.des import Arrivals, ClusterConfig, Simulation, simulate
from thunder_mw.benchmarks.reproduction import best_baseline, summarise_runs
from thunder_mw.benchmarks.scenarios import POLICIES, SCENARIOS, Published
from thunder_mw.benchmarks.workloads import PRESETS, LogNormal, ProgramSpec, generate

TINY_SWE = dataclasses.replace(
    PRESETS["swe-agent"],
    name="tiny-swe",
    output_tokens=LogNormal(40, 0.5, 8, 200),
    tool_result_tokens=LogNormal(250, 0.8, 10, 1500),
    start_s=None,
)
SMALL = ClusterConfig(engines=2, kv_tokens=12_288, max_model_len=8192)


def swe(n: int) -> list[ProgramSpec]:
    return generate(TINY_SWE, n, seed=1, max_context_tokens=8192)


def test_a_closed_loop_reports_throughput_over_the_window_after_warm_up() -> None:
    m = simulate(swe(40), POLICIES["thunder-mw"], SMALL, Arrivals("closed", 8)).metrics
    assert m["warmup_s"] > 0 and m["steady_window_s"] > 0
    assert m["steady_programs_done"] > 0 and m["steps_per_min_steady"] > 0
    # The window ends when the last program starts, before the run drains.
    assert m["warmup_s"] + m["steady_window_s"] < m["makespan_s"]


def test_one_wave_has_no_steady_state() -> None:
    m = simulate(swe(8), POLICIES["thunder-mw"], SMALL, Arrivals("closed", 8)).metrics
    assert m["steps_per_min_steady"] is None and m["steady_window_s"] == 0.0


def test_the_warm_up_lasts_until_a_concurrencys_worth_of_programs_finished() -> None:
    short = simulate(swe(40), POLICIES["sticky"], SMALL, Arrivals("closed", 8, 2)).metrics
    default = simulate(swe(40), POLICIES["sticky"], SMALL, Arrivals("closed", 8)).metrics
    assert short["warmup_s"] < default["warmup_s"]


def test_continuums_ttl_reaches_the_engine_as_pins() -> None:
    sim = Simulation(swe(6), POLICIES["continuum"], SMALL, Arrivals("closed", 6))
    sim.run()
    assert sum(b.engine.stats.pins_created for b in sim.backends.values()) > 0
    plain = Simulation(swe(6), POLICIES["session_affinity"], SMALL, Arrivals("closed", 6))
    plain.run()
    assert sum(b.engine.stats.pins_created for b in plain.backends.values()) == 0


def test_only_the_offload_baseline_brings_a_host_tier_unless_the_scenario_has_one() -> None:
    scenario = SCENARIOS["paper-rollout-2node"]
    assert dict(engine_options(scenario, "offload"))["host_kv_tokens"] > 0
    assert engine_options(scenario, "kv_aware") == ()
    tiered = SCENARIOS["hicache-batch192"]
    assert all(engine_options(tiered, p) for p in tiered.policies)


def test_the_offload_baselines_engines_load_evicted_blocks_from_the_host() -> None:
    tier = (("host_kv_tokens", 48_000),)
    cluster = dataclasses.replace(SMALL, engine_options=tier)
    sim = Simulation(swe(16), POLICIES["offload"], cluster, Arrivals("closed", 16))
    sim.run()
    assert sum(b.engine.stats.kv_load_tokens for b in sim.backends.values()) > 0


def _row(
    policy: str, seed: int, value: float, engines: int = 1, per: int = 96, wave: bool = False
) -> dict[str, Any]:
    return {
        "policy": policy,
        "seed": seed,
        "engines": engines,
        "programs_per_engine": per,
        "wave": wave,
        "steps_per_min_steady": value,
    }


def test_the_published_ratio_is_compared_with_the_seed_paired_simulated_one() -> None:
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


def test_a_ratio_off_by_more_than_30_percent_is_not_reproduced() -> None:
    scenario = dataclasses.replace(
        SCENARIOS["paper-swe-glm46"], published=(Published("fig", "src", 2.65),)
    )
    rows = [_row("vllm", 0, 100), _row("thunderagent", 0, 120)]
    (entry,) = summarise_runs(scenario, ["vllm", "thunderagent"], rows)["reproduction"]
    assert entry["gap"] == round(1.2 / 2.65 - 1, 3) and not entry["reproduced"]


def test_a_figure_for_one_fleet_size_is_read_at_that_size() -> None:
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


def test_the_strongest_baseline_excludes_thunder_mw_and_the_originals_rules() -> None:
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


@pytest.mark.slow
def test_a_published_scenario_writes_the_figures_beside_the_measured_ones(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    args = parser.parse_args(
        [
            "--scenario", "paper-swe-glm46", "--workload", "swe-agent",
            "--programs-per-engine", "3", "--kv-tokens", "16384", "--seeds", "2",
            "--policies", "vllm,thunderagent,thunder-mw", "--no-sweep", "--no-plots",
            "--jobs", "1", "--output", str(out),
        ]
    )  # fmt: skip
    assert run_bench(args) == 0
    report = json.loads(out.read_text())
    assert report["config"]["seeds"] == [0, 1]
    (entry,) = [r for r in report["reproduction"] if r["policy"] == "thunderagent"]
    assert entry["published_ratio"] == 2.65 and entry["measured_ratio"] is not None
    assert {w["policy"] for w in report["wave"]} == {"vllm", "thunderagent", "thunder-mw"}
    steady = {r["policy"]: r for r in report["steady"]}
    assert steady["vllm"]["steps_per_min_steady"]["n"] == 2
    # The headline figures: both, over the seeds, with intervals and a verdict per ratio.
    assert report["seeds"] == [0, 1]
    (point,) = report["figures"]["points"]
    ratio = point["ratios"]["vllm"]
    for metric in ("makespan_s", "steps_per_min_steady"):
        assert ratio[metric]["verdict"] in ("win", "tie", "loss")
        assert ratio[metric]["seeds"] == [0, 1] and len(ratio[metric]["ci95"]) == 2
        assert point["policies"]["thunderagent"][metric]["n"] == 2


def test_a_run_stopped_when_the_window_closes_counts_open_programs_as_unfinished() -> None:
    arrivals = Arrivals("closed", 8, stop_at_window_end=True)
    m = simulate(swe(40), POLICIES["sticky"], SMALL, arrivals).metrics
    full = simulate(swe(40), POLICIES["sticky"], SMALL, Arrivals("closed", 8)).metrics
    assert m["steps_per_min_steady"] == full["steps_per_min_steady"]
    assert m["programs_unfinished"] > 0 and m["programs_failed"] == 0
    assert m["makespan_s"] < full["makespan_s"]


def test_calls_in_flight_at_the_windows_cuts_count_pro_rata() -> None:
    arrivals = Arrivals("closed", 8, stop_at_window_end=True)
    sim = Simulation(swe(40), POLICIES["sticky"], SMALL, arrivals)
    m = sim.run().metrics
    warm = sim._warm
    assert warm is not None
    assert sim._steps_at_last_start is not None
    end_steps, end_output = sim._in_flight_at_last_start
    # Some call was part-way at each cut, and no more than one per program in flight.
    assert 0 < end_steps < 8 and 0 <= warm[4] < 8 and end_output > 0
    steps = sim._steps_at_last_start + end_steps - warm[1] - warm[4]
    span = sim._last_start - warm[0]
    assert m["steps_per_min_steady"] == round(60 * steps / span, 2)
    assert m["steps_per_min_steady"] != round(60 * (sim._steps_at_last_start - warm[1]) / span, 2)


def test_a_closed_loop_with_bursts_starts_programs_in_groups() -> None:
    sim = Simulation(swe(40), POLICIES["sticky"], SMALL, Arrivals("closed", 8, burst=4))
    sim.run()
    starts: dict[float, int] = {}
    for run in sim.runs.values():
        if run.spec.parent_id is None and run.arrived_at > 0:
            starts[run.arrived_at] = starts.get(run.arrived_at, 0) + 1
    assert sum(starts.values()) == 32
    assert all(n % 4 == 0 for n in starts.values())
    plain = Simulation(swe(40), POLICIES["sticky"], SMALL, Arrivals("closed", 8))
    plain.run()
    assert len({r.arrived_at for r in plain.runs.values() if r.arrived_at > 0}) > len(starts)


def test_a_burst_larger_than_the_concurrency_is_refused() -> None:
    with pytest.raises(ValueError, match="burst"):
        Arrivals("closed", 8, burst=9)


def test_a_mixed_fleet_gives_each_engine_its_profile_and_capacity() -> None:
    scenario = SCENARIOS["test-mixed-fleet"]
    cluster = cluster_for(scenario, "kv_aware", scenario.engines, 0)
    sim = Simulation(swe(2), POLICIES["kv_aware"], cluster, Arrivals("batch"))
    capacities = [b.engine.capacity_tokens for b in sim.backends.values()]
    assert capacities[0] > 4 * capacities[1]  # an H100 beside an RTX 5090
    profiles = [b.engine.config.profile for b in sim.backends.values()]
    assert profiles == ["h100-8b", "rtx5090-qwen3-8b"]


def test_a_mixed_workload_alternates_its_presets_and_keeps_its_prefix() -> None:
    from thunder_mw.benchmarks.workloads import generate_mix

    mixed = generate_mix("mix:swe-agent+tool-orchestra", 10, seed=3)
    types = [p.session_type for p in mixed]
    assert types[0] != types[1] and types[::2] == [types[0]] * 5 and types[1::2] == [types[1]] * 5
    assert len({p.program_id for p in mixed}) == 10
    assert generate_mix("mix:swe-agent+tool-orchestra", 6, seed=3) == mixed[:6]
    with pytest.raises(ValueError, match="mix"):
        generate_mix("mix:swe-agent+nope", 4)


def test_continuum_engines_order_their_queue_by_program_arrival() -> None:
    from thunder_mw.sim.engine import Engine, EngineConfig, SamplingParams

    engine = Engine(EngineConfig(num_blocks=64, program_fcfs=True), [0])
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request("old#0", [1] * 32, params, program_id="old")
    engine.add_request("new#0", [2] * 32, params, program_id="new")
    engine.add_request("newer#0", [3] * 32, params, program_id="newer")
    engine.add_request("old#1", [1] * 40, params, program_id="old")  # the old program returns
    order = [s.request_id for s in engine._waiting]
    assert order == ["old#0", "old#1", "new#0", "newer#0"]
    fcfs = Engine(EngineConfig(num_blocks=64), [0])
    for rid, pid in (("old#0", "old"), ("new#0", "new"), ("old#1", "old")):
        fcfs.add_request(rid, [1] * 32, params, program_id=pid)
    assert [s.request_id for s in fcfs._waiting] == ["old#0", "new#0", "old#1"]


def test_only_continuum_brings_program_fcfs_and_host_tiers_are_sized_to_node_ram() -> None:
    scenario = SCENARIOS["paper-swe-glm46"]
    assert dict(engine_options(scenario, "continuum")) == {"program_fcfs": True}
    host = dict(engine_options(scenario, "offload"))["host_kv_tokens"]
    # Half of an 8xH100 node's 2 TB at GLM-4.6's KV bytes per token: ~2.65 M tokens.
    assert 2_600_000 < host < 2_700_000


def _fig_row(
    policy: str, seed: int, wave: bool, value: float, cap: int | None = None, per: int = 8
) -> dict[str, Any]:
    metric = "makespan_s" if wave else "steps_per_min_steady"
    return {
        "policy": policy, "seed": seed, "wave": wave, "cap": cap, "engines": 1,
        "programs_per_engine": per, metric: value, "steady_programs_done": 40,
    }  # fmt: skip


def test_vllm_capped_takes_the_best_cap_per_figure_and_records_it() -> None:
    from thunder_mw.benchmarks.figures import capped_rows, choose_caps

    scenario = dataclasses.replace(SCENARIOS["paper-swe-glm46"], programs_per_engine=8)
    rows = []
    for seed in range(5):
        rows += [
            _fig_row("vllm", seed, False, 20.0), _fig_row("vllm", seed, True, 400.0),
            _fig_row("vllm_capped", seed, False, 25.0 + seed, cap=4),
            _fig_row("vllm_capped", seed, True, 420.0, cap=4),
            _fig_row("vllm_capped", seed, False, 22.0, cap=2),
            _fig_row("vllm_capped", seed, True, 390.0, cap=2),
        ]  # fmt: skip
    caps = choose_caps(scenario, ["vllm", "vllm_capped"], rows)
    assert caps is not None
    assert (caps["window_cap"], caps["batch_cap"], caps["uncapped"]) == (4, 2, "vllm")
    assert [s["cap"] for s in caps["sweep"]] == [2, 4, 8]  # 8: the uncapped engine
    chosen = capped_rows(scenario, caps, rows)
    assert {(r["wave"], r["cap"]) for r in chosen} == {(False, 4), (True, 2)}
    assert len(chosen) == 10


def test_offload_capped_sweeps_its_caps_over_offload_and_plans_its_own_runs() -> None:
    from thunder_mw.benchmarks.bench_cli import plan_jobs
    from thunder_mw.benchmarks.figures import capped_rows, choose_caps

    scenario = dataclasses.replace(SCENARIOS["paper-swe-glm46"], programs_per_engine=8)
    rows = []
    for seed in range(5):
        rows += [
            _fig_row("vllm", seed, False, 10.0),
            _fig_row("offload", seed, False, 20.0), _fig_row("offload", seed, True, 400.0),
            _fig_row("vllm_capped", seed, False, 15.0, cap=4),
            _fig_row("offload_capped", seed, False, 19.0, cap=4),
            _fig_row("offload_capped", seed, True, 380.0, cap=4),
        ]  # fmt: skip
    policies = ["vllm", "offload", "vllm_capped", "offload_capped"]
    caps = choose_caps(scenario, policies, rows, "offload_capped")
    assert caps is not None
    # Its uncapped point is offload's run, which wins the window here; cap 4 the batch.
    assert (caps["uncapped"], caps["window_cap"], caps["batch_cap"]) == ("offload", 8, 4)
    chosen = capped_rows(scenario, caps, rows, "offload_capped")
    assert {r["policy"] for r in chosen} == {"offload_capped"}
    assert {(r["wave"], r["cap"]) for r in chosen} == {(False, 8), (True, 4)}
    # vllm_capped's sweep is its own: offload's runs are not its uncapped point.
    vllm = choose_caps(scenario, policies, rows)
    assert vllm is not None and vllm["uncapped"] == "vllm"
    jobs = plan_jobs(SCENARIOS["swe-agent-knee"], ["offload", "offload_capped"], seeds=1)
    assert sorted({j.cap or 0 for j in jobs if j.policy == "offload_capped"}) == [48, 96, 144]
    assert dict(engine_options(scenario, "offload_capped")) == dict(
        engine_options(scenario, "offload")
    )


def test_a_tier_is_cut_with_the_gpu_cache_it_sits_behind() -> None:
    # swe-agent-knee cuts the 8B engine's 467,280 GPU tokens to 131,072: the node's
    # 953,674-token share of host RAM shrinks by the same factor, 2.04x the GPU cache.
    tier = dict(engine_options(SCENARIOS["swe-agent-knee"], "offload"))["host_kv_tokens"]
    assert tier == 267_505


def test_the_figures_carry_intervals_verdicts_and_the_seeds() -> None:
    from thunder_mw.benchmarks.figures import figures

    scenario = dataclasses.replace(SCENARIOS["paper-swe-glm46"], programs_per_engine=8)
    rows = []
    for seed in range(5):
        rows += [
            _fig_row("vllm", seed, False, 20.0 + seed), _fig_row("vllm", seed, True, 400.0),
            _fig_row("thunder-mw", seed, False, 1.1 * (20.0 + seed)),
            _fig_row("thunder-mw", seed, True, 400.0 + (seed - 2) * 10),
        ]  # fmt: skip
    (point,) = figures(scenario, ["vllm", "thunder-mw"], rows)["points"]
    steady = point["ratios"]["vllm"]["steps_per_min_steady"]
    assert steady["ratio"] == 1.1 and steady["verdict"] == "win"
    assert steady["seeds"] == [0, 1, 2, 3, 4]
    makespan = point["ratios"]["vllm"]["makespan_s"]
    assert makespan["verdict"] == "tie" and makespan["ci95"][0] < 1 < makespan["ci95"][1]
    assert point["policies"]["vllm"]["steps_per_min_steady"]["ci95"][0] < 22.0
    assert point["strongest"] == {"makespan_s": "vllm", "steps_per_min_steady": "vllm"}
    assert point["window_ok"]  # 40 completions >= 4 x 8
