"""The engine's own KV gauge corrects the scheduler's accounting (policies/resident.py)."""

from __future__ import annotations

import random

import pytest

from thunder_mw.policies import BackendChanged, CallFinished, ReleaseRequested, RequestArrived, Tick
from thunder_mw.policies.core import BackendMetrics, Forward, Hold, RequestInfo, SchedulerCore
from thunder_mw.policies.pipeline import PipelineError, build_pipeline
from thunder_mw.policies.program_table import ProgramState, Usage
from thunder_mw.policies.resident import resident_ratio
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention

CHARS_PER_TOKEN = 4


def ctx(pid: str) -> AgentContext:
    return AgentContext(program_id=pid, source=Convention.THUNDERAGENT)


def info(tokens: int, out: int = 10) -> RequestInfo:
    return RequestInfo(prompt_chars=(tokens - 1) * CHARS_PER_TOKEN, max_tokens=out)


def make(floor: float | None, capacities: tuple[int, ...] = (10_000,)) -> SchedulerCore:
    stages = build_pipeline(
        [
            {
                "admission": {
                    "high_watermark": 1.0,
                    "low_watermark": 0.8,
                    "buffer_tokens_per_program": 0,
                    "resident_floor": floor,
                    "overflow": "hold",
                }
            },
            {"state_aware_pause": {"acting_token_weight": 1.0, "yield_idle_after_s": None}},
            {"migration": {}},
        ]
    )
    labels = [(f"b{i}", c) for i, c in enumerate(capacities)]
    return SchedulerCore(labels, stages, chars_per_token=CHARS_PER_TOKEN)


def test_the_ratio_is_bounded_smoothed_and_needs_evidence() -> None:
    # The engine holds 2,000 of 8,000 reserved tokens: 0.25, floored at 0.5.
    assert resident_ratio(1.0, 0.2, 10_000, 8_000, floor=0.5) == 0.85  # one EMA step
    ratio = 1.0
    for _ in range(50):
        ratio = resident_ratio(ratio, 0.2, 10_000, 8_000, floor=0.5)
    assert ratio == pytest.approx(0.5)
    # Never inflates: the engine holding more than reserved leaves the reservations alone.
    assert resident_ratio(1.0, 1.0, 10_000, 2_000, floor=0.5) == 1.0
    # No gauge, no capacity, or too little reserved to judge: unchanged.
    assert resident_ratio(0.7, None, 10_000, 8_000, floor=0.5) == 0.7
    assert resident_ratio(0.7, 0.1, None, 8_000, floor=0.5) == 0.7
    assert resident_ratio(0.7, 0.0, 10_000, 100, floor=0.5) == 0.7


def scrape(core: SchedulerCore, usage: float, now: float, times: int = 30) -> None:
    for i in range(times):  # each a new scrape
        core.handle(BackendChanged("b0", metrics=BackendMetrics(kv_usage=usage), now=now + i))


def test_an_engine_holding_less_than_reserved_lets_more_programs_in() -> None:
    for floor, expect in ((None, Hold), (0.5, Forward)):
        core = make(floor)
        for pid in "abcd":  # 4 x 2,400 = 9,600 of 10,000 reserved, all reasoning
            decision = core.handle(RequestArrived(ctx(pid), info(2390), 0.0)).decision
            assert isinstance(decision, Forward)
        # The engine says 50 % is in use: 5,000 of the 9,600 reserved.
        scrape(core, 0.5, 1.0)
        decision = core.handle(RequestArrived(ctx("e"), info(2390), 2.0)).decision
        assert isinstance(decision, expect), floor


def test_the_correction_never_goes_below_its_floor() -> None:
    core = make(0.9)
    for pid in "abcd":
        core.handle(RequestArrived(ctx(pid), info(2390), 0.0))
    scrape(core, 0.0, 1.0)  # an engine that claims to hold nothing
    assert core.backends["b0"].resident_ratio == pytest.approx(0.9, abs=1e-3)
    assert core.backends["b0"].unused == pytest.approx(960, abs=2)
    decision = core.handle(RequestArrived(ctx("e"), info(2390), 2.0)).decision
    assert isinstance(decision, Hold)  # 9,600 - 960 + 2,400 > 10,000


def test_running_reservations_are_kept_exactly_through_any_events() -> None:
    rng = random.Random(7)
    core = make(0.5, capacities=(6_000, 6_000))
    now = 0.0
    pids = [f"p{i}" for i in range(12)]
    for _ in range(2_000):
        now += rng.random()
        pid = rng.choice(pids)
        op = rng.random()
        program = core.table.get(pid)
        if op < 0.45:
            core.handle(RequestArrived(ctx(pid), info(rng.randint(100, 2000)), now))
        elif op < 0.85 and program is not None and program.in_flight:
            usage = Usage(rng.randint(100, 2000), rng.randint(1, 200), 0)
            core.handle(CallFinished(pid, usage, rng.random() < 0.9, now))
        elif op < 0.9:
            core.handle(ReleaseRequested(pid, "release", now))
        elif op < 0.95:
            core.handle(Tick(now))
        else:
            core.handle(
                BackendChanged(
                    rng.choice(["b0", "b1"]), metrics=BackendMetrics(kv_usage=rng.random()), now=now
                )
            )
        for label, backend in core.backends.items():
            running = sum(
                p.reserved_tokens
                for p in core.table
                if p.backend == label and p.state is ProgramState.ACTIVE and p.in_flight > 0
            )
            assert backend.running_reserved == running
            assert 0.5 <= backend.resident_ratio <= 1.0


def test_the_floor_is_validated() -> None:
    with pytest.raises(PipelineError, match=r"admission\.resident_floor"):
        build_pipeline([{"admission": {"resident_floor": 0.1}}])
