"""Checks on the agent-context fields themselves: each form is accepted, stripped, and invalid
values are rejected with a 4xx that names the field (never forwarded, never a 5xx)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from thunder_mw.conformance._catalogue import check
from thunder_mw.conformance.session import Fail, NotApplicable, Session, clip

__all__ = ["CONTROL_FIELD", "CONTROL_HEADER", "FORMS", "INVALID", "Built", "Form", "Invalid"]

T, DB, DH = "thunderagent", "dynamo-body", "dynamo-headers"

# (body, headers, body paths that must not reach the engine, headers that must not either)
Built = tuple[dict[str, Any], dict[str, str], list[str], list[str]]


@dataclass(frozen=True)
class Form:
    """One way of naming a program (and its extras) in a request."""

    name: str
    label: str
    accept_profiles: tuple[str, ...]
    strip_profiles: tuple[str, ...]
    build: Callable[[Session, str], Built]
    path: str = "/v1/chat/completions"


def _dynamo_context(program: str, **extra: Any) -> dict[str, Any]:
    return {
        "session_type_id": "conformance",
        "session_id": program.rsplit("-", 1)[0],
        "trajectory_id": program,
        **extra,
    }


FORMS = (
    Form(
        "program_id.top_level",
        "`program_id` at the top level of the body",
        (T,),
        (T,),
        lambda s, p: (s.chat(program_id=p, max_tokens=4), {}, ["program_id"], []),
    ),
    Form(
        "program_id.extra_body",
        "`program_id` inside a literal nested `extra_body` object",
        (T,),
        (T,),
        lambda s, p: (
            s.chat(extra_body={"program_id": p}, max_tokens=4),
            {},
            ["extra_body.program_id"],
            [],
        ),
    ),
    Form(
        "docker_ids",
        "`docker_ids` (with a program_id)",
        (T,),
        (),
        lambda s, p: (
            s.chat(program_id=p, docker_ids=[f"sandbox-{s.run_id}"], max_tokens=4),
            {},
            ["docker_ids", "program_id"],
            [],
        ),
    ),
    Form(
        "tool_ids",
        "`tool_ids` (with a program_id)",
        (T,),
        (),
        lambda s, p: (
            s.chat(program_id=p, tool_ids=[f"tool-{s.run_id}"], max_tokens=4),
            {},
            ["tool_ids", "program_id"],
            [],
        ),
    ),
    Form(
        "nvext.agent_context",
        "Dynamo's `nvext.agent_context` (trajectory_id names the program)",
        (DB,),
        (DB,),
        lambda s, p: (
            s.chat(
                nvext={"agent_context": _dynamo_context(p, trajectory_final=False)}, max_tokens=4
            ),
            {},
            ["nvext.agent_context"],
            [],
        ),
    ),
    Form(
        "nvext.agent_hints",
        "Dynamo's `nvext.agent_hints` next to `nvext.agent_context`",
        (DB,),
        (DB,),
        lambda s, p: (
            s.chat(
                nvext={
                    "agent_context": _dynamo_context(p),
                    "agent_hints": {"priority": 2, "osl": 4},
                },
                max_tokens=4,
            ),
            {},
            ["nvext.agent_context", "nvext.agent_hints"],
            [],
        ),
    ),
    Form(
        "dynamo_headers",
        "the `X-Dynamo-Session-ID` / `X-Dynamo-Parent-Session-ID` headers",
        (DH,),
        (DH,),
        lambda s, p: (
            s.chat(max_tokens=4),
            {"X-Dynamo-Session-ID": p, "X-Dynamo-Parent-Session-ID": f"{p}-parent"},
            [],
            ["x-dynamo-session-id", "x-dynamo-parent-session-id"],
        ),
    ),
    Form(
        "nvext.agent_context.trajectory_only",
        "Dynamo's `nvext.agent_context` with `trajectory_id` alone (ai-dynamo/dynamo#10800)",
        (DB,),
        (DB,),
        lambda s, p: (
            s.chat(nvext={"agent_context": {"trajectory_id": p}}, max_tokens=4),
            {},
            ["nvext.agent_context"],
            [],
        ),
    ),
    Form(
        "nvext.agent_hints.speculative_prefill",
        "Dynamo's `nvext.agent_hints.speculative_prefill` next to a program id",
        (DB,),
        (DB,),
        lambda s, p: (
            s.chat(
                nvext={
                    "agent_context": {"trajectory_id": p},
                    "agent_hints": {"speculative_prefill": True},
                },
                max_tokens=4,
            ),
            {},
            ["nvext.agent_hints", "nvext.agent_context"],
            [],
        ),
    ),
    Form(
        "dynamo_trajectory_headers",
        "the `x-dynamo-trajectory-id` / `x-dynamo-parent-trajectory-id` headers "
        "(ai-dynamo/dynamo#10808)",
        (DH,),
        (DH,),
        lambda s, p: (
            s.chat(max_tokens=4),
            {"x-dynamo-trajectory-id": p, "x-dynamo-parent-trajectory-id": f"{p}-parent"},
            [],
            ["x-dynamo-trajectory-id", "x-dynamo-parent-trajectory-id"],
        ),
    ),
    Form(
        "claude_code.child_agent",
        "Claude Code's `x-claude-code-session-id` / `-agent-id` headers (the agent id is the "
        "child's program)",
        (),
        (),
        lambda s, p: (
            s.chat(max_tokens=4),
            {"x-claude-code-session-id": f"{p}-session", "x-claude-code-agent-id": p},
            [],
            ["x-claude-code-session-id", "x-claude-code-agent-id"],
        ),
    ),
    Form(
        "responses.program_id",
        "`program_id` in a /v1/responses body",
        (),
        (),
        lambda s, p: (s.responses(program_id=p, max_output_tokens=4), {}, ["program_id"], []),
        "/v1/responses",
    ),
    Form(
        "responses.nvext.agent_context",
        "Dynamo's `nvext.agent_context` in a /v1/responses body",
        (),
        (),
        lambda s, p: (
            s.responses(nvext={"agent_context": {"trajectory_id": p}}, max_output_tokens=4),
            {},
            ["nvext"],
            [],
        ),
        "/v1/responses",
    ),
    Form(
        "vllm_xargs.agentic_context",
        "the vLLM router's `vllm_xargs.agentic_context`",
        (),
        (),
        lambda s, p: (
            s.chat(vllm_xargs={"agentic_context": {"program_id": p, "priority": 1}}, max_tokens=4),
            {},
            ["vllm_xargs.agentic_context"],
            [],
        ),
    ),
    Form(
        "litellm.metadata",
        "LiteLLM's `metadata.session_id`",
        (),
        (),
        lambda s, p: (
            s.chat(metadata={"session_id": p}, max_tokens=4),
            {},
            ["metadata.session_id"],
            [],
        ),
    ),
    Form(
        "litellm.header",
        "LiteLLM's `x-litellm-session-id` header",
        (),
        (),
        lambda s, p: (
            s.chat(max_tokens=4),
            {"x-litellm-session-id": p},
            [],
            ["x-litellm-session-id"],
        ),
    ),
)


CONTROL_FIELD = "x_conformance_control"
CONTROL_HEADER = "x-conformance-control"


def _accept(form: Form) -> Callable[[Session], Any]:
    async def run(s: Session) -> str | None:
        program = s.program_id()
        body, headers, _, _ = form.build(s, program)
        await s.post_ok(body, headers=headers, path=form.path)
        s.received_once(body)
        programs = await s.programs()
        if programs is None:
            raise NotApplicable(
                "answered 2xx and forwarded once, but the server publishes no program views to "
                "show that it read the program"
            )
        if program not in programs:
            raise Fail(
                f"answered 2xx but its program views do not list program {program!r}",
                sorted(programs)[:20],
            )
        await s.release(program)
        return None

    return run


def _strip(form: Form) -> Callable[[Session], Any]:
    async def run(s: Session) -> str | None:
        program = s.program_id()
        body, headers, paths, header_names = form.build(s, program)
        # The precondition: a field (or header) that is NOT agent context, sent beside the
        # form, reaches the engine. A server that drops whatever it does not know would
        # otherwise pass without stripping anything.
        body[CONTROL_FIELD] = s.run_id
        await s.post_ok(body, headers={**headers, CONTROL_HEADER: s.run_id}, path=form.path)
        record = s.received_once(body)
        forwarded = record.json()
        if paths and not (isinstance(forwarded, dict) and CONTROL_FIELD in forwarded):
            raise NotApplicable(
                f"the server drops body fields it does not know (`{CONTROL_FIELD}` did not "
                "reach the engine either), so stripping cannot be told from dropping"
            )
        if header_names and record.header(CONTROL_HEADER) is None:
            raise NotApplicable(
                f"the server drops client headers (`{CONTROL_HEADER}` did not reach the "
                "engine either), so stripping cannot be told from dropping"
            )
        for path in paths:
            if _has_path(forwarded, path):
                raise Fail(f"the backend received `{path}`", forwarded)
        for name in header_names:
            if record.header(name) is not None:
                raise Fail(f"the backend received header `{name}`", record.headers)
        if program.encode() in record.body:
            raise Fail("the program id still appears in the forwarded body", forwarded)
        await s.release(program)
        return None

    return run


for _form in FORMS:
    check(
        f"accept.{_form.name}",
        f"A request naming its program with {_form.label} is answered 2xx, forwarded once "
        "and listed under that program (n/a where the server publishes no program views).",
        *_form.accept_profiles,
    )(_accept(_form))
    check(
        f"strip.{_form.name}",
        f"{_form.label[0].upper()}{_form.label[1:]} does not reach the backend.",
        *_form.strip_profiles,
    )(_strip(_form))


@check(
    "strip.emptied_containers_removed",
    "Objects left empty by stripping (`extra_body`, `nvext`) are removed, not forwarded as {}.",
)
async def _emptied_containers_removed(s: Session) -> str | None:
    program = s.program_id()
    body = s.chat(
        extra_body={"program_id": program},
        nvext={"agent_context": _dynamo_context(program)},
        max_tokens=4,
    )
    await s.post_ok(body)
    forwarded = s.forwarded_json(body)
    for key in ("extra_body", "nvext"):
        if key in forwarded:
            raise Fail(f"the backend received `{key}`: {forwarded[key]!r}", forwarded)
    await s.release(program)
    return None


# ---------------------------------------------------------------------------- rejection
@dataclass(frozen=True)
class Invalid:
    name: str
    label: str
    field: str  # the name the error body must mention
    profiles: tuple[str, ...]
    build: Callable[[Session], tuple[dict[str, Any], dict[str, str]]]
    # The same request made valid: the server must accept it, or its rejection of the
    # invalid one says nothing about validation (it may reject the whole form).
    valid: Callable[[Session], tuple[dict[str, Any], dict[str, str]]]


def _with_context(s: Session, agent_context: dict[str, Any]) -> dict[str, Any]:
    return s.chat(nvext={"agent_context": agent_context}, max_tokens=4)


def _with_hints(s: Session, hints: dict[str, Any]) -> dict[str, Any]:
    return s.chat(program_id=s.program_id(), nvext={"agent_hints": hints}, max_tokens=4)


def _top(value: Any) -> Callable[[Session], tuple[dict[str, Any], dict[str, str]]]:
    return lambda s: (s.chat(program_id=value, max_tokens=4), {})


def _valid_program(s: Session) -> tuple[dict[str, Any], dict[str, str]]:
    return s.chat(program_id=s.program_id(), max_tokens=4), {}


def _valid_context(s: Session) -> tuple[dict[str, Any], dict[str, str]]:
    return _with_context(s, _dynamo_context(s.program_id())), {}


def _header(**headers: str) -> Callable[[Session], tuple[dict[str, Any], dict[str, str]]]:
    return lambda s: (s.chat(max_tokens=4), {k.replace("_", "-"): v for k, v in headers.items()})


def _header_with_program(
    name: str, **more: str
) -> Callable[[Session], tuple[dict[str, Any], dict[str, str]]]:
    extra = {k.replace("_", "-"): v for k, v in more.items()}
    return lambda s: (s.chat(max_tokens=4), {name: s.program_id(), **extra})


INVALID = (
    Invalid(
        "program_id.blank", "an empty `program_id`", "program_id", (), _top(""), _valid_program
    ),
    Invalid(
        "program_id.whitespace",
        "a whitespace-only `program_id`",
        "program_id",
        (),
        _top(" \t  "),
        _valid_program,
    ),
    Invalid(
        "program_id.too_long",
        "a 5000-character `program_id`",
        "program_id",
        (),
        _top("p" * 5000),
        _valid_program,
    ),
    Invalid(
        "program_id.wrong_type",
        "a numeric `program_id`",
        "program_id",
        (),
        _top(12345),
        _valid_program,
    ),
    Invalid(
        "extra_body.program_id.blank",
        "a whitespace-only `extra_body.program_id`",
        "program_id",
        (),
        lambda s: (s.chat(extra_body={"program_id": "   "}, max_tokens=4), {}),
        lambda s: (s.chat(extra_body={"program_id": s.program_id()}, max_tokens=4), {}),
    ),
    Invalid(
        "docker_ids.wrong_type",
        "`docker_ids` given as a string, not a list",
        "docker_ids",
        (),
        lambda s: (s.chat(program_id=s.program_id(), docker_ids="sandbox-1", max_tokens=4), {}),
        lambda s: (s.chat(program_id=s.program_id(), docker_ids=["sandbox-1"], max_tokens=4), {}),
    ),
    Invalid(
        "nvext.agent_context.unknown_key",
        "an unknown key in `nvext.agent_context`",
        "bogus_key",
        (DB,),
        lambda s: (_with_context(s, {**_dynamo_context(s.program_id()), "bogus_key": 1}), {}),
        _valid_context,
    ),
    Invalid(
        "nvext.agent_context.blank_trajectory_id",
        "a whitespace-only `trajectory_id`",
        "trajectory_id",
        (DB,),
        lambda s: (_with_context(s, {**_dynamo_context("x-1"), "trajectory_id": "  "}), {}),
        _valid_context,
    ),
    Invalid(
        "nvext.agent_context.missing_trajectory_id",
        "`nvext.agent_context` without `trajectory_id` (the one required field)",
        "trajectory_id",
        (DB,),
        lambda s: (_with_context(s, {"session_type_id": "c", "session_id": "s"}), {}),
        lambda s: (_with_context(s, {"trajectory_id": s.program_id()}), {}),
    ),
    Invalid(
        "nvext.agent_context.blank_session_id",
        "a whitespace-only optional `session_id` (validated when present)",
        "session_id",
        (DB,),
        lambda s: (_with_context(s, {"trajectory_id": s.program_id(), "session_id": " "}), {}),
        lambda s: (_with_context(s, {"trajectory_id": s.program_id(), "session_id": "s"}), {}),
    ),
    Invalid(
        "nvext.agent_context.wrong_type",
        "a numeric `trajectory_id`",
        "trajectory_id",
        (DB,),
        lambda s: (_with_context(s, {**_dynamo_context("x-1"), "trajectory_id": 7}), {}),
        _valid_context,
    ),
    Invalid(
        "nvext.agent_hints.unknown_key",
        "an unknown key in `nvext.agent_hints`",
        "bogus_hint",
        (DB,),
        lambda s: (_with_hints(s, {"osl": 4, "bogus_hint": 1}), {}),
        lambda s: (_with_hints(s, {"osl": 4}), {}),
    ),
    Invalid(
        "nvext.agent_hints.speculative_prefill.wrong_type",
        '`nvext.agent_hints.speculative_prefill: "yes"` (not a boolean)',
        "speculative_prefill",
        (DB,),
        lambda s: (_with_hints(s, {"speculative_prefill": "yes"}), {}),
        lambda s: (_with_hints(s, {"speculative_prefill": True}), {}),
    ),
    Invalid(
        "dynamo_header.blank",
        "an empty `X-Dynamo-Session-ID` header",
        "x-dynamo-session-id",
        (DH,),
        _header(X_Dynamo_Session_ID=""),
        _header_with_program("X-Dynamo-Session-ID"),
    ),
    Invalid(
        "dynamo_header.bad_final",
        "`X-Dynamo-Session-Final: maybe`",
        "x-dynamo-session-final",
        (DH,),
        _header_with_program("X-Dynamo-Session-ID", X_Dynamo_Session_Final="maybe"),
        _header_with_program("X-Dynamo-Session-ID", X_Dynamo_Session_Final="false"),
    ),
    Invalid(
        "dynamo_trajectory_header.too_long",
        "a 5000-character `x-dynamo-trajectory-id` header",
        "x-dynamo-trajectory-id",
        (DH,),
        _header(x_dynamo_trajectory_id="t" * 5000),
        _header_with_program("x-dynamo-trajectory-id"),
    ),
    Invalid(
        "dynamo_trajectory_header.bad_final",
        "`x-dynamo-trajectory-final: soon`",
        "x-dynamo-trajectory-final",
        (DH,),
        _header_with_program("x-dynamo-trajectory-id", x_dynamo_trajectory_final="soon"),
        _header_with_program("x-dynamo-trajectory-id", x_dynamo_trajectory_final="false"),
    ),
    Invalid(
        "vllm_xargs.agentic_context.unknown_key",
        "an unknown key in `vllm_xargs.agentic_context`",
        "bogus_key",
        (),
        lambda s: (
            s.chat(
                vllm_xargs={"agentic_context": {"program_id": "p-1", "bogus_key": 1}}, max_tokens=4
            ),
            {},
        ),
        lambda s: (
            s.chat(vllm_xargs={"agentic_context": {"program_id": s.program_id()}}, max_tokens=4),
            {},
        ),
    ),
)


def _reject(invalid: Invalid) -> Callable[[Session], Any]:
    async def run(s: Session) -> str | None:
        valid, valid_headers = invalid.valid(s)
        answer = await s.post(valid, headers=valid_headers)
        if not 200 <= answer.status < 300:
            raise NotApplicable(
                f"the server also refuses the valid form of this request ({answer.status}: "
                f"{clip(answer.body, 160)}), so its refusal says nothing about validation"
            )
        body, headers = invalid.build(s)
        sent = copy.deepcopy(body)
        reply = await s.post(body, headers=headers)
        if not 400 <= reply.status < 500:
            raise Fail(f"expected a 4xx, got {reply.status} for {clip(sent, 200)}", reply.body)
        if invalid.field.lower() not in reply.body.decode("utf-8", "replace").lower():
            raise Fail(f"the error body does not name `{invalid.field}`", reply.body)
        if s.received(body):
            raise Fail("the rejected request still reached the backend", s.received(body)[0].body)
        return f"{reply.status}: {clip(reply.body, 160)}"

    return run


for _invalid in INVALID:
    check(
        f"reject.{_invalid.name}",
        f"A request with {_invalid.label} is rejected with a 4xx naming `{_invalid.field}`, "
        "and is not forwarded.",
        *_invalid.profiles,
    )(_reject(_invalid))


def _has_path(data: Any, path: str) -> bool:
    for part in path.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True
