"""Reads every supported agent-context convention out of a decoded body and headers, and strips it.

Pure: no I/O. The middleware decodes the body once and hands the dict here; this module
removes the agent-context fields in place (so the rest of the body keeps its keys, values
and order) and returns the normalised `AgentContext`.

Precedence (docs/usage.md): the body wins over headers, as in Dynamo. Two body forms that name
DIFFERENT programs are an error. Among headers, the first present in this order names the
program: Dynamo's session header, Dynamo's older trajectory header, LiteLLM, the operator's
session header, coding-agent headers (explicit gateway headers before agent-native ones, as
Dynamo's session-ids page rules since ai-dynamo/dynamo#10896).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import msgspec

from thunder_mw.schemas.agent_context import (
    AgentContext,
    DynamoAgentContext,
    DynamoAgentHints,
    VllmAgenticContext,
)
from thunder_mw.schemas.config import AgentContextSettings, Convention

__all__ = [
    "H_CLAUDE_AGENT",
    "H_CLAUDE_PARENT",
    "H_CLAUDE_SESSION",
    "H_CODEX_SESSION",
    "H_CODEX_THREAD",
    "H_DYNAMO_FINAL",
    "H_DYNAMO_PARENT",
    "H_DYNAMO_PARENT_TRAJECTORY",
    "H_DYNAMO_SESSION",
    "H_DYNAMO_TRAJECTORY",
    "H_DYNAMO_TRAJECTORY_FINAL",
    "H_LITELLM_SESSION",
    "H_OPENCODE_PARENT",
    "H_OPENCODE_SESSION",
    "ContextError",
    "ContextParser",
]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# Docker's own rule for container names (and a hex id is a valid name too).
_CONTAINER_REF = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
_MAX_CONTAINER_REF = 128
_NAMED_FIELD = re.compile(r"(?:unknown|missing required) field `([^`]*)`")

# Header names as ASGI gives them: lower-case bytes.
H_DYNAMO_SESSION = b"x-dynamo-session-id"
H_DYNAMO_PARENT = b"x-dynamo-parent-session-id"
H_DYNAMO_FINAL = b"x-dynamo-session-final"
# The trajectory headers (ai-dynamo/dynamo#10800, #10808), still in its ThunderAgent router docs.
H_DYNAMO_TRAJECTORY = b"x-dynamo-trajectory-id"
H_DYNAMO_PARENT_TRAJECTORY = b"x-dynamo-parent-trajectory-id"
H_DYNAMO_TRAJECTORY_FINAL = b"x-dynamo-trajectory-final"
_FINAL_HEADERS = {
    H_DYNAMO_FINAL: "X-Dynamo-Session-Final",
    H_DYNAMO_TRAJECTORY_FINAL: "X-Dynamo-Trajectory-Final",
}
H_LITELLM_SESSION = b"x-litellm-session-id"
H_CLAUDE_SESSION = b"x-claude-code-session-id"
H_CLAUDE_AGENT = b"x-claude-code-agent-id"
H_CLAUDE_PARENT = b"x-claude-code-parent-agent-id"
H_CODEX_SESSION = b"session-id"
H_CODEX_THREAD = b"thread-id"
H_OPENCODE_SESSION = b"x-session-id"
H_OPENCODE_PARENT = b"x-parent-session-id"

_HEADERS_BY_CONVENTION: dict[Convention, tuple[bytes, ...]] = {
    Convention.DYNAMO_HEADERS: (
        H_DYNAMO_SESSION,
        H_DYNAMO_PARENT,
        H_DYNAMO_FINAL,
        H_DYNAMO_TRAJECTORY,
        H_DYNAMO_PARENT_TRAJECTORY,
        H_DYNAMO_TRAJECTORY_FINAL,
    ),
    Convention.LITELLM: (H_LITELLM_SESSION,),
    Convention.CODING_AGENTS: (
        H_CLAUDE_SESSION,
        H_CLAUDE_AGENT,
        H_CLAUDE_PARENT,
        H_CODEX_SESSION,
        H_CODEX_THREAD,
        H_OPENCODE_SESSION,
        H_OPENCODE_PARENT,
    ),
}

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


class ContextError(Exception):
    """Bad agent context or body: becomes an OpenAI-style error naming `param`."""

    def __init__(
        self, message: str, param: str, code: str = "invalid_agent_context", status: int = 400
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status


class _Found:
    """What the conventions found so far; `program_id` comes from the first body form."""

    __slots__ = (
        "deadline_s",
        "docker_ids",
        "expected_output_tokens",
        "extra_hints",
        "final",
        "kv_retention_ttl_s",
        "parent",
        "priority",
        "program_id",
        "program_param",
        "session_id",
        "session_type",
        "source",
        "speculative_prefill",
        "strict_priority",
    )

    def __init__(self) -> None:
        self.program_id: str | None = None
        self.program_param = ""
        self.source: Convention | None = None
        self.parent: str | None = None
        self.session_id: str | None = None
        self.session_type: str | None = None
        self.docker_ids: list[str] = []
        self.priority: int | None = None
        self.strict_priority: int | None = None
        self.expected_output_tokens: int | None = None
        self.deadline_s: float | None = None
        self.kv_retention_ttl_s: float | None = None
        self.final = False
        self.speculative_prefill: bool | None = None
        self.extra_hints: list[tuple[str, Any]] = []

    def name_program(self, program_id: str, param: str, source: Convention) -> None:
        if self.program_id is None:
            self.program_id, self.program_param, self.source = program_id, param, source
        elif program_id != self.program_id:
            raise ContextError(
                f"{param} names program {program_id!r} but {self.program_param} names "
                f"{self.program_id!r}; send one program per request",
                param,
                code="conflicting_program_ids",
            )


class ContextParser:
    """Parses and strips agent context for one configuration; build once, reuse per request."""

    def __init__(self, settings: AgentContextSettings) -> None:
        self._settings = settings
        enabled = set(settings.conventions)
        self._thunderagent = Convention.THUNDERAGENT in enabled
        self._dynamo_body = Convention.DYNAMO_BODY in enabled
        self._dynamo_headers = Convention.DYNAMO_HEADERS in enabled
        self._vllm_router = Convention.VLLM_ROUTER in enabled
        self._litellm = Convention.LITELLM in enabled
        self._coding = Convention.CODING_AGENTS in enabled
        self._session_header = (
            settings.session_header.lower().encode("latin-1")
            if settings.session_header and Convention.SESSION_HEADER in enabled
            else None
        )
        names: set[bytes] = set()
        for convention, headers in _HEADERS_BY_CONVENTION.items():
            if convention in enabled:
                names.update(headers)
        if self._session_header:
            names.add(self._session_header)
        self.context_headers: frozenset[bytes] = frozenset(names)
        self._extra_hints = frozenset(settings.extra_agent_hints)
        self._max_id = settings.max_id_length
        self._max_docker_ids = settings.max_docker_ids

    # ---------------------------------------------------------------- public
    def parse(
        self, body: dict[str, Any] | None, headers: Iterable[tuple[bytes, bytes]]
    ) -> tuple[AgentContext | None, bool]:
        """Return (context or None when the request carries none, whether `body` was changed).

        `body` is modified in place: agent-context fields are removed. Raises ContextError.
        """
        found = _Found()
        changed = False
        if body is not None:
            if self._thunderagent:
                changed |= self._thunderagent_fields(body, found)
            if self._dynamo_body or self._dynamo_headers:
                changed |= self._nvext(body, found)
            if self._vllm_router:
                changed |= self._vllm_xargs(body, found)
            if self._litellm:
                changed |= self._litellm_metadata(body, found)
        if self.context_headers:
            self._headers(headers, found)
        if found.program_id is None:
            if found.docker_ids:
                raise ContextError(
                    "docker_ids/tool_ids need a program id to own them", "program_id"
                )
            return None, changed
        return (
            AgentContext(
                program_id=found.program_id,
                source=found.source,
                parent_program_id=found.parent,
                session_id=found.session_id,
                session_type=found.session_type,
                docker_ids=tuple(found.docker_ids),
                priority=found.priority or 0,
                strict_priority=found.strict_priority,
                expected_output_tokens=found.expected_output_tokens,
                deadline_s=found.deadline_s,
                kv_retention_ttl_s=found.kv_retention_ttl_s,
                final=found.final,
                speculative_prefill=found.speculative_prefill,
                extra_hints=tuple(found.extra_hints),
            ),
            changed,
        )

    # ---------------------------------------------------------------- checks
    def check_id(self, value: object, param: str) -> str:
        if not isinstance(value, str):
            raise ContextError(f"{param} must be a string, got {_type_name(value)}", param)
        if not value or value.isspace():
            raise ContextError(f"{param} must not be empty or whitespace", param)
        if len(value) > self._max_id:
            raise ContextError(
                f"{param} is {len(value)} characters long; the limit is {self._max_id}", param
            )
        if _CONTROL.search(value):
            raise ContextError(f"{param} must not contain control characters", param)
        return value

    def _docker_ids(self, value: object, param: str, found: _Found) -> None:
        if value is None:
            return
        if not isinstance(value, list):
            raise ContextError(
                f"{param} must be a list of container ids, got {_type_name(value)}", param
            )
        if len(found.docker_ids) + len(value) > self._max_docker_ids:
            raise ContextError(f"{param} names more than {self._max_docker_ids} containers", param)
        seen = set(found.docker_ids)
        for i, ref in enumerate(value):
            item = f"{param}[{i}]"
            if not isinstance(ref, str):
                raise ContextError(f"{item} must be a string, got {_type_name(ref)}", item)
            if len(ref) > _MAX_CONTAINER_REF or not _CONTAINER_REF.fullmatch(ref):
                raise ContextError(f"{item} is not a container id or name: {ref[:80]!r}", item)
            if ref in seen:
                raise ContextError(f"{item} repeats container {ref!r}", item)
            seen.add(ref)
            found.docker_ids.append(ref)

    # ---------------------------------------------------------------- body forms
    def _thunderagent_fields(self, body: dict[str, Any], found: _Found) -> bool:
        changed = False
        if "program_id" in body:
            value = body.pop("program_id")
            changed = True
            if value is not None:
                found.name_program(
                    self.check_id(value, "program_id"), "program_id", Convention.THUNDERAGENT
                )
        for key in ("docker_ids", "tool_ids"):
            if key in body:
                self._docker_ids(body.pop(key), key, found)
                changed = True
        nested = body.get("extra_body")
        if isinstance(nested, dict) and (
            "program_id" in nested or "docker_ids" in nested or "tool_ids" in nested
        ):
            changed = True
            value = nested.pop("program_id", None)
            if value is not None:
                param = "extra_body.program_id"
                found.name_program(self.check_id(value, param), param, Convention.THUNDERAGENT)
            for key in ("docker_ids", "tool_ids"):
                if key in nested:
                    self._docker_ids(nested.pop(key), f"extra_body.{key}", found)
            if not nested:
                del body["extra_body"]
        return changed

    def _nvext(self, body: dict[str, Any], found: _Found) -> bool:
        nvext = body.get("nvext")
        if nvext is None:
            return False
        if not isinstance(nvext, dict):
            raise ContextError(f"nvext must be an object, got {_type_name(nvext)}", "nvext")
        changed = False
        if self._dynamo_body and "agent_context" in nvext:
            raw = nvext.pop("agent_context")
            changed = True
        else:
            raw = None
        if raw is not None:  # null is the same as leaving it out (docs/usage.md)
            ctx = _convert(raw, DynamoAgentContext, "nvext.agent_context")
            for name in ("session_type_id", "session_id", "trajectory_id"):
                value = getattr(ctx, name)
                if value is not None:
                    self.check_id(value, f"nvext.agent_context.{name}")
            param = "nvext.agent_context.trajectory_id"
            found.name_program(ctx.trajectory_id, param, Convention.DYNAMO_BODY)
            if ctx.parent_trajectory_id is not None:
                found.parent = found.parent or self.check_id(
                    ctx.parent_trajectory_id, "nvext.agent_context.parent_trajectory_id"
                )
            found.session_id = found.session_id or ctx.session_id
            found.session_type = found.session_type or ctx.session_type_id
            found.final |= ctx.trajectory_final
        if "agent_hints" in nvext:
            changed = True
            hints = nvext.pop("agent_hints")
            if hints is not None:
                self._agent_hints(hints, found)
        if changed and not nvext:
            del body["nvext"]
        return changed

    def _agent_hints(self, raw: object, found: _Found) -> None:
        if isinstance(raw, dict) and self._extra_hints:
            raw = dict(raw)
            for name in [k for k in raw if k in self._extra_hints]:
                value = raw.pop(name)
                if value is not None:
                    found.extra_hints.append((name, value))
        hints = _convert(raw, DynamoAgentHints, "nvext.agent_hints")
        for name in ("strict_priority", "osl"):
            if (getattr(hints, name) or 0) < 0:
                raise ContextError(
                    f"nvext.agent_hints.{name} must be >= 0", f"nvext.agent_hints.{name}"
                )
        if hints.priority is not None:
            found.priority = hints.priority
        found.strict_priority = hints.strict_priority
        found.expected_output_tokens = hints.osl
        found.speculative_prefill = hints.speculative_prefill

    def _vllm_xargs(self, body: dict[str, Any], found: _Found) -> bool:
        xargs = body.get("vllm_xargs")
        if not isinstance(xargs, dict) or "agentic_context" not in xargs:
            return False
        raw = xargs.pop("agentic_context")
        if raw is None:  # the same as leaving it out
            if not xargs:
                del body["vllm_xargs"]
            return True
        ctx = _convert(raw, VllmAgenticContext, "vllm_xargs.agentic_context")
        base = "vllm_xargs.agentic_context"
        if ctx.program_id is not None:
            found.name_program(
                self.check_id(ctx.program_id, f"{base}.program_id"),
                f"{base}.program_id",
                Convention.VLLM_ROUTER,
            )
        if ctx.parent_program_id is not None:
            found.parent = found.parent or self.check_id(
                ctx.parent_program_id, f"{base}.parent_program_id"
            )
        for name in ("deadline_seconds", "expected_output_length", "kv_retention_ttl_seconds"):
            if (getattr(ctx, name) or 0) < 0:
                raise ContextError(f"{base}.{name} must be >= 0", f"{base}.{name}")
        if ctx.priority is not None and found.priority is None:
            found.priority = ctx.priority
        found.deadline_s = ctx.deadline_seconds
        found.kv_retention_ttl_s = ctx.kv_retention_ttl_seconds
        if found.expected_output_tokens is None:
            found.expected_output_tokens = ctx.expected_output_length
        if not xargs:
            del body["vllm_xargs"]
        return True

    def _litellm_metadata(self, body: dict[str, Any], found: _Found) -> bool:
        metadata = body.get("metadata")
        if not isinstance(metadata, dict) or "session_id" not in metadata:
            return False
        value = metadata.pop("session_id")
        if value is not None:
            param = "metadata.session_id"
            found.name_program(self.check_id(value, param), param, Convention.LITELLM)
        if not metadata:
            del body["metadata"]
        return True

    # ---------------------------------------------------------------- headers
    def _headers(self, headers: Iterable[tuple[bytes, bytes]], found: _Found) -> None:
        got: dict[bytes, str] = {}
        wanted = self.context_headers
        for name, value in headers:
            if name in wanted:
                got[name] = _header_text(name, value)
        if not got:
            return
        # Every present header is validated even when the body names the program: a bad
        # header is a client bug worth reporting, not something to forward silently.
        checked = {
            n: self.check_id(v, n.decode()) for n, v in got.items() if n not in _FINAL_HEADERS
        }
        for name, label in _FINAL_HEADERS.items():
            if name in got:
                flag = got[name].strip().lower()
                if flag not in _TRUE and flag not in _FALSE:
                    raise ContextError(f"{label} must be true or false, got {flag[:20]!r}", label)
                found.final |= flag in _TRUE
        program, parent, source = _program_from_headers(checked, self._session_header)
        if found.program_id is None and program is not None and source is not None:
            found.program_id, found.program_param, found.source = program, "header", source
            found.parent = found.parent or parent


def _program_from_headers(
    h: dict[bytes, str], session_header: bytes | None
) -> tuple[str | None, str | None, Convention | None]:
    """The program (and its parent) the headers name, by the documented header precedence."""
    session, trajectory = h.get(H_DYNAMO_SESSION), h.get(H_DYNAMO_TRAJECTORY)
    if session is not None or trajectory is not None:
        # The session header wins when both name a program (#10896 replaced the trajectory
        # headers with it); a parent header belongs to the id header of its own family.
        session_parent, trajectory_parent = (
            h.get(H_DYNAMO_PARENT),
            h.get(H_DYNAMO_PARENT_TRAJECTORY),
        )
        if session is not None:
            same = trajectory is None or trajectory == session
            return (
                session,
                session_parent or (trajectory_parent if same else None),
                (Convention.DYNAMO_HEADERS),
            )
        return trajectory, trajectory_parent or session_parent, Convention.DYNAMO_HEADERS
    if H_LITELLM_SESSION in h:
        return h[H_LITELLM_SESSION], None, Convention.LITELLM
    if session_header is not None and session_header in h:
        return h[session_header], None, Convention.SESSION_HEADER
    if H_CLAUDE_SESSION in h:
        # Dynamo's session-ids page: a root turn is its session; a child agent's turn is its
        # agent id, whose parent is the parent agent id, else the root session.
        claude_session = h[H_CLAUDE_SESSION]
        agent = h.get(H_CLAUDE_AGENT)
        if agent is None or agent == claude_session:
            return claude_session, None, Convention.CODING_AGENTS
        return agent, h.get(H_CLAUDE_PARENT) or claude_session, Convention.CODING_AGENTS
    for name in (H_CODEX_SESSION, H_CODEX_THREAD, H_OPENCODE_SESSION):
        if name in h:
            parent = h.get(H_OPENCODE_PARENT) if name == H_OPENCODE_SESSION else None
            return h[name], parent, Convention.CODING_AGENTS
    return None, None, None


def _convert(raw: object, kind: type[Any], param: str) -> Any:
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        # msgspec says "... - at `$.trajectory_id`"; turn the path into the OpenAI `param`.
        message, _, where = str(exc).partition(" - at `$")
        path = param + where.rstrip("`")
        named = _NAMED_FIELD.search(message)
        if named:
            path = f"{path}.{named.group(1)}"
        raise ContextError(f"{path}: {message}", path) from None


def _header_text(name: bytes, value: bytes) -> str:
    """A header's value as the text its client meant: UTF-8, as HTTP clients send non-ASCII
    ids (ASGI servers hand over the raw bytes; Latin-1 would turn `café` into `cafÃ©`)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        label = name.decode("latin-1")
        raise ContextError(
            f"header {label} is not valid UTF-8 (byte 0x{value[exc.start]:02x} at offset "
            f"{exc.start}); send ids as UTF-8 text",
            label,
        ) from None


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__
    )
