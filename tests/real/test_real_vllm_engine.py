"""What the real vLLM CPU engine does that the rest of the suite relies on, observed directly."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest
from support.real_vllm import RealVllm, parse_ignored_fields
from tokenizers import Tokenizer

TIMEOUT = httpx.Timeout(120.0)
CHAT_MESSAGES = [
    {"role": "system", "content": "You are a terse agent."},
    {"role": "user", "content": "List the files, then run the tests."},
]


def _post(engine: RealVllm, path: str, body: dict[str, object]) -> dict[str, Any]:
    response = httpx.post(f"{engine.url}{path}", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _random_token_ids(count: int, seed: int) -> list[int]:
    # Skips the four special tokens so the prompt is plain text to the engine.
    rng = random.Random(seed)
    return [rng.randrange(4, 1000) for _ in range(count)]


@pytest.mark.real_vllm
def test_engine_reports_24_kv_blocks_of_128_tokens(vllm_engine: RealVllm) -> None:
    assert (vllm_engine.num_blocks, vllm_engine.block_size) == (24, 128)


@pytest.mark.real_vllm
def test_engine_serves_the_tiny_model_under_its_served_name(vllm_engine: RealVllm) -> None:
    models = httpx.get(f"{vllm_engine.url}/v1/models", timeout=TIMEOUT).json()
    assert [(m["id"], m["max_model_len"]) for m in models["data"]] == [("tiny", 2048)]


@pytest.mark.real_vllm
def test_chat_completion_reports_usage_matching_the_tokenized_prompt(
    vllm_engine: RealVllm,
) -> None:
    body = {"model": "tiny", "messages": CHAT_MESSAGES, "max_tokens": 6, "ignore_eos": True}
    reply = _post(vllm_engine, "/v1/chat/completions", body)
    tokenized = _post(vllm_engine, "/tokenize", {"model": "tiny", "messages": CHAT_MESSAGES})
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["usage"]["completion_tokens"] == 6
    assert reply["usage"]["prompt_tokens"] == tokenized["count"]
    assert "cached_tokens" in reply["usage"]["prompt_tokens_details"]


@pytest.mark.real_vllm
def test_streamed_chat_ends_with_a_usage_chunk_without_choices(vllm_engine: RealVllm) -> None:
    body = {
        "model": "tiny",
        "messages": CHAT_MESSAGES,
        "max_tokens": 8,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST", f"{vllm_engine.url}/v1/chat/completions", json=body, timeout=TIMEOUT
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: ") :] for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 8
    assert all(chunk.get("usage") is None for chunk in chunks[:-1])
    assert len([c for c in chunks[:-1] if c["choices"]]) >= 2


@pytest.mark.real_vllm
def test_completion_of_a_raw_prompt_counts_the_tokens_of_the_shipped_tokenizer(
    vllm_engine: RealVllm,
) -> None:
    prompt = "def plan(step): return retry(tool_call, 3)"
    reply = _post(
        vllm_engine,
        "/v1/completions",
        {"model": "tiny", "prompt": prompt, "max_tokens": 5, "ignore_eos": True},
    )
    local_ids = Tokenizer.from_file(str(vllm_engine.tokenizer_json)).encode(prompt).ids
    assert isinstance(reply["choices"][0]["text"], str)
    usage = reply["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(local_ids), 5)


@pytest.mark.real_vllm
def test_repeated_prompt_hits_the_prefix_cache_in_whole_128_token_blocks(
    vllm_engine: RealVllm,
) -> None:
    assert vllm_engine.reset_prefix_cache()
    prompt = _random_token_ids(619, seed=619)
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
    before = vllm_engine.metrics()
    first = _post(vllm_engine, "/v1/completions", body)
    second = _post(vllm_engine, "/v1/completions", body)
    after = vllm_engine.metrics()

    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # 619 tokens hold 4 full blocks; the partial fifth block is never shared.
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 4 * 128
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    queries = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    assert (hits, queries) == (512, 2 * 619)


@pytest.mark.real_vllm
def test_reset_prefix_cache_forgets_cached_blocks(vllm_engine: RealVllm) -> None:
    body = {"model": "tiny", "prompt": _random_token_ids(300, seed=300), "max_tokens": 1}
    _post(vllm_engine, "/v1/completions", body)
    assert vllm_engine.reset_prefix_cache()
    again = _post(vllm_engine, "/v1/completions", body)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


@pytest.mark.real_vllm
def test_engine_log_names_a_request_field_it_ignored(vllm_engine: RealVllm) -> None:
    offset = vllm_engine.log_offset()
    body = {"model": "tiny", "messages": CHAT_MESSAGES, "max_tokens": 1, "program_id": "p-42"}
    _post(vllm_engine, "/v1/chat/completions", body)
    assert vllm_engine.ignored_fields_since(offset) == {"program_id"}


@pytest.mark.real_vllm
def test_engine_log_names_no_field_for_a_plain_request(vllm_engine: RealVllm) -> None:
    offset = vllm_engine.log_offset()
    body = {"model": "tiny", "messages": CHAT_MESSAGES, "max_tokens": 1}
    _post(vllm_engine, "/v1/chat/completions", body)
    assert vllm_engine.ignored_fields_since(offset) == set()


def test_ignored_field_lines_are_parsed_from_vllm_log_format() -> None:
    log = (
        "(APIServer pid=1) DEBUG 11-29 19:40:01 [protocol.py:79] The following fields were "
        "present in the request but ignored: {'program_id', 'nvext'}\n"
        "(APIServer pid=1) INFO 11-29 19:40:01 [loggers.py:1] unrelated line\n"
        "(APIServer pid=1) DEBUG 11-29 19:40:02 [protocol.py:79] The following fields were "
        "present in the request but ignored: {'agent_context'}\n"
    )
    assert parse_ignored_fields(log) == {"program_id", "nvext", "agent_context"}


@pytest.mark.real_vllm
def test_engine_refuses_the_vllm_routers_agentic_context_object(vllm_engine: RealVllm) -> None:
    # What the vLLM router forwards to its workers when a client names the program the way its
    # docs ask: stock vLLM 0.32 takes vllm_xargs values as scalars (or lists of them) only, so
    # the router's program identity must be its header form in front of it (vllm_real.py).
    body = {
        "model": "tiny",
        "prompt": "hello",
        "max_tokens": 2,
        "vllm_xargs": {"agentic_context": {"program_id": "p-1", "step_id": 0}},
    }
    response = httpx.post(f"{vllm_engine.url}/v1/completions", json=body, timeout=TIMEOUT)
    assert response.status_code == 400, response.text
    assert "vllm_xargs" in response.text


@pytest.mark.real_vllm
def test_the_metrics_page_restricted_by_name_carries_what_the_probe_reads(
    vllm_engine: RealVllm,
) -> None:
    # The gateway's probe (engines/pool.py `_read_page`) asks for its samples by name on
    # prometheus_client's own mount, /metrics/; vLLM's /metrics route renders the whole page
    # whatever is asked. Both read the same signals and capacity.
    from thunder_mw.engines.capacity import exposition_capacity
    from thunder_mw.engines.exposition import read_exposition
    from thunder_mw.engines.pool import SCRAPED_SAMPLES, restricted_page_target, signals

    body = {"model": "tiny", "messages": CHAT_MESSAGES, "max_tokens": 4}
    _post(vllm_engine, "/v1/chat/completions", body)
    names = SCRAPED_SAMPLES["vllm"]

    def read(target: str) -> httpx.Response:
        answer = httpx.get(f"{vllm_engine.url}{target}", timeout=TIMEOUT)
        assert answer.status_code == 200
        return answer

    for _ in range(20):  # between two equal whole pages: the counters settled after the call
        before = read("/metrics")
        asked = read(restricted_page_target(names))
        whole = read("/metrics")
        full = read_exposition(whole.content, names)
        if signals("vllm", read_exposition(before.content, names)) == signals("vllm", full):
            break
    ignored = read("/metrics?name%5B%5D=vllm%3Anum_requests_running")
    assert len(asked.content) * 10 < len(whole.content)  # only the samples asked for
    assert len(ignored.content) * 10 > len(whole.content) * 9  # the whole page
    restricted = read_exposition(asked.content)
    assert set(restricted.totals) <= names
    assert signals("vllm", restricted) == signals("vllm", full)
    assert signals("vllm", full).prefill_seconds_total  # the call's counters are read
    assert exposition_capacity(restricted) == exposition_capacity(full) == 24 * 128
