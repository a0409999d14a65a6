"""Specification of the scheduler core's run-time fleet: engines that join, drain and leave,
and caches that go cold when weights are updated (pure, simulated clock)."""

from __future__ import annotations

import pytest
from test_scheduler_core import _program, ctx, info, make, of, run_step

from thunder_mw.policies import (
    BackendAdded,
    BackendChanged,
    BackendDrained,
    BackendRemoved,
    CachesFlushed,
    CallFinished,
    RequestArrived,
    Tick,
)
from thunder_mw.policies.core import BackendMetrics, Forward, Hold, Reject, Resumed
from thunder_mw.policies.program_table import ProgramState, Usage

# ------------------------------------------------------------------ adding


def test_an_added_backend_takes_the_held_programs_at_once() -> None:
    core = make(capacities=(1000,))
    run_step(core, "a", 900, 0)
    decision = core.handle(RequestArrived(ctx("b"), info(500), 2.0)).decision
    assert isinstance(decision, Hold)
    actions = core.handle(BackendAdded("b1", 1000, 3.0)).actions
    assert [(r.program_id, r.backend) for r in of(actions, Resumed)] == [("b", "b1")]
    assert core.backends["b1"].reserved > 0


def test_a_new_program_goes_to_the_added_backend_when_it_is_emptier() -> None:
    core = make(capacities=(1000,))
    run_step(core, "a", 300, 0)
    core.handle(BackendAdded("b1", 1000, 1.0))
    assert run_step(core, "b", 100, 2.0) == "b1"


def test_adding_a_backend_twice_is_refused() -> None:
    core = make(capacities=(1000,))
    with pytest.raises(ValueError, match="b0"):
        core.handle(BackendAdded("b0", 1000, 0.0))


def test_an_added_backend_that_is_not_healthy_admits_nothing_until_a_probe_says_so() -> None:
    core = make(capacities=(100,))
    run_step(core, "a", 90, 0)
    core.handle(BackendAdded("b1", 1000, 1.0, healthy=False))
    decision = core.handle(RequestArrived(ctx("b"), info(500), 2.0)).decision
    assert isinstance(decision, Hold)
    actions = core.handle(BackendChanged("b1", healthy=True, now=3.0)).actions
    assert [r.backend for r in of(actions, Resumed)] == ["b1"]


# ------------------------------------------------------------------ draining
def test_a_draining_backend_admits_no_new_program() -> None:
    core = make(capacities=(1000, 1000))
    core.handle(BackendDrained("b0", 0.0))
    for i in range(4):
        assert run_step(core, f"p{i}", 100, float(i)) == "b1"


def test_draining_moves_idle_programs_off_at_once_and_their_next_request_elsewhere() -> None:
    core = make(capacities=(1000, 1000))
    core.handle(BackendChanged("b1", healthy=False, now=0.0))
    run_step(core, "idle", 200, 0)
    core.handle(BackendChanged("b1", healthy=True, now=1.0))
    core.handle(BackendDrained("b0", 2.0))
    assert core.backends["b0"].reserved == 0 and core.drained("b0")
    decision = core.handle(RequestArrived(ctx("idle"), info(300), 3.0)).decision
    assert decision == Forward("idle", "b1")
    assert _program(core, "idle").migrations == 1


def test_a_program_reasoning_on_a_draining_backend_finishes_there_then_leaves_it() -> None:
    core = make(capacities=(1000, 1000))
    core.handle(BackendChanged("b1", healthy=False, now=0.0))
    decision = core.handle(RequestArrived(ctx("busy"), info(200), 0.0)).decision
    assert decision == Forward("busy", "b0")
    core.handle(BackendChanged("b1", healthy=True, now=1.0))
    core.handle(BackendDrained("b0", 2.0))
    program = _program(core, "busy")
    assert program.state is ProgramState.ACTIVE and not core.drained("b0")
    core.handle(CallFinished("busy", Usage(200, 10), True, 3.0))
    assert core.drained("b0") and core.backends["b0"].reserved == 0
    assert program.steps == 1  # its call was answered, not lost
    decision = core.handle(RequestArrived(ctx("busy"), info(250), 4.0)).decision
    assert decision == Forward("busy", "b1")


def test_paused_programs_homed_on_a_draining_backend_resume_elsewhere() -> None:
    core = make(capacities=(1000, 1000))
    core.handle(BackendChanged("b1", healthy=False, now=0.0))
    run_step(core, "big", 700, 0)
    run_step(core, "small", 250, 0)
    # grows: "big" paused
    decision = core.handle(RequestArrived(ctx("small"), info(500), 2.0)).decision
    assert isinstance(decision, Forward)
    assert _program(core, "big").state is ProgramState.PAUSED
    decision = core.handle(RequestArrived(ctx("big"), info(750), 3.0)).decision
    assert isinstance(decision, Hold)  # waits in the queue for room on its home
    core.handle(BackendChanged("b1", healthy=True, now=4.0))  # (b1 back: big may go there or stay)
    core.handle(BackendDrained("b0", 5.0))
    program = _program(core, "big")
    assert program.state is ProgramState.ACTIVE and program.backend == "b1"


def test_probes_do_not_bring_a_draining_backend_back() -> None:
    core = make(capacities=(1000, 1000))
    core.handle(BackendDrained("b0", 0.0))
    core.handle(BackendChanged("b0", healthy=True, capacity=1000, now=1.0))
    assert not core.backends["b0"].healthy
    assert run_step(core, "a", 100, 2.0) == "b1"


def test_draining_the_last_backend_holds_programs_until_another_joins() -> None:
    core = make(capacities=(1000,))
    core.handle(BackendDrained("b0", 0.0))
    decision = core.handle(RequestArrived(ctx("a"), info(100), 1.0)).decision
    assert isinstance(decision, Reject)
    assert decision.status == 503  # no backend at all: fail fast, as when all are down
    core.handle(BackendAdded("b1", 1000, 2.0))
    assert run_step(core, "a", 100, 3.0) == "b1"


# ------------------------------------------------------------------ removing
def test_removing_a_backend_forgets_it_and_unplaces_what_was_left_on_it() -> None:
    core = make(capacities=(1000, 1000))
    core.handle(BackendChanged("b1", healthy=False, now=0.0))
    decision = core.handle(RequestArrived(ctx("busy"), info(200), 0.0)).decision
    assert isinstance(decision, Forward)
    assert decision.backend == "b0"
    core.handle(BackendChanged("b1", healthy=True, now=1.0))
    core.handle(BackendRemoved("b0", 2.0))
    assert "b0" not in core.backends
    program = _program(core, "busy")
    assert program.state is ProgramState.PAUSED
    # Its call still ends normally (answered by the engine that left), and nothing breaks.
    core.handle(CallFinished("busy", Usage(200, 10), True, 3.0))
    assert program.steps == 1
    assert run_step(core, "busy", 300, 4.0) == "b1"
    core.handle(Tick(5.0))


def test_removing_an_unknown_backend_is_a_no_op() -> None:
    core = make(capacities=(1000,))
    assert core.handle(BackendRemoved("nope", 0.0)).actions == []
    assert core.handle(BackendDrained("nope", 0.0)).actions == []


# ------------------------------------------------------------------ cold caches
def test_marking_caches_cold_restarts_the_expected_hit_rate() -> None:
    core = make(capacities=(1000,))
    core.handle(
        BackendChanged(
            "b0", metrics=BackendMetrics(prefix_hits_total=80, prefix_queries_total=100), now=0
        )
    )
    assert core.backends["b0"].prefix_hit_rate() == pytest.approx(0.8)
    core.handle(CachesFlushed(1.0))
    backend = core.backends["b0"]
    assert backend.cold_since == 1.0 and backend.prefix_hit_rate() is None
    core.handle(
        BackendChanged(
            "b0", metrics=BackendMetrics(prefix_hits_total=90, prefix_queries_total=200), now=2
        )
    )
    assert backend.prefix_hit_rate() == pytest.approx(0.1)
    assert core.counters["cache_flushes"] == 1


def test_an_engine_restart_after_a_flush_resets_the_baselines() -> None:
    core = make(capacities=(1000,))
    core.handle(
        BackendChanged(
            "b0", metrics=BackendMetrics(prefix_hits_total=80, prefix_queries_total=100), now=0
        )
    )
    core.handle(CachesFlushed(1.0))
    core.handle(
        BackendChanged(
            "b0", metrics=BackendMetrics(prefix_hits_total=5, prefix_queries_total=10), now=2
        )
    )
    assert core.backends["b0"].prefix_hit_rate() == pytest.approx(0.5)


def test_cold_caches_drop_paused_programs_home_preference() -> None:
    core = make(capacities=(1000, 1000))
    core.handle(BackendChanged("b1", healthy=False, now=0.0))
    run_step(core, "big", 700, 0)
    run_step(core, "small", 250, 0)
    core.handle(RequestArrived(ctx("small"), info(500), 2.0))
    big = _program(core, "big")
    assert big.state is ProgramState.PAUSED and big.backend == "b0"
    core.handle(BackendChanged("b1", healthy=True, now=3.0))
    core.handle(CachesFlushed(4.0))
    assert big.backend is None
    outcome = core.handle(RequestArrived(ctx("big"), info(750), 5.0))
    decision, actions = outcome.decision, outcome.actions
    assert isinstance(decision, Forward)
    assert not of(actions, Resumed)[0].migrated  # nothing was resident to migrate


def test_cold_caches_keep_placed_programs_where_they_are() -> None:
    core = make(capacities=(1000,))
    run_step(core, "a", 300, 0)
    core.handle(CachesFlushed(1.0))
    program = _program(core, "a")
    assert program.state is ProgramState.ACTIVE and program.backend == "b0"
    assert core.backends["b0"].reserved == program.reserved_tokens
