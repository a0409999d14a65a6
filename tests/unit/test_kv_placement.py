"""KV-aware placement of new programs (policies/kv_placement.py), in the pure core, clock injected;
and the shared prefix the live gateway keys requests by."""

from __future__ import annotations

from typing import Any

from thunder_mw.middleware.call_state import RequestBody
from thunder_mw.middleware.live_scheduler import request_info
from thunder_mw.policies import CachesFlushed, CallFinished, RequestArrived
from thunder_mw.policies.core import Decision, Forward, Hold, RequestInfo, SchedulerCore
from thunder_mw.policies.core_view import ReadOnlyCore
from thunder_mw.policies.kv_placement import KvPlacement
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.prefix_index import PrefixIndex
from thunder_mw.policies.program_table import Usage
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention

CHARS_PER_TOKEN = 4
WITH: list[dict[str, Any]] = [
    {"admission": {"overflow": "hold"}},
    {"state_aware_pause": {}},
    {"kv_placement": {}},
    {"migration": {}},
]
WITHOUT: list[dict[str, Any]] = [
    {"admission": {"overflow": "hold"}},
    {"state_aware_pause": {}},
    {"migration": {}},
]


def make(
    policies: list[dict[str, Any]], capacities: tuple[int, ...] = (100_000, 100_000)
) -> SchedulerCore:
    labels = [(f"b{i}", c) for i, c in enumerate(capacities)]
    return SchedulerCore(labels, build_pipeline(policies), chars_per_token=CHARS_PER_TOKEN)


def send(
    core: SchedulerCore,
    pid: str,
    tokens: int,
    prefix: str | None,
    now: float,
    prefix_tokens: int = 2000,
    **kw: Any,
) -> Decision | None:
    info = RequestInfo(
        prompt_chars=(tokens - 1) * CHARS_PER_TOKEN,
        max_tokens=10,
        prefix_key=prefix,
        prefix_chars=(prefix_tokens - 1) * CHARS_PER_TOKEN if prefix else 0,
    )
    ctx = AgentContext(program_id=pid, source=Convention.THUNDERAGENT, **kw)
    return core.handle(RequestArrived(ctx, info, now)).decision


def placed(
    core: SchedulerCore, pid: str, tokens: int, prefix: str | None, now: float, **kw: Any
) -> str:
    decision = send(core, pid, tokens, prefix, now, **kw)
    assert isinstance(decision, Forward), decision
    return decision.backend


def test_a_new_program_goes_where_its_prefix_is_when_the_load_differs_by_less() -> None:
    for policies, expected in ((WITH, "b1"), (WITHOUT, "b0")):
        core = make(policies)
        assert placed(core, "x", 2100, "sys-x", 0.0) == "b0"
        assert placed(core, "y", 2300, "sys-y", 0.0) == "b1"  # 200 tokens less room on b1
        # b1 caches sys-y's 2,000 tokens: worth more than its 200 tokens less room.
        assert placed(core, "new", 2100, "sys-y", 1.0) == expected


def test_load_outweighs_a_smaller_prefix() -> None:
    core = make(WITH)
    assert placed(core, "x", 2100, "sys-x", 0.0) == "b0"
    assert placed(core, "y", 9000, "sys-y", 0.0) == "b1"  # b1 has 6,900 tokens less room
    assert placed(core, "new", 2100, "sys-y", 1.0) == "b0"


def test_only_engines_that_admit_the_program_are_candidates() -> None:
    core = make(WITH, capacities=(10_000, 10_000))
    assert placed(core, "x", 2100, "sys-x", 0.0) == "b0"
    assert placed(core, "y", 9500, "sys-y", 0.0) == "b1"  # b1 is full
    assert placed(core, "new", 2100, "sys-y", 1.0) == "b0"
    core = make(WITH, capacities=(10_000,))
    placed(core, "big", 9500, "sys", 0.0)
    assert isinstance(send(core, "held", 2100, "sys", 1.0), Hold)


def test_a_sub_agent_without_a_prefix_of_its_own_goes_where_its_parents_is() -> None:
    core = make(WITH)
    assert placed(core, "x", 2100, "sys-x", 0.0) == "b0"
    assert placed(core, "parent", 2300, "sys-p", 0.0) == "b1"
    assert placed(core, "sub", 500, None, 1.0, parent_program_id="parent") == "b1"
    # Without a parent (or a prefix) it is the room alone.
    assert placed(core, "lone", 500, None, 1.0) == "b0"


def test_a_program_with_a_home_is_left_to_the_migration_stage() -> None:
    core = make(WITH)
    assert placed(core, "x", 2100, "sys-x", 0.0) == "b0"
    core.handle(CallFinished("x", Usage(2100, 10), True, 0.5))
    assert placed(core, "y", 2300, "sys-y", 0.0) == "b1"
    stage = next(s for s in core.stages if isinstance(s, KvPlacement))
    program = core.table.get("x")
    assert program is not None and stage.place(ReadOnlyCore(core), program.view, 1.0) is None


def test_an_engine_whose_cache_was_flushed_holds_no_prefix_any_more() -> None:
    core = make(WITH)
    placed(core, "x", 2100, "sys-x", 0.0)
    placed(core, "y", 2300, "sys-y", 0.0)
    stage = next(s for s in core.stages if isinstance(s, KvPlacement))
    assert stage.index is not None and stage.index.overlap("b1", "sys-y") > 0
    core.handle(CachesFlushed(1.0))
    assert placed(core, "new", 2100, "sys-y", 2.0) == "b0"  # the room alone decides now
    assert stage.index.overlap("b1", "sys-y") == 0


def test_the_prefix_index_forgets_the_least_recently_used_past_capacity() -> None:
    index = PrefixIndex(lambda label: 1000)
    index.remember("b0", "a", 600)
    index.remember("b0", "b", 300)
    index.remember("b0", "a", 600)  # used again: now the most recent
    index.remember("b0", "c", 300)
    assert index.overlap("b0", "b") == 0 and index.overlap("b0", "a") == 600
    assert index.tokens_held("b0") == 900 and index.holds("c") == ["b0"]
    index.forget("a")
    assert index.tokens_held("b0") == 300


def _info(data: dict[str, Any]) -> RequestInfo:
    import msgspec

    return request_info(RequestBody(data, msgspec.json.encode(data)))


def test_the_live_prefix_key_is_the_system_message() -> None:
    system = {"role": "system", "content": "You are a coding agent."}
    a = _info({"messages": [system, {"role": "user", "content": "task a"}]})
    b = _info({"messages": [system, {"role": "user", "content": "task b, longer"}]})
    assert a.prefix_key is not None and a.prefix_key == b.prefix_key
    assert a.prefix_chars == len("You are a coding agent.")
    other = _info({"messages": [{"role": "developer", "content": "Other."}]})
    assert other.prefix_key not in (None, a.prefix_key)
    assert _info({"messages": [{"role": "user", "content": "hi"}]}).prefix_key is None
    assert _info({"prompt": "text"}).prefix_key is None
    assert _info({"instructions": "Be brief.", "input": "hi"}).prefix_key is not None
