"""Tier-aware placement (migration `tier_aware`): a paused program whose home engine has a
host KV tier waits for that engine unless a move pays after a full recompute
(policies/stages.py `Migration`, policies/overflow_cost.py `move_pays`). Pure: the core with
the clock passed in, learned costs set on the admission stage as it would learn them."""

from __future__ import annotations

from typing import Any

import pytest
from test_scheduler_core import _program, ctx, info, make, of, run_step

from thunder_mw.policies import (
    DecisionsApplied,
    HostTierDeclared,
    ReleaseRequested,
    RequestArrived,
    Tick,
)
from thunder_mw.policies.core import Forward, Hold, Resumed, SchedulerCore
from thunder_mw.policies.decisions import Pause
from thunder_mw.policies.overflow_cost import EngineCosts, move_pays
from thunder_mw.policies.stages import Admission

TIER_TOKENS = 50_000
LOAD_TOKENS_PER_S = 1e6  # the host link: 1 us per token reloaded


def _core(tier: bool = True, **migration: Any) -> SchedulerCore:
    core = make(capacities=(1000, 1000), migration={"tier_aware": True, **migration})
    if tier:
        core.handle(HostTierDeclared("b0", TIER_TOKENS, LOAD_TOKENS_PER_S))
    return core


def _learned(core: SchedulerCore, **costs: float) -> None:
    """Both engines' costs as the admission stage would have learned them."""
    admission = next(s for s in core.stages if isinstance(s, Admission))
    for label in core.backends:
        admission.costs[label] = EngineCosts(**costs)  # type: ignore[arg-type]


def _paused_behind_a_filler(core: SchedulerCore) -> None:
    """Program `a` (610 tokens of context) paused on b0, whose room a filler then takes."""
    assert run_step(core, "a", 600, 0) == "b0"
    core.handle(DecisionsApplied([Pause(_program(core, "a"))], 1))
    assert core.handle(RequestArrived(ctx("filler"), info(800), 2)).decision == Forward(
        "filler", "b0"
    )


def test_with_a_tier_at_home_and_no_price_learned_the_program_waits_for_home() -> None:
    core = _core()
    _paused_behind_a_filler(core)
    decision = core.handle(RequestArrived(ctx("a"), info(620), 3)).decision
    assert isinstance(decision, Hold)  # b1 is empty, but nothing shows a move pays
    actions = core.handle(ReleaseRequested("filler", "release", 4)).actions
    resumed = of(actions, Resumed)
    assert [(r.program_id, r.backend, r.migrated) for r in resumed] == [("a", "b0", False)]
    assert _program(core, "a").migrations == 0


def test_a_move_pays_when_the_wait_for_home_exceeds_the_recompute_elsewhere() -> None:
    # Recompute on b1: 610 tokens x 1 ms x a batch of 1 = 0.61 s, against a 10 s hold.
    core = _core()
    _learned(core, prefill_s_per_token=1e-3, hold_s=10.0)
    _paused_behind_a_filler(core)
    outcome = core.handle(RequestArrived(ctx("a"), info(620), 3))
    decision, actions = outcome.decision, outcome.actions
    assert decision == Forward("a", "b1") and of(actions, Resumed)[0].migrated


def test_the_program_waits_when_the_recompute_costs_more_than_the_wait() -> None:
    # The same move against a 0.1 s hold (and a 0.6 ms reload): waiting for home is cheaper.
    core = _core()
    _learned(core, prefill_s_per_token=1e-3, hold_s=0.1)
    _paused_behind_a_filler(core)
    assert isinstance(core.handle(RequestArrived(ctx("a"), info(620), 3)).decision, Hold)


def test_until_a_hold_is_seen_the_wait_is_one_cycle_of_the_program() -> None:
    # No hold learned: the program's expected tool time plus a call (the tool-time model's
    # prior, far above the 0.61 s recompute), so the move pays.
    core = _core()
    _learned(core, prefill_s_per_token=1e-3)
    _paused_behind_a_filler(core)
    assert core.handle(RequestArrived(ctx("a"), info(620), 3)).decision == Forward("a", "b1")


def test_without_a_tier_at_home_placement_is_the_default_one() -> None:
    # Nothing keeps the context at home: a move costs nothing staying would not.
    core = _core(tier=False)
    _paused_behind_a_filler(core)
    assert core.handle(RequestArrived(ctx("a"), info(620), 3)).decision == Forward("a", "b1")


@pytest.mark.parametrize(("price", "backend"), [
    (None, "b0"),  # no price: nothing shows a move pays, forced onto home past its room
    (1e-3, "b1"),  # 0.61 s of recompute against the 101 s it has waited: moved
    (1.0, "b0"),  # 610 s of recompute: home
])  # fmt: skip
def test_the_forced_resume_applies_the_same_rule(price: float | None, backend: str) -> None:
    core = _core(resume_timeout_s=100)
    if price is not None:
        _learned(core, prefill_s_per_token=price, hold_s=0.1)
    _paused_behind_a_filler(core)
    # on b1
    assert isinstance(core.handle(RequestArrived(ctx("hog"), info(300), 2)).decision, Forward)
    # b1 admits a, but the 0.1 s hold keeps it waiting for home until it is overdue.
    assert isinstance(core.handle(RequestArrived(ctx("a"), info(620), 3)).decision, Hold)
    resumed = of(core.handle(Tick(104)).actions, Resumed)
    assert [(r.program_id, r.backend, r.forced) for r in resumed] == [("a", backend, True)]


def test_move_pays_charges_a_full_recompute_against_the_wait_and_the_reload() -> None:
    # stay = wait + C r B_home; move = C p B_target.
    assert move_pays(1000, 5.0, 1e-3, 4, 0.0, 1)  # 5 s > 4 s
    assert not move_pays(1000, 3.0, 1e-3, 4, 0.0, 1)  # 3 s < 4 s
    assert move_pays(1000, 3.0, 1e-3, 4, 2e-4, 10)  # 3 + 2 s of reload stall > 4 s: move
    assert not move_pays(1000, 0.0, 1e-3, 0, 0.0, 0)  # empty batches count one sequence


def test_a_program_waiting_for_home_holds_up_nobody_who_fits_elsewhere() -> None:
    # The queue's head waits for b0; a new program behind it goes to b1 at once (the
    # strict queue would have held it too), and the head does not take b1's room from it.
    core = _core()
    _learned(core, prefill_s_per_token=1e-3, hold_s=10.0)  # a move would pay...
    _paused_behind_a_filler(core)
    # ...alone, it moves
    assert isinstance(core.handle(RequestArrived(ctx("a"), info(620), 3)).decision, Forward)
    core = _core()
    _learned(core, prefill_s_per_token=1e-3, hold_s=10.0)
    _paused_behind_a_filler(core)
    assert core.handle(RequestArrived(ctx("hog"), info(500), 2)).decision == Forward("hog", "b1")
    # b1: 510 + 630 > 1000
    assert isinstance(core.handle(RequestArrived(ctx("a"), info(620), 3)).decision, Hold)
    # Behind a in the queue (programs under way first, where there is a tier): held at
    # once, placed past a at the next pass that can (the next tick at the latest: a
    # request adds no room, and the queue is not looked at again for it).
    assert isinstance(core.handle(RequestArrived(ctx("new"), info(300), 4)).decision, Hold)
    resumed = of(core.handle(Tick(5)).actions, Resumed)
    assert [(r.program_id, r.backend) for r in resumed] == [("new", "b1")]
    assert _program(core, "a").backend == "b0" and _program(core, "a").migrations == 0


def test_nobody_passes_a_program_waiting_for_home_on_that_home() -> None:
    # b and a both wait for b0; b, behind a in the queue, fits there first (it is smaller)
    # but waits: the engine a waits for is closed to those behind it.
    core = _core()
    assert run_step(core, "a", 600, 0) == "b0"
    assert run_step(core, "hog", 600, 0) == "b1"
    assert run_step(core, "b", 100, 0) == "b0"  # as much room on each: the first
    core.handle(DecisionsApplied([Pause(_program(core, "a")), Pause(_program(core, "b"))], 1))
    assert core.handle(RequestArrived(ctx("filler"), info(700), 2)).decision == Forward(
        "filler", "b0"
    )
    assert isinstance(core.handle(RequestArrived(ctx("a"), info(620), 3)).decision, Hold)
    # 710 + 130 fits b0
    assert isinstance(core.handle(RequestArrived(ctx("b"), info(120), 4)).decision, Hold)
    actions = core.handle(ReleaseRequested("filler", "release", 5)).actions
    assert [(r.program_id, r.backend) for r in of(actions, Resumed)] == [("a", "b0"), ("b", "b0")]
