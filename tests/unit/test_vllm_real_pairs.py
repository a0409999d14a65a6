"""The real-engine benchmark's paired figures: thunder-mw over every other system, and each of
thunder-mw's own forms (its routing-only control) over plain vLLM; the targets compare the
default with the peers a user would pick instead, never with thunder-mw's own forms."""

from __future__ import annotations

from typing import Any

from thunder_mw.benchmarks import vllm_real
from thunder_mw.benchmarks.scenarios import POLICIES, SCENARIOS


def _runs(figures: dict[str, list[float]]) -> dict[str, list[dict[str, Any]]]:
    return {
        name: [
            {"repeat": i, "steps_per_min": v, "prefix_hit_rate": 0.5} for i, v in enumerate(values)
        ]
        for name, values in figures.items()
    }


RUNS = _runs(
    {
        "direct": [100.0, 104.0, 98.0, 102.0],
        "thunder-mw": [90.0, 93.0, 88.0, 91.0],
        vllm_real.ROUTING_ONLY: [96.0, 99.0, 94.0, 97.0],
        "smg/cache_aware": [95.0, 97.0, 92.0, 96.0],
    }
)


def test_the_routing_only_form_is_paired_with_plain_vllm() -> None:
    pairs = vllm_real.paired_ratios(RUNS)
    own = pairs[f"{vllm_real.ROUTING_ONLY}/direct"]
    # 96/100, 99/104, 94/98, 97/102: 0.96, 0.952, 0.959, 0.951
    assert own["steps_per_min"]["median"] == 0.9555
    assert own["steps_per_min_ratio"]["verdict"] == "loss"
    # The default over it: what holding adds beside the gateway's own hop.
    assert pairs[f"thunder-mw/{vllm_real.ROUTING_ONLY}"]["steps_per_min"]["max"] < 1.0
    # Only thunder-mw's own forms get a pair with plain vLLM of their own.
    assert "smg/cache_aware/direct" not in pairs


def test_no_target_compares_the_default_with_its_own_forms() -> None:
    # The routing-only control is the fastest "other" system here; the target names the
    # fastest peer instead.
    targets = vllm_real.regime_targets("cheap", RUNS)
    best = next(t for t in targets if t["target"].startswith("steps/min vs the best other"))
    assert "(smg/cache_aware)" in best["target"]


def test_the_routing_only_form_serves_the_routing_stage_alone() -> None:
    system = vllm_real.system_named(vllm_real.ROUTING_ONLY)
    assert system.kind == "thunder-mw"
    assert system.pipeline == system.stand_in == "session_affinity"
    assert vllm_real.ROUTING_ONLY in SCENARIOS["vllm-cpu-real"].policies


def test_the_drain_fcfs_form_serves_the_default_with_the_fixed_drain_order() -> None:
    system = vllm_real.system_named(vllm_real.DRAIN_FCFS)
    assert system.kind == "thunder-mw"
    assert system.pipeline == system.stand_in == vllm_real.DRAIN_FCFS
    pause = next(
        e["state_aware_pause"] for e in POLICIES[system.pipeline] if "state_aware_pause" in e
    )
    assert pause["drain_victim"] == "fcfs"


def test_each_repeat_draws_its_own_wave_and_every_draw_overflows() -> None:
    scenario = SCENARIOS["vllm-cpu-real"]
    assert scenario.kv_tokens is not None
    bar = vllm_real.OVERFLOW_AT_LEAST * scenario.kv_tokens
    seeds = vllm_real.draw_seeds(scenario, 0, 5)
    assert len(set(seeds)) == 5 and seeds[0] == 0 and seeds == sorted(seeds)
    for seed in range(seeds[-1] + 1):
        peak = sum(vllm_real.peak_context(p) for p in vllm_real.regime_programs(scenario, seed))
        # Taken exactly when the draw overflows by construction (seed 1 falls short).
        assert (seed in seeds) == (peak >= bar), (seed, peak, bar)
    # Too few programs for any draw to overflow (the short form): consecutive seeds.
    small = vllm_real.draw_seeds(scenario, 7, 3, count=1)
    assert small == [7, 8, 9]


def test_the_simulator_is_summarised_over_the_repeats_draws_as_the_runs_are() -> None:
    def figures(steps: float, prefill: float) -> dict[str, Any]:
        return {
            "steps_per_min": steps,
            "preemptions": 2,
            "makespan_s": None,
            "engine_seconds": {"prefill": prefill, "decode": 1.0},
        }

    by_draw = {
        0: {"direct": figures(100.0, 0.5)},
        2: {"direct": figures(120.0, 0.7)},
        3: {"direct": figures(90.0, 0.6)},
    }
    summary = vllm_real.over_repeats(by_draw, [0, 2, 3])["direct"]
    assert summary["steps_per_min"] == 100.0 and summary["preemptions"] == 2
    assert summary["engine_seconds"] == {"prefill": 0.6, "decode": 1.0}
    assert summary["makespan_s"] is None
    # One draw replayed every repeat (a file from before the draws): its figures as they are.
    assert (
        vllm_real.over_repeats(by_draw, [2, 2, 2])["direct"]
        == vllm_real.simulated_figures(by_draw[2])["direct"]
    )


def test_a_target_reads_the_tables_ratio_and_interval_not_the_runs_spread() -> None:
    # Four runs of 0.90-1.01x plain vLLM: their spread holds 1.0, the interval does not.
    runs = _runs(
        {
            "direct": [100.0, 100.0, 100.0, 100.0],
            "thunder-mw": [90.0, 91.0, 92.0, 101.0],
            "smg/cache_aware": [99.0, 99.0, 99.0, 99.0],
        }
    )
    target = vllm_real.regime_targets("cheap", runs)[0]
    compared = vllm_real.paired_ratios(runs)["thunder-mw/direct"]["steps_per_min_ratio"]
    assert target["value"] == compared["ratio"] and target["ci95"] == compared["ci95"]
    assert target["verdict"] == compared["verdict"]
    assert target["value"] < 1.0 and target["met"] is False
    assert compared["verdict"] == "loss" and target["tie"] is False
