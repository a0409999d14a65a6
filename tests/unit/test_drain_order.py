"""The drain's fixed orders (state_aware_pause `fcfs` and `new_first`, and `auto` with
`drain_victim` one of them, or null on a fleet with a host KV tier): of the calls in flight
the program that arrived last is marked to pause first, and paused programs resume in
arrival order, however long each has waited, under `new_first` after every program not yet
begun (policies/stages.py), with the clock injected."""

from __future__ import annotations

from typing import Any

from thunder_mw.benchmarks.bench_cli import resolved_rules
from thunder_mw.benchmarks.reuse import RECORDED_RULES, pause_rule
from thunder_mw.benchmarks.scenarios import SCENARIOS
from thunder_mw.policies import (
    BackendChanged,
    CallFinished,
    HostTierDeclared,
    ReleaseRequested,
    RequestArrived,
    Tick,
)
from thunder_mw.policies.core import Forward, Hold, RequestInfo, Resumed, SchedulerCore
from thunder_mw.policies.decisions import Paused
from thunder_mw.policies.events import BackendMetrics
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.program_table import Usage
from thunder_mw.policies.stages import StateAwarePause
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention
from thunder_mw.schemas.stage_params import PauseParams

CHARS_PER_TOKEN = 4


def ctx(pid: str) -> AgentContext:
    return AgentContext(program_id=pid, source=Convention.THUNDERAGENT)


def info(tokens: int) -> RequestInfo:
    return RequestInfo(prompt_chars=(tokens - 1) * CHARS_PER_TOKEN, max_tokens=10)


def make(**pause: Any) -> tuple[SchedulerCore, StateAwarePause]:
    """One engine of 1,000 tokens that holds what does not fit, a program in a tool
    reserving its whole context, no yield to the queue."""
    stages = build_pipeline(
        [
            {
                "admission": {
                    "high_watermark": 1.0,
                    "low_watermark": 1.0,
                    "buffer_tokens_per_program": 0,
                    "overflow": "hold",
                    "fill_idle_engine": False,
                }
            },
            {
                "state_aware_pause": {
                    "acting_token_weight": 1.0,
                    "idle_fate": "weight",
                    "yield_idle_after_s": None,
                    **pause,
                }
            },
            {"migration": {}},
        ]
    )
    pause_stage = next(s for s in stages if isinstance(s, StateAwarePause))
    return SchedulerCore([("b0", 1000)], stages, chars_per_token=CHARS_PER_TOKEN), pause_stage


def paused(actions: Any) -> list[str]:
    return [a.program_id for a in actions if isinstance(a, Paused)]


def resumed(actions: Any) -> list[str]:
    return [a.program_id for a in actions if isinstance(a, Resumed)]


def in_tools(core: SchedulerCore, ends: str) -> None:
    """a, b and c arrive in that order (300 tokens each); their calls end in the order
    `ends` (one a second from t=3), and each runs a tool."""
    for i, pid in enumerate("abc"):
        core.handle(RequestArrived(ctx(pid), info(290), float(i)))
    for i, pid in enumerate(ends):
        core.handle(CallFinished(pid, Usage(290, 10, 0), True, 3.0 + i))


def test_of_the_calls_in_flight_the_one_that_arrived_last_is_marked_first() -> None:
    # a, b and c arrive in that order (300 tokens each) and stay in their calls; a answers
    # and asks again with 500: 1,100 reserved, no program in a tool, so one call is marked to
    # pause when it ends. cost_benefit marks the largest (a); fcfs the last to arrive (c).
    for victim, expected in (("cost_benefit", ["a"]), ("fcfs", ["c"])):
        core, _ = make(victim=victim)
        for i, pid in enumerate("abc"):
            decision = core.handle(RequestArrived(ctx(pid), info(290), float(i))).decision
            assert isinstance(decision, Forward)
        core.handle(CallFinished("a", Usage(290, 10, 0), True, 3.0))
        outcome = core.handle(RequestArrived(ctx("a"), info(490), 4.0))
        assert isinstance(outcome.decision, Forward), victim
        assert paused(outcome.actions) == expected, victim


def test_of_the_programs_in_tools_the_longest_tool_goes_first() -> None:
    # In a tool a program's KV idles: fcfs pauses by the tool, as cost_benefit does (b's
    # tool began last, so it is expected to run longest), not by arrival (c).
    for victim in ("cost_benefit", "fcfs"):
        core, _ = make(victim=victim)
        in_tools(core, "cab")
        outcome = core.handle(RequestArrived(ctx("a"), info(490), 6.0))
        assert paused(outcome.actions) == ["b"], victim


def test_paused_programs_resume_in_arrival_order_not_by_their_wait() -> None:
    # c is paused first and asks again first; b is paused later. When a ends, the queue's
    # order decides who returns: fcfs takes b (it arrived before c); cost_benefit's order by
    # wait takes c, queued first.
    for victim, first in (("cost_benefit", "c"), ("fcfs", "b")):
        core, _ = make(victim=victim)
        in_tools(core, "acb")
        # a grows to 700: b and c, in their tools, both go (1,300 reserved) in the rule's order.
        out = core.handle(RequestArrived(ctx("a"), info(690), 6.0))
        assert sorted(paused(out.actions)) == ["b", "c"], victim
        # Their next requests wait, c's first.
        assert isinstance(core.handle(RequestArrived(ctx("c"), info(390), 7.0)).decision, Hold)
        assert isinstance(core.handle(RequestArrived(ctx("b"), info(390), 8.0)).decision, Hold)
        core.handle(CallFinished("a", Usage(690, 10, 0), True, 9.0))
        # a ends: room for both; the queue's order says which goes first.
        out = core.handle(ReleaseRequested("a", "release", 10.0))
        assert resumed(out.actions)[:1] == [first], victim


def test_new_first_resumes_a_program_not_yet_begun_before_paused_ones() -> None:
    # a, b and c run tools; n arrives and waits (no room). a grows to 800: b and c pause,
    # n still does not fit, and b's and c's next requests wait behind it. When a ends,
    # fcfs resumes by arrival (b, before n); new_first resumes n, whose every call is still
    # ahead, before both.
    for victim, first in (("fcfs", "b"), ("new_first", "n")):
        core, _ = make(victim=victim)
        in_tools(core, "abc")
        held = core.handle(RequestArrived(ctx("n"), info(290), 6.0)).decision
        assert isinstance(held, Hold), victim
        out = core.handle(RequestArrived(ctx("a"), info(790), 7.0))
        assert sorted(paused(out.actions)) == ["b", "c"], victim
        assert not resumed(out.actions), victim
        for t, pid in ((8.0, "c"), (9.0, "b")):
            assert isinstance(core.handle(RequestArrived(ctx(pid), info(390), t)).decision, Hold)
        core.handle(CallFinished("a", Usage(790, 10, 0), True, 10.0))
        out = core.handle(ReleaseRequested("a", "release", 11.0))
        assert resumed(out.actions)[:1] == [first], victim


def test_new_first_marks_calls_in_flight_as_fcfs_does() -> None:
    # Of the calls in flight the last arrival's is marked (c), as under fcfs.
    core, _ = make(victim="new_first")
    for i, pid in enumerate("abc"):
        assert isinstance(
            core.handle(RequestArrived(ctx(pid), info(290), float(i))).decision, Forward
        )
    core.handle(CallFinished("a", Usage(290, 10, 0), True, 3.0))
    outcome = core.handle(RequestArrived(ctx("a"), info(490), 4.0))
    assert paused(outcome.actions) == ["c"]


def test_auto_drains_in_arrival_order_once_arrivals_stop() -> None:
    core, stage = make(victim="auto", drain_victim="fcfs")
    # A batch's first requests are not a stream: the drain's rule from the start.
    in_tools(core, "cab")
    assert stage.rule() == "fcfs"
    core.handle(RequestArrived(ctx("a"), info(290), 6.0))
    core.handle(CallFinished("a", Usage(290, 10, 0), True, 7.0))
    core.handle(ReleaseRequested("a", "release", 8.0))  # a program ended: arrivals now count
    for t in (9.0, 10.0, 11.0):  # new programs once a second: a stream
        core.handle(RequestArrived(ctx(f"n{t:.0f}"), info(90), t))
    assert stage.rule() == "shortest_first"
    # Nothing new for far more than the stream's patience: the drain again.
    core.handle(CallFinished("n9", Usage(90, 10, 0), True, 60.0))
    assert stage.rule() == "fcfs"


def test_the_default_drains_by_the_host_tier() -> None:
    # drain_victim null: fcfs where a backend has a host KV tier, cost_benefit elsewhere; a
    # tier the config declares after the core is built is read at the first request.
    for tokens, drain in ((0, "cost_benefit"), (4000, "fcfs")):
        core, stage = make(victim="auto")
        if tokens:
            core.handle(HostTierDeclared("b0", tokens, 1e6))
        in_tools(core, "cab")
        assert stage.rule() == drain, tokens
    # A tier reported later (a backend change) switches the drain's rule then, and the
    # queue is re-keyed with it.
    core, stage = make(victim="auto")
    in_tools(core, "acb")
    out = core.handle(RequestArrived(ctx("a"), info(690), 6.0))
    assert sorted(paused(out.actions)) == ["b", "c"]
    for t, pid in ((7.0, "c"), (8.0, "b")):  # c queues first
        assert isinstance(core.handle(RequestArrived(ctx(pid), info(390), t)).decision, Hold)
    assert stage.rule() == "cost_benefit"
    core.handle(BackendChanged("b0", 9.0, metrics=BackendMetrics(host_kv_tokens=4000)))
    assert stage.rule() == "fcfs"
    core.handle(CallFinished("a", Usage(690, 10, 0), True, 10.0))
    out = core.handle(ReleaseRequested("a", "release", 11.0))
    assert resumed(out.actions)[:1] == ["b"]  # by arrival, not by wait


def test_recorded_as_it_acts() -> None:
    assert PauseParams().drain_victim is None
    rules = resolved_rules(
        SCENARIOS["swe-agent-knee"],
        [
            "thunder-mw",
            "thunder-mw/host-tier",
            "thunder-mw/drain-fcfs",
            "thunder-mw/drain-new-first",
            "thunderagent",
        ],
    )["pause_victim"]
    assert rules == {
        "thunder-mw": "auto",
        "thunder-mw/host-tier": "auto (drain fcfs)",
        "thunder-mw/drain-fcfs": "auto (drain fcfs)",
        "thunder-mw/drain-new-first": "auto (drain new_first)",
        "thunderagent": "shortest_first",
    }
    # A file written before it recorded the rule reads it from the pipeline it ran.
    legacy = RECORDED_RULES["pause_victim"][2]
    assert legacy({}) == "cost_benefit"
    assert legacy({"victim": "auto", "drain_victim": "fcfs"}) == pause_rule("auto", "fcfs")
    assert pause_rule("fcfs", "cost_benefit") == "fcfs"


def test_programs_are_numbered_in_the_order_they_arrive() -> None:
    core, _ = make()
    for t, pid in enumerate(("x", "y", "z")):
        core.handle(RequestArrived(ctx(pid), info(100), float(t)))
    core.handle(RequestArrived(ctx("x"), info(100), 5.0))  # a later request: same program
    arrivals = {p.program_id: p.arrival for p in core.programs()}
    assert arrivals == {"x": 0, "y": 1, "z": 2}


def test_a_switch_to_the_drain_reorders_the_queue_by_arrival() -> None:
    # While programs stream in, the queue is ordered by wait; once they stop, fcfs re-keys
    # it by arrival: b, which asked again after c, goes first. Under cost_benefit the order
    # by wait stands.
    for drain, first in (("cost_benefit", "c"), ("fcfs", "b")):
        core, stage = make(victim="auto", drain_victim=drain)
        for i, pid in enumerate("abcx"):
            core.handle(RequestArrived(ctx(pid), info(290 if pid != "x" else 90), i * 0.1))
        core.handle(CallFinished("x", Usage(90, 10, 0), True, 1.2))
        core.handle(ReleaseRequested("x", "release", 1.5))  # arrivals count from now
        for t in (2.0, 3.0, 4.0):  # one a second: a stream, each held (no room)
            held = core.handle(RequestArrived(ctx(f"n{t:.0f}"), info(290), t)).decision
            assert isinstance(held, Hold)
        assert stage.rule() == "shortest_first"
        for t, pid in ((5.0, "b"), (5.2, "c"), (5.5, "a")):
            core.handle(CallFinished(pid, Usage(290, 10, 0), True, t))
        out = core.handle(RequestArrived(ctx("a"), info(790), 6.0))  # b and c must go
        assert sorted(paused(out.actions)) == ["b", "c"], drain
        for t, pid in ((7.0, "c"), (8.0, "b")):  # c queues first
            assert isinstance(core.handle(RequestArrived(ctx(pid), info(390), t)).decision, Hold)
        core.handle(Tick(100.0))  # no arrival for far past the stream's patience
        assert stage.rule() == drain
        core.handle(CallFinished("a", Usage(790, 10, 0), True, 101.0))
        out = core.handle(ReleaseRequested("a", "release", 102.0))
        assert resumed(out.actions)[:1] == [first], drain
