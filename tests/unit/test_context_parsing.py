"""Specification of how every agent-context convention is read, validated and stripped."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import AgentContextSettings, Convention
from thunder_mw.schemas.context_parsing import ContextError, ContextParser

DYNAMO = {"session_type_id": "swe", "session_id": "run-1", "trajectory_id": "run-1:main"}


def parse(
    body: dict[str, Any] | None = None,
    headers: Iterable[tuple[str, str]] | Mapping[str, str] = (),
    **settings: Any,
) -> tuple[AgentContext | None, bool]:
    parser = ContextParser(AgentContextSettings(**settings))
    hdrs = [(k.lower().encode(), v.encode()) for k, v in dict(headers).items()]
    return parser.parse(body, hdrs)


def error_of(
    body: dict[str, Any] | None = None,
    headers: Iterable[tuple[str, str]] | Mapping[str, str] = (),
    **settings: Any,
) -> ContextError:
    with pytest.raises(ContextError) as info:
        parse(body, headers, **settings)
    return info.value


# ------------------------------------------------------------------ ThunderAgent body fields
def test_top_level_program_id_names_the_program_and_is_stripped() -> None:
    body = {"model": "m", "program_id": "p1", "messages": []}
    ctx, changed = parse(body)
    assert ctx is not None
    assert ctx.program_id == "p1" and ctx.source is Convention.THUNDERAGENT
    assert changed and body == {"model": "m", "messages": []}
    assert list(body) == ["model", "messages"]


def test_nested_extra_body_program_id_is_read_and_the_emptied_object_removed() -> None:
    body = {"model": "m", "extra_body": {"program_id": "p1", "docker_ids": ["box-1"]}}
    ctx, _ = parse(body)
    assert ctx is not None
    assert ctx.program_id == "p1" and ctx.docker_ids == ("box-1",)
    assert body == {"model": "m"}


def test_extra_body_siblings_survive_stripping() -> None:
    body = {"model": "m", "extra_body": {"program_id": "p1", "top_k": 5}}
    parse(body)
    assert body == {"model": "m", "extra_body": {"top_k": 5}}


def test_docker_ids_and_tool_ids_are_merged() -> None:
    ctx, _ = parse({"program_id": "p", "docker_ids": ["a1"], "tool_ids": ["b2"]})
    assert ctx is not None
    assert ctx.docker_ids == ("a1", "b2")


def test_same_program_in_top_level_and_extra_body_is_fine() -> None:
    ctx, _ = parse({"program_id": "p", "extra_body": {"program_id": "p"}})
    assert ctx is not None
    assert ctx.program_id == "p"


def test_two_body_forms_naming_different_programs_is_an_error() -> None:
    err = error_of({"program_id": "a", "nvext": {"agent_context": {**DYNAMO}}})
    assert err.code == "conflicting_program_ids"
    assert err.param == "nvext.agent_context.trajectory_id"


def test_null_program_id_counts_as_absent_but_is_still_stripped() -> None:
    body = {"model": "m", "program_id": None}
    ctx, changed = parse(body)
    assert ctx is None and changed and body == {"model": "m"}


# ------------------------------------------------------------------ Dynamo body
def test_dynamo_agent_context_maps_trajectory_to_program() -> None:
    body = {
        "model": "m",
        "nvext": {"agent_context": {**DYNAMO, "parent_trajectory_id": "run-1:planner"}},
    }
    ctx, _ = parse(body)
    assert ctx is not None
    assert ctx.program_id == "run-1:main"
    assert ctx.session_id == "run-1" and ctx.session_type == "swe"
    assert ctx.parent_program_id == "run-1:planner"
    assert ctx.source is Convention.DYNAMO_BODY
    assert body == {"model": "m"}


def test_dynamo_final_flag_is_read() -> None:
    ctx, _ = parse({"nvext": {"agent_context": {**DYNAMO, "trajectory_final": True}}})
    assert ctx is not None
    assert ctx.final


def test_dynamo_unknown_key_is_rejected_by_name() -> None:
    err = error_of({"nvext": {"agent_context": {**DYNAMO, "trajectroy": "x"}}})
    assert err.param == "nvext.agent_context.trajectroy"


def test_dynamo_missing_trajectory_id_is_named() -> None:
    ctx = dict(DYNAMO)
    del ctx["trajectory_id"]
    err = error_of({"nvext": {"agent_context": ctx}})
    assert err.param == "nvext.agent_context.trajectory_id" and err.status == 400


def test_dynamo_trajectory_id_alone_names_the_program() -> None:
    # ai-dynamo/dynamo#10800: trajectory_id is the only required field.
    body = {"model": "m", "nvext": {"agent_context": {"trajectory_id": "t-1"}}}
    ctx, changed = parse(body)
    assert ctx is not None
    assert ctx.program_id == "t-1" and ctx.source is Convention.DYNAMO_BODY
    assert ctx.session_id is None and ctx.session_type is None
    assert changed and body == {"model": "m"}


@pytest.mark.parametrize("name", ["session_id", "session_type_id"])
def test_dynamo_optional_ids_are_validated_when_present(name: str) -> None:
    for bad, fragment in (("  ", "empty"), (7, "Expected `str"), ("a\x00b", "control")):
        err = error_of({"nvext": {"agent_context": {"trajectory_id": "t", name: bad}}})
        assert err.param == f"nvext.agent_context.{name}" and fragment in err.message


def test_dynamo_null_optional_id_counts_as_absent() -> None:
    ctx, _ = parse({"nvext": {"agent_context": {"trajectory_id": "t", "session_id": None}}})
    assert ctx is not None
    assert ctx.program_id == "t" and ctx.session_id is None


def test_dynamo_unknown_key_is_still_rejected_with_trajectory_id_alone() -> None:
    err = error_of({"nvext": {"agent_context": {"trajectory_id": "t", "sesion_id": "s"}}})
    assert err.param == "nvext.agent_context.sesion_id" and err.status == 400


def test_dynamo_wrong_type_is_named() -> None:
    err = error_of({"nvext": {"agent_context": {**DYNAMO, "trajectory_id": 7}}})
    assert err.param == "nvext.agent_context.trajectory_id"


def test_dynamo_blank_id_is_rejected() -> None:
    err = error_of({"nvext": {"agent_context": {**DYNAMO, "session_id": "  "}}})
    assert err.param == "nvext.agent_context.session_id"


def test_agent_hints_set_priority_and_expected_output() -> None:
    body = {
        "program_id": "p",
        "nvext": {"agent_hints": {"priority": 5, "osl": 200, "strict_priority": 1}},
    }
    ctx, _ = parse(body)
    assert ctx is not None
    assert (ctx.priority, ctx.expected_output_tokens, ctx.strict_priority) == (5, 200, 1)
    assert "nvext" not in body


def test_speculative_prefill_hint_is_read_onto_the_context_and_stripped() -> None:
    body = {
        "model": "m",
        "program_id": "p",
        "nvext": {"agent_hints": {"speculative_prefill": True}},
    }
    ctx, _ = parse(body)
    assert ctx is not None
    assert ctx.speculative_prefill is True
    assert body == {"model": "m"}


def test_speculative_prefill_must_be_a_boolean() -> None:
    err = error_of({"program_id": "p", "nvext": {"agent_hints": {"speculative_prefill": "yes"}}})
    assert err.param == "nvext.agent_hints.speculative_prefill"


def test_an_unknown_hint_is_rejected_by_name() -> None:
    err = error_of({"program_id": "p", "nvext": {"agent_hints": {"latency_sensitivity": 1.5}}})
    assert err.param == "nvext.agent_hints.latency_sensitivity" and err.status == 400


def test_an_allow_listed_hint_is_read_onto_the_context_and_stripped() -> None:
    hints = {"priority": 2, "latency_sensitivity": 1.5, "cache_ttl": {"s": 30}}
    body = {"model": "m", "program_id": "p", "nvext": {"agent_hints": hints}}
    ctx, _ = parse(body, extra_agent_hints=["latency_sensitivity", "cache_ttl"])
    assert ctx is not None
    assert ctx.priority == 2
    assert ctx.extra_hints == (("latency_sensitivity", 1.5), ("cache_ttl", {"s": 30}))
    assert ctx.hint("latency_sensitivity") == 1.5 and ctx.hint("absent") is None
    assert body == {"model": "m"}


def test_allow_listing_one_hint_still_rejects_others() -> None:
    err = error_of(
        {"program_id": "p", "nvext": {"agent_hints": {"latency_sensitivity": 1, "bogus": 1}}},
        extra_agent_hints=["latency_sensitivity"],
    )
    assert err.param == "nvext.agent_hints.bogus"


@pytest.mark.parametrize("names", [["osl"], ["not a name"], ["x", "x"]])
def test_the_hint_allow_list_refuses_documented_bad_or_repeated_names(names: list[str]) -> None:
    with pytest.raises(ValueError, match="extra_agent_hints"):
        AgentContextSettings(extra_agent_hints=names)


def test_other_nvext_keys_are_kept() -> None:
    body = {"program_id": "p", "nvext": {"agent_hints": {"priority": 1}, "greed_sampling": True}}
    parse(body)
    assert body["nvext"] == {"greed_sampling": True}


def test_nvext_must_be_an_object() -> None:
    assert error_of({"nvext": [1]}).param == "nvext"


# ------------------------------------------------------------------ Dynamo headers
def test_dynamo_session_header_names_the_program() -> None:
    ctx, _ = parse({}, {"X-Dynamo-Session-ID": "s1", "X-Dynamo-Parent-Session-ID": "s0"})
    assert ctx is not None
    assert ctx.program_id == "s1" and ctx.parent_program_id == "s0"
    assert ctx.source is Convention.DYNAMO_HEADERS


def test_a_header_id_is_read_as_utf8() -> None:
    ctx, _ = parse({}, {"X-Dynamo-Session-ID": "café-ü-程序"})
    assert ctx is not None
    assert ctx.program_id == "café-ü-程序"


@pytest.mark.parametrize("name", ["x-dynamo-session-id", "x-litellm-session-id"])
def test_a_header_that_is_not_utf8_is_an_error_naming_it(name: str) -> None:
    parser = ContextParser(AgentContextSettings())
    with pytest.raises(ContextError) as info:
        parser.parse({}, [(name.encode(), b"\xff\xfe")])
    assert info.value.param == name and info.value.status == 400
    assert "UTF-8" in info.value.message and "0xff" in info.value.message


def test_session_final_header_ends_the_program() -> None:
    ctx, _ = parse({}, {"X-Dynamo-Session-ID": "s1", "X-Dynamo-Session-Final": "true"})
    assert ctx is not None
    assert ctx.final


def test_session_final_header_must_be_boolean() -> None:
    err = error_of({}, {"X-Dynamo-Session-ID": "s1", "X-Dynamo-Session-Final": "maybe"})
    assert err.param == "X-Dynamo-Session-Final"


def test_body_wins_over_headers() -> None:
    ctx, _ = parse({"program_id": "from-body"}, {"X-Dynamo-Session-ID": "from-header"})
    assert ctx is not None
    assert ctx.program_id == "from-body" and ctx.source is Convention.THUNDERAGENT


def test_a_bad_header_is_an_error_even_when_the_body_names_the_program() -> None:
    err = error_of({"program_id": "p"}, {"X-Dynamo-Session-ID": "x" * 300})
    assert err.param == "x-dynamo-session-id"


def test_trajectory_headers_name_the_program_its_parent_and_end() -> None:
    headers = {
        "x-dynamo-trajectory-id": "t1",
        "x-dynamo-parent-trajectory-id": "t0",
        "x-dynamo-trajectory-final": "true",
    }
    ctx, _ = parse({}, headers)
    assert ctx is not None
    assert (ctx.program_id, ctx.parent_program_id, ctx.final) == ("t1", "t0", True)
    assert ctx.source is Convention.DYNAMO_HEADERS


def test_trajectory_final_header_must_be_boolean() -> None:
    err = error_of({}, {"x-dynamo-trajectory-id": "t1", "x-dynamo-trajectory-final": "soon"})
    assert err.param == "X-Dynamo-Trajectory-Final" and err.status == 400


@pytest.mark.parametrize("name", ["x-dynamo-trajectory-id", "x-dynamo-parent-trajectory-id"])
def test_trajectory_headers_are_validated(name: str) -> None:
    headers = {"x-dynamo-trajectory-id": "t1", name: " "}
    assert error_of({}, headers).param == name


def test_session_header_wins_over_trajectory_header() -> None:
    headers = {
        "X-Dynamo-Session-ID": "s1",
        "X-Dynamo-Parent-Session-ID": "s0",
        "x-dynamo-trajectory-id": "t1",
        "x-dynamo-parent-trajectory-id": "t0",
    }
    ctx, _ = parse({}, headers)
    assert ctx is not None
    assert (ctx.program_id, ctx.parent_program_id) == ("s1", "s0")


def test_the_losing_trajectory_header_lends_no_parent_to_another_program() -> None:
    headers = {
        "X-Dynamo-Session-ID": "s1",
        "x-dynamo-trajectory-id": "t1",
        "x-dynamo-parent-trajectory-id": "t0",
    }
    ctx, _ = parse({}, headers)
    assert ctx is not None
    assert (ctx.program_id, ctx.parent_program_id) == ("s1", None)


def test_a_trajectory_parent_applies_when_both_headers_name_the_same_program() -> None:
    headers = {
        "X-Dynamo-Session-ID": "p",
        "x-dynamo-trajectory-id": "p",
        "x-dynamo-parent-trajectory-id": "p0",
    }
    ctx, _ = parse({}, headers)
    assert ctx is not None
    assert (ctx.program_id, ctx.parent_program_id) == ("p", "p0")


def test_either_final_header_ends_the_session_header_program() -> None:
    headers = {"X-Dynamo-Session-ID": "s1", "x-dynamo-trajectory-final": "true"}
    ctx, _ = parse({}, headers)
    assert ctx is not None and ctx.final


def test_body_wins_over_trajectory_header() -> None:
    headers = {"x-dynamo-trajectory-id": "h", "x-dynamo-parent-trajectory-id": "h0"}
    ctx, _ = parse({"nvext": {"agent_context": {"trajectory_id": "b"}}}, headers)
    assert ctx is not None
    assert ctx.program_id == "b" and ctx.source is Convention.DYNAMO_BODY
    assert ctx.parent_program_id is None


def test_trajectory_header_wins_over_coding_agent_headers() -> None:
    headers = {"x-dynamo-trajectory-id": "t", "x-claude-code-session-id": "cc"}
    conventions = [Convention.DYNAMO_HEADERS, Convention.CODING_AGENTS]
    ctx, _ = parse({}, headers, conventions=conventions)
    assert ctx is not None and ctx.program_id == "t"


def test_trajectory_headers_are_listed_for_stripping_under_dynamo_headers() -> None:
    parser = ContextParser(AgentContextSettings())
    for name in (
        b"x-dynamo-trajectory-id",
        b"x-dynamo-parent-trajectory-id",
        b"x-dynamo-trajectory-final",
    ):
        assert name in parser.context_headers
    off = ContextParser(AgentContextSettings(conventions=[Convention.THUNDERAGENT]))
    assert b"x-dynamo-trajectory-id" not in off.context_headers


def test_dynamo_header_wins_over_litellm_header() -> None:
    ctx, _ = parse({}, {"x-litellm-session-id": "l", "X-Dynamo-Session-ID": "d"})
    assert ctx is not None
    assert ctx.program_id == "d"


def test_context_headers_are_listed_for_stripping() -> None:
    parser = ContextParser(AgentContextSettings())
    assert b"x-dynamo-session-id" in parser.context_headers
    assert b"x-litellm-session-id" in parser.context_headers
    assert b"x-claude-code-session-id" not in parser.context_headers  # off by default


# ---------------------------------------------------- vLLM router, LiteLLM, coding agents
def test_vllm_router_agentic_context_is_read_and_other_xargs_kept() -> None:
    body = {
        "vllm_xargs": {
            "agentic_context": {"program_id": "p", "priority": 3, "expected_output_length": 64},
            "foo": 1,
        }
    }
    ctx, _ = parse(body)
    assert ctx is not None
    assert ctx.program_id == "p" and ctx.priority == 3 and ctx.expected_output_tokens == 64
    assert ctx.source is Convention.VLLM_ROUTER
    assert body == {"vllm_xargs": {"foo": 1}}


def test_vllm_router_unknown_key_is_rejected() -> None:
    err = error_of({"vllm_xargs": {"agentic_context": {"program_id": "p", "prio": 1}}})
    assert err.param == "vllm_xargs.agentic_context.prio"


def test_litellm_metadata_session_is_a_program_and_emptied_metadata_removed() -> None:
    body = {"metadata": {"session_id": "L1"}}
    ctx, _ = parse(body)
    assert ctx is not None
    assert ctx.program_id == "L1" and ctx.source is Convention.LITELLM and body == {}


def test_litellm_header() -> None:
    ctx, _ = parse({}, {"x-litellm-session-id": "L2"})
    assert ctx is not None
    assert ctx.program_id == "L2"


def test_coding_agent_headers_are_off_by_default() -> None:
    ctx, _ = parse({}, {"x-claude-code-session-id": "cc"})
    assert ctx is None


CODING = [Convention.THUNDERAGENT, Convention.DYNAMO_HEADERS, Convention.CODING_AGENTS]


def test_claude_code_root_turn_is_its_session() -> None:
    ctx, _ = parse({}, {"x-claude-code-session-id": "s"}, conventions=CODING)
    assert ctx is not None
    assert (ctx.program_id, ctx.parent_program_id) == ("s", None)
    assert ctx.source is Convention.CODING_AGENTS


def test_claude_code_top_level_child_agent_is_its_agent_id_under_the_session() -> None:
    # Dynamo's session-ids page (ai-dynamo/dynamo#10896): the agent id is the child's session,
    # its parent is the parent agent id, else the root session.
    headers = {"x-claude-code-session-id": "s", "x-claude-code-agent-id": "a2"}
    ctx, _ = parse({}, headers, conventions=CODING)
    assert ctx is not None
    assert (ctx.program_id, ctx.parent_program_id) == ("a2", "s")


def test_claude_code_nested_child_agent_is_under_its_parent_agent() -> None:
    headers = {
        "x-claude-code-session-id": "s",
        "x-claude-code-agent-id": "a3",
        "x-claude-code-parent-agent-id": "a2",
    }
    ctx, _ = parse({}, headers, conventions=CODING)
    assert ctx is not None
    assert (ctx.program_id, ctx.parent_program_id) == ("a3", "a2")


def test_dynamo_session_header_wins_over_claude_code_headers() -> None:
    headers = {
        "X-Dynamo-Session-ID": "d",
        "x-claude-code-session-id": "s",
        "x-claude-code-agent-id": "a2",
    }
    ctx, _ = parse({}, headers, conventions=CODING)
    assert ctx is not None
    assert (ctx.program_id, ctx.parent_program_id) == ("d", None)


def test_a_final_header_applies_to_an_agent_native_program() -> None:
    headers = {"x-claude-code-session-id": "s", "X-Dynamo-Session-Final": "true"}
    ctx, _ = parse({}, headers, conventions=CODING)
    assert ctx is not None
    assert ctx.program_id == "s" and ctx.final


def test_codex_session_id_and_opencode_parent() -> None:
    ctx, _ = parse({}, {"session-id": "cx"}, conventions=CODING)
    assert ctx is not None and ctx.program_id == "cx"
    ctx, _ = parse({}, {"x-session-id": "oc", "x-parent-session-id": "oc0"}, conventions=CODING)
    assert ctx is not None
    assert (ctx.program_id, ctx.parent_program_id) == ("oc", "oc0")


def test_operator_session_header() -> None:
    ctx, _ = parse(
        {},
        {"x-user-session": "u1"},
        conventions=[Convention.SESSION_HEADER],
        session_header="X-User-Session",
    )
    assert ctx is not None
    assert ctx.program_id == "u1" and ctx.source is Convention.SESSION_HEADER


def test_disabled_convention_is_neither_read_nor_stripped() -> None:
    body = {"program_id": "p"}
    ctx, changed = parse(body, conventions=[Convention.DYNAMO_BODY])
    assert ctx is None and not changed and body == {"program_id": "p"}


# ------------------------------------------------------------------ validation
@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("a" * 257, "limit is 256"),
        ("bad\nid", "control"),
        (5, "must be a string"),
        (["p"], "must be a string"),
    ],
)
def test_invalid_program_ids_are_rejected_naming_the_field(value: object, fragment: str) -> None:
    err = error_of({"program_id": value})
    assert err.param == "program_id" and fragment in err.message and err.status == 400


def test_docker_ids_must_be_a_list() -> None:
    assert error_of({"program_id": "p", "docker_ids": "abc"}).param == "docker_ids"


def test_docker_id_that_is_not_a_container_reference_is_named() -> None:
    err = error_of({"program_id": "p", "docker_ids": ["ok", "rm -rf /"]})
    assert err.param == "docker_ids[1]"


def test_repeated_docker_id_is_rejected() -> None:
    err = error_of({"program_id": "p", "docker_ids": ["a1", "a1"]})
    assert err.param == "docker_ids[1]" and "repeats" in err.message


def test_more_than_64_docker_ids_is_rejected() -> None:
    err = error_of({"program_id": "p", "docker_ids": [f"c{i}" for i in range(65)]})
    assert err.param == "docker_ids"


def test_exactly_64_docker_ids_is_fine() -> None:
    ctx, _ = parse({"program_id": "p", "docker_ids": [f"c{i}" for i in range(64)]})
    assert ctx is not None
    assert len(ctx.docker_ids) == 64


def test_docker_ids_without_a_program_are_rejected() -> None:
    assert error_of({"docker_ids": ["a1"]}).param == "program_id"


def test_no_context_leaves_body_untouched() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    ctx, changed = parse(body)
    assert ctx is None and not changed
