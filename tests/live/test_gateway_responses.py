"""/v1/responses end to end: thunder-mw in front of the simulated engine reads and strips the
agent context from Responses bodies, relays vLLM's event stream unchanged, and accounts the
program's tokens (cached ones included) from the answer or from `response.completed`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.asgi_servers import serving

from thunder_mw.conformance.session import parse_sse
from thunder_mw.middleware.app import create_app
from thunder_mw.middleware.forwarder import sse_data
from thunder_mw.schemas.config import SimEngineSettings, ThunderConfig
from thunder_mw.sim.server import create_sim_app

LONG_INPUT = " ".join(f"word{i}" for i in range(200))
FORMS = {
    "program_id": ({"program_id": "{p}"}, {}),
    "dynamo_body": ({"nvext": {"agent_context": {"trajectory_id": "{p}"}}}, {}),
    "dynamo_hints": (
        {"program_id": "{p}", "nvext": {"agent_hints": {"speculative_prefill": True}}},
        {},
    ),
    "vllm_router": ({"vllm_xargs": {"agentic_context": {"program_id": "{p}"}}}, {}),
    "session_header": ({}, {"X-Dynamo-Session-ID": "{p}"}),
    "trajectory_header": ({}, {"x-dynamo-trajectory-id": "{p}"}),
}


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[str, str]]:
    sim = create_sim_app(SimEngineSettings(num_blocks=256, block_size=16, profile="instant"))
    with serving(sim) as engine:
        config = ThunderConfig(backends=[{"name": "sim-0", "url": engine.url}])
        with serving(create_app(config)) as gw:
            yield gw.url, engine.url


def _fill(value: Any, program: str) -> Any:
    return json.loads(json.dumps(value).replace("{p}", program))


def _ignored(engine_url: str) -> list[str]:
    last: list[str] = httpx.get(f"{engine_url}/debug/unknown_fields").json()["last"]
    return last


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_each_form_names_the_program_and_is_stripped_from_a_responses_body(
    stack: tuple[str, str], form: str, stream: bool
) -> None:
    url, engine_url = stack
    program = f"resp-{form}-{stream}"
    fields, headers = (_fill(part, program) for part in FORMS[form])
    body = {"model": "sim-model", "input": "hello", "max_output_tokens": 2, **fields}
    if stream:
        body["stream"] = True
    before = httpx.get(f"{engine_url}/debug/unknown_fields").json()["count"]
    r = httpx.post(f"{url}/v1/responses", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    after = httpx.get(f"{engine_url}/debug/unknown_fields").json()
    assert after["count"] == before, after  # nothing the engine ignores reached it
    view = httpx.get(f"{url}/programs/{program}").json()
    assert view["steps"] == 1 and view["completion_tokens"] == 2 and view["prompt_tokens"] > 0


def _usage_of_stream(content: bytes) -> dict[str, Any]:
    last = json.loads(parse_sse(content)[-1])
    assert last["type"] == "response.completed"
    usage: dict[str, Any] = last["response"]["usage"]
    return usage


def test_the_event_stream_reaches_the_client_unchanged_and_usage_is_accounted(
    stack: tuple[str, str],
) -> None:
    url, _ = stack
    body = {
        "model": "sim-model",
        "input": LONG_INPUT,
        "max_output_tokens": 3,
        "stream": True,
        "program_id": "resp-stream-usage",
    }
    replies = [httpx.post(f"{url}/v1/responses", json=body, timeout=30) for _ in range(2)]
    assert [r.status_code for r in replies] == [200, 200]
    blocks = [b for b in replies[1].content.split(b"\n\n") if b]
    assert all(b.startswith(b"event: response.") for b in blocks)
    usages = [_usage_of_stream(r.content) for r in replies]
    view = httpx.get(f"{url}/programs/resp-stream-usage").json()
    assert view["steps"] == 2 and view["completion_tokens"] == 6
    assert view["prompt_tokens"] == sum(u["input_tokens"] for u in usages)
    cached = [u["input_tokens_details"]["cached_tokens"] for u in usages]
    assert cached[1] > 0 and view["cached_tokens"] == sum(cached)


def test_the_non_streamed_answer_accounts_cached_tokens(stack: tuple[str, str]) -> None:
    url, _ = stack
    body = {
        "model": "sim-model",
        "input": "whole " + LONG_INPUT,
        "max_output_tokens": 1,
        "program_id": "resp-whole-usage",
    }
    answers = [httpx.post(f"{url}/v1/responses", json=body, timeout=30).json() for _ in range(2)]
    cached = [a["usage"]["input_tokens_details"]["cached_tokens"] for a in answers]
    view = httpx.get(f"{url}/programs/resp-whole-usage").json()
    assert cached[1] > 0 and view["cached_tokens"] == sum(cached)


@pytest.mark.parametrize(
    ("event", "data"),
    [
        (b'data: {"usage": 1}', b'{"usage": 1}'),
        (b'data:{"usage": 1}', b'{"usage": 1}'),
        (b'event: response.completed\ndata: {"usage": 1}', b'{"usage": 1}'),
        (b": comment\nevent: x\ndata: {}\nid: 3", b"{}"),
        (b"event: response.completed", None),
    ],
)
def test_the_data_line_of_an_event_is_found_after_an_event_line(
    event: bytes, data: bytes | None
) -> None:
    assert sse_data(event) == data
