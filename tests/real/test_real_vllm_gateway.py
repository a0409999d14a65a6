"""thunder-mw in front of the REAL vLLM CPU engine: answers, usage capture, and stripping proven
by the engine's own log of the request fields it ignored."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from support.asgi_servers import ServerThread, serving
from support.real_vllm import RealVllm

from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import ThunderConfig

PROMPT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Summarise the repository layout in one line."}
]


@pytest.fixture(scope="module")
def gateway(vllm_engine: RealVllm) -> Iterator[ServerThread]:
    config = ThunderConfig(backends=[{"name": "vllm-0", "url": vllm_engine.url}])
    with serving(create_app(config)) as gw:
        yield gw


def _ignored_after(vllm_engine: RealVllm, offset: int) -> set[str]:
    # vLLM writes its "ignored fields" line when it parses the request; give the log a moment.
    time.sleep(0.3)
    return vllm_engine.ignored_fields_since(offset)


def test_engine_capacity_is_discovered(gateway: ServerThread, vllm_engine: RealVllm) -> None:
    health = httpx.get(f"{gateway.url}/health").json()
    backend = health["backends"][0]
    assert backend["healthy"] is True
    assert backend["capacity_tokens"] == vllm_engine.num_blocks * vllm_engine.block_size
    assert backend["capacity_source"] == "engine"


@pytest.fixture
def client(gateway: ServerThread) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_openai_client_non_streaming_through_thunder_mw(
    gateway: ServerThread, vllm_engine: RealVllm, client: openai.OpenAI
) -> None:
    offset = vllm_engine.log_offset()
    answer = client.chat.completions.create(
        model=vllm_engine.model,
        messages=PROMPT,
        max_tokens=8,
        temperature=0,
        extra_body={"program_id": "real-1", "docker_ids": ["sandbox-a"], "ignore_eos": True},
    )
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 8 and answer.usage.prompt_tokens > 0
    assert answer.choices[0].message.content
    program = httpx.get(f"{gateway.url}/programs/real-1").json()
    assert program["context_tokens"] == answer.usage.prompt_tokens + 8
    assert program["docker_ids"] == ["sandbox-a"]
    ignored = _ignored_after(vllm_engine, offset)
    assert not ignored & {"program_id", "docker_ids"}, ignored


def test_openai_client_streaming_through_thunder_mw(
    gateway: ServerThread, vllm_engine: RealVllm, client: openai.OpenAI
) -> None:
    offset = vllm_engine.log_offset()
    chunks = list(
        client.chat.completions.create(
            model=vllm_engine.model,
            messages=PROMPT,
            max_tokens=6,
            stream=True,
            extra_body={
                "program_id": "real-2",
                "ignore_eos": True,
                "nvext": {"agent_hints": {"priority": 2}},
            },
        )
    )
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content is not None) >= 1
    assert all(c.usage is None for c in chunks)  # the injected usage chunk stays hidden
    program = httpx.get(f"{gateway.url}/programs/real-2").json()
    assert program["completion_tokens"] == 6 and program["prompt_tokens"] > 0
    ignored = _ignored_after(vllm_engine, offset)
    assert not ignored & {"program_id", "nvext"}, ignored


def test_dynamo_context_is_stripped_before_the_engine(
    gateway: ServerThread, vllm_engine: RealVllm
) -> None:
    offset = vllm_engine.log_offset()
    body = {
        "model": vllm_engine.model,
        "prompt": "one two three",
        "max_tokens": 2,
        "nvext": {
            "agent_context": {"session_type_id": "t", "session_id": "s", "trajectory_id": "s:1"}
        },
        "vllm_xargs": {"agentic_context": {"program_id": "s:1"}},
    }
    r = httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2
    ignored = _ignored_after(vllm_engine, offset)
    assert not ignored & {"nvext", "vllm_xargs", "agent_context"}, ignored


def test_prefix_cache_hits_are_captured_for_a_program(
    gateway: ServerThread, vllm_engine: RealVllm
) -> None:
    vllm_engine.reset_prefix_cache()
    prompt = " ".join(f"word{i}" for i in range(400))
    body = {"model": vllm_engine.model, "prompt": prompt, "max_tokens": 1, "program_id": "real-3"}
    for _ in range(2):
        r = httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
    program = httpx.get(f"{gateway.url}/programs/real-3").json()
    assert program["steps"] == 2
    # The repeat hits whole 128-token blocks of the first call's prompt.
    assert program["cached_tokens"] > 0 and program["cached_tokens"] % vllm_engine.block_size == 0


# Every agent-context form, old and new, through thunder-mw to the real engine: (route, body
# fields, headers, the program it names, that program's parent). Each request also carries
# CONTROL, a field vLLM does not read: the engine logging it as ignored proves that its log
# would show a context field that got through.
CONTROL = "x_thunder_control"
DYNAMO_FORMS: dict[str, tuple[str, dict[str, Any], dict[str, str], str, str | None]] = {
    "program_id+docker_ids": (
        "/v1/chat/completions", {"program_id": "f-ta", "docker_ids": ["box-f"]}, {}, "f-ta", None
    ),
    "extra_body.program_id": (
        "/v1/chat/completions", {"extra_body": {"program_id": "f-eb"}}, {}, "f-eb", None
    ),
    "nvext.agent_context.trajectory_only": (
        "/v1/chat/completions", {"nvext": {"agent_context": {"trajectory_id": "f-dt"}}}, {},
        "f-dt", None,
    ),
    "nvext.agent_context.full": (
        "/v1/chat/completions",
        {"nvext": {"agent_context": {"session_type_id": "swe", "session_id": "f-s",
                                     "trajectory_id": "f-df", "parent_trajectory_id": "f-dp",
                                     "trajectory_final": False}}},
        {}, "f-df", "f-dp",
    ),
    "nvext.agent_hints.speculative_prefill": (
        "/v1/chat/completions",
        {"program_id": "f-sp",
         "nvext": {"agent_hints": {"priority": 3, "osl": 8, "speculative_prefill": True}}},
        {}, "f-sp", None,
    ),
    "x-dynamo-trajectory-id": (
        "/v1/chat/completions", {},
        {"x-dynamo-trajectory-id": "f-th", "x-dynamo-parent-trajectory-id": "f-tp"},
        "f-th", "f-tp",
    ),
    "X-Dynamo-Session-ID": (
        "/v1/chat/completions", {},
        {"X-Dynamo-Session-ID": "f-sh", "X-Dynamo-Parent-Session-ID": "f-shp"}, "f-sh", "f-shp",
    ),
    "session header over trajectory header": (
        "/v1/chat/completions", {},
        {"X-Dynamo-Session-ID": "f-win", "x-dynamo-trajectory-id": "f-lose"}, "f-win", None,
    ),
    "Claude Code child agent": (
        "/v1/chat/completions", {},
        {"x-claude-code-session-id": "f-cc", "x-claude-code-agent-id": "f-cc-a1"},
        "f-cc-a1", "f-cc",
    ),
    "vllm_xargs.agentic_context": (
        "/v1/chat/completions", {"vllm_xargs": {"agentic_context": {"program_id": "f-vx"}}}, {},
        "f-vx", None,
    ),
    "metadata.session_id": ("/v1/chat/completions", {"metadata": {"session_id": "f-ll"}}, {},
                            "f-ll", None),
    "responses+program_id": ("/v1/responses", {"program_id": "f-rp"}, {}, "f-rp", None),
    "responses+nvext.agent_context": (
        "/v1/responses",
        {"nvext": {"agent_context": {"trajectory_id": "f-rn"},
                   "agent_hints": {"speculative_prefill": True}}},
        {"x-dynamo-trajectory-final": "false"}, "f-rn", None,
    ),
}  # fmt: skip
STRIPPED = {"program_id", "docker_ids", "extra_body", "nvext", "vllm_xargs", "metadata"}


@pytest.fixture(scope="module")
def all_forms_gateway(vllm_engine: RealVllm) -> Iterator[ServerThread]:
    conventions = ["thunderagent", "dynamo_body", "dynamo_headers", "vllm_router", "litellm",
                   "coding_agents"]  # fmt: skip
    config = ThunderConfig(
        backends=[{"name": "vllm-0", "url": vllm_engine.url}],
        agent_context={"conventions": conventions},
    )
    with serving(create_app(config)) as gw:
        yield gw


@pytest.mark.parametrize("form", list(DYNAMO_FORMS))
def test_the_real_engine_answers_each_form_with_the_context_stripped(
    form: str, all_forms_gateway: ServerThread, vllm_engine: RealVllm
) -> None:
    path, fields, headers, program, parent = DYNAMO_FORMS[form]
    if path == "/v1/responses":
        body = {"model": vllm_engine.model, "input": "Say hi.", "max_output_tokens": 2}
    else:
        body = {"model": vllm_engine.model, "messages": PROMPT, "max_tokens": 2}
    body = {**body, CONTROL: 1, **fields}
    offset = vllm_engine.log_offset()
    r = httpx.post(f"{all_forms_gateway.url}{path}", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert (usage.get("completion_tokens") or usage.get("output_tokens")) > 0
    view = httpx.get(f"{all_forms_gateway.url}/programs/{program}").json()
    assert view["steps"] >= 1 and view["parent_program_id"] == parent, view
    ignored = _ignored_after(vllm_engine, offset)
    assert CONTROL in ignored, f"the engine's log shows no ignored fields at all: {ignored}"
    assert not ignored & STRIPPED, ignored
