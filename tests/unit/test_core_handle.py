"""`SchedulerCore.handle(event) -> Outcome` is the one entry point: each event, one shape."""

from __future__ import annotations

from test_scheduler_core import _program, ctx, info, make

from thunder_mw.policies import (
    BackendAdded,
    BackendChanged,
    BackendDrained,
    BackendRemoved,
    CachesFlushed,
    CallFinished,
    ClientLeft,
    ConnectionRefused,
    DecisionsApplied,
    Event,
    ForeignReservations,
    HoldExpired,
    HostTierDeclared,
    Outcome,
    Pause,
    ProgramAdopted,
    ReleaseRequested,
    RequestArrived,
    TakenOver,
    Tick,
    Usage,
)
from thunder_mw.policies.core import Forward, Hold
from thunder_mw.policies.events import ProgramHistory


def test_a_request_answers_with_its_decision_and_the_actions() -> None:
    core = make((1000,))
    out = core.handle(RequestArrived(ctx("p"), info(100), 0.0))
    assert isinstance(out, Outcome)
    assert isinstance(out.decision, Forward) and out.decision.backend == "b0"
    # A new program is admitted by being placed: the caller is told it resumed there.
    assert [type(a).__name__ for a in out.actions] == ["Resumed"]


def test_a_request_that_does_not_fit_is_held() -> None:
    core = make((1000,))
    core.handle(RequestArrived(ctx("big"), info(900), 0.0))
    out = core.handle(RequestArrived(ctx("p"), info(500), 0.0))
    assert isinstance(out.decision, Hold)


def test_a_release_says_whether_the_program_was_known() -> None:
    core = make((1000,))
    assert core.handle(ReleaseRequested("nobody", "client", 0.0)).found is False
    core.handle(RequestArrived(ctx("p"), info(100), 0.0))
    core.handle(CallFinished("p", Usage(100, 10), True, 1.0))
    assert core.handle(ReleaseRequested("p", "client", 2.0)).found is True


def test_a_refused_connection_answers_with_the_new_backend() -> None:
    core = make((1000, 1000))
    first = core.handle(RequestArrived(ctx("p"), info(100), 0.0)).decision
    assert isinstance(first, Forward)
    out = core.handle(ConnectionRefused("p", first.backend, 0.5))
    assert out.backend is not None and out.backend != first.backend


def test_an_adopted_program_is_answered_with_its_view() -> None:
    core = make((1000,))
    history = ProgramHistory(steps=3, context_tokens=50, backend="b0")
    out = core.handle(ProgramAdopted(ctx("p"), history, 0.0))
    assert out.program is not None and out.program.program_id == "p"
    assert out.program.steps == 3


def test_every_event_type_has_a_handler_and_returns_an_outcome() -> None:
    core = make((1000, 1000))
    events: list[Event] = [
        RequestArrived(ctx("p"), info(100), 0.0),
        CallFinished("p", Usage(100, 10), True, 1.0),
        RequestArrived(ctx("q"), info(100), 1.0),
        ClientLeft("q", 1.5),
        HoldExpired("q", 1.6, place=False),
        Tick(2.0),
        BackendChanged("b1", 2.0, capacity=2000),
        ForeignReservations("b1", 100, 2.0),
        HostTierDeclared("b0", 1000, 1e5),
        BackendAdded("b2", 1000, 2.0),
        BackendDrained("b2", 2.0),
        BackendRemoved("b2", 2.0),
        CachesFlushed(2.0, ("b0",)),
        ProgramAdopted(ctx("r"), ProgramHistory(backend="b1"), 2.0),
        TakenOver("r", "b1", 0, 2.0),
    ]
    for event in events:
        assert isinstance(core.handle(event), Outcome), event
    for event in (
        DecisionsApplied([Pause(_program(core, "p"), "operator")], 3.0),
        ReleaseRequested("p", "client", 4.0),
    ):
        assert isinstance(core.handle(event), Outcome), event


def test_the_same_events_through_handle_decide_the_same_on_two_cores() -> None:
    """Bit for bit: `handle` is the only way in (the `_on_*` methods behind it are private),
    and two cores told the same events decide the same (no state outside the core)."""
    a, b = make((1000,)), make((1000,))
    for i in range(4):
        oa = a.handle(RequestArrived(ctx(f"p{i}"), info(400), float(i)))
        ob = b.handle(RequestArrived(ctx(f"p{i}"), info(400), float(i)))
        assert (oa.decision, oa.actions) == (ob.decision, ob.actions)
    for i in range(4):
        aa = a.handle(CallFinished(f"p{i}", Usage(400, 10), True, 10.0 + i)).actions
        ob = b.handle(CallFinished(f"p{i}", Usage(400, 10), True, 10.0 + i))
        assert aa == ob.actions
    assert a.handle(Tick(20.0)).actions == b.handle(Tick(20.0)).actions


def test_the_event_methods_behind_handle_are_private() -> None:
    core = make((1000,))
    public = {name for name in dir(core) if name.startswith("on_")}
    assert public == set()
    commands = {"add_backend", "drain_backend", "remove_backend", "declare_host_tier"}
    commands |= {"mark_cache_cold", "reroute", "apply"}
    assert commands.isdisjoint(dir(core))
