"""The real-engine benchmark's tool times follow the engine measured at start: the wave's tool
seconds are the regime's multiple of its calls' engine seconds alone, so a machine twice as fast
runs the same regime with tools half as long (on 2026-12-07 a faster machine with the preset's
fixed times left the engine idle enough that saving its time moved nothing)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from thunder_mw.benchmarks import vllm_real
from thunder_mw.benchmarks.scenarios import SCENARIOS
from thunder_mw.benchmarks.workloads import Call, ProgramSpec
from thunder_mw.sim.cost_model import StepCost, get_profile

# Each term on its own scale, so a wrong count of any of them shows.
COST = StepCost(a=1.0, b=1e-3, c=1e-2, d=1e-5, e=1e-7, f=100.0)


def test_a_calls_time_alone_is_its_new_tokens_prefill_and_its_decode_steps() -> None:
    program = ProgramSpec(
        "p",
        "swe",
        system_tokens=100,
        calls=(Call(growth_tokens=3000, output_tokens=3), Call(growth_tokens=50, output_tokens=2)),
    )
    # Call 0: 3,100 tokens of prompt, 100 of them before its new ones; 2,048 then 952 (the
    # engine's chunk), the first step taking the request in; then 2 decode steps past the first
    # token at 3,100 and 3,101 tokens of context.
    first = (
        COST.step_seconds(2048, 0, 0, 2048 * 100 + 2048 * 2049 // 2, admitted=1)
        + COST.step_seconds(952, 0, 0, 952 * 2148 + 952 * 953 // 2)
        + COST.step_seconds(0, 1, 3100)
        + COST.step_seconds(0, 1, 3101)
    )
    # Call 1: its prompt is the last one, its answer (3 tokens) and 50 new tokens; the answer
    # is in the cache (3,103 tokens), the 50 are not; one decode step at 3,153.
    second = COST.step_seconds(50, 0, 0, 50 * 3103 + 50 * 51 // 2, admitted=1)
    second += COST.step_seconds(0, 1, 3153)
    assert vllm_real.alone_seconds([program], COST) == pytest.approx(first + second)


def test_the_tools_take_the_regimes_multiple_of_the_engines_time_at_any_speed() -> None:
    scenario = SCENARIOS["vllm-cpu-real"]
    draws = vllm_real.regime_draws(scenario, [0, 2, 3])
    regime = vllm_real.REGIMES["dear"]
    profile = get_profile(regime.profile)
    twice = replace(profile, a=2 * profile.a, b=2 * profile.b, c=2 * profile.c)
    twice = replace(twice, d=2 * profile.d, e=2 * profile.e, f=2 * profile.f)
    fast, slow = (vllm_real.regime_tool_scale(regime, draws, c) for c in (profile, twice))
    assert slow["scale"] == pytest.approx(2 * fast["scale"])
    for figures, cost in ((fast, profile), (slow, twice)):
        scaled = vllm_real.regime_draws(scenario, [0, 2, 3], tool_scale=figures["scale"])
        tools = sum(c.tool_s for w in scaled.values() for p in w for c in p.calls)
        engine = sum(vllm_real.alone_seconds(w, cost) for w in scaled.values())
        assert tools / engine == pytest.approx(regime.tools_per_engine_second)
        assert figures["engine_alone_s"] == pytest.approx(engine, abs=1e-4)
    # The same tokens at either speed: only the tools differ.
    at = vllm_real.regime_draws(scenario, [0], tool_scale=fast["scale"])[0]
    assert [p.context_tokens() for p in at] == [p.context_tokens() for p in draws[0]]


def test_a_wave_without_tools_has_nothing_to_scale() -> None:
    program = ProgramSpec("p", "swe", 10, calls=(Call(growth_tokens=5, output_tokens=2),))
    with pytest.raises(ValueError, match="tool time"):
        vllm_real.regime_tool_scale(vllm_real.REGIMES["cheap"], {0: [program]}, COST)
