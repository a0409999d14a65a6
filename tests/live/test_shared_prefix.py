"""A prefix (system prompt) shared by programs on one backend is counted once (simulated clock)."""

from __future__ import annotations

from typing import Any

import pytest

from thunder_mw.policies import CallFinished, ReleaseRequested, RequestArrived
from thunder_mw.policies.core import Forward, Hold, Paused, RequestInfo, SchedulerCore
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.program_table import Program, Usage
from thunder_mw.policies.shared_prefix import SharedPrefixes
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention

CHARS_PER_TOKEN = 4


def _program(core: SchedulerCore, program_id: str) -> Program:
    """The core's entry for `program_id` (the test fails here if it has none)."""
    program = core.table.get(program_id)
    assert program is not None, program_id
    return program


def ctx(pid: str) -> AgentContext:
    return AgentContext(program_id=pid, source=Convention.THUNDERAGENT)


def info(tokens: int, prefix: str | None = "sys", prefix_tokens: int = 400) -> RequestInfo:
    """A request of `tokens` prompt tokens (10 out) whose first `prefix_tokens` are `prefix`."""
    return RequestInfo(
        prompt_chars=(tokens - 1) * CHARS_PER_TOKEN,
        max_tokens=10,
        prefix_key=prefix,
        prefix_chars=(prefix_tokens - 1) * CHARS_PER_TOKEN if prefix else 0,
    )


def make(shared: bool = True, acting_weight: float = 1.0) -> SchedulerCore:
    policies: list[dict[str, Any]] = [
        {
            "admission": {
                "high_watermark": 1.0,
                "low_watermark": 1.0,
                "buffer_tokens_per_program": 0,
                "shared_prefix": shared,
                "overflow": "hold",
            }
        },
        {"state_aware_pause": {"acting_token_weight": acting_weight, "yield_idle_after_s": None}},
        {"migration": {}},
    ]
    return SchedulerCore([("b0", 1000)], build_pipeline(policies), chars_per_token=CHARS_PER_TOKEN)


# ------------------------------------------------------------------ the arithmetic
def test_all_but_one_copy_of_a_prefix_is_credited_at_its_reservation_weight() -> None:
    held = SharedPrefixes(acting_weight=0.5)
    held.add("sys", 100, running=True)
    assert (held.credit, held.running_credit) == (0, 0)  # one copy: nothing counted twice
    held.add("sys", 100, running=True)
    assert (held.credit, held.running_credit) == (100, 100)
    held.add("sys", 100, running=False)  # an idle holder counts it at the ACTING weight
    assert (held.credit, held.running_credit) == (150, 100)
    held.remove("sys", running=True)
    held.remove("sys", running=True)
    # Only the idle copy is left: it is the one the reservations count, nothing is credited.
    assert (held.credit, held.running_credit) == (0, 0)
    held.remove("sys", running=False)
    with pytest.raises(KeyError):
        held.remove("sys", running=False)


def test_a_newcomer_is_credited_what_is_already_held_of_its_prefix() -> None:
    held = SharedPrefixes(acting_weight=0.5)
    assert held.credit_for("sys", running=True) == 0  # nothing held yet
    held.add("sys", 100, running=False)
    # An idle copy counts 50 now; a running newcomer makes it a full copy, crediting the 50.
    assert held.credit_for("sys", running=True) == 50
    held.add("sys", 100, running=True)
    assert held.credit_for("sys", running=True) == 100
    assert held.credit_for("sys", running=False) == 50
    assert held.credit_for("other", running=True) == 0
    assert held.credit_for(None, running=True) == 0


def test_prefixes_are_credited_apart() -> None:
    held = SharedPrefixes(acting_weight=1.0)
    for key, size in (("a", 100), ("a", 100), ("b", 30), ("b", 30), ("b", 30)):
        held.add(key, size, running=True)
    assert held.credit == 100 + 2 * 30


# ------------------------------------------------------------------ the core plans with it
def test_a_program_sharing_the_prefix_fits_where_whole_contexts_would_not() -> None:
    for shared, expected in ((True, Forward), (False, Hold)):
        core = make(shared=shared)
        first = core.handle(RequestArrived(ctx("a"), info(590), 0.0)).decision
        assert isinstance(first, Forward)
        # 600 + 600 reserved; the engine holds the 400-token prefix once: 800.
        second = core.handle(RequestArrived(ctx("b"), info(590), 1.0)).decision
        assert isinstance(second, expected), shared
    assert core.backends["b0"].unused == 0


def test_programs_with_other_prefixes_get_no_credit() -> None:
    core = make()
    core.handle(RequestArrived(ctx("a"), info(590, prefix="one"), 0.0))
    decision = core.handle(RequestArrived(ctx("b"), info(590, prefix="two"), 1.0)).decision
    assert isinstance(decision, Hold)
    assert core.backends["b0"].unused == 0


def test_the_credit_follows_programs_out_and_overflow_is_judged_with_it() -> None:
    core = make(acting_weight=1.0)
    core.handle(RequestArrived(ctx("a"), info(590), 0.0))
    core.handle(RequestArrived(ctx("b"), info(590), 1.0))
    backend = core.backends["b0"]
    assert backend.unused == 400 and backend.running_unused == 400
    core.handle(CallFinished("a", Usage(590, 10), True, 2.0))
    core.handle(CallFinished("b", Usage(590, 10), True, 2.0))
    # Both ACTING now (whole contexts counted): still one copy held, nothing over capacity.
    assert backend.unused == 400 and backend.running_unused == 0
    # a's context grows by 150: 750 + 600 - 400 = 950 fits; no one is paused.
    actions = core.handle(RequestArrived(ctx("a"), info(740), 3.0)).actions
    assert not [p for p in actions if isinstance(p, Paused)]
    # b's grows too: 750 + 750 - 400 = 1100 > 1000: a, ACTING, is paused; then the prefix
    # is no longer shared and the credit is gone.
    core.handle(CallFinished("a", Usage(740, 10), True, 4.0))
    actions = core.handle(RequestArrived(ctx("b"), info(740), 5.0)).actions
    paused = [p.program_id for p in actions if isinstance(p, Paused)]
    assert paused == ["a"]
    assert backend.unused == 0
    assert backend.reserved == _program(core, "b").reserved_tokens > 740


def test_release_removes_the_programs_copy() -> None:
    core = make()
    core.handle(RequestArrived(ctx("a"), info(590), 0.0))
    core.handle(RequestArrived(ctx("b"), info(590), 1.0))
    core.handle(CallFinished("b", Usage(590, 10), True, 2.0))
    core.handle(ReleaseRequested("b", "client", 3.0))
    assert core.backends["b0"].unused == 0
    assert core.backends["b0"].reserved == 600


# ------------------------------------------------------------------ live
def test_the_live_gateway_credits_a_system_prompt_its_programs_share() -> None:
    """Through the gateway: two programs with one system prompt on one engine; the backend's
    reservation carries a credit for the copy it holds once, and none without the option."""
    import asyncio

    import httpx

    from thunder_mw.middleware.app import ThunderGateway
    from thunder_mw.schemas.config import ThunderConfig

    system = {"role": "system", "content": "You are a careful software engineer. " * 40}

    def credit(shared: bool) -> int:
        config = ThunderConfig(
            backends=[
                {
                    "name": "sim-0",
                    "type": "sim",
                    "sim": {"num_blocks": 2048, "block_size": 16, "time_scale": 50.0},
                }
            ],
            policies=[
                {"admission": {"shared_prefix": shared, "overflow": "hold"}},
                {"migration": {}},
            ],
            tools={"docker": {"enabled": False}},
        )

        async def run() -> int:
            app = ThunderGateway(config)
            try:
                async with httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=30
                ) as client:
                    for program in ("a", "b"):
                        body = {
                            "model": "sim-model",
                            "messages": [system, {"role": "user", "content": f"task {program}"}],
                            "max_tokens": 4,
                            "program_id": program,
                        }
                        r = await client.post("/v1/chat/completions", json=body)
                        assert r.status_code == 200, r.text
                return app.core.scheduler.core.backends["sim-0"].shared_credit
            finally:
                await app.core.shutdown()

        return asyncio.run(run())

    with_option = credit(True)
    # One copy of the ~370-token system prompt is credited back (at the ACTING weight).
    assert 100 < with_option < 400
    assert credit(False) == 0
