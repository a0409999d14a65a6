"""Admission that prices an overflow the host KV tier holds at its reload alone (admission
`tier_reload`, policies/overflow_cost.py `tier_pays`), with the clock injected."""

from __future__ import annotations

from dataclasses import replace

from thunder_mw.policies import CallFinished, HostTierDeclared, RequestArrived
from thunder_mw.policies.core import Forward, Hold, RequestInfo, SchedulerCore
from thunder_mw.policies.overflow_cost import (
    EngineCosts,
    OverflowView,
    admit_past_capacity,
    allowance,
    tier_pays,
)
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.program_table import Usage
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention
from thunder_mw.schemas.stage_params import AdmissionParams

CHARS_PER_TOKEN = 4
# Every call in the engine: 1,000 running of 1,000, a 5,000-token tier behind it.
BUSY = OverflowView(
    capacity=1000,
    reserved=1000,
    running=1000,
    batch=10,
    host_tokens=5000,
    max_overflow=0.25,
    duty=1.0,
)
CHEAP_RELOAD = EngineCosts(prefill_s_per_token=1e-2, host_s_per_token=1e-5)


def test_off_by_default_the_gpu_caps_what_runs() -> None:
    assert AdmissionParams().tier_reload is False
    assert not admit_past_capacity(CHEAP_RELOAD, BUSY, 400, budget_s=10.0)
    assert allowance(CHEAP_RELOAD, BUSY, 400, budget_s=10.0) == 0  # duty 1: no room


# The same engine with the tier's rule on: its programs' whole contexts, 1,000 tokens, fit
# the GPU (1,000) and the tier (5,000) together with room for 5,000 more.
TIERED = replace(BUSY, tier_reload=True, contexts=1000, tier_tokens=5000)


def test_a_tier_that_holds_the_overflow_costs_only_its_reload() -> None:
    tiered = TIERED
    # 400 tokens reloaded, stalling 10 sequences: 0.04 s against a 10 s hold.
    assert tier_pays(CHEAP_RELOAD, tiered, 400, budget_s=10.0)
    assert admit_past_capacity(CHEAP_RELOAD, tiered, 400, budget_s=10.0)
    assert allowance(CHEAP_RELOAD, tiered, 400, budget_s=10.0) == 5000
    # A reload dearer than the hold it spares: held, as the rule of the cost-aware mode.
    slow = EngineCosts(prefill_s_per_token=1e-2, host_s_per_token=1e-2)
    assert not admit_past_capacity(slow, tiered, 400, budget_s=10.0)
    assert not admit_past_capacity(CHEAP_RELOAD, tiered, 400, budget_s=0.01)


def test_past_the_tier_or_without_its_price_the_gpu_rules_again() -> None:
    tiered = TIERED
    full = replace(tiered, contexts=5900)  # 5,900 + 200 > 1,000 on the GPU + 5,000 in the tier
    assert not admit_past_capacity(CHEAP_RELOAD, full, 200, budget_s=10.0)
    unpriced = EngineCosts(prefill_s_per_token=1e-2)  # no load speed known
    assert not admit_past_capacity(unpriced, tiered, 400, budget_s=10.0)
    untiered = replace(tiered, host_tokens=0, tier_tokens=0)
    assert not admit_past_capacity(CHEAP_RELOAD, untiered, 400, budget_s=10.0)


def test_contexts_that_fell_to_the_tier_fill_it_though_they_reserve_nothing() -> None:
    # Idle programs whose reservations count none of their contexts (min-waste let them
    # fall to the tier): reservations say 1,000 of 1,000, but 5,900 tokens of context are
    # placed, so the tier has no room for 200 more and what falls to it pushes out another
    # context, a recompute: the GPU rules decide (every call in the engine: no room).
    filled = replace(TIERED, contexts=5900)
    assert not admit_past_capacity(CHEAP_RELOAD, filled, 200, budget_s=10.0)
    assert admit_past_capacity(CHEAP_RELOAD, replace(filled, contexts=5800), 200, budget_s=10.0)
    # Pausing waits past the limit by the whole tier only while what is placed fits it.
    assert allowance(CHEAP_RELOAD, filled, 200, budget_s=10.0) == 5000
    assert allowance(CHEAP_RELOAD, replace(filled, contexts=6100), 200, budget_s=10.0) == 0


def ctx(pid: str) -> AgentContext:
    return AgentContext(program_id=pid, source=Convention.THUNDERAGENT)


def info(tokens: int) -> RequestInfo:
    return RequestInfo(prompt_chars=(tokens - 1) * CHARS_PER_TOKEN, max_tokens=10)


def make(tier_reload: bool) -> SchedulerCore:
    stages = build_pipeline(
        [
            {
                "admission": {
                    "high_watermark": 1.0,
                    "low_watermark": 0.8,
                    "buffer_tokens_per_program": 0,
                    "overflow": "cost_aware",
                    "max_overflow": 0.0,
                    "tier_reload": tier_reload,
                }
            },
            {"state_aware_pause": {"acting_token_weight": 1.0, "yield_idle_after_s": None}},
            {"migration": {}},
        ]
    )
    core = SchedulerCore([("b0", 1000)], stages, chars_per_token=CHARS_PER_TOKEN)
    costs = core.stages[0].costs.setdefault("b0", EngineCosts())  # type: ignore[attr-defined]
    costs.prefill_s_per_token = 1.0  # recompute is dear: only the tier may take the overflow
    costs.hold_s = 60.0
    costs.call_s = 1.0
    core.handle(HostTierDeclared("b0", 5000, load_tokens_per_s=1e6))
    return core


def test_in_the_core_calls_in_flight_spill_to_the_tier_only_when_asked() -> None:
    for tier_reload, expected in ((False, Hold), (True, Forward)):
        core = make(tier_reload)
        for pid in ("a", "b"):  # both still reasoning: 800 running, at t = 0
            decision = core.handle(RequestArrived(ctx(pid), info(390), 0.0)).decision
            assert isinstance(decision, Forward)
        decision = core.handle(RequestArrived(ctx("c"), info(390), 1.0)).decision
        assert isinstance(decision, expected), tier_reload
        if tier_reload:
            core.handle(CallFinished("c", Usage(390, 10, 0), True, 1.5))
