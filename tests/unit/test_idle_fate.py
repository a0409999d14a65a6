"""What an ACTING program's reservation counts under pausing's `idle_fate`: `min_waste`
(InferCept's min-waste rule, policies/overflow_cost.py `keeps_idle_context`) on every
backend, or, by default, `tiered_min_waste`: that rule where the backend has a host KV tier,
the weight elsewhere."""

from __future__ import annotations

import pytest

from thunder_mw.policies import CallFinished, RequestArrived
from thunder_mw.policies.core import Forward, RequestInfo, SchedulerCore
from thunder_mw.policies.core_events import HostTierDeclared, ReleaseRequested
from thunder_mw.policies.overflow_cost import EngineCosts, keeps_idle_context
from thunder_mw.policies.pipeline import build_pipeline
from thunder_mw.policies.program_table import Usage
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import Convention
from thunder_mw.schemas.stage_params import PauseParams

CHARS_PER_TOKEN = 4


def test_keep_while_the_tool_ends_before_a_recompute_would_have_paid_off() -> None:
    # p x M = 1e-4 s/token x 50,000 tokens of batch = 5 s.
    assert keeps_idle_context(4.9, 50_000, 1e-4, None)
    assert not keeps_idle_context(5.1, 50_000, 1e-4, None)
    # A cheaper recompute, or a smaller batch it stalls, lets the context go sooner.
    assert not keeps_idle_context(4.9, 50_000, 5e-5, None)
    assert not keeps_idle_context(4.9, 20_000, 1e-4, None)
    # A host tier: two transfers at 1e-5 s/token instead of the recompute (1 s at M).
    assert not keeps_idle_context(1.1, 50_000, 1e-4, 1e-5)
    assert keeps_idle_context(0.9, 50_000, 1e-4, 1e-5)
    # A tier slower than recomputing never makes keeping dearer than dropping.
    assert keeps_idle_context(4.9, 50_000, 1e-4, 1e-3)


def test_by_default_the_rule_decides_on_every_backend() -> None:
    assert PauseParams().idle_fate == "min_waste"


def ctx(pid: str) -> AgentContext:
    return AgentContext(program_id=pid, source=Convention.THUNDERAGENT)


def info(tokens: int) -> RequestInfo:
    return RequestInfo(prompt_chars=(tokens - 1) * CHARS_PER_TOKEN, max_tokens=10)


def make(fate: str, prefill_s_per_token: float | None, tier: int = 0) -> SchedulerCore:
    stages = build_pipeline(
        [
            {"admission": {"buffer_tokens_per_program": 0, "overflow": "cost_aware"}},
            {
                "state_aware_pause": {
                    "acting_token_weight": 0.5,
                    "idle_fate": fate,
                    "yield_idle_after_s": None,
                }
            },
            {"migration": {}},
        ]
    )
    core = SchedulerCore([("b0", 100_000)], stages, chars_per_token=CHARS_PER_TOKEN)
    if tier:
        core.handle(HostTierDeclared("b0", tier, load_tokens_per_s=1e12))
    costs = core.stages[0].costs.setdefault("b0", EngineCosts())  # type: ignore[attr-defined]
    costs.prefill_s_per_token = prefill_s_per_token
    return core


def run_call(core: SchedulerCore, pid: str, tokens: int, start: float, end: float) -> None:
    decision = core.handle(RequestArrived(ctx(pid), info(tokens), start)).decision
    assert isinstance(decision, Forward)
    core.handle(CallFinished(pid, Usage(tokens, 10, 0), True, end))


def reserved(core: SchedulerCore, pid: str) -> int:
    program = core.program(pid)
    assert program is not None
    return program.reserved_tokens


@pytest.mark.parametrize(
    ("fate", "price", "tier", "expected"),
    [
        # 1 s/token x ~20 k tokens of batch: any tool ends first, the context is kept whole.
        ("min_waste", 1.0, 0, 10_010),
        # 1e-9 s/token: recomputing is all but free, the context is let go (none counted).
        ("min_waste", 1e-9, 0, 0),
        # No price learned yet: the configured weight, as `weight` always.
        ("min_waste", None, 0, 5_005),
        ("weight", 1e-9, 0, 5_005),
        # The rule only on a backend with a host tier (where a let-go context waits a
        # reload away: 2 x 1e-12 s/token, so it is let go), the weight elsewhere.
        ("tiered_min_waste", 1e-9, 0, 5_005),
        ("tiered_min_waste", 1.0, 0, 5_005),
        ("tiered_min_waste", 1.0, 1_000_000, 0),
        ("weight", 1.0, 1_000_000, 5_005),
    ],
)
def test_an_acting_programs_reservation_follows_the_rule(
    fate: str, price: float | None, tier: int, expected: int
) -> None:
    core = make(fate, price, tier)
    # still reasoning: batch
    decision = core.handle(RequestArrived(ctx("other"), info(10_000), 0.0)).decision
    assert isinstance(decision, Forward)
    for step in range(3):  # tool gaps of 10 s: the expected tool time
        run_call(core, "p", 10_000, 20.0 * step, 20.0 * step + 10.0)
    assert reserved(core, "p") == expected


def test_a_context_let_go_is_still_counted_among_the_engines_contexts() -> None:
    # Its reservation counts none of it (min-waste let it go), yet the engine keeps it, on
    # the GPU or in its host tier, until something pushes it out: the backend's `contexts`
    # (what the tier's rule checks for room) still holds it whole, and loses it on release.
    core = make("min_waste", 1e-9)
    for step in range(3):
        run_call(core, "p", 10_000, 20.0 * step, 20.0 * step + 10.0)
    backend = core.backends["b0"]
    assert reserved(core, "p") == 0
    assert backend.contexts == 10_010
    core.handle(ReleaseRequested("p", "final", 70.0))
    assert backend.contexts == 0 and backend.reserved == 0
