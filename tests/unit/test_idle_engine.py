"""An engine with no call in flight admits the queue's head past the watermark (admission
`fill_idle_engine`, policies/admission.py), with the clock injected."""

from __future__ import annotations

from thunder_mw.policies import CallFinished, RequestArrived
from thunder_mw.policies.core import Forward, Hold, RequestInfo, Resumed, SchedulerCore
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.program_table import Usage
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention
from thunder_mw.schemas.stage_params import AdmissionParams

CHARS_PER_TOKEN = 4


def ctx(pid: str) -> AgentContext:
    return AgentContext(program_id=pid, source=Convention.THUNDERAGENT)


def info(tokens: int) -> RequestInfo:
    return RequestInfo(prompt_chars=(tokens - 1) * CHARS_PER_TOKEN, max_tokens=10)


def make(fill_idle_engine: bool) -> SchedulerCore:
    """One engine of 1,000 tokens that holds what does not fit (no cost-aware overflow), a
    program in a tool reserving its whole context."""
    stages = build_pipeline(
        [
            {
                "admission": {
                    "high_watermark": 1.0,
                    "low_watermark": 0.8,
                    "buffer_tokens_per_program": 0,
                    "overflow": "hold",
                    "fill_idle_engine": fill_idle_engine,
                }
            },
            {"state_aware_pause": {"acting_token_weight": 1.0, "yield_idle_after_s": None}},
            {"migration": {}},
        ]
    )
    return SchedulerCore([("b0", 1000)], stages, chars_per_token=CHARS_PER_TOKEN)


def test_on_by_default() -> None:
    assert AdmissionParams().fill_idle_engine is True


def test_an_engine_whose_programs_all_run_tools_admits_the_head() -> None:
    for fill, expected in ((True, Forward), (False, Hold)):
        core = make(fill)
        assert isinstance(core.handle(RequestArrived(ctx("a"), info(600), 0.0)).decision, Forward)
        core.handle(CallFinished("a", Usage(600, 10, 0), True, 1.0))  # a runs a tool now
        # 610 reserved by a and 610 asked: past 1,000, but nothing is in the engine.
        decision = core.handle(RequestArrived(ctx("b"), info(600), 1.1)).decision
        assert isinstance(decision, expected), fill


def test_a_call_in_flight_keeps_the_watermark() -> None:
    core = make(True)
    assert isinstance(core.handle(RequestArrived(ctx("a"), info(600), 0.0)).decision, Forward)
    # a's call is still in the engine: b waits, as without the rule.
    assert isinstance(core.handle(RequestArrived(ctx("b"), info(600), 0.5)).decision, Hold)


def test_a_held_head_is_resumed_once_the_last_call_ends() -> None:
    core = make(True)
    core.handle(RequestArrived(ctx("a"), info(600), 0.0))
    assert isinstance(core.handle(RequestArrived(ctx("b"), info(600), 0.5)).decision, Hold)
    actions = core.handle(CallFinished("a", Usage(600, 10, 0), True, 1.0)).actions
    assert [a.program_id for a in actions if isinstance(a, Resumed)] == ["b"]


def test_a_head_larger_than_the_limit_still_waits() -> None:
    core = make(True)
    core.handle(RequestArrived(ctx("a"), info(600), 0.0))
    core.handle(CallFinished("a", Usage(600, 10, 0), True, 1.0))
    # Alone it would not fit under the watermark: only an empty engine takes it.
    assert isinstance(core.handle(RequestArrived(ctx("b"), info(1200), 1.1)).decision, Hold)
