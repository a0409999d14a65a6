"""Specification of the pure scheduler core and its pipeline stages (no I/O, simulated clock)."""

from __future__ import annotations

from typing import Any, TypeVar

import pytest

from thunder_mw.policies import (
    BackendChanged,
    CallFinished,
    ClientLeft,
    DecisionsApplied,
    HostTierDeclared,
    ReleaseRequested,
    RequestArrived,
    Tick,
)
from thunder_mw.policies.core import (
    Action,
    BackendMetrics,
    Forward,
    Hold,
    Paused,
    ReclaimTools,
    Reject,
    Released,
    RequestInfo,
    Resumed,
    SchedulerCore,
)
from thunder_mw.policies.decisions import Decision, Pause
from thunder_mw.policies.pipeline import PipelineError, build_pipeline
from thunder_mw.policies.program_table import Phase, Program, ProgramState, Usage
from thunder_mw.policies.stages import Admission
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention

CHARS_PER_TOKEN = 4
A = TypeVar("A")


def _program(core: SchedulerCore, program_id: str) -> Program:
    """The core's entry for `program_id` (the test fails here if it has none)."""
    program = core.table.get(program_id)
    assert program is not None, program_id
    return program


def ctx(pid: str, **kw: Any) -> AgentContext:
    return AgentContext(program_id=pid, source=Convention.THUNDERAGENT, **kw)


def info(tokens: int, out: int = 10) -> RequestInfo:
    """A request whose body estimates to `tokens` prompt tokens and `out` output tokens."""
    return RequestInfo(prompt_chars=(tokens - 1) * CHARS_PER_TOKEN, max_tokens=out)


def make(
    capacities: tuple[int | None, ...] = (1000,),
    policies: list[dict[str, Any]] | None = None,
    **stage_params: dict[str, Any],
) -> SchedulerCore:
    if policies is None:
        policies = [
            {
                "admission": {
                    "high_watermark": 1.0,
                    "low_watermark": 0.8,
                    "buffer_tokens_per_program": 0,
                    "overflow": "hold",
                    # The watermark alone: an idle engine holds too (test_idle_engine.py).
                    "fill_idle_engine": False,
                }
            },
            # Rules are pinned with whole-context accounting and no yielding unless a test asks.
            {
                "state_aware_pause": {
                    "acting_token_weight": 1.0,
                    "yield_idle_after_s": None,
                    **stage_params.get("pause", {}),
                }
            },
            {"migration": stage_params.get("migration", {})},
            {"gc_hooks": stage_params.get("gc", {})},
        ]
    labels = [(f"b{i}", c) for i, c in enumerate(capacities)]
    return SchedulerCore(labels, build_pipeline(policies), chars_per_token=CHARS_PER_TOKEN)


def run_step(
    core: SchedulerCore, pid: str, tokens: int, now: float, out: int = 10, **kw: Any
) -> str:
    """One request that is forwarded and answered: the program ends up ACTING."""
    decision = core.handle(RequestArrived(ctx(pid, **kw), info(tokens, out), now)).decision
    assert isinstance(decision, Forward), decision
    core.handle(CallFinished(pid, Usage(tokens, out), True, now + 1))
    return decision.backend


def of(actions: list[Action], kind: type[A]) -> list[A]:
    return [a for a in actions if isinstance(a, kind)]


# ------------------------------------------------------------------ admission
def test_a_new_program_that_fits_is_forwarded_and_reserves_its_footprint() -> None:
    core = make()
    outcome = core.handle(RequestArrived(ctx("a"), info(300, 20), 0.0))
    decision, actions = outcome.decision, outcome.actions
    assert decision == Forward("a", "b0")
    assert core.backends["b0"].reserved == 320
    assert of(actions, Resumed)[0].admitted


def test_a_program_that_does_not_fit_is_held_then_admitted_when_room_frees() -> None:
    core = make()
    run_step(core, "a", 700, 0)
    decision = core.handle(RequestArrived(ctx("b"), info(500), 2.0)).decision
    assert isinstance(decision, Hold)
    actions = core.handle(ReleaseRequested("a", "release", 3.0)).actions
    assert [(r.program_id, r.backend) for r in of(actions, Resumed)] == [("b", "b0")]
    program = _program(core, "b")
    assert program.state is ProgramState.ACTIVE and program.in_flight == 1


def test_congested_backend_admits_nothing_until_below_the_low_watermark() -> None:
    core = make()
    run_step(core, "a", 500, 0)
    run_step(core, "b", 450, 0)
    # b grows: 1100 reserved > high -> congested
    core.handle(RequestArrived(ctx("b"), info(600), 5))
    admission = next(s for s in core.stages if isinstance(s, Admission))
    assert admission.congested["b0"] or _program(core, "a").state is ProgramState.PAUSED
    # After the pause the backend holds ~610 (> low 800? no): check hysteresis directly.
    backend = core.backends["b0"]
    admission.congested["b0"] = True
    backend.reserved = 850
    small = core.table.touch(ctx("c"), 6)[0]
    assert not core.admits(small, backend, 6)  # 850 > low (800): still congested
    backend.reserved = 790
    assert core.admits(small, backend, 6)


def test_unknown_capacity_admits_everything() -> None:
    core = make(capacities=(None,))
    for i in range(20):
        decision = core.handle(RequestArrived(ctx(f"p{i}"), info(10_000), 0)).decision
        assert isinstance(decision, Forward)


# ------------------------------------------------------------------ pausing
def test_overflow_pauses_acting_programs_before_reasoning_ones() -> None:
    core = make()
    run_step(core, "grower", 100, 0)
    run_step(core, "acting", 400, 0)
    core.handle(RequestArrived(ctx("reasoning"), info(300), 2))  # in flight
    # its context grows: overflow
    actions = core.handle(RequestArrived(ctx("grower"), info(400), 3)).actions
    paused = of(actions, Paused)
    assert [p.program_id for p in paused] == ["acting"] and not paused[0].pending
    assert _program(core, "reasoning").state is ProgramState.ACTIVE


def test_shortest_first_pauses_the_smallest_acting_program() -> None:
    core = make(pause={"victim": "shortest_first"})
    run_step(core, "grower", 100, 0)
    run_step(core, "big", 500, 0)
    run_step(core, "small", 200, 0)
    actions = core.handle(RequestArrived(ctx("grower"), info(300), 5)).actions
    assert [p.program_id for p in of(actions, Paused)] == ["small"]


def test_cost_benefit_pauses_the_program_with_the_longest_expected_tool_time() -> None:
    core = make()
    # Teach the model: "slow" has long tool gaps (30 s), "quick" short ones (1 s).
    run_step(core, "grower", 100, 0)
    run_step(core, "slow", 300, 0)
    run_step(core, "quick", 300, 0)
    run_step(core, "quick", 300, 3)
    run_step(core, "slow", 300, 31)
    # Both are ACTING again; the grower's next request overflows the backend a little.
    actions = core.handle(RequestArrived(ctx("grower"), info(380), 33)).actions
    assert [p.program_id for p in of(actions, Paused)] == ["slow"]


def _auto_core_with_a_stream(stream: bool) -> SchedulerCore:
    """`big` (510) and `small` (210) ACTING since t=1; with `stream`, a program ended at
    t=2 and two new ones arrived at t=3 and t=4 (a stream with a 1 s gap; their calls still
    run); without, the two new ones are a batch's late starters (nothing ended before)."""
    core = make(pause={"victim": "auto"})
    run_step(core, "grower", 100, 0)
    run_step(core, "big", 500, 0)
    run_step(core, "small", 200, 0)
    run_step(core, "done", 10, 0)
    if stream:
        core.handle(ReleaseRequested("done", "release", 2))
    for i, at in ((1, 3.0), (2, 4.0)):  # their first calls stay in flight: not victims
        decision = core.handle(RequestArrived(ctx(f"n{i}"), info(10), at)).decision
        assert isinstance(decision, Forward)
    return core


@pytest.mark.parametrize(
    ("stream", "at", "victim"),
    [(True, 5.0, "small"), (True, 20.0, "big"), (False, 5.0, "big")],
    ids=["streaming-shortest-first", "stream-stopped-cost-benefit", "batch-cost-benefit"],
)
def test_auto_pauses_the_shortest_while_programs_keep_arriving(
    stream: bool, at: float, victim: str
) -> None:
    # Entries pushed under one rule are re-keyed when it switches: "big" and "small" went
    # into the pause order under cost-benefit (largest first) before the stream began.
    core = _auto_core_with_a_stream(stream)
    # overflow by ~70 tokens
    actions = core.handle(RequestArrived(ctx("grower"), info(300), at)).actions
    assert [p.program_id for p in of(actions, Paused)] == [victim]


def test_auto_yields_nothing_while_programs_keep_arriving() -> None:
    def newcomer(stream: bool) -> Decision | None:
        core = make(pause={"victim": "auto", "yield_idle_after_s": 5})
        run_step(core, "done", 10, 0)
        run_step(core, "idle", 600, 0)
        run_step(core, "idle", 600, 31)  # its tool calls take ~30 s
        if stream:
            core.handle(ReleaseRequested("done", "release", 32))
        for i in range(3):
            run_step(core, f"n{i}", 10, 33 + i)  # new programs every second
        # fits only by a yield
        decision = core.handle(RequestArrived(ctx("new"), info(500), 36)).decision
        return decision

    assert isinstance(newcomer(stream=True), Hold)  # more keep coming: it waits its turn
    assert newcomer(stream=False) == Forward("new", "b0")  # a batch's: the idle one yields


@pytest.mark.parametrize("victim", ["cost_benefit", "shortest_first", "auto"])
def test_only_auto_watches_arrivals_and_ends(victim: str) -> None:
    # The request path calls a stage's hook only where its rule needs it.
    core = make(pause={"victim": victim})
    pause = next(s for s in core.stages if s.name == "state_aware_pause")
    called = (pause.on_request in core._request_hooks, pause.on_release in core._release_hooks)
    assert called == (victim == "auto",) * 2


def test_marking_a_reasoning_program_lowers_the_projection_so_only_one_is_marked() -> None:
    core = make()
    run_step(core, "r3", 100, 0)
    core.handle(RequestArrived(ctx("r1"), info(400), 1))
    core.handle(RequestArrived(ctx("r2"), info(400), 1))
    # 1130 > 1000, all reasoning
    actions = core.handle(RequestArrived(ctx("r3"), info(300), 2)).actions
    marked = [p for p in of(actions, Paused) if p.pending]
    assert len(marked) == 1  # 1130 - 410 = 720 <= 1000: one is enough


@pytest.mark.parametrize(("rule", "marked"), [("largest", "r2"), ("smallest", "r1")])
def test_the_reasoning_victim_rule_picks_which_call_is_marked(rule: str, marked: str) -> None:
    core = make(pause={"reasoning_victim": rule})
    run_step(core, "r3", 100, 0)
    core.handle(RequestArrived(ctx("r1"), info(300), 1))
    core.handle(RequestArrived(ctx("r2"), info(500), 1))
    # 1130 > 1000, all reasoning
    actions = core.handle(RequestArrived(ctx("r3"), info(300), 2)).actions
    # Either frees enough alone: `smallest` marks the call whose context is cheapest to
    # recompute when it returns, `largest` the one that frees the most.
    assert [p.program_id for p in of(actions, Paused) if p.pending] == [marked]


def test_the_original_rule_over_pauses_and_is_kept_only_for_its_baseline() -> None:
    core = make(capacities=(1200,), policies=[{"thunderagent": {}}])
    run_step(core, "r3", 100, 0)
    core.handle(RequestArrived(ctx("r1"), info(300), 1))
    core.handle(RequestArrived(ctx("r2"), info(300), 1))
    core.handle(RequestArrived(ctx("r3"), info(300), 2))  # 1230 > 1200, all reasoning
    actions = core.handle(Tick(3)).actions
    assert len([p for p in of(actions, Paused) if p.pending]) == 3


def test_a_program_marked_while_reasoning_pauses_when_its_call_ends() -> None:
    core = make()
    run_step(core, "r2", 100, 0)
    core.handle(RequestArrived(ctx("r1"), info(500), 1))
    core.handle(RequestArrived(ctx("r2"), info(500), 2))
    marked = next(p for p in core.programs() if p.pause_pending)
    actions = core.handle(CallFinished(marked.program_id, Usage(500, 10), True, 2)).actions
    paused = of(actions, Paused)
    assert paused and paused[0].program_id == marked.program_id and not paused[0].pending
    assert _program(core, marked.program_id).state is ProgramState.PAUSED
    assert core.backends["b0"].pending_release == 0


def test_a_paused_programs_next_request_is_held_and_nothing_running_is_aborted() -> None:
    core = make()
    run_step(core, "b", 100, 0)
    run_step(core, "a", 600, 0)
    # b grows: overflow pauses ACTING a
    actions = core.handle(RequestArrived(ctx("b"), info(500), 2)).actions
    assert of(actions, Paused)[0].program_id == "a"
    decision = core.handle(RequestArrived(ctx("a"), info(620), 3)).decision
    assert isinstance(decision, Hold)
    assert _program(core, "b").in_flight == 1


# ------------------------------------------------------------------ resume and migration
def test_resume_prefers_the_home_backend_when_it_has_room() -> None:
    core = make(capacities=(1000, 1000))
    home = run_step(core, "a", 600, 0)
    program = _program(core, "a")
    core.handle(DecisionsApplied([Pause(program)], 1))
    outcome = core.handle(RequestArrived(ctx("a"), info(620), 2))
    decision, actions = outcome.decision, outcome.actions
    assert decision == Forward("a", home) and not of(actions, Resumed)[0].migrated


def test_resume_migrates_to_the_backend_with_the_most_room_when_home_is_full() -> None:
    core = make(capacities=(1000, 1000))
    assert run_step(core, "a", 600, 0) == "b0"
    core.handle(DecisionsApplied([Pause(_program(core, "a"))], 1))
    decision = core.handle(RequestArrived(ctx("filler"), info(800), 2)).decision
    assert decision == Forward("filler", "b0")  # both empty: the first with the most room
    outcome = core.handle(RequestArrived(ctx("a"), info(620), 3))
    decision, actions = outcome.decision, outcome.actions
    assert decision == Forward("a", "b1")
    resumed = of(actions, Resumed)[0]
    assert resumed.migrated and resumed.previous_backend == "b0"
    assert _program(core, "a").migrations == 1


def test_queue_order_is_priority_then_largest_first() -> None:
    core = make()
    run_step(core, "hog", 990, 0, out=5)
    for pid, tokens, priority in (("low-big", 400, 0), ("low-small", 100, 0), ("high", 200, 5)):
        decision = core.handle(
            RequestArrived(ctx(pid, priority=priority), info(tokens), 1)
        ).decision
        assert isinstance(decision, Hold)
    actions = core.handle(ReleaseRequested("hog", "release", 2)).actions
    assert [r.program_id for r in of(actions, Resumed)] == ["high", "low-big", "low-small"]


@pytest.mark.parametrize(
    ("started_first", "host_tier", "order"),
    [
        (False, 0, ["new", "old"]),
        (True, 0, ["old", "new"]),
        (False, 50_000, ["new", "old"]),
        # The default, by what a resume costs: a reload from the host tier, where there is
        # one; without, the paused program's KV is gone and arrival order is kept.
        (None, 0, ["new", "old"]),
        (None, 50_000, ["old", "new"]),
    ],
)
def test_started_first_queues_a_paused_program_ahead_of_one_not_yet_begun(
    started_first: bool | None, host_tier: int, order: list[str]
) -> None:
    # The queue's own order (ageing, then largest first): the drain's fixed order, the
    # default on a tiered fleet (test_drain_order.py), would order by arrival instead.
    core = make(
        migration={} if started_first is None else {"started_first": started_first},
        pause={"drain_victim": "cost_benefit"},
    )
    if host_tier:
        core.handle(HostTierDeclared("b0", host_tier, 1e6))
    run_step(core, "old", 300, 0)
    core.handle(DecisionsApplied([Pause(_program(core, "old"))], 1))
    assert isinstance(core.handle(RequestArrived(ctx("hog"), info(990), 2)).decision, Forward)
    assert isinstance(core.handle(RequestArrived(ctx("new"), info(200), 3)).decision, Hold)
    # old comes back from its tool long after new queued: by ageing alone, new goes first.
    assert isinstance(core.handle(RequestArrived(ctx("old"), info(320), 200)).decision, Hold)
    actions = core.handle(ReleaseRequested("hog", "release", 201)).actions
    assert [r.program_id for r in of(actions, Resumed)] == order


def test_a_starving_program_is_force_resumed_after_the_timeout() -> None:
    core = make(migration={"resume_timeout_s": 100})
    core.handle(RequestArrived(ctx("hog"), info(990), 0))
    decision = core.handle(RequestArrived(ctx("starved"), info(500), 1)).decision
    assert isinstance(decision, Hold)
    assert not of(core.handle(Tick(50)).actions, Resumed)
    resumed = of(core.handle(Tick(102)).actions, Resumed)
    assert [(r.program_id, r.forced) for r in resumed] == [("starved", True)]


# ------------------------------------------------------------------ failures, release, expiry
def test_a_failed_call_returns_the_program_to_acting_and_frees_its_request_tokens() -> None:
    core = make()
    run_step(core, "a", 300, 0)
    core.handle(RequestArrived(ctx("a"), info(600), 2))
    assert core.backends["b0"].reserved > 600  # its request's estimate is reserved
    core.handle(CallFinished("a", None, False, 3))
    program = _program(core, "a")
    assert program.phase is Phase.ACTING and program.in_flight == 0 and program.failures == 1
    assert core.backends["b0"].reserved == 310  # back to its last known context


def test_a_failed_first_call_leaves_its_program_holding_nothing() -> None:
    core = make(
        policies=[
            {
                "admission": {
                    "buffer_tokens_per_program": 64,
                    "overflow": "hold",
                    "fill_idle_engine": False,
                }
            },
            {"gc_hooks": {}},
        ]
    )
    core.handle(RequestArrived(ctx("a"), info(300, 200), 0))
    assert core.backends["b0"].reserved == 564
    core.handle(CallFinished("a", None, False, 1))
    program = _program(core, "a")
    assert program.failures == 1 and program.reserved_tokens == 0
    assert core.backends["b0"].reserved == 0  # not even the per-program buffer


def test_a_program_whose_calls_all_failed_expires_after_failed_ttl_not_idle_ttl() -> None:
    core = make(gc={"idle_ttl_s": 1800, "failed_ttl_s": 30})
    core.handle(RequestArrived(ctx("doomed", docker_ids=("box-1",)), info(100), 0))
    core.handle(CallFinished("doomed", None, False, 1))
    # the client retries: the clock restarts
    core.handle(RequestArrived(ctx("doomed"), info(100), 10))
    core.handle(CallFinished("doomed", None, False, 11))
    run_step(core, "fine", 100, 0)
    assert not of(core.handle(Tick(40)).actions, Released)
    actions = core.handle(Tick(41)).actions
    assert of(actions, Released) == [Released("doomed", "failed", ("box-1",))]
    assert of(actions, ReclaimTools)[0].container_ids == ("box-1",)
    assert core.table.get("doomed") is None and core.table.get("fine") is not None


def test_one_successful_call_takes_a_program_off_the_failed_expiry() -> None:
    core = make(gc={"idle_ttl_s": 1800, "failed_ttl_s": 30})
    core.handle(RequestArrived(ctx("a"), info(100), 0))
    core.handle(CallFinished("a", None, False, 1))
    run_step(core, "a", 100, 2)
    assert not of(core.handle(Tick(100)).actions, Released) and core.table.get("a") is not None


def test_a_never_answered_program_with_a_call_in_flight_or_held_does_not_expire() -> None:
    core = make(gc={"failed_ttl_s": 5})
    core.handle(RequestArrived(ctx("slow"), info(100), 0))  # in flight for longer than the TTL
    core.handle(RequestArrived(ctx("hog"), info(880), 0))
    decision = core.handle(RequestArrived(ctx("held"), info(500), 1)).decision
    assert isinstance(decision, Hold)
    assert not of(core.handle(Tick(100)).actions, Released)
    core.handle(CallFinished("slow", None, False, 101))
    assert not of(core.handle(Tick(105)).actions, Released)
    assert [r.program_id for r in of(core.handle(Tick(106.5)).actions, Released)] == ["slow"]


def test_release_while_held_answers_the_held_request_with_409() -> None:
    core = make()
    core.handle(RequestArrived(ctx("hog"), info(990), 0))
    core.handle(RequestArrived(ctx("held"), info(500), 1))
    outcome = core.handle(ReleaseRequested("held", "release", 2))
    released, actions = outcome.found, outcome.actions
    assert released
    reject = of(actions, Reject)[0]
    assert (reject.program_id, reject.status, reject.code) == ("held", 409, "program_released")
    assert core.queue_length() == 0


def test_a_held_request_whose_client_left_leaves_the_queue() -> None:
    core = make()
    core.handle(RequestArrived(ctx("hog"), info(990), 0))
    core.handle(RequestArrived(ctx("gone"), info(500), 1))
    actions = core.handle(ClientLeft("gone", 2)).actions
    assert core.queue_length() == 0 and core.table.get("gone") is None
    assert of(actions, Released)[0].reason == "abandoned"


def test_idle_programs_expire_and_their_containers_are_reclaimed() -> None:
    core = make(gc={"idle_ttl_s": 60})
    run_step(core, "a", 100, 0, docker_ids=("box-1",))
    assert not of(core.handle(Tick(30)).actions, Released)
    actions = core.handle(Tick(62)).actions
    assert of(actions, Released)[0] == Released("a", "expired", ("box-1",))
    reclaim = of(actions, ReclaimTools)[0]
    assert reclaim.container_ids == ("box-1",) and reclaim.hooks == ("stop", "remove")
    assert core.table.get("a") is None and core.backends["b0"].reserved == 0


def test_a_program_with_a_call_in_flight_never_expires() -> None:
    core = make(gc={"idle_ttl_s": 10})
    core.handle(RequestArrived(ctx("a"), info(100), 0))
    assert not of(core.handle(Tick(1000)).actions, Released)


def test_a_final_request_ends_the_program_after_it_is_answered() -> None:
    core = make()
    core.handle(RequestArrived(ctx("a", final=True), info(100), 0))
    actions = core.handle(CallFinished("a", Usage(100, 10), True, 1)).actions
    assert of(actions, Released)[0].reason == "final" and core.table.get("a") is None


def test_parallel_requests_of_one_program_are_legal_and_counted() -> None:
    core = make()
    core.handle(RequestArrived(ctx("a"), info(100), 0))
    decision = core.handle(RequestArrived(ctx("a"), info(100), 0)).decision
    assert isinstance(decision, Forward) and _program(core, "a").in_flight == 2
    core.handle(CallFinished("a", Usage(100, 10), True, 1))
    assert _program(core, "a").phase is Phase.REASONING
    core.handle(CallFinished("a", Usage(100, 10), True, 1))
    assert _program(core, "a").phase is Phase.ACTING


# ------------------------------------------------------------------ backends
def test_growing_preemptions_shrink_the_planned_capacity_and_quiet_restores_it() -> None:
    core = make()
    core.handle(BackendChanged("b0", metrics=BackendMetrics(preemptions_total=0), now=0))
    core.handle(BackendChanged("b0", metrics=BackendMetrics(preemptions_total=5), now=5))
    assert core.backends["b0"].scale == pytest.approx(0.9)
    for t in range(10):
        core.handle(BackendChanged("b0", metrics=BackendMetrics(preemptions_total=5), now=10 + t))
    assert core.backends["b0"].scale == pytest.approx(1.0)


def test_a_backend_going_down_hands_its_idle_programs_back_and_they_move() -> None:
    core = make(capacities=(1000, 1000))
    home = run_step(core, "a", 300, 0)
    core.handle(BackendChanged(home, healthy=False, now=2))
    assert core.backends[home].reserved == 0
    decision = core.handle(RequestArrived(ctx("a"), info(320), 3)).decision
    assert isinstance(decision, Forward) and decision.backend != home


def test_capacity_is_rediscovered_after_a_restart() -> None:
    core = make()
    core.handle(BackendChanged("b0", capacity=5000, now=1))
    assert core.backends["b0"].capacity == 5000


def test_no_healthy_backend_rejects_at_once() -> None:
    core = make()
    core.handle(BackendChanged("b0", healthy=False, now=0))
    decision = core.handle(RequestArrived(ctx("a"), info(10), 1)).decision
    assert isinstance(decision, Reject) and decision.status == 503


# ------------------------------------------------------------------ baselines and pipeline
def test_round_robin_spreads_one_programs_requests_over_backends() -> None:
    core = make(capacities=(1000, 1000), policies=[{"round_robin": {}}])
    seen = set()
    for t in range(4):
        decision = core.handle(RequestArrived(ctx("a"), info(10), t)).decision
        assert isinstance(decision, Forward)
        seen.add(decision.backend)
        core.handle(CallFinished("a", Usage(10, 1), True, t + 0.5))
    assert seen == {"b0", "b1"}


def test_sticky_keeps_a_program_home_and_never_holds() -> None:
    core = make(capacities=(1000, 1000), policies=[{"sticky": {}}])
    homes = {run_step(core, "a", 500, t) for t in range(3)}
    assert len(homes) == 1
    for pid in ("b", "c", "d"):  # 500 + 3 x 800 tokens: far past both engines' room
        decision = core.handle(RequestArrived(ctx(pid), info(800), 5)).decision
        assert isinstance(decision, Forward) and decision.planned


def test_unknown_stage_params_are_errors_naming_the_location() -> None:
    with pytest.raises(PipelineError) as info_:
        build_pipeline([{"admission": {"high": 1}}, {"nope": {}}])
    assert info_.value.problems[0] == "policies[0].admission.high: unknown parameter"
    assert info_.value.problems[1].startswith("policies[1].nope: unknown stage")


def test_third_party_stage_by_import_path() -> None:
    stages = build_pipeline([{"thunder_mw.policies.stages:Sticky": {}}])
    assert stages[0].name == "sticky"


def test_a_program_idle_in_a_long_tool_yields_its_room_to_a_waiting_one() -> None:
    core = make(pause={"yield_idle_after_s": 5})
    run_step(core, "idle", 600, 0)
    run_step(core, "idle", 600, 31)  # its tool calls take ~30 s
    outcome = core.handle(RequestArrived(ctx("new"), info(500), 33))
    decision, actions = outcome.decision, outcome.actions
    assert decision == Forward("new", "b0")
    paused = of(actions, Paused)
    assert [(p.program_id, p.reason) for p in paused] == [("idle", "yield_to_queue")]


def test_a_program_about_to_return_from_its_tool_keeps_its_room() -> None:
    core = make(pause={"yield_idle_after_s": 5})
    run_step(core, "quick", 600, 0)
    run_step(core, "quick", 600, 2)  # its tool calls take ~1 s
    decision = core.handle(RequestArrived(ctx("new"), info(500), 3.5)).decision
    assert isinstance(decision, Hold)
    assert _program(core, "quick").state is ProgramState.ACTIVE


def test_programs_do_not_yield_when_yielding_is_off() -> None:
    core = make()
    run_step(core, "idle", 600, 0)
    run_step(core, "idle", 600, 31)
    decision = core.handle(RequestArrived(ctx("new"), info(500), 33)).decision
    assert isinstance(decision, Hold)


def test_a_pipeline_error_survives_pickling_as_its_problems() -> None:
    """`bench --jobs N` runs pipelines in worker processes: the error crosses back pickled."""
    import pickle

    with pytest.raises(PipelineError) as raised:
        build_pipeline([{"admission": {"overflow": "maybe"}}])
    again = pickle.loads(pickle.dumps(raised.value))
    assert again.problems == raised.value.problems and str(again) == str(raised.value)
