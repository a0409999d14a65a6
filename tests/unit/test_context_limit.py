"""Requests past every engine's limit (policies/context_limit.py): refused at once or sent
unplanned, never held; and requests that could only run alone, held briefly then placed."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from test_scheduler_core import _program, ctx, info, make, run_step

from thunder_mw.middleware.request_body import BodyError, decode_object
from thunder_mw.policies import (
    BackendChanged,
    CallFinished,
    HoldExpired,
    RequestArrived,
    context_limit,
)
from thunder_mw.policies.core import (
    Forward,
    Hold,
    Paused,
    Reject,
    RequestInfo,
    Resumed,
    SchedulerCore,
)
from thunder_mw.policies.program_table import ProgramState, Usage


def engines(core: SchedulerCore, max_model_len: int | None = None) -> SchedulerCore:
    for backend in core.backends.values():
        backend.max_model_len = max_model_len
    return core


def test_max_tokens_past_every_model_length_is_refused_without_touching_anyone() -> None:
    core = engines(make(capacities=(100_000, 100_000)), max_model_len=32_768)
    run_step(core, "busy", 20_000, 0)
    outcome = core.handle(RequestArrived(ctx("huge"), info(10, out=200_000), 1))
    decision, actions = outcome.decision, outcome.actions
    assert isinstance(decision, Reject)
    assert (decision.status, decision.code, decision.param) == (
        400,
        "context_length_exceeded",
        "max_tokens",
    )
    assert "32768 tokens (max_model_len of b0)" in decision.message
    assert "200000 in the completion" in decision.message
    assert actions == []
    assert core.table.get("huge") is None  # no program was made for it
    assert _program(core, "busy").state is ProgramState.ACTIVE
    assert core.counters["context_length_refusals"] == 1


def test_a_prompt_past_every_kv_cache_is_refused_naming_the_messages() -> None:
    core = make(capacities=(1000, 2000))  # model lengths unknown: the KV cache bounds
    chars = 2001 * context_limit.MAX_CHARS_PER_TOKEN  # at least 2,001 tokens, whatever it is
    decision = core.handle(RequestArrived(ctx("p"), RequestInfo(prompt_chars=chars), 0)).decision
    assert isinstance(decision, Reject) and decision.param == "messages"
    assert "2000 tokens (KV cache of b1)" in decision.message


def test_an_unhealthy_engine_with_room_does_not_make_a_request_fit() -> None:
    core = make(capacities=(1000, 10_000))
    core.handle(BackendChanged("b1", healthy=False, now=0))
    decision = core.handle(RequestArrived(ctx("p"), info(10, out=5000), 1)).decision
    assert isinstance(decision, Reject) and "KV cache of b0" in decision.message


def test_an_engine_with_unknown_limits_might_take_anything() -> None:
    core = make(capacities=(1000, None))
    decision = core.handle(RequestArrived(ctx("p"), info(10, out=50_000), 0)).decision
    assert not isinstance(decision, Reject)


def test_past_the_model_length_by_the_estimate_only_goes_to_the_engine_unplanned() -> None:
    """The estimate (4 chars a token) says 5,000 tokens; the floor (32 a token) 625: only the
    engine's tokenizer can tell, so it is asked at once, and nothing is reserved or paused."""
    core = engines(make(capacities=(10_000, 10_000)), max_model_len=2048)
    core.backends["b1"].max_model_len = 4096
    run_step(core, "busy", 1500, 0)
    outcome = core.handle(RequestArrived(ctx("long"), info(5000), 1))
    decision, actions = outcome.decision, outcome.actions
    assert isinstance(decision, Forward) and not decision.planned
    assert decision.backend == "b1"  # the longest model length
    assert actions == [] and core.table.get("long") is None
    assert sum(b.reserved for b in core.backends.values()) == _program(core, "busy").reserved_tokens


def test_a_known_program_sent_unplanned_goes_home_when_home_serves_as_long_a_model() -> None:
    core = engines(make(capacities=(10_000, 10_000)), max_model_len=2048)
    home = run_step(core, "a", 1000, 0)
    reserved = _program(core, "a").reserved_tokens
    decision = core.handle(RequestArrived(ctx("a"), info(4000), 2)).decision
    assert isinstance(decision, Forward) and not decision.planned and decision.backend == home
    assert _program(core, "a").reserved_tokens == reserved  # its reservation did not grow


def test_a_compacted_conversation_is_sized_by_its_new_prompt_not_its_old_context() -> None:
    """An agent that compacts its history to fit is neither sent unplanned for the length it
    had nor reserves room for it: its body shrank, so its context is the new prompt."""
    core = engines(make(capacities=(10_000,)), max_model_len=3_000)
    run_step(core, "p", 2_900, 0, out=50)  # the engine reports a 2,950-token context
    assert _program(core, "p").context_tokens == 2_950
    decision = core.handle(RequestArrived(ctx("p"), info(500, out=100), 5)).decision
    assert isinstance(decision, Forward) and decision.planned
    program = _program(core, "p")
    assert program.context_tokens == 500
    assert program.reserved_tokens == 600  # its prompt and output, not 2,950 + 100
    assert core.counters["unplanned_forwards"] == 0


def test_a_compacted_conversation_is_not_held_for_an_empty_engine_for_its_old_length() -> None:
    """Past the whole KV cache by its old context and output (2,950 + 100 of 3,000), a
    compacted call would be held for an engine emptied for it; by what it sends it fits."""
    core = make(capacities=(3_000,))
    run_step(core, "p", 2_900, 0, out=50)  # a 2,950-token context
    decision = core.handle(RequestArrived(ctx("p"), info(500, out=100), 5)).decision
    assert isinstance(decision, Forward) and decision.planned
    assert _program(core, "p").reserved_tokens == 600


def test_a_grown_conversation_still_reserves_the_context_the_engine_reported() -> None:
    """A body that grew is an append: the engine's count of the context (its prompt and a
    reply longer than the body shows) stays the floor of what it asks."""
    core = make(capacities=(10_000,))
    core.handle(RequestArrived(ctx("p"), info(2_000), 0))
    core.handle(CallFinished("p", Usage(2_000, 1_500), True, 1))
    decision = core.handle(RequestArrived(ctx("p"), info(2_100), 5)).decision
    assert isinstance(decision, Forward)
    program = _program(core, "p")
    assert program.context_tokens == 3_500
    assert program.reserved_tokens == 3_500 + 10  # not the body's 2,100 + 10


def test_larger_than_every_kv_cache_by_the_estimate_is_held_alone_then_placed() -> None:
    core = make(capacities=(1000,))
    run_step(core, "resident", 600, 0)
    # floor 137: may fit an engine
    decision = core.handle(RequestArrived(ctx("big"), info(1100), 1)).decision
    assert isinstance(decision, Hold) and decision.alone
    actions = core.handle(HoldExpired("big", 11, place=True)).actions
    resumed = [a for a in actions if isinstance(a, Resumed)]
    assert [(a.program_id, a.backend, a.forced) for a in resumed] == [("big", "b0", True)]
    # The idle program's KV is what the engine evicts for it anyway: paused, not lost.
    paused = {a.program_id for a in actions if isinstance(a, Paused)}
    assert "resident" in paused


def test_a_request_that_merely_waits_for_room_is_not_alone_and_leaves_on_its_deadline() -> None:
    core = make(capacities=(1000,))
    run_step(core, "resident", 700, 0)
    decision = core.handle(RequestArrived(ctx("late"), info(500), 1)).decision
    assert isinstance(decision, Hold) and not decision.alone
    core.handle(HoldExpired("late", 601, place=False))
    assert core.table.get("late") is None  # a program that never ran leaves no trace
    assert core.queue_length() == 0


def test_only_the_prompt_bearing_fields_count_toward_the_floor() -> None:
    body: dict[str, object] = {
        "model": "m",
        "messages": [{"role": "system", "content": "ab"}, {"role": "user", "content": "cde"}],
        "tools": [{"type": "function", "function": {"name": "fg"}}],
        "request_id": "x" * 100_000,  # ids and metadata are no prompt
        "metadata": {"note": "y" * 100_000},
    }
    chars = context_limit.prompt_text_chars(body)
    assert chars == len("system" + "ab" + "user" + "cde" + "function" + "fg")
    ids = context_limit.prompt_text_chars({"prompt": [1, 2, 3], "max_tokens": 5})
    assert context_limit.prompt_floor(ids) == 3  # a token id is one token


def test_a_huge_non_prompt_field_is_not_a_too_long_prompt() -> None:
    """The raw body is 100 KB; its prompt is one word: the engine decides, not the floor."""
    core = engines(make(capacities=(3072,)), max_model_len=2048)
    info_ = RequestInfo(prompt_chars=100_000, max_tokens=8, prompt_text_chars=10)
    decision = core.handle(RequestArrived(ctx("p"), info_, 0)).decision
    assert not isinstance(decision, Reject)


_BODIES: list[dict[str, Any]] = [
    {"prompt": [1, 2, 3]},
    {"input_ids": [0] * 500, "max_tokens": 1},
    {"prompt": [[7, 8], [9]]},
    {"messages": [{"role": "user", "content": "caf\u00e9 \U0001f600" * 50}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}], "n": 1},
    {"input": [{"content": "a", "n": 1, "f": 1.5, "b": True, "z": None}], "text": ""},
    {"tools": [{"function": {"name": "f", "parameters": {"properties": {}}}}], "suffix": "s"},
]


@pytest.mark.parametrize("body", _BODIES)
def test_a_body_of_n_bytes_never_counts_more_prompt_characters_than_the_bound(
    body: dict[str, Any],
) -> None:
    for raw in (msgspec.json.encode(body), json.dumps(body).encode()):  # compact, \u-escaped
        assert context_limit.prompt_text_chars(body) <= context_limit.prompt_chars_bound(len(raw))


@pytest.mark.parametrize(
    ("body", "limit"),
    [
        ({"messages": [{"role": "user", "content": "w " * 40_000}], "max_tokens": 8}, 2048),
        ({"messages": [{"role": "user", "content": "hi"}], "request_id": "x" * 9000}, 2048),
        ({"prompt": [5] * 3000, "max_tokens": 1}, 2048),
        ({"prompt": [5] * 2000, "max_tokens": 1}, 2048),
        ({"prompt": "p", "max_tokens": 2040, "metadata": {"k": "v" * 500}}, 2048),
        ({"prompt": "p" * 70_000, "max_tokens": 10}, 4096),
    ],
)
def test_counting_the_prompt_fields_only_when_the_body_may_be_too_long_decides_the_same(
    body: dict[str, Any], limit: int
) -> None:
    """The core counts `prompt_body`'s prompt characters only when the body's size bound
    would refuse it; the decision is the one the exact count gives."""
    raw = msgspec.json.encode(body)
    exact = RequestInfo(
        prompt_chars=len(raw),
        max_tokens=body.get("max_tokens"),
        prompt_text_chars=context_limit.prompt_text_chars(body),
    )
    lazy = RequestInfo(prompt_chars=len(raw), max_tokens=body.get("max_tokens"), prompt_body=body)
    decisions: list[tuple[type, object]] = []
    for given in (exact, lazy):
        core = engines(make(capacities=(100_000,)), max_model_len=limit)
        decision = core.handle(RequestArrived(ctx("p"), given, 0)).decision
        decisions.append((type(decision), getattr(decision, "message", None)))
    assert decisions[0] == decisions[1]


def test_an_integer_past_64_bits_is_refused_as_the_body_is_read() -> None:

    assert decode_object(b'{"top_k": 9223372036854775807}', for_engine=True)["top_k"] == 2**63 - 1
    # Admin bodies, and fields no engine reads as an integer, take any integer JSON allows.
    assert decode_object(b'{"x": 1000000000000000000000000000000}')["x"] == 10**30
    big = b'{"x": {"big": 1000000000000000000000000000000}}'
    assert decode_object(big, for_engine=True)["x"]["big"] == 10**30
    for raw, field in (
        (b'{"top_k": 1000000000000000000000000000000}', "top_k"),
        (b'{"sampling_params": {"seed": -9223372036854775809}}', "sampling_params.seed"),
    ):
        with pytest.raises(BodyError) as err:
            decode_object(raw, for_engine=True)
        assert (err.value.status, err.value.code, err.value.param) == (
            400,
            "integer_out_of_range",
            field,
        )
