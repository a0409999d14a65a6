"""Specification of the scheduler core's boundary: other replicas reach it only as events,
what leaves it is a frozen snapshot of a program, and stages read a view and return decisions
the core applies (policies/stage_contract.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from thunder_mw.policies import (
    BackendAdded,
    CallFinished,
    DecisionsApplied,
    ForeignReservations,
    Pause,
    Phase,
    ProgramAdopted,
    ProgramSnapshot,
    ProgramView,
    ReleaseRequested,
    RequestArrived,
    Stage,
    StageDecision,
    StageView,
    TakenOver,
    Tick,
)
from thunder_mw.policies.core import Forward, Hold, Paused, RequestInfo, Resumed, SchedulerCore
from thunder_mw.policies.events import ProgramHistory
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.program_table import Program, ProgramState, Usage
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention

CHARS_PER_TOKEN = 4
PIPELINE: list[dict[str, Any]] = [
    {
        "admission": {
            "high_watermark": 1.0,
            "low_watermark": 0.8,
            "buffer_tokens_per_program": 0,
            "fill_idle_engine": False,  # the watermark alone (test_idle_engine.py)
        }
    },
    {"state_aware_pause": {"acting_token_weight": 1.0, "yield_idle_after_s": None}},
    {"migration": {}},
]


def ctx(pid: str) -> AgentContext:
    return AgentContext(program_id=pid, source=Convention.THUNDERAGENT)


def info(tokens: int, out: int = 10) -> RequestInfo:
    return RequestInfo(prompt_chars=(tokens - 1) * CHARS_PER_TOKEN, max_tokens=out)


def make(*extra: Stage, capacities: tuple[int, ...] = (1000,)) -> SchedulerCore:
    labels = [(f"b{i}", c) for i, c in enumerate(capacities)]
    stages = [*build_pipeline(PIPELINE), *extra]
    return SchedulerCore(labels, stages, chars_per_token=CHARS_PER_TOKEN)


def _program(core: SchedulerCore, program_id: str) -> Program:
    program = core.table.get(program_id)
    assert program is not None, program_id
    return program


def run_step(core: SchedulerCore, pid: str, tokens: int, now: float) -> None:
    decision = core.handle(RequestArrived(ctx(pid), info(tokens), now)).decision
    assert isinstance(decision, Forward), decision
    core.handle(CallFinished(pid, Usage(tokens, 10), True, now + 1))


# ------------------------------------------------------------------ other replicas
def test_other_replicas_reservations_count_against_the_engine_until_they_shrink() -> None:
    core = make()
    assert core.handle(ForeignReservations("b0", 900, 0.0)).actions == []  # grew: nothing to resume
    assert core.backends["b0"].reserved == 900
    decision = core.handle(RequestArrived(ctx("a"), info(500), 1.0)).decision
    assert isinstance(decision, Hold)
    actions = core.handle(ForeignReservations("b0", 100, 2.0)).actions
    assert [(a.program_id, a.backend) for a in actions if isinstance(a, Resumed)] == [("a", "b0")]
    assert core.backends["b0"].reserved == 100 + _program(core, "a").reserved_tokens
    assert core.handle(ForeignReservations("b0", -5, 3.0)).actions == []  # never below zero
    assert (
        core.foreign_reserved("b0") == 0
        and core.handle(ForeignReservations("gone", 1, 3)).actions == []
    )


def test_a_program_taken_over_keeps_its_engine_and_leaves_the_others_share() -> None:
    # Room for both counts: it is placed before it leaves the others' share.
    core = make(capacities=(2000,))
    core.handle(ForeignReservations("b0", 600, 0.0))
    history = ProgramHistory(backend="b0", steps=3, context_tokens=590, prompt_tokens=900)
    program = core.handle(ProgramAdopted(ctx("p"), history, 1.0)).program
    assert program is not None
    assert (program.state, program.backend, program.steps) == (ProgramState.PAUSED, "b0", 3)
    actions = core.handle(TakenOver("p", "b0", 600, 2.0)).actions
    assert [a.program_id for a in actions if isinstance(a, Resumed)] == ["p"]
    now = core.snapshot("p")
    assert now is not None and now.state is ProgramState.ACTIVE
    assert core.foreign_reserved("b0") == 0
    assert core.backends["b0"].reserved == now.reserved_tokens == 590
    assert core.counters["takeovers"] == 1
    assert core.handle(TakenOver("p", "b0", 600, 3.0)).actions == []  # already placed here


def test_an_older_record_does_not_overwrite_what_this_replica_knows() -> None:
    core = make()
    run_step(core, "p", 300, 0.0)
    program = core.handle(
        ProgramAdopted(ctx("p"), ProgramHistory(backend="b0", steps=0), 5.0)
    ).program
    assert program is not None
    assert (program.steps, program.context_tokens) == (1, 310)


# ------------------------------------------------------------------ what leaves the core
def test_a_program_handed_out_of_the_core_does_not_change_after_later_events() -> None:
    core = make(capacities=(2000,))
    history = ProgramHistory(backend="b0", steps=3, context_tokens=590, prompt_tokens=900)
    adopted = core.handle(ProgramAdopted(ctx("p"), history, 1.0)).program
    asked = core.snapshot("p")
    listed = core.snapshots()
    core.handle(TakenOver("p", "b0", 0, 2.0))  # placed: ACTIVE, 590 tokens reserved
    run_step(core, "p", 600, 3.0)
    for program in (adopted, asked, *listed):
        assert program is not None
        assert (program.state, program.reserved_tokens, program.steps) == (
            ProgramState.PAUSED,
            0,
            3,
        )
    now = core.snapshot("p")
    assert now is not None and (now.state, now.steps) == (ProgramState.ACTIVE, 4)
    assert now != asked and isinstance(now, ProgramSnapshot)


def test_a_snapshot_cannot_be_written_to() -> None:
    core = make()
    run_step(core, "p", 300, 0.0)
    program = core.snapshot("p")
    assert program is not None
    with pytest.raises(AttributeError):
        program.state = ProgramState.PAUSED  # type: ignore[misc]
    assert _program(core, "p").state is ProgramState.ACTIVE


# The core's bookkeeping, which means nothing outside it; every other field of `Program`
# leaves it in a snapshot (a new field is one or the other, decided here).
_BOOKKEEPING = {"pending_tokens", "running_tokens", "held_context", "paused_at", "idle_share"}


def test_a_snapshot_has_every_field_of_the_program_but_the_cores_bookkeeping() -> None:
    fields = set(ProgramSnapshot.__struct_fields__)
    assert fields == set(Program.__struct_fields__) - _BOOKKEEPING - {"version"}
    view_fields = {name for name in vars(ProgramView) if not name.startswith("_")}
    assert view_fields <= fields
    core = make()
    run_step(core, "p", 300, 0.0)
    live, snapshot = _program(core, "p"), core.snapshot("p")
    assert snapshot is not None
    for name in fields:
        expected = getattr(live, name)
        assert getattr(snapshot, name) == (tuple(expected) if name == "docker_ids" else expected)


def test_a_pick_copies_only_the_programs_it_chooses_in_its_order() -> None:
    core = make()
    for i, tokens in enumerate((100, 300, 200)):
        run_step(core, f"p{i}", tokens, float(i))
    picked = core.snapshots(lambda programs: sorted(programs, key=lambda p: -p.context_tokens)[:2])
    assert [p.program_id for p in picked] == ["p1", "p2"]
    assert all(isinstance(p, ProgramSnapshot) for p in picked)


def test_the_counts_the_gauges_read_agree_with_the_snapshots() -> None:
    core = make()
    run_step(core, "a", 600, 0.0)
    core.handle(RequestArrived(ctx("b"), info(300), 1.0))  # in flight: REASONING
    core.handle(RequestArrived(ctx("c"), info(600), 2.0))  # no room: held, PAUSED
    programs = core.snapshots()
    counts = core.state_counts()
    for state in ProgramState:
        for phase in Phase:
            expected = sum(1 for p in programs if (p.state, p.phase) == (state, phase))
            assert counts[state][phase] == expected, (state, phase)
    assert core.held_count() == 1 and counts[ProgramState.ACTIVE][Phase.REASONING] == 1
    assert core.knows("c") and not core.knows("gone")


def test_decisions_from_outside_name_their_program_by_its_snapshot() -> None:
    core = make()
    run_step(core, "a", 300, 0.0)
    run_step(core, "b", 300, 0.0)
    a, b = core.snapshot("a"), core.snapshot("b")
    assert a is not None and b is not None
    core.handle(ReleaseRequested("b", "release", 1.0))
    actions = core.handle(DecisionsApplied([Pause(a, "operator"), Pause(b, "operator")], 2.0))
    assert [(x.program_id, x.reason) for x in actions.actions if isinstance(x, Paused)] == [
        ("a", "operator")  # b has gone: its decision is dropped
    ]
    assert _program(core, "a").state is ProgramState.PAUSED


# ------------------------------------------------------------------ the stage contract
class _PausesAndLooks(Stage):
    """Pauses `a` on a tick, then reads the view: the pause is already applied."""

    name = "pauses_and_looks"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[ProgramState] = []

    def on_tick(self, view: StageView, now: float) -> Iterator[StageDecision]:
        program = view.program("a")
        if program is not None and program.state is ProgramState.ACTIVE:
            yield Pause(program, "test")
            self.seen.append(program.state)


def test_a_generator_hook_sees_each_decision_applied_before_its_next_step() -> None:
    probe = _PausesAndLooks()
    core = make(probe)
    run_step(core, "a", 300, 0.0)
    core.handle(Tick(5.0))
    assert probe.seen == [ProgramState.PAUSED]
    assert core.backends["b0"].reserved == 0 and core.counters["pauses"] == 1


class _LooksAtVictims(Stage):
    """Walks a backend's pause order on a tick and pauses nobody."""

    name = "looks_at_victims"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def on_tick(self, view: StageView, now: float) -> tuple[()]:
        backend = view.backends["b0"]
        while (victim := view.next_victim(backend, acting=True)) is not None:
            self.seen.append(victim.program_id)
        return ()


def test_victims_a_stage_looks_at_but_does_not_pause_stay_in_the_pause_order() -> None:
    probe = _LooksAtVictims()
    core = make(probe)
    run_step(core, "big", 400, 0.0)
    run_step(core, "small", 200, 0.0)
    core.handle(Tick(5.0))
    core.handle(Tick(6.0))
    assert probe.seen == ["big", "small", "big", "small"]  # the same order, both times


def test_decisions_from_outside_the_pipeline_are_applied_as_a_stages_would_be() -> None:
    core = make()
    run_step(core, "a", 300, 0.0)
    actions = core.handle(DecisionsApplied([Pause(_program(core, "a"), "operator")], 2.0)).actions
    assert [(a.program_id, a.reason) for a in actions if isinstance(a, Paused)] == [
        ("a", "operator")
    ]
    assert len(actions) == 1


# ------------------------------------------------------------------ what stages are given
class _TriesToWrite(Stage):
    """On each request, tries to change its program and an engine through what it was given,
    and records the view and program it got and each attempt that was refused."""

    name = "tries_to_write"

    def __init__(self) -> None:
        super().__init__()
        self.views: list[StageView] = []
        self.programs: list[ProgramView] = []
        self.refused: list[str] = []

    def bind(self, view: StageView) -> tuple[()]:
        self.views.append(view)
        return ()

    def on_request(self, view: StageView, program: ProgramView, now: float) -> tuple[()]:
        self.views.append(view)
        self.programs.append(program)
        try:
            program.steps = 99  # type: ignore[misc]
        except AttributeError:
            self.refused.append("steps")
        try:
            program.docker_ids.append("c1")  # type: ignore[attr-defined]
        except AttributeError:
            self.refused.append("docker_ids")
        try:
            view.backends["b0"].reserved = 0  # type: ignore[misc]
        except AttributeError:
            self.refused.append("reserved")
        return ()


def test_a_stage_cannot_change_a_program_or_an_engine_through_what_it_reads() -> None:
    probe = _TriesToWrite()
    core = make(probe)
    run_step(core, "a", 300, 0.0)
    run_step(core, "a", 400, 2.0)
    assert probe.refused == ["steps", "docker_ids", "reserved"] * 2
    a = core.snapshot("a")
    assert a is not None and a.steps == 2 and a.docker_ids == ()
    assert core.backends["b0"].reserved == a.reserved_tokens > 0


def test_a_stages_view_answers_the_stage_contract_and_nothing_else() -> None:
    probe = _TriesToWrite()
    core = make(probe)
    run_step(core, "a", 300, 0.0)
    view = probe.views[0]
    assert all(v is view for v in probe.views)  # one view of the core, made with it
    assert not isinstance(view, SchedulerCore)
    assert not hasattr(view, "handle") and not hasattr(view, "table")
    contract = {name for name in vars(StageView) if not name.startswith("_")}
    assert {name for name in dir(view) if not name.startswith("_")} == contract


def test_a_stage_reads_each_program_through_one_view_always_current() -> None:
    probe = _TriesToWrite()
    core = make(probe)
    run_step(core, "a", 300, 0.0)
    run_step(core, "a", 400, 2.0)
    first, second = probe.programs
    assert first is second  # made once with the program: no copy per hook call
    snapshot = core.snapshot("a")
    assert snapshot is not None
    for name in ProgramSnapshot.__struct_fields__:
        assert getattr(first, name) == getattr(snapshot, name), name


def test_the_engines_leave_the_core_read_only() -> None:
    core = make()
    engines = core.backend_views()
    run_step(core, "a", 300, 0.0)
    assert engines["b0"].reserved == core.backends["b0"].reserved > 0  # always current
    with pytest.raises(AttributeError):
        engines["b0"].reserved = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        engines["b1"] = engines["b0"]  # type: ignore[index]
    core.handle(BackendAdded("b1", 500, 1.0))
    assert engines["b1"].capacity == 500 and set(engines) == {"b0", "b1"}
