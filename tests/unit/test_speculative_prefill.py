"""Speculative prefill: the stage's decisions (pure core, clock injected), the prompt memory and
answer recording of the live side, and the benchmark harness carrying out `Prefill`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from thunder_mw.benchmarks.des import Simulation
from thunder_mw.benchmarks.workloads import Call, ProgramSpec
from thunder_mw.middleware.speculative_prefill import (
    AnswerRecorder,
    PromptMemory,
    Remembered,
    warming_body,
)
from thunder_mw.observability.prefill_metrics import PrefillMetrics
from thunder_mw.policies import (
    BackendDrained,
    BackendView,
    CallFinished,
    Decisions,
    DecisionsApplied,
    Pause,
    ProgramView,
    ReleaseRequested,
    RequestArrived,
    Resume,
    Stage,
    StageDecision,
    StageView,
    Tick,
)
from thunder_mw.policies.core import (
    Action,
    Forward,
    Hold,
    Prefill,
    RequestInfo,
    Resumed,
    SchedulerCore,
)
from thunder_mw.policies.program_table import Program, ProgramState, Usage
from thunder_mw.policies.speculative_prefill import SpeculativePrefill, SpeculativePrefillParams
from thunder_mw.policies.stages import Admission, AdmissionParams, Migration, StateAwarePause
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention

CHARS_PER_TOKEN = 4
HOLD = AdmissionParams(overflow="hold")


class _MoveIdleOnTick(Stage):
    """Another rule resuming paused, idle programs on `target` (as a tiering or cost rule may)."""

    name = "move_idle_on_tick"

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target

    def on_tick(self, view: StageView, now: float) -> Iterator[StageDecision]:
        for program in view.programs():
            if program.state is ProgramState.PAUSED and not program.waiting:
                yield Resume(program, self.target)


def _program(core: SchedulerCore, program_id: str) -> Program:
    """The core's entry for `program_id` (the test fails here if it has none)."""
    program = core.table.get(program_id)
    assert program is not None, program_id
    return program


def make(*stages: Stage, capacities: tuple[int, ...] = (100_000, 100_000)) -> SchedulerCore:
    labels = [(f"b{i}", c) for i, c in enumerate(capacities)]
    core_stages = [Admission(HOLD), StateAwarePause(), Migration(), *stages]
    return SchedulerCore(labels, core_stages, chars_per_token=CHARS_PER_TOKEN)


def ctx(pid: str, **kw: Any) -> AgentContext:
    return AgentContext(program_id=pid, source=Convention.THUNDERAGENT, **kw)


def run_call(
    core: SchedulerCore,
    pid: str,
    tokens: int,
    start: float,
    end: float,
    out: int = 10,
    **kw: Any,
) -> list[Action]:
    info = RequestInfo(prompt_chars=(tokens - 1) * CHARS_PER_TOKEN, max_tokens=out)
    decision = core.handle(RequestArrived(ctx(pid, **kw), info, start)).decision
    assert isinstance(decision, Forward), decision
    return core.handle(CallFinished(pid, Usage(tokens, out), True, end)).actions


def spec(**params: Any) -> SpeculativePrefill:
    return SpeculativePrefill(SpeculativePrefillParams(**{"default": True, **params}))


def prefills(actions: list[Action]) -> list[Prefill]:
    return [a for a in actions if isinstance(a, Prefill)]


# ------------------------------------------------------------------ when the stage warms
def test_a_program_moved_while_its_tool_runs_is_warmed_on_its_new_engine() -> None:
    core = make(spec(min_context_tokens=0, prefetch_before_s=None), _MoveIdleOnTick("b1"))
    run_call(core, "a", 2000, 0.0, 1.0)
    assert _program(core, "a").backend == "b0"
    core.handle(BackendDrained("b0", 2.0))  # its engine leaves: the ACTING program is unplaced
    actions = core.handle(Tick(3.0)).actions
    resumed = [a for a in actions if isinstance(a, Resumed)]
    assert len(resumed) == 1 and resumed[0].migrated and resumed[0].backend == "b1"
    assert prefills(actions) == [Prefill("a", "b1", 2010, "resume")]


def test_a_hint_of_false_turns_warming_off_and_true_turns_it_on_over_the_default() -> None:
    core = make(spec(min_context_tokens=0, prefetch_before_s=None), _MoveIdleOnTick("b1"))
    run_call(core, "off", 2000, 0.0, 1.0, speculative_prefill=False)
    core.handle(BackendDrained("b0", 2.0))
    assert prefills(core.handle(Tick(3.0)).actions) == []

    core = make(
        spec(default=False, min_context_tokens=0, prefetch_before_s=None),
        _MoveIdleOnTick("b2"),
        capacities=(100_000,) * 3,
    )
    run_call(core, "quiet", 2000, 0.0, 1.0)
    run_call(core, "asked", 2000, 0.0, 1.0, speculative_prefill=True)
    core.handle(BackendDrained("b0", 2.0))
    core.handle(BackendDrained("b1", 2.0))
    assert [p.program_id for p in prefills(core.handle(Tick(3.0)).actions)] == ["asked"]


def test_short_contexts_are_not_warmed() -> None:
    core = make(spec(min_context_tokens=5000, prefetch_before_s=None), _MoveIdleOnTick("b1"))
    run_call(core, "a", 2000, 0.0, 1.0)
    core.handle(BackendDrained("b0", 2.0))
    assert prefills(core.handle(Tick(3.0)).actions) == []


def test_a_program_resumed_with_its_request_waiting_is_not_warmed() -> None:
    """Its request goes out at once and prefills its context itself."""
    core = make(spec(min_context_tokens=0, prefetch_before_s=None), capacities=(3000,))
    run_call(core, "a", 2000, 0.0, 1.0)
    info = RequestInfo(prompt_chars=2999 * CHARS_PER_TOKEN, max_tokens=10)
    decision = core.handle(RequestArrived(ctx("big"), info, 1.5)).decision
    assert isinstance(decision, Hold)
    actions = core.handle(ReleaseRequested("a", "release", 2.0)).actions
    assert [a.program_id for a in actions if isinstance(a, Resumed)] == ["big"]
    assert prefills(actions) == []


# ------------------------------------------------------------------ prefetch
def test_a_paused_program_is_resumed_and_warmed_shortly_before_its_tool_should_end() -> None:
    core = make(spec(min_context_tokens=0, prefetch_before_s=1.0))
    # Its tool calls take 10 s: the program's own EMA says so after two calls.
    run_call(core, "a", 1000, 0.0, 1.0)
    run_call(core, "a", 2000, 11.0, 12.0)
    assert core.expected_tool_time(_program(core, "a")) == pytest.approx(10.0)
    core.handle(BackendDrained("b0", 13.0))
    assert _program(core, "a").state is ProgramState.PAUSED
    assert prefills(core.handle(Tick(20.0)).actions) == []  # due at 12 + 10 - 1 = 21
    actions = core.handle(Tick(21.0)).actions
    assert prefills(actions) == [Prefill("a", "b1", 2010, "prefetch")]
    assert _program(core, "a").state is ProgramState.ACTIVE
    assert _program(core, "a").backend == "b1"


def test_a_program_due_while_still_placed_is_prefetched_once_paused_later() -> None:
    # Due at 12 + 10 - 1 = 21 while still placed on b0 (its KV there, nothing to warm); the
    # drain that pauses it comes after that tick, and the next tick must still warm it.
    core = make(spec(min_context_tokens=0, prefetch_before_s=1.0))
    run_call(core, "a", 1000, 0.0, 1.0)
    run_call(core, "a", 2000, 11.0, 12.0)
    assert prefills(core.handle(Tick(21.0)).actions) == []
    assert _program(core, "a").state is ProgramState.ACTIVE
    core.handle(BackendDrained("b0", 21.5))
    assert _program(core, "a").state is ProgramState.PAUSED
    assert prefills(core.handle(Tick(22.0)).actions) == [Prefill("a", "b1", 2010, "prefetch")]
    assert _program(core, "a").backend == "b1"


def test_prefetch_never_takes_room_from_a_queued_request() -> None:
    core = make(spec(min_context_tokens=0, prefetch_before_s=1.0), capacities=(3000, 3000))
    run_call(core, "a", 2000, 0.0, 1.0)
    core.handle(BackendDrained("b0", 1.5))
    # b1 fills up and a request is left waiting for room.
    info = RequestInfo(prompt_chars=2500 * CHARS_PER_TOKEN, max_tokens=10)
    assert isinstance(core.handle(RequestArrived(ctx("hog"), info, 1.6)).decision, Forward)
    assert isinstance(core.handle(RequestArrived(ctx("queued"), info, 1.7)).decision, Hold)
    assert prefills(core.handle(Tick(5.0)).actions) == []
    assert _program(core, "a").state is ProgramState.PAUSED


def test_prefetch_needs_room_for_the_next_request() -> None:
    core = make(spec(min_context_tokens=0, prefetch_before_s=1.0), capacities=(3000, 3000))
    run_call(core, "a", 2000, 0.0, 1.0)
    core.handle(BackendDrained("b0", 1.5))
    run_call(core, "hog", 2500, 1.6, 1.7)  # ACTING on b1, most of its 3 k reserved
    assert core.queue_length() == 0
    assert prefills(core.handle(Tick(5.0)).actions) == []
    assert _program(core, "a").state is ProgramState.PAUSED


def test_prefetch_waits_for_room_at_home_unless_told_to_move_the_program() -> None:
    """Its KV may still be cached at home: moving it early would recompute it for nothing."""
    for elsewhere, expected in ((False, []), (True, [Prefill("a", "b1", 2010, "prefetch")])):
        core = make(
            spec(min_context_tokens=0, prefetch_before_s=1.0, prefetch_elsewhere=elsewhere),
            capacities=(100_000, 4500),
        )
        run_call(core, "a", 2000, 0.0, 1.0)
        # paused at home (b0), which then fills up
        core.handle(DecisionsApplied([Pause(_program(core, "a"))], 1.0))
        hog = RequestInfo(prompt_chars=98_500 * CHARS_PER_TOKEN, max_tokens=10)
        # in flight
        assert isinstance(core.handle(RequestArrived(ctx("hog"), hog, 1.5)).decision, Forward)
        assert _program(core, "hog").backend == "b0" and core.room(core.backends["b0"]) < 2000
        assert prefills(core.handle(Tick(5.0)).actions) == expected


# ------------------------------------------------------------------ answers and memory
def test_a_json_chat_answer_is_recorded_with_its_tool_calls() -> None:
    recorder = AnswerRecorder(10_000)
    recorder.feed_json(
        msgspec.json.encode(
            {
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": "Let me look.",
                            "tool_calls": [
                                {
                                    "id": "c1",
                                    "type": "function",
                                    "function": {"name": "ls", "arguments": '{"d": "/"}'},
                                }
                            ],
                        },
                    }
                ]
            }
        )
    )
    assert recorder.message() == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"d": "/"}'}}
        ],
    }


def test_a_streamed_answer_is_assembled_from_its_deltas() -> None:
    def event(delta: dict[str, Any]) -> bytes:
        return b"data: " + msgspec.json.encode({"choices": [{"index": 0, "delta": delta}]})

    chunks = [
        event({"role": "assistant", "content": "Hel"}),
        event({"content": "lo"}),
        event({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "cat"}}]}),
        event({"tool_calls": [{"index": 0, "function": {"arguments": '{"f": '}}]}),
        event({"tool_calls": [{"index": 0, "function": {"arguments": '"a"}'}}]}),
        b'data: {"choices": [], "usage": {"prompt_tokens": 3}}',
        b"data: [DONE]",
    ]
    recorder = AnswerRecorder(10_000)
    recorder.feed_events(b"\n\n".join(chunks[:3]) + b"\n\n")
    recorder.feed_events(b"\n\n".join(chunks[3:]) + b"\n\n")
    assert recorder.message() == {
        "role": "assistant",
        "content": "Hello",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "cat", "arguments": '{"f": "a"}'}}
        ],
    }


def test_a_completion_answer_is_recorded_as_text() -> None:
    recorder = AnswerRecorder(10_000)
    recorder.feed_json(b'{"choices": [{"index": 0, "text": " world"}]}')
    body = warming_body(
        Remembered("/v1/completions", {"prompt": "hello", "max_tokens": 50}, recorder.message(), 1)
    )
    assert body == {"prompt": "hello world", "max_tokens": 1}


def test_the_warming_body_is_the_last_request_plus_its_answer_asking_for_one_token() -> None:
    remembered = Remembered(
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "fix it"}],
            "tools": [{"type": "function", "function": {"name": "ls"}}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_completion_tokens": 500,
        },
        {"role": "assistant", "content": "done"},
        1,
    )
    assert warming_body(remembered) == {
        "model": "m",
        "messages": [
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": "done"},
        ],
        "tools": [{"type": "function", "function": {"name": "ls"}}],
        "max_tokens": 1,
    }
    ids = Remembered("/v1/completions", {"prompt": [1, 2, 3]}, {"content": "x"}, 1)
    assert warming_body(ids) is None


def _answer(text: str) -> AnswerRecorder:
    recorder = AnswerRecorder(1_000_000)
    recorder.feed_json(msgspec.json.encode({"choices": [{"message": {"content": text}}]}))
    return recorder


def test_the_memory_keeps_within_its_byte_budget_dropping_the_least_recent_program() -> None:
    metrics = PrefillMetrics(CollectorRegistry())
    memory = PromptMemory(1000, metrics)
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "x"}]}
    memory.store("a", "/v1/chat/completions", body, 300, _answer("a" * 100))
    memory.store("b", "/v1/chat/completions", body, 300, _answer("b" * 100))
    assert memory.bytes_held == 800 and len(memory) == 2
    memory.store("c", "/v1/chat/completions", body, 300, _answer("c" * 100))
    assert memory.get("a") is None and memory.get("b") is not None
    assert memory.bytes_held == 800 and memory.evictions == 1
    assert metrics.evictions._value.get() == 1
    assert metrics.memory_bytes._value.get() == 0  # not watched: the prefiller wires it
    # A program's newer prompt replaces its older one; one over the budget is not kept.
    memory.store("b", "/v1/chat/completions", body, 500, _answer("b" * 100))
    held = memory.get("b")
    assert memory.bytes_held == 1000 and held is not None and held.size == 600
    memory.store("c", "/v1/chat/completions", body, 5000, _answer("c"))
    assert memory.get("c") is None and memory.bytes_held == 600
    memory.forget("b")
    assert memory.bytes_held == 0 and len(memory) == 0


def test_an_answer_past_the_budget_is_not_recorded_and_drops_the_older_prompt() -> None:
    memory = PromptMemory(1000)
    body: dict[str, Any] = {"messages": []}
    memory.store("a", "/v1/chat/completions", body, 100, _answer("short"))
    recorder = memory.recorder("/v1/chat/completions")
    assert recorder is not None
    recorder.feed_events(
        b"data: " + msgspec.json.encode({"choices": [{"delta": {"content": "x" * 2000}}]}) + b"\n\n"
    )
    assert recorder.overflow
    memory.store("a", "/v1/chat/completions", body, 100, recorder)
    assert memory.get("a") is None and memory.bytes_held == 0
    assert memory.recorder("/v1/responses") is None  # a route it cannot warm


# ------------------------------------------------------------------ the harness carries it out
class _ElsewhereAfterEachCall(Stage):
    """Test rule: a program is paused when its call ends, and may not return to that engine
    (as when its engine is drained): its next call runs on the other one."""

    name = "elsewhere_after_each_call"

    def __init__(self) -> None:
        super().__init__()
        self.cached: list[tuple[int, int]] = []
        self.left: dict[str, str] = {}

    def on_finished(
        self, view: StageView, program: ProgramView, usage: Usage | None, ok: bool, now: float
    ) -> Decisions:
        if usage is not None:
            self.cached.append((usage.prompt_tokens, usage.cached_tokens))
        if program.in_flight == 0 and program.backend is not None:
            self.left[program.program_id] = program.backend
            return [Pause(program)]
        return ()

    def admits(
        self, view: StageView, program: ProgramView, backend: BackendView, tokens: int, now: float
    ) -> bool:
        return self.left.get(program.program_id) != backend.label


def _moved_program_cache(with_prefill: bool) -> list[tuple[int, int]]:
    rule = _ElsewhereAfterEachCall()
    stages: list[Stage] = [Admission(HOLD), StateAwarePause(), Migration(), rule]
    if with_prefill:
        stages.append(spec(min_context_tokens=0, prefetch_before_s=5.0, prefetch_elsewhere=True))
    calls = (Call(4000, 50, tool_s=10.0), Call(200, 50, tool_s=0.0))
    program = ProgramSpec("p", "swe-agent", 1000, calls)
    sim = Simulation([program], None)
    sim.core = SchedulerCore(
        [(b, sim.backends[b].engine.capacity_tokens) for b in sim.backends], stages
    )
    result = sim.run()
    assert result.metrics["programs_completed"] == 1
    if with_prefill:
        assert result.metrics["speculative_prefills"] == 1
    return rule.cached


def test_the_harness_sends_the_warming_request_so_the_moved_program_hits_the_cache() -> None:
    cold = _moved_program_cache(with_prefill=False)
    warm = _moved_program_cache(with_prefill=True)
    (_, first_cached), (prompt, cold_cached) = cold
    assert first_cached == 0 and cold_cached < 1100  # at most its system prompt was there
    (_, _), (same_prompt, warm_cached) = warm
    assert same_prompt == prompt
    # The whole context but the new growth (and the last, sampled, token) was warmed.
    assert warm_cached >= prompt - 200 - 16
