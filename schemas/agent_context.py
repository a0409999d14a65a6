"""One normalised answer to "which agent program is this request part of?", whatever sent it."""

from __future__ import annotations

from typing import Any

import msgspec

from thunder_mw.schemas.config import Convention

__all__ = ["AgentContext", "DynamoAgentContext", "DynamoAgentHints", "VllmAgenticContext"]


class AgentContext(msgspec.Struct, frozen=True, kw_only=True):
    """Agent context of one request, after parsing and validation.

    `source` names the convention the program id came from; `ephemeral` marks a program
    thunder-mw made up for a request that carried no context (`on_missing: ephemeral`).
    """

    program_id: str
    source: Convention | None
    parent_program_id: str | None = None
    session_id: str | None = None
    session_type: str | None = None
    docker_ids: tuple[str, ...] = ()
    priority: int = 0
    strict_priority: int | None = None
    expected_output_tokens: int | None = None
    deadline_s: float | None = None
    kv_retention_ttl_s: float | None = None
    final: bool = False
    ephemeral: bool = False
    # `nvext.agent_hints.speculative_prefill`: the client expects its next turn to extend this
    # one, so warming that prefix is worth it (True), or asks for no warming (False); None:
    # not sent, the `speculative_prefill` stage's default applies.
    speculative_prefill: bool | None = None
    # Hints named in `agent_context.extra_agent_hints`, as (name, value) in the order sent.
    extra_hints: tuple[tuple[str, Any], ...] = ()

    def hint(self, name: str) -> Any:
        """An allow-listed extra hint's value, or None when the request did not send it."""
        return next((value for key, value in self.extra_hints if key == name), None)


# --- Wire shapes of the strict conventions. forbid_unknown_fields makes a typo an error that
# --- names the key instead of a silently ignored field (Dynamo rejects them the same way).


class DynamoAgentContext(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`trajectory_id` is the only required field since ai-dynamo/dynamo#10800; the other ids
    are optional and validated when present."""

    trajectory_id: str
    session_type_id: str | None = None
    session_id: str | None = None
    parent_trajectory_id: str | None = None
    trajectory_final: bool = False


class DynamoAgentHints(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The hints Dynamo's agent-hints page lists; others are accepted only when allow-listed
    in `agent_context.extra_agent_hints`."""

    priority: int | None = None
    strict_priority: int | None = msgspec.field(default=None)
    osl: int | None = None
    speculative_prefill: bool | None = None


class VllmAgenticContext(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    program_id: str | None = None
    parent_program_id: str | None = None
    priority: int | None = None
    deadline_seconds: float | None = None
    expected_output_length: int | None = None
    kv_retention_ttl_seconds: float | None = None
