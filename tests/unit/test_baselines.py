"""Specification of the baseline stages users run (policies/baselines.py), in the pure core."""

from __future__ import annotations

from typing import Any, TypeVar

import pytest

from thunder_mw.policies import (
    BackendChanged,
    CallFinished,
    ProgramView,
    ReleaseRequested,
    RequestArrived,
    Stage,
    StageView,
    Tick,
)
from thunder_mw.policies.baselines import KvAware, ProgressTtl, SessionAffinity
from thunder_mw.policies.core import (
    Action,
    Forward,
    Hold,
    Paused,
    RequestInfo,
    Resumed,
    SchedulerCore,
)
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.program_table import Usage
from thunder_mw.policies.stages import StageParams
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention

CHARS_PER_TOKEN = 4
S = TypeVar("S", bound=Stage)
A = TypeVar("A")


def ctx(pid: str, **kw: Any) -> AgentContext:
    return AgentContext(program_id=pid, source=Convention.THUNDERAGENT, **kw)


def info(tokens: int, out: int = 10) -> RequestInfo:
    return RequestInfo(prompt_chars=(tokens - 1) * CHARS_PER_TOKEN, max_tokens=out)


def make(
    policies: list[dict[str, Any]], capacities: tuple[int, ...] = (100_000, 100_000)
) -> SchedulerCore:
    labels = [(f"b{i}", c) for i, c in enumerate(capacities)]
    return SchedulerCore(labels, build_pipeline(policies), chars_per_token=CHARS_PER_TOKEN)


def send(
    core: SchedulerCore, pid: str, tokens: int, now: float, out: int = 10, **kw: Any
) -> tuple[Forward, list[Action]]:
    outcome = core.handle(RequestArrived(ctx(pid, **kw), info(tokens, out), now))
    decision, actions = outcome.decision, outcome.actions
    assert isinstance(decision, Forward), decision
    return decision, actions


def answer(core: SchedulerCore, pid: str, tokens: int, now: float, out: int = 10) -> list[Action]:
    return core.handle(CallFinished(pid, Usage(tokens, out), True, now)).actions


def stage(core: SchedulerCore, cls: type[S]) -> S:
    return next(s for s in core.stages if isinstance(s, cls))


# ------------------------------------------------------------------ the core's routing hook
class _SeesFootprint(Stage):
    name = "sees_footprint"

    def __init__(self, params: StageParams | None = None) -> None:
        super().__init__(params)
        self.seen: list[int] = []

    def route(self, view: StageView, program: ProgramView, now: float) -> str | None:
        self.seen.append(program.request_tokens)
        return None


def test_a_route_hook_sees_the_arriving_requests_footprint() -> None:
    probe = _SeesFootprint()
    core = SchedulerCore([("b0", 100_000)], [probe], chars_per_token=CHARS_PER_TOKEN)
    send(core, "a", 100, 0, out=10)
    answer(core, "a", 100, 1)
    send(core, "a", 3000, 2, out=50)  # per request: the footprint of THIS request
    program = core.table.get("a")
    assert program is not None
    assert probe.seen == [program.request_tokens] and program.request_tokens >= 3050


# ------------------------------------------------------------------ kv_aware
def test_kv_aware_sends_a_request_to_the_engine_holding_its_prefix() -> None:
    core = make([{"kv_aware": {}}])
    home = send(core, "a", 8000, 0)[0].backend
    answer(core, "a", 8000, 1)
    other = "b1" if home == "b0" else "b0"
    send(core, "busy", 1000, 1)  # some load elsewhere, less than a's context
    decision, _ = send(core, "a", 8500, 2)
    assert decision.backend == home != other


def test_kv_aware_moves_a_request_off_its_home_when_the_load_there_outweighs_the_prefix() -> None:
    core = make([{"kv_aware": {}}])
    assert send(core, "a", 2000, 0)[0].backend == "b0"
    answer(core, "a", 2000, 1)
    # Long requests in flight on a's home (b1 was down when they came), more than its prefix.
    core.handle(BackendChanged("b1", healthy=False, now=1.2))
    for i in range(3):
        send(core, f"hog{i}", 20_000, 1.5)
    core.handle(BackendChanged("b1", healthy=True, now=1.8))
    kv = stage(core, KvAware)
    assert kv.active_tokens("b0") > 2000 and kv.active_tokens("b1") == 0
    assert send(core, "a", 2100, 2)[0].backend == "b1"


def test_kv_aware_places_a_new_program_on_the_least_loaded_engine() -> None:
    core = make([{"kv_aware": {}}])
    first = send(core, "a", 5000, 0)[0].backend
    second = send(core, "b", 5000, 0.1)[0].backend
    assert first != second


def test_kv_aware_never_holds_a_request_whatever_the_load() -> None:
    core = make([{"kv_aware": {}}], capacities=(1000, 1000))
    for i in range(10):
        decision = core.handle(RequestArrived(ctx(f"p{i}"), info(900), i)).decision
        assert isinstance(decision, Forward)


def test_kv_aware_index_forgets_the_least_recently_routed_prefix_past_capacity() -> None:
    core = make([{"kv_aware": {}}], capacities=(10_000,))
    send(core, "old", 6000, 0)
    answer(core, "old", 6000, 1)
    send(core, "new", 6000, 2)
    kv = stage(core, KvAware)
    assert kv.overlap("b0", "old") == 0 and kv.overlap("b0", "new") > 0


def test_kv_aware_forgets_a_released_program() -> None:
    core = make([{"kv_aware": {}}])
    backend = send(core, "a", 3000, 0)[0].backend
    answer(core, "a", 3000, 1)
    core.handle(ReleaseRequested("a", "release", 2))
    kv = stage(core, KvAware)
    assert kv.overlap(backend, "a") == 0 and kv.active_tokens(backend) == 0


# ------------------------------------------------------------------ session_affinity
def test_session_affinity_keeps_every_request_of_a_program_on_one_engine() -> None:
    core = make([{"session_affinity": {}}], capacities=(1000, 1000, 1000))
    for pid in ("a", "b", "c", "d"):
        homes = set()
        for t in range(3):
            homes.add(send(core, pid, 100, t)[0].backend)
            answer(core, pid, 100, t + 0.5)
        assert len(homes) == 1


def test_session_affinity_moves_only_the_programs_of_a_lost_engine() -> None:
    labels = ["b0", "b1", "b2", "b3"]
    before = {f"p{i}": SessionAffinity.pick(f"p{i}", labels) for i in range(200)}
    after = {p: SessionAffinity.pick(p, ["b0", "b1", "b3"]) for p in before}
    moved = {p for p in before if before[p] != after[p]}
    assert moved == {p for p in before if before[p] == "b2"}
    assert len({*before.values()}) == 4  # it spreads programs over every engine


# ------------------------------------------------------------------ direct (vllm)
def test_direct_sends_every_request_to_one_engine() -> None:
    core = make([{"direct": {}}], capacities=(100, 100))
    for i in range(5):
        assert send(core, f"p{i}", 500, i)[0].backend == "b0"


# ------------------------------------------------------------------ continuum_ttl
def test_continuum_asks_the_engine_to_pin_for_a_multiple_of_the_expected_tool_time() -> None:
    core = make([{"session_affinity": {}}, {"continuum_ttl": {"ttl_multiplier": 2.0}}])
    send(core, "a", 100, 0)
    answer(core, "a", 100, 1)
    decision, _ = send(core, "a", 200, 4)  # a 3-second tool gap observed
    answer(core, "a", 200, 5)
    decision, _ = send(core, "a", 300, 8)
    program = core.table.get("a")
    assert program is not None
    assert decision.kv_ttl_s == pytest.approx(2.0 * core.expected_tool_time(program))
    assert decision.kv_ttl_s is not None
    assert 5.0 < decision.kv_ttl_s <= 6.0


def test_continuum_does_not_pin_for_a_tool_expected_to_outlast_its_cap() -> None:
    core = make([{"session_affinity": {}}, {"continuum_ttl": {"max_ttl_s": 10}}])
    send(core, "a", 100, 0)
    answer(core, "a", 100, 1)
    decision, _ = send(core, "a", 200, 100)  # a 99-second tool
    assert decision.kv_ttl_s == 0.0


def test_without_a_ttl_stage_requests_carry_no_ttl() -> None:
    core = make([{"session_affinity": {}}])
    assert send(core, "a", 100, 0)[0].kv_ttl_s is None


# ------------------------------------------------------------------ vllm_router_program
def ttl_core(capacity: int = 10_000, **params: Any) -> SchedulerCore:
    policies: list[dict[str, Any]] = [
        {
            "admission": {
                "buffer_tokens_per_program": 0,
                "overflow": "hold",
                "fill_idle_engine": False,
            }
        },
        {"progress_ttl": {"max_acting_ttl_s": 20, "min_samples": 2, **params}},
        {"migration": {}},
    ]
    return make(policies, capacities=(capacity,))


def test_progress_ttl_pauses_a_program_still_acting_when_its_ttl_expires() -> None:
    core = ttl_core()
    send(core, "a", 1000, 0)
    answer(core, "a", 1000, 1)  # TTL armed: the cap (no returns observed yet), 20 s
    assert not of(core.handle(Tick(15)).actions, Paused)
    paused = of(core.handle(Tick(21.5)).actions, Paused)
    assert [p.program_id for p in paused] == ["a"] and paused[0].reason == "ttl_expired"
    assert core.backends["b0"].reserved == 0


def test_a_zero_ttl_pauses_the_program_as_its_call_ends_not_at_the_next_tick() -> None:
    core = ttl_core(capacity=2000, immature_ttl_s=0.0)
    send(core, "a", 1500, 0)
    decision = core.handle(RequestArrived(ctx("b"), info(1500), 0.5)).decision
    assert isinstance(decision, Hold)
    actions = answer(core, "a", 1500, 1)  # no tick in between: the answer itself frees a's room
    assert [(p.program_id, p.reason) for p in of(actions, Paused)] == [("a", "ttl_expired")]
    assert [r.program_id for r in of(actions, Resumed)] == ["b"]
    assert not of(core.handle(Tick(1.25)).actions, Paused)  # nothing left armed for the tick


def test_progress_ttl_leaves_a_program_that_returned_in_time() -> None:
    core = ttl_core()
    send(core, "a", 1000, 0)
    answer(core, "a", 1000, 1)
    send(core, "a", 1100, 10)
    assert not of(core.handle(Tick(25)).actions, Paused)


def test_progress_ttl_predicts_the_quantile_of_observed_returns() -> None:
    core = ttl_core(return_quantile=0.9, min_samples=5)
    ttl = stage(core, ProgressTtl)
    t = 0.0
    for gap in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10):
        send(core, "a", 100, t)
        answer(core, "a", 100, t + 1)
        t += 1 + gap
    send(core, "a", 100, t)  # ten returns observed: 1..10 s
    assert ttl.predicted_ttl(None) == 10  # their 90th percentile
    fresh = ttl_core().stages[1]
    assert isinstance(fresh, ProgressTtl)
    assert fresh.predicted_ttl(None) == 20  # no samples: the cap


def test_a_program_served_its_segment_yields_to_a_waiting_one() -> None:
    core = ttl_core(capacity=2000, max_segment_rounds=2)
    send(core, "a", 1500, 0)
    answer(core, "a", 1500, 1)
    decision = core.handle(RequestArrived(ctx("b"), info(1500), 1.5)).decision
    assert isinstance(decision, Hold)
    send(core, "a", 1500, 2)
    actions = answer(core, "a", 1500, 3)  # its second round: it yields, b runs
    assert [p.reason for p in of(actions, Paused)] == ["max_segment_yield"]
    assert [r.program_id for r in of(actions, Resumed)] == ["b"]


def gain_core() -> SchedulerCore:
    policies: list[dict[str, Any]] = [
        {
            "admission": {
                "buffer_tokens_per_program": 0,
                "overflow": "hold",
                "fill_idle_engine": False,
            }
        },
        {"progress_ttl": {"max_acting_ttl_s": 20}},
        {"batch_gain": {"prefill_intercept_s": 0.0, "prefill_s_per_1k_tokens": 0.1}},
        {"migration": {}},
    ]
    return make(policies, capacities=(10_000,))


def test_batch_gain_evicts_an_acting_program_early_when_the_wait_saved_outweighs_its_recompute() -> (  # noqa: E501 (the name says what it checks)
    None
):
    core = gain_core()
    send(core, "a", 4000, 0)
    answer(core, "a", 4000, 1)  # acting, TTL armed until t = 21
    outcome = core.handle(RequestArrived(ctx("b"), info(7000), 2))
    decision, actions = outcome.decision, outcome.actions  # saves ~19 s, costs 0.4 s
    assert isinstance(decision, Forward)
    assert [p.reason for p in of(actions, Paused)] == ["batch_gain_admit"]


def test_batch_gain_keeps_an_acting_program_whose_ttl_is_about_to_free_the_room() -> None:
    core = gain_core()
    send(core, "a", 9000, 0)
    answer(core, "a", 9000, 1)  # TTL until t = 21; its recompute would cost 0.9 s
    outcome = core.handle(RequestArrived(ctx("b"), info(7000), 20.5))
    decision, actions = outcome.decision, outcome.actions
    assert isinstance(decision, Hold) and not of(actions, Paused)
    resumed = of(core.handle(Tick(21.5)).actions, Resumed)  # the TTL frees the room
    assert [r.program_id for r in resumed] == ["b"]


def test_the_vllm_router_program_preset_builds_at_the_documented_defaults() -> None:
    core = make([{"vllm_router_program": {}}])
    names = [s.name for s in core.stages]
    assert names == [
        "admission",
        "program_gate",
        "progress_ttl",
        "state_aware_pause",
        "program_binding",
        "migration",
    ]
    stages: dict[str, Any] = {s.name: s.params for s in core.stages}  # each its own Params
    assert (stages["admission"].high_watermark, stages["admission"].low_watermark) == (1.0, 1.0)
    assert stages["admission"].buffer_tokens_per_program == 100
    assert stages["program_gate"].max_active_programs_per_target == 64
    assert stages["program_gate"].waiting_request_threshold == 1
    ttl = stages["progress_ttl"]
    assert (ttl.max_acting_ttl_s, ttl.max_segment_rounds, ttl.min_samples) == (10.0, 14, 100)
    assert stages["migration"].placement == "mru"
    assert not stages["state_aware_pause"].pause_acting
    old = make([{"vllm_router_program/binary-reading": {}}])
    assert "batch_gain" in [s.name for s in old.stages]


def router(capacities: tuple[int, ...] = (100_000, 100_000), **gate: Any) -> SchedulerCore:
    return make(
        [
            {
                "admission": {
                    "high_watermark": 1.0,
                    "low_watermark": 1.0,
                    "overflow": "hold",
                    "fill_idle_engine": False,
                }
            },
            {"program_gate": gate},
            {"progress_ttl": {"max_acting_ttl_s": 10.0}},
            {"state_aware_pause": {"victim": "shortest_first", "pause_acting": False,
                                   "yield_idle_after_s": None}},
            {"program_binding": {}},
            {"migration": {"placement": "mru", "aging_s": 1e9}},
        ],
        capacities,
    )  # fmt: skip


def test_the_router_holds_a_program_past_the_count_cap_per_engine() -> None:
    core = router(capacities=(100_000,), max_active_programs_per_target=2)
    send(core, "a", 100, 0)
    send(core, "b", 100, 0)
    decision = core.handle(RequestArrived(ctx("c"), info(100), 0)).decision
    assert isinstance(decision, Hold)


def test_the_router_holds_new_programs_while_the_engine_has_waiting_requests() -> None:
    from thunder_mw.policies.core import BackendMetrics

    core = router(capacities=(100_000,))
    core.handle(BackendChanged("b0", metrics=BackendMetrics(waiting=1), now=0))
    decision = core.handle(RequestArrived(ctx("a"), info(100), 0.5)).decision
    assert isinstance(decision, Hold)
    resumed = of(
        core.handle(BackendChanged("b0", metrics=BackendMetrics(waiting=0), now=1)).actions, Resumed
    )
    assert [r.program_id for r in resumed] == ["a"]


def test_the_router_binds_a_new_program_by_consistent_hash() -> None:
    core = router()
    for pid in ("p1", "p2", "p3", "p4", "p5", "p6"):
        decision, _ = send(core, pid, 100, 0)
        assert decision.backend == SessionAffinity.pick(pid, ["b0", "b1"])


def test_the_routers_capacity_repair_never_pauses_an_acting_program() -> None:
    core = router(capacities=(10_000,))
    send(core, "a", 4000, 0)
    answer(core, "a", 4000, 1)  # a is ACTING (in its tool), its TTL armed
    send(core, "b", 4000, 1)
    answer(core, "b", 4000, 2)
    # b's next call overflows the engine: REASONING b is marked, a keeps its place (with
    # pause_acting, the default pipeline's rule, a would be paused at once instead).
    outcome = core.handle(RequestArrived(ctx("b"), info(7000), 2.5))
    decision, actions = outcome.decision, outcome.actions
    assert isinstance(decision, Forward)
    assert [(p.program_id, p.pending) for p in of(actions, Paused)] == [("b", True)]


def test_the_routers_ttl_is_zero_before_its_statistics_window_is_full() -> None:
    stage = ProgressTtl(ProgressTtl.Params(max_acting_ttl_s=10.0, immature_ttl_s=0.0))
    assert stage.predicted_ttl("swe") == 0.0
    assert ProgressTtl(ProgressTtl.Params(max_acting_ttl_s=10.0)).predicted_ttl("swe") == 10.0


def of(actions: list[Action], kind: type[A]) -> list[A]:
    return [a for a in actions if isinstance(a, kind)]
