"""The recording backend (deterministic answers, what it records, its flavours) and the strict
JSON comparison the fidelity checks rely on."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from support.asgi_servers import serving

from thunder_mw.conformance.compare import first_difference
from thunder_mw.conformance.recording_backend import RecordingBackend
from thunder_mw.conformance.session import parse_sse

CHAT = {"model": "m", "messages": [{"role": "user", "content": "[tag-1] hi"}], "max_tokens": 4}


@pytest.fixture
def recorder() -> Iterator[tuple[RecordingBackend, str]]:
    backend = RecordingBackend()
    with serving(backend) as server:
        yield backend, server.url


def test_records_the_body_bytes_and_headers_it_received(
    recorder: tuple[RecordingBackend, str],
) -> None:
    backend, url = recorder
    raw = b'{"model": "m",  "messages": [{"role": "user", "content": "[tag-1] hi"}]}'
    httpx.post(f"{url}/v1/chat/completions", content=raw, headers={"X-Trace": "t1"})
    (record,) = backend.containing("[tag-1]")
    assert record.body == raw
    assert record.header("x-trace") == "t1"


def test_the_same_request_gets_the_same_answer(recorder: tuple[RecordingBackend, str]) -> None:
    _, url = recorder
    first = httpx.post(f"{url}/v1/chat/completions", json=CHAT).content
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT).content == first


def test_streaming_sends_what_it_records_and_usage_only_when_asked(
    recorder: tuple[RecordingBackend, str],
) -> None:
    backend, url = recorder
    plain = httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": True})
    assert parse_sse(plain.content) == backend.requests[-1].sent_events
    assert parse_sse(plain.content)[-1] == b"[DONE]"
    assert not any(b'"usage"' in e for e in parse_sse(plain.content))
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with_usage = parse_sse(httpx.post(f"{url}/v1/chat/completions", json=body).content)
    assert json.loads(with_usage[-2])["choices"] == [] and "usage" in json.loads(with_usage[-2])


def test_a_body_that_is_not_a_json_object_gets_400(recorder: tuple[RecordingBackend, str]) -> None:
    _, url = recorder
    assert httpx.post(f"{url}/v1/chat/completions", content=b"[1]").status_code == 400


def test_the_inspection_api_lists_filters_and_clears(
    recorder: tuple[RecordingBackend, str],
) -> None:
    backend, url = recorder
    httpx.post(f"{url}/v1/chat/completions", json=CHAT)
    found = httpx.get(f"{url}/_recorder/requests", params={"contains": "[tag-1]"}).json()
    assert found["count"] == 1 and json.loads(found["requests"][0]["body"]) == CHAT
    assert httpx.delete(f"{url}/_recorder/requests").json() == {"cleared": True}
    assert backend.requests == []


def test_vllm_flavour_publishes_cache_config_for_capacity_discovery(
    recorder: tuple[RecordingBackend, str],
) -> None:
    _, url = recorder
    text = httpx.get(f"{url}/metrics").text
    assert 'vllm:cache_config_info{block_size="16"' in text and "num_gpu_blocks=" in text


def test_sglang_flavour_publishes_server_info() -> None:
    with serving(RecordingBackend("sglang")) as server:
        info = httpx.get(f"{server.url}/server_info").json()
        assert info["max_total_num_tokens"] > 0
        assert "sglang:token_usage" in httpx.get(f"{server.url}/metrics").text


@pytest.mark.parametrize(
    ("expected", "actual", "where"),
    [
        ({"a": 1}, {"a": 1.0}, "$.a: expected int"),
        ({"a": 1}, {"a": True}, "$.a: expected int"),
        ({"a": -0.0}, {"a": 0.0}, "$.a: expected -0.0"),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, "$: key order changed"),
        ({"a": [{"b": None}]}, {"a": [{}]}, "$.a[0]: key 'b' is missing"),
        ({"a": "é"}, {"a": "e"}, "$.a: expected 'é'"),
    ],
)
def test_first_difference_names_where_two_documents_differ(
    expected: object, actual: object, where: str
) -> None:
    difference = first_difference(expected, actual)
    assert difference is not None and difference.startswith(where)


def test_first_difference_can_ignore_key_order_only() -> None:
    assert first_difference({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"d": 3, "c": 2}, "a": 1},
                            ordered=False) is None  # fmt: skip
    assert first_difference({"a": [1, 2]}, {"a": [2, 1]}, ordered=False) is not None
