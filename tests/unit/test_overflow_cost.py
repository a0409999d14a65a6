"""Cost-aware overflow (policies/overflow_cost.py) and the host KV tier, with the clock injected."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from thunder_mw.policies import BackendChanged, CallFinished, HostTierDeclared, RequestArrived
from thunder_mw.policies.core import (
    BackendMetrics,
    Forward,
    Hold,
    RequestInfo,
    Resumed,
    SchedulerCore,
)
from thunder_mw.policies.overflow_cost import (
    FIT_MIN_WEIGHT,
    EngineCosts,
    OverflowView,
    admit_past_capacity,
    allowance,
    budget,
    duty,
)
from thunder_mw.policies.pipeline import PipelineError, build_pipeline
from thunder_mw.policies.program_table import Usage
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention

CHARS_PER_TOKEN = 4


def ctx(pid: str) -> AgentContext:
    return AgentContext(program_id=pid, source=Convention.THUNDERAGENT)


def info(tokens: int, out: int = 10) -> RequestInfo:
    return RequestInfo(prompt_chars=(tokens - 1) * CHARS_PER_TOKEN, max_tokens=out)


def make(
    overflow: str = "cost_aware",
    capacity: int = 1000,
    max_overflow: float = 0.5,
    recompute_overflow: bool = True,
) -> SchedulerCore:
    stages = build_pipeline(
        [
            {
                "admission": {
                    "high_watermark": 1.0,
                    "low_watermark": 0.8,
                    "buffer_tokens_per_program": 0,
                    "overflow": overflow,
                    "max_overflow": max_overflow,
                    "recompute_overflow": recompute_overflow,
                    # The overflow rule alone: an idle engine holds too (test_idle_engine.py).
                    "fill_idle_engine": False,
                }
            },
            # Idle programs counted whole, whatever recompute costs: the overflow rule alone
            # (the min-waste idle fate would let them go where it is cheap: test_idle_fate).
            {
                "state_aware_pause": {
                    "acting_token_weight": 1.0,
                    "idle_fate": "weight",
                    "yield_idle_after_s": None,
                }
            },
            {"migration": {}},
        ]
    )
    return SchedulerCore([("b0", capacity)], stages, chars_per_token=CHARS_PER_TOKEN)


def teach(core: SchedulerCore, s_per_token: float, hold_s: float) -> None:
    """What the engine's counters and the queue would have taught it."""
    costs = core.stages[0].costs.setdefault("b0", EngineCosts())  # type: ignore[attr-defined]
    costs.prefill_s_per_token = s_per_token
    costs.hold_s = hold_s
    costs.call_s = 1.0  # with the 2 s default tool time: a third of each cycle in a call


def fill(core: SchedulerCore, now: float = 0.0) -> None:
    """Two programs that ran one call each and now run their tools: 800 of 1000 reserved."""
    for pid in ("a", "b"):
        decision = core.handle(RequestArrived(ctx(pid), info(390), now)).decision
        assert isinstance(decision, Forward)
        core.handle(CallFinished(pid, Usage(390, 10, 0), True, now + 0.5))


# ------------------------------------------------------------------ the estimators
def test_call_timings_teach_the_per_token_prefill_and_the_decode_step() -> None:
    costs = EngineCosts()
    # 11 output tokens in 1.0 s after a first token at 0.5 s: 0.05 s per decode step.
    costs.observe_call(2000, 0, 11, ttft_s=0.5, duration_s=1.0)
    assert costs.decode_step_s == pytest.approx(0.05)
    # The first token's step also decoded the batch: (0.5 - 0.05) / 2000 uncached tokens.
    assert costs.prefill_s_per_token == pytest.approx(0.45 / 2000)
    # Only uncached tokens were computed: 1000 of 3000 cost 0.25 s.
    before = costs.prefill_s_per_token
    assert before is not None
    costs.observe_call(3000, 2000, 11, ttft_s=0.3, duration_s=0.8)
    assert costs.prefill_s_per_token is not None
    assert costs.prefill_s_per_token > before


def test_short_prefills_and_unstreamed_calls_teach_nothing_about_prefill() -> None:
    costs = EngineCosts()
    costs.observe_call(100, 0, 1, ttft_s=0.5, duration_s=0.5)  # too few tokens computed
    costs.observe_call(5000, 0, 50, ttft_s=None, duration_s=3.0)  # first byte is the last
    costs.observe_call(5000, 0, 50, ttft_s=2.0, duration_s=1.0)  # inconsistent timing
    assert costs.prefill_s_per_token is None and costs.samples == 0


def test_engine_counters_win_over_call_timings_and_survive_a_restart() -> None:
    costs = EngineCosts()
    costs.observe_counters(10.0, 100_000.0, 50.0, 1000.0)  # baseline only
    assert costs.prefill_s_per_token is None
    costs.observe_counters(12.0, 110_000.0, 55.0, 1100.0)
    assert costs.prefill_s_per_token == pytest.approx(2.0 / 10_000)
    assert costs.decode_step_s == pytest.approx(5.0 / 100)
    learned = costs.prefill_s_per_token
    costs.observe_call(4000, 0, 10, ttft_s=40.0, duration_s=41.0)  # ignored now
    assert costs.prefill_s_per_token == learned
    costs.observe_counters(0.1, 1000.0, 0.1, 10.0)  # the engine restarted: re-base, no sample
    assert costs.prefill_s_per_token == learned


class _Engine:
    """A chunked-prefill engine in counters: each step costs t0 + p x its prefill tokens, and
    every request's prefill time counts each step its chunks ran in (vLLM's histograms)."""

    def __init__(self, t0: float, p: float) -> None:
        self.t0, self.p = t0, p
        self.prefill_s = self.prefill_tokens = self.decode_s = self.decode_tokens = 0.0
        self.steps = self.itl_s = self.itl_n = self.computed = 0.0

    def interval(self, costs: EngineCosts, prefill_per_step: float, batch: int = 20) -> None:
        for _ in range(50):  # steps
            step = self.t0 + self.p * prefill_per_step
            self.steps += 1
            self.computed += prefill_per_step
            self.itl_s += step * batch
            self.itl_n += batch
            # Two requests share each step's prefill budget: each is charged the whole step.
            self.prefill_s += 2 * step
            self.prefill_tokens += prefill_per_step
        costs.observe_counters(
            self.prefill_s,
            self.prefill_tokens,
            self.itl_s,
            self.itl_n,
            self.steps,
            self.itl_s,
            self.itl_n,
            self.computed,
        )


def test_the_prefill_price_is_the_slope_of_step_time_on_prefill_load() -> None:
    # Per-request prefill seconds over tokens charge a shared step to each request in it and
    # the batch's decoding to the prefill: here 2 x (t0 / x + p), far above p. The slope of
    # the mean step time on prompt tokens per step is p itself.
    engine, costs = _Engine(t0=0.02, p=4e-5), EngineCosts()
    loads = [300.0, 800.0, 150.0, 1200.0, 500.0, 950.0] * 3
    engine.interval(costs, loads[0])  # the first scrape only sets the base
    prices = []
    for load in loads[1:]:
        engine.interval(costs, load)
        prices.append(costs.prefill_s_per_token)
    ready = next(i for i, p in enumerate(prices) if p == pytest.approx(engine.p, rel=1e-6))
    # Until the intervals weigh FIT_MIN_WEIGHT (decayed), the per-request ratio, ~2x p.
    assert FIT_MIN_WEIGHT <= ready + 1 <= FIT_MIN_WEIGHT + 2
    assert all(p is not None and p > 2 * engine.p for p in prices[:ready])
    assert prices[ready:] == pytest.approx([engine.p] * len(prices[ready:]), rel=1e-6)


def test_a_prefill_load_that_never_varies_leaves_the_per_request_ratio() -> None:
    engine, costs = _Engine(t0=0.02, p=4e-5), EngineCosts()
    for _ in range(20):
        engine.interval(costs, 500.0)  # every interval alike: no slope to read
    ratio = 2 * (engine.t0 + engine.p * 500.0) / 500.0
    assert costs.prefill_s_per_token == pytest.approx(ratio)


def test_the_regression_needs_the_step_counters_and_survives_a_restart() -> None:
    engine, costs = _Engine(t0=0.02, p=4e-5), EngineCosts()
    for load in [300.0, 800.0, 150.0, 1200.0, 500.0, 950.0] * 2:
        engine.interval(costs, load)
    learned = costs.prefill_s_per_token
    assert learned == pytest.approx(engine.p)
    # The engine restarted: every counter back near zero re-bases, and teaches nothing.
    costs.observe_counters(0.1, 300.0, 0.1, 20.0, 1.0, 0.1, 20.0, 300.0)
    assert costs.prefill_s_per_token == learned
    # An engine without the step counters (SGLang; older vLLM) keeps the ratio.
    ratio_only = EngineCosts()
    ratio_only.observe_counters(10.0, 100_000.0, 50.0, 1000.0, None, None, None, None)
    ratio_only.observe_counters(12.0, 110_000.0, 55.0, 1100.0, None, None, None, None)
    assert ratio_only.prefill_s_per_token == pytest.approx(2.0 / 10_000)


def test_only_real_holds_teach_the_hold_time() -> None:
    costs = EngineCosts()
    costs.observe_hold(0.0)  # placed in the event it arrived
    assert costs.hold_s is None
    costs.observe_hold(30.0)
    assert costs.hold_s == 30.0


# ------------------------------------------------------------------ the rule
VIEW = OverflowView(
    capacity=1000, reserved=900, running=0, batch=10, host_tokens=0, max_overflow=0.5, duty=0.1
)


def test_cheap_recompute_admits_past_capacity_and_dear_recompute_holds() -> None:
    # Its 400 tokens recomputed, stalling 10 sequences, vs a 10 s budget.
    cheap = EngineCosts(prefill_s_per_token=1e-4)  # 400 * 1e-4 * 10 = 0.4 s < 10 s
    dear = EngineCosts(prefill_s_per_token=1e-2)  # 40 s > 10 s
    assert admit_past_capacity(cheap, VIEW, 400, budget_s=10.0)
    assert not admit_past_capacity(dear, VIEW, 400, budget_s=10.0)
    # A short hold tips the same cheap recompute the other way.
    assert not admit_past_capacity(cheap, VIEW, 400, budget_s=0.1)
    # A wider batch pays more for the same tokens.
    wide = replace(VIEW, batch=1000)
    assert not admit_past_capacity(cheap, wide, 400, budget_s=10.0)


def test_running_programs_must_fit_the_gpu_by_themselves() -> None:
    cheap = EngineCosts(prefill_s_per_token=1e-9, host_s_per_token=1e-9)
    busy = replace(VIEW, running=700, host_tokens=5000)
    assert admit_past_capacity(cheap, busy, 300, budget_s=10.0)  # 1000 running: fits
    assert not admit_past_capacity(cheap, busy, 301, budget_s=10.0)  # would be preempted


def test_what_runs_on_average_must_fit_the_gpu() -> None:
    cheap = EngineCosts(prefill_s_per_token=1e-9, host_s_per_token=1e-9)
    tiered = replace(VIEW, host_tokens=5000, duty=1.0)
    # Programs in a call half the time: 2,000 reserved run 1,000 at once on average.
    half = replace(tiered, reserved=1100, duty=0.5)
    assert admit_past_capacity(cheap, half, 900, budget_s=10.0)
    assert not admit_past_capacity(cheap, half, 901, budget_s=10.0)
    assert allowance(cheap, half, 400, budget_s=10.0) == 1000
    # Calls never timed yet: every program is taken to be in a call, nothing overflows.
    assert not admit_past_capacity(cheap, tiered, 101, budget_s=10.0)
    assert duty(EngineCosts(), 5.0) == 1.0
    assert duty(EngineCosts(call_s=5.0), 15.0) == 0.25


def test_nothing_learned_or_past_the_bound_holds() -> None:
    assert not admit_past_capacity(EngineCosts(), VIEW, 400, budget_s=1e9)
    cheap = EngineCosts(prefill_s_per_token=1e-9)
    assert admit_past_capacity(cheap, VIEW, 600, budget_s=10.0)  # 500 over: the bound itself
    assert not admit_past_capacity(cheap, VIEW, 601, budget_s=10.0)
    assert admit_past_capacity(EngineCosts(), VIEW, 100, budget_s=0.0)  # it fits


def test_the_budget_is_the_hold_bounded_by_the_cycle() -> None:
    costs = EngineCosts(call_s=5.0)
    assert budget(costs, expected_tool_s=10.0) == 15.0  # no hold seen: the cycle
    costs.hold_s = 4.0
    assert budget(costs, expected_tool_s=10.0) == 4.0
    costs.hold_s = 400.0  # a long hold: the overflow is recomputed once per cycle
    assert budget(costs, expected_tool_s=10.0) == 15.0


def test_a_host_tier_reloads_cheaply_what_recompute_would_not_pay_for() -> None:
    dear = EngineCosts(prefill_s_per_token=1e-2, host_s_per_token=1e-6)
    tiered = replace(VIEW, host_tokens=2000, max_overflow=0)
    assert admit_past_capacity(dear, tiered, 600, budget_s=10.0)  # 500 over, in the tier
    full = replace(tiered, reserved=2900)
    assert not admit_past_capacity(dear, full, 200, budget_s=10.0)  # past the whole pool
    assert allowance(dear, tiered, 400, budget_s=10.0) == 2000
    assert allowance(dear, VIEW, 400, budget_s=10.0) == 0
    assert allowance(EngineCosts(prefill_s_per_token=1e-6), VIEW, 400, budget_s=10.0) == 500


# ------------------------------------------------------------------ in the core
def test_hold_mode_holds_what_does_not_fit_whatever_it_costs() -> None:
    core = make("hold")
    teach(core, 1e-9, 1e6)
    fill(core)
    decision = core.handle(RequestArrived(ctx("c"), info(390), 1.0)).decision
    assert isinstance(decision, Hold)


def test_cost_aware_admits_past_capacity_where_recompute_is_cheap() -> None:
    core = make()
    teach(core, 1e-6, 60.0)
    fill(core)
    decision = core.handle(RequestArrived(ctx("c"), info(390), 1.0)).decision
    assert isinstance(decision, Forward)  # 1200 of 1000 reserved
    assert core.backends["b0"].reserved == 1200
    # The pause stage leaves what the rule admitted running: nothing was paused.
    assert core.counters["pauses"] == 0 and core.counters["pauses_marked"] == 0


@pytest.mark.parametrize("tier", [0, 2000])
def test_without_recompute_overflow_only_a_tier_takes_what_does_not_fit(tier: int) -> None:
    # Recompute is cheap (the rule would admit past capacity), but `recompute_overflow` is
    # off: without a host tier the third program waits; with one it runs, as by default.
    core = make(recompute_overflow=False)
    teach(core, 1e-6, 60.0)
    if tier:
        core.handle(HostTierDeclared("b0", tier, load_tokens_per_s=1e6))
    fill(core)
    decision = core.handle(RequestArrived(ctx("c"), info(390), 1.0)).decision
    assert isinstance(decision, Forward if tier else Hold)


def test_cost_aware_holds_where_recompute_is_dear() -> None:
    core = make()
    teach(core, 1.0, 60.0)  # 400 tokens x 2 sequences x 1 s >> 60 s
    fill(core)
    decision = core.handle(RequestArrived(ctx("c"), info(390), 1.0)).decision
    assert isinstance(decision, Hold)


def test_cost_aware_learns_from_the_calls_and_the_queue_with_the_clock_injected() -> None:
    core = make()
    fill(core, 0.0)
    # Nothing learned yet: the third program is held.
    decision = core.handle(RequestArrived(ctx("c"), info(390), 1.0)).decision
    assert isinstance(decision, Hold)
    # Program a's next call ends at t=5 after a 0.4 s first token over 390 uncached tokens.
    decision = core.handle(RequestArrived(ctx("a"), info(400), 2.0)).decision
    assert isinstance(decision, Forward)
    actions = core.handle(
        CallFinished("a", Usage(400, 10, 0, ttft_s=0.4, duration_s=0.49), True, 5.0)
    ).actions
    costs = core.stages[0].costs["b0"]  # type: ignore[attr-defined]
    assert costs.prefill_s_per_token == pytest.approx((0.4 - 0.01) / 400)
    assert costs.call_s == pytest.approx(0.49)
    # Recomputing c's 400 tokens (0.39 s x 2 programs) costs less than its cycle (the 2 s
    # default tool time + 0.49 s): c, queued at t=1, runs now past capacity, held 4 s.
    assert any(isinstance(a, Resumed) and a.program_id == "c" for a in actions)
    assert core.backends["b0"].reserved == 1210
    assert costs.hold_s == pytest.approx(4.0)


def test_running_programs_are_never_admitted_past_the_gpu() -> None:
    core = make()
    teach(core, 1e-9, 60.0)
    for pid in ("a", "b"):  # both still reasoning: 800 running
        core.handle(RequestArrived(ctx(pid), info(390), 0.0))
    decision = core.handle(RequestArrived(ctx("c"), info(390), 1.0)).decision
    assert isinstance(decision, Hold)


def test_declared_host_tier_lets_programs_spill_instead_of_waiting() -> None:
    core = make(max_overflow=0.0)
    teach(core, 1.0, 60.0)  # recompute is dear: without the tier it holds
    core.handle(HostTierDeclared("b0", 2000, load_tokens_per_s=1e6))
    fill(core)
    decision = core.handle(RequestArrived(ctx("c"), info(390), 1.0)).decision
    assert isinstance(decision, Forward)
    with pytest.raises(ValueError, match="unknown backend"):
        core.handle(HostTierDeclared("nope", 10))
    with pytest.raises(ValueError, match="positive load speed"):
        core.handle(HostTierDeclared("b0", 10, 0.0))


def test_an_engine_reported_host_tier_counts_too() -> None:
    core = make(max_overflow=0.0)
    teach(core, 1.0, 60.0)
    core.handle(HostTierDeclared("b0", 0, load_tokens_per_s=1e6))
    core.handle(BackendChanged("b0", metrics=BackendMetrics(host_kv_tokens=2000.0), now=0.0))
    fill(core)
    decision = core.handle(RequestArrived(ctx("c"), info(390), 1.0)).decision
    assert isinstance(decision, Forward)


def test_the_overflow_mode_is_validated() -> None:
    with pytest.raises(PipelineError, match=r"admission\.overflow"):
        build_pipeline([{"admission": {"overflow": "maybe"}}])


# ------------------------------------------------------------------ the live feed
def test_vllm_metrics_feed_the_cost_counters() -> None:
    from pathlib import Path

    from thunder_mw.engines.pool import parse_signals

    text = (Path(__file__).parents[1] / "sim" / "vllm_0.32_metrics.txt").read_bytes()
    m = parse_signals("vllm", text)
    assert m.prefill_seconds_total == pytest.approx(0.01650172000006478)
    assert m.prefill_tokens_total == 6.0
    assert m.decode_seconds_total == pytest.approx(0.01940876499998012)
    assert m.decode_tokens_total == 3.0
    # The regression's: steps (iteration_tokens_total's count) and inter-token latencies.
    assert m.steps_total == 3.0
    assert m.inter_tokens_total == 2.0
    assert m.inter_token_seconds_total == pytest.approx(0.01940876499998012)


def test_sglang_hicache_reports_its_host_tier() -> None:
    from thunder_mw.engines.pool import parse_signals

    text = b'sglang:hicache_host_total_tokens{model_name="m"} 500000.0\n'
    assert parse_signals("sglang", text).host_kv_tokens == 500000.0


def test_a_backends_host_tier_comes_from_its_config_its_sim_engine_or_its_plan() -> None:
    from thunder_mw.engines.pool import Backend
    from thunder_mw.schemas.config import BackendSettings

    def tier(**kw: Any) -> tuple[int, float | None]:
        return Backend(BackendSettings.model_validate(kw), "http://e", "e").host_tier

    assert tier(url="http://e") == (0, None)
    assert tier(url="http://e", host_kv_tokens=9000, host_kv_load_tokens_per_s=5e5) == (9000, 5e5)
    assert tier(type="sim", sim={"host_kv_tokens": 4000, "host_kv_load_tokens_per_s": 1e6}) == (
        4000,
        1e6,
    )
    plan = {"kv_space_gib": 1.0, "layers": 2, "kv_heads": 2, "head_dim": 64, "offload_tokens": 7}
    assert tier(url="http://e", plan=plan) == (7, None)


def test_the_gateway_times_streamed_calls_only_to_their_first_token() -> None:
    import time

    from thunder_mw.middleware.call_state import CallState, RequestBody
    from thunder_mw.middleware.live_scheduler import timed_usage

    call = CallState()
    assert timed_usage(call, Usage(10, 2, 0)) == Usage(10, 2, 0)  # never forwarded: untimed
    call.forwarded_at = time.perf_counter() - 2.0
    call.first_body_at = call.forwarded_at + 0.5
    unstreamed = timed_usage(call, Usage(10, 2, 0))
    assert unstreamed is not None and unstreamed.ttft_s is None
    assert unstreamed.duration_s is not None and unstreamed.duration_s >= 2.0
    call.body = RequestBody({"stream": True}, b"{}")
    streamed = timed_usage(call, Usage(10, 2, 0))
    assert streamed is not None and streamed.ttft_s == pytest.approx(0.5)
    assert timed_usage(call, None) is None
