"""Property: whatever JSON and headers arrive, the answer is 2xx or a 4xx naming a field."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thunder_mw.middleware.agent_context import AgentContextMiddleware
from thunder_mw.middleware.types import Message, Receive, Scope, Send
from thunder_mw.schemas.config import AgentContextSettings, Convention

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
context_keys = st.sampled_from(
    [
        "program_id",
        "docker_ids",
        "tool_ids",
        "extra_body",
        "nvext",
        "vllm_xargs",
        "metadata",
        "model",
        "stream",
    ]
)
agent_context_like = st.fixed_dictionaries(
    {},
    optional={
        "session_type_id": json_values,
        "session_id": json_values,
        "trajectory_id": json_values,
        "parent_trajectory_id": json_values,
        "trajectory_final": json_values,
        "unknown": json_values,
    },
)
bodies = st.one_of(
    json_values,
    st.dictionaries(context_keys, json_values, max_size=6),
    st.builds(
        lambda ac, extra: {"nvext": {"agent_context": ac, **extra}},
        agent_context_like,
        st.dictionaries(st.sampled_from(["agent_hints", "x"]), json_values, max_size=2),
    ),
    st.builds(lambda ac: {"vllm_xargs": {"agentic_context": ac}}, json_values),
    st.builds(
        lambda eb: {"extra_body": eb, "program_id": "p"},
        st.dictionaries(context_keys, json_values, max_size=3),
    ),
)
header_names = st.sampled_from(
    [
        "x-dynamo-session-id",
        "x-dynamo-parent-session-id",
        "x-dynamo-session-final",
        "x-litellm-session-id",
        "x-claude-code-session-id",
        "x-claude-code-agent-id",
        "session-id",
        "thread-id",
        "x-session-id",
        "content-type",
    ]
)
header_values = st.binary(max_size=40).filter(lambda b: b"\r" not in b and b"\n" not in b)
headers = st.lists(st.tuples(header_names, header_values), max_size=4)

ALL = AgentContextSettings(
    conventions=[c for c in Convention if c is not Convention.SESSION_HEADER]
)


async def _downstream(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _call(raw: bytes, hdrs: list[tuple[bytes, bytes]], mode: str) -> tuple[int, bytes]:
    settings_ = ALL.model_copy(update={"on_missing": mode})
    app = AgentContextMiddleware(_downstream, settings_, max_body_bytes=1 << 20)
    scope: Scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": hdrs,
    }
    sent: list[Message] = []
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if delivered:
            return {"type": "http.disconnect"}
        delivered = True
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status: int = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return status, body


def _assert_well_formed(status: int, body: bytes) -> None:
    assert status == 200 or 400 <= status < 500, status
    if status != 200:
        error = json.loads(body)["error"]
        assert error["type"] == "invalid_request_error"
        assert isinstance(error["param"], str) and error["param"], error
        assert error["message"]


@pytest.mark.slow  # ~3 s: 400 examples
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, hdrs=headers, mode=st.sampled_from(["ephemeral", "passthrough", "reject"]))
def test_arbitrary_json_and_headers_never_cause_a_server_error(
    body: Any, hdrs: list[tuple[str, bytes]], mode: str
) -> None:
    raw = json.dumps(body).encode()
    encoded = [(n.encode(), v) for n, v in hdrs]
    _assert_well_formed(*asyncio.run(_call(raw, encoded, mode)))


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_never_cause_a_server_error(raw: bytes) -> None:
    _assert_well_formed(*asyncio.run(_call(raw, [], "ephemeral")))


def test_json_nested_past_the_decoders_depth_limit_is_a_400_naming_the_body() -> None:
    status, body = asyncio.run(_call(b"[" * 100_000, [], "ephemeral"))
    assert status == 400
    assert json.loads(body)["error"]["code"] == "invalid_json"
