"""Specification of the simulated engine's /v1/responses: vLLM's response object, its stream of
events, and usage with cached tokens — read back through the OpenAI client as users would."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai

from thunder_mw.conformance.session import parse_sse
from thunder_mw.schemas.config import SimEngineSettings
from thunder_mw.sim.embedded import EmbeddedEngine

LONG_INPUT = " ".join(f"word{i}" for i in range(120))
STREAM_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
DONE_ORDER = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def _with_engine(body: Callable[[str], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        engine = EmbeddedEngine(SimEngineSettings(num_blocks=64, block_size=16, profile="instant"))
        url = await engine.start()
        try:
            return await body(url)
        finally:
            await engine.stop()

    return asyncio.run(main())


def test_a_non_streamed_answer_is_a_completed_response_with_usage() -> None:
    async def body(url: str) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=url) as client:
            request = {"model": "sim-model", "input": "hello there", "max_output_tokens": 4}
            answer: dict[str, Any] = (await client.post("/v1/responses", json=request)).json()
            return answer

    answer = _with_engine(body)
    assert answer["object"] == "response" and answer["id"].startswith("resp_")
    assert answer["status"] == "incomplete"  # stopped by max_output_tokens, as vLLM says
    assert answer["incomplete_details"] == {"reason": "max_output_tokens"}
    (item,) = answer["output"]
    assert item["type"] == "message" and item["role"] == "assistant"
    assert item["content"][0]["type"] == "output_text" and item["content"][0]["text"]
    usage = answer["usage"]
    assert usage["output_tokens"] == 4 and usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + 4
    assert usage["input_tokens_details"]["cached_tokens"] == 0


def test_a_repeated_input_reports_cached_tokens() -> None:
    async def body(url: str) -> list[dict[str, Any]]:
        request = {"model": "sim-model", "input": LONG_INPUT, "max_output_tokens": 1}
        async with httpx.AsyncClient(base_url=url) as client:
            return [(await client.post("/v1/responses", json=request)).json() for _ in range(2)]

    first, second = _with_engine(body)
    assert first["usage"]["input_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % 16 == 0  # whole blocks of the first call's prompt


def test_a_streamed_answer_sends_vllms_events_in_order_with_usage_at_the_end() -> None:
    async def body(url: str) -> bytes:
        request = {
            "model": "sim-model",
            "input": LONG_INPUT,
            "max_output_tokens": 3,
            "stream": True,
        }
        async with httpx.AsyncClient(base_url=url) as client:
            response = await client.post("/v1/responses", json=request)
            assert response.headers["content-type"].startswith("text/event-stream")
            return response.content

    raw = _with_engine(body)
    blocks = [b for b in raw.split(b"\n\n") if b]
    events = [json.loads(e) for e in parse_sse(raw)]
    for block, event in zip(blocks, events, strict=True):
        assert block.startswith(b"event: " + event["type"].encode() + b"\ndata: ")
    types = [e["type"] for e in events]
    assert types[:4] == STREAM_ORDER and types[-4:] == DONE_ORDER
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert events[-4]["text"] == deltas
    completed = events[-1]["response"]
    assert completed["usage"]["output_tokens"] == 3
    assert completed["output"][0]["content"][0]["text"] == deltas
    assert (
        events[0]["response"]["status"] == "in_progress" and events[0]["response"]["usage"] is None
    )


def test_the_openai_client_reads_both_forms() -> None:
    async def body(url: str) -> tuple[Any, list[Any]]:
        async with openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=0
        ) as client:
            whole = await client.responses.create(
                model="sim-model",
                instructions="Be brief.",
                input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                max_output_tokens=2,
            )
            stream = await client.responses.create(
                model="sim-model", input="hi", max_output_tokens=2, stream=True
            )
            return whole, [event async for event in stream]

    whole, streamed = _with_engine(body)
    assert whole.output_text and whole.usage.output_tokens == 2
    assert streamed[-1].type == "response.completed"
    assert streamed[-1].response.usage.input_tokens_details.cached_tokens >= 0


def test_fields_the_engine_does_not_read_are_recorded_as_ignored() -> None:
    async def body(url: str) -> dict[str, Any]:
        request = {
            "model": "sim-model",
            "input": "x",
            "max_output_tokens": 1,
            "program_id": "p",
            "metadata": {"k": "v"},
        }
        async with httpx.AsyncClient(base_url=url) as client:
            await client.post("/v1/responses", json=request)
            fields: dict[str, Any] = (await client.get("/debug/unknown_fields")).json()
            return fields

    assert _with_engine(body)["last"] == ["program_id"]


def test_an_input_that_is_not_text_or_items_is_a_400_naming_body_input() -> None:
    async def body(url: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=url) as client:
            return await client.post("/v1/responses", json={"model": "sim-model", "input": 5})

    response = _with_engine(body)
    # vLLM names a field its request model refused by its place in the body.
    assert response.status_code == 400 and response.json()["error"]["param"] == "body.input"
