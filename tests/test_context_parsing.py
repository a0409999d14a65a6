"""Specification of how every agent-context convention is read, validated and stripped."""

from __future__ import annotations

import pytest

from thunder_mw.schemas.config import AgentContextSettings, Convention
from thunder_mw.schemas.context_parsing import ContextError, ContextParser

DYNAMO = {"session_type_id": "swe", "session_id": "run-1", "trajectory_id": "run-1:main"}


def parse(body=None, headers=(), **settings):
    parser = ContextParser(AgentContextSettings(**settings))
    hdrs = [(k.lower().encode(), v.encode()) for k, v in dict(headers).items()]
    return parser.parse(body, hdrs)


def error_of(body=None, headers=(), **settings) -> ContextError:
    with pytest.raises(ContextError) as info:
        parse(body, headers, **settings)
    return info.value


# ------------------------------------------------------------------ ThunderAgent body fields
def test_top_level_program_id_names_the_program_and_is_stripped():
    body = {"model": "m", "program_id": "p1", "messages": []}
    ctx, changed = parse(body)
    assert ctx.program_id == "p1" and ctx.source is Convention.THUNDERAGENT
    assert changed and body == {"model": "m", "messages": []}
    assert list(body) == ["model", "messages"]


def test_nested_extra_body_program_id_is_read_and_the_emptied_object_removed():
    body = {"model": "m", "extra_body": {"program_id": "p1", "docker_ids": ["box-1"]}}
    ctx, _ = parse(body)
    assert ctx.program_id == "p1" and ctx.docker_ids == ("box-1",)
    assert body == {"model": "m"}


def test_extra_body_siblings_survive_stripping():
    body = {"model": "m", "extra_body": {"program_id": "p1", "top_k": 5}}
    parse(body)
    assert body == {"model": "m", "extra_body": {"top_k": 5}}


def test_docker_ids_and_tool_ids_are_merged():
    ctx, _ = parse({"program_id": "p", "docker_ids": ["a1"], "tool_ids": ["b2"]})
    assert ctx.docker_ids == ("a1", "b2")


def test_same_program_in_top_level_and_extra_body_is_fine():
    ctx, _ = parse({"program_id": "p", "extra_body": {"program_id": "p"}})
    assert ctx.program_id == "p"


def test_two_body_forms_naming_different_programs_is_an_error():
    err = error_of({"program_id": "a", "nvext": {"agent_context": {**DYNAMO}}})
    assert err.code == "conflicting_program_ids"
    assert err.param == "nvext.agent_context.trajectory_id"


def test_null_program_id_counts_as_absent_but_is_still_stripped():
    body = {"model": "m", "program_id": None}
    ctx, changed = parse(body)
    assert ctx is None and changed and body == {"model": "m"}


# ------------------------------------------------------------------ Dynamo body
def test_dynamo_agent_context_maps_trajectory_to_program():
    body = {
        "model": "m",
        "nvext": {"agent_context": {**DYNAMO, "parent_trajectory_id": "run-1:planner"}},
    }
    ctx, _ = parse(body)
    assert ctx.program_id == "run-1:main"
    assert ctx.session_id == "run-1" and ctx.session_type == "swe"
    assert ctx.parent_program_id == "run-1:planner"
    assert ctx.source is Convention.DYNAMO_BODY
    assert body == {"model": "m"}


def test_dynamo_final_flag_is_read():
    ctx, _ = parse({"nvext": {"agent_context": {**DYNAMO, "trajectory_final": True}}})
    assert ctx.final


def test_dynamo_unknown_key_is_rejected_by_name():
    err = error_of({"nvext": {"agent_context": {**DYNAMO, "trajectroy": "x"}}})
    assert err.param == "nvext.agent_context.trajectroy"


def test_dynamo_missing_required_field_is_named():
    ctx = dict(DYNAMO)
    del ctx["session_id"]
    assert error_of({"nvext": {"agent_context": ctx}}).param == "nvext.agent_context.session_id"


def test_dynamo_wrong_type_is_named():
    err = error_of({"nvext": {"agent_context": {**DYNAMO, "trajectory_id": 7}}})
    assert err.param == "nvext.agent_context.trajectory_id"


def test_dynamo_blank_id_is_rejected():
    err = error_of({"nvext": {"agent_context": {**DYNAMO, "session_id": "  "}}})
    assert err.param == "nvext.agent_context.session_id"


def test_agent_hints_set_priority_and_expected_output():
    body = {
        "program_id": "p",
        "nvext": {"agent_hints": {"priority": 5, "osl": 200, "strict_priority": 1}},
    }
    ctx, _ = parse(body)
    assert (ctx.priority, ctx.expected_output_tokens, ctx.strict_priority) == (5, 200, 1)
    assert "nvext" not in body


def test_other_nvext_keys_are_kept():
    body = {"program_id": "p", "nvext": {"agent_hints": {"priority": 1}, "greed_sampling": True}}
    parse(body)
    assert body["nvext"] == {"greed_sampling": True}


def test_nvext_must_be_an_object():
    assert error_of({"nvext": [1]}).param == "nvext"


# ------------------------------------------------------------------ Dynamo headers
def test_dynamo_session_header_names_the_program():
    ctx, _ = parse({}, {"X-Dynamo-Session-ID": "s1", "X-Dynamo-Parent-Session-ID": "s0"})
    assert ctx.program_id == "s1" and ctx.parent_program_id == "s0"
    assert ctx.source is Convention.DYNAMO_HEADERS


def test_session_final_header_ends_the_program():
    ctx, _ = parse({}, {"X-Dynamo-Session-ID": "s1", "X-Dynamo-Session-Final": "true"})
    assert ctx.final


def test_session_final_header_must_be_boolean():
    err = error_of({}, {"X-Dynamo-Session-ID": "s1", "X-Dynamo-Session-Final": "maybe"})
    assert err.param == "X-Dynamo-Session-Final"


def test_body_wins_over_headers():
    ctx, _ = parse({"program_id": "from-body"}, {"X-Dynamo-Session-ID": "from-header"})
    assert ctx.program_id == "from-body" and ctx.source is Convention.THUNDERAGENT


def test_a_bad_header_is_an_error_even_when_the_body_names_the_program():
    err = error_of({"program_id": "p"}, {"X-Dynamo-Session-ID": "x" * 300})
    assert err.param == "x-dynamo-session-id"


def test_dynamo_header_wins_over_litellm_header():
    ctx, _ = parse({}, {"x-litellm-session-id": "l", "X-Dynamo-Session-ID": "d"})
    assert ctx.program_id == "d"


def test_context_headers_are_listed_for_stripping():
    parser = ContextParser(AgentContextSettings())
    assert b"x-dynamo-session-id" in parser.context_headers
    assert b"x-litellm-session-id" in parser.context_headers
    assert b"x-claude-code-session-id" not in parser.context_headers  # off by default


# ---------------------------------------------------- vLLM router, LiteLLM, coding agents
def test_vllm_router_agentic_context_is_read_and_other_xargs_kept():
    body = {
        "vllm_xargs": {
            "agentic_context": {"program_id": "p", "priority": 3, "expected_output_length": 64},
            "foo": 1,
        }
    }
    ctx, _ = parse(body)
    assert ctx.program_id == "p" and ctx.priority == 3 and ctx.expected_output_tokens == 64
    assert ctx.source is Convention.VLLM_ROUTER
    assert body == {"vllm_xargs": {"foo": 1}}


def test_vllm_router_unknown_key_is_rejected():
    err = error_of({"vllm_xargs": {"agentic_context": {"program_id": "p", "prio": 1}}})
    assert err.param == "vllm_xargs.agentic_context.prio"


def test_litellm_metadata_session_is_a_program_and_emptied_metadata_removed():
    body = {"metadata": {"session_id": "L1"}}
    ctx, _ = parse(body)
    assert ctx.program_id == "L1" and ctx.source is Convention.LITELLM and body == {}


def test_litellm_header():
    ctx, _ = parse({}, {"x-litellm-session-id": "L2"})
    assert ctx.program_id == "L2"


def test_coding_agent_headers_are_off_by_default():
    ctx, _ = parse({}, {"x-claude-code-session-id": "cc"})
    assert ctx is None


def test_claude_code_agent_is_a_sub_program_of_its_session():
    conventions = [Convention.THUNDERAGENT, Convention.CODING_AGENTS]
    ctx, _ = parse(
        {},
        {"x-claude-code-session-id": "s", "x-claude-code-agent-id": "a2"},
        conventions=conventions,
    )
    assert ctx.program_id == "s/a2" and ctx.parent_program_id == "s"


def test_operator_session_header():
    ctx, _ = parse(
        {},
        {"x-user-session": "u1"},
        conventions=[Convention.SESSION_HEADER],
        session_header="X-User-Session",
    )
    assert ctx.program_id == "u1" and ctx.source is Convention.SESSION_HEADER


def test_disabled_convention_is_neither_read_nor_stripped():
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
def test_invalid_program_ids_are_rejected_naming_the_field(value, fragment):
    err = error_of({"program_id": value})
    assert err.param == "program_id" and fragment in err.message and err.status == 400


def test_docker_ids_must_be_a_list():
    assert error_of({"program_id": "p", "docker_ids": "abc"}).param == "docker_ids"


def test_docker_id_that_is_not_a_container_reference_is_named():
    err = error_of({"program_id": "p", "docker_ids": ["ok", "rm -rf /"]})
    assert err.param == "docker_ids[1]"


def test_repeated_docker_id_is_rejected():
    err = error_of({"program_id": "p", "docker_ids": ["a1", "a1"]})
    assert err.param == "docker_ids[1]" and "repeats" in err.message


def test_more_than_64_docker_ids_is_rejected():
    err = error_of({"program_id": "p", "docker_ids": [f"c{i}" for i in range(65)]})
    assert err.param == "docker_ids"


def test_exactly_64_docker_ids_is_fine():
    ctx, _ = parse({"program_id": "p", "docker_ids": [f"c{i}" for i in range(64)]})
    assert len(ctx.docker_ids) == 64


def test_docker_ids_without_a_program_are_rejected():
    assert error_of({"docker_ids": ["a1"]}).param == "program_id"


def test_no_context_leaves_body_untouched():
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    ctx, changed = parse(body)
    assert ctx is None and not changed
