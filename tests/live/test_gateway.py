"""The standalone gateway over real sockets, before in-test engines that record what they got."""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from support.asgi_servers import ServerThread, serving
from support.fake_engine import FakeEngine
from support.polling import wait_until

from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import ThunderConfig
from thunder_mw.sim.ports import free_port

CHAT = {"model": "m", "messages": [{"role": "user", "content": "héllo 😀"}], "temperature": 0.25}


def gateway(*engines: FakeEngine, **config: Any) -> AbstractContextManager[ServerThread]:
    backends = [{"name": f"e{i}", "url": e.url} for i, e in enumerate(engines)]
    return serving(create_app(ThunderConfig(backends=backends, **config)))


def stream_chat(gw: ServerThread) -> AbstractContextManager[httpx.Response]:
    """A streamed chat call of program `p`, read as the test chooses."""
    return httpx.stream(
        "POST", f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True, "program_id": "p"}
    )


def events(text: str) -> list[str]:
    return [e for e in text.split("\n\n") if e]


# ------------------------------------------------------------------ forwarding and stripping
def test_chat_request_is_forwarded_without_agent_context(engine: FakeEngine) -> None:
    with gateway(engine) as gw:
        body = {**CHAT, "program_id": "p1", "docker_ids": ["box-1"]}
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    assert engine.last().raw == json.dumps(CHAT, separators=(",", ":"), ensure_ascii=False).encode()


def test_body_without_context_reaches_the_engine_byte_for_byte(engine: FakeEngine) -> None:
    raw = b'{"model": "m",  "messages": [], "n": 1.50, "x": "\\u00e9"}'
    with gateway(engine) as gw:
        r = httpx.post(
            f"{gw.url}/v1/completions", content=raw, headers={"content-type": "application/json"}
        )
    assert r.status_code == 200
    assert engine.last().raw == raw


def test_context_headers_are_not_forwarded(engine: FakeEngine) -> None:
    with gateway(engine) as gw:
        headers = {"X-Dynamo-Session-ID": "s1", "x-litellm-session-id": "s1", "x-custom": "kept"}
        httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers=headers)
    received = engine.last().headers
    assert "x-dynamo-session-id" not in received and "x-litellm-session-id" not in received
    assert received["x-custom"] == "kept"


def test_client_authorization_is_not_forwarded_by_default(engine: FakeEngine) -> None:
    with gateway(engine) as gw:
        httpx.post(
            f"{gw.url}/v1/chat/completions",
            json=CHAT,
            headers={"Authorization": "Bearer sk-client"},
        )
    assert "authorization" not in engine.last().headers


def test_backend_api_key_is_sent(engine: FakeEngine) -> None:
    cfg = ThunderConfig(backends=[{"url": engine.url, "api_key": "engine-key"}])
    with serving(create_app(cfg)) as gw:
        httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT)
    assert engine.last().headers["authorization"] == "Bearer engine-key"


def test_engine_status_and_error_body_pass_through(engine: FakeEngine) -> None:
    engine.status = 422
    with gateway(engine) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "program_id": "p"})
        programs = httpx.get(f"{gw.url}/programs").json()["programs"]
    assert r.status_code == 422 and r.json() == {"error": {"message": "engine says no"}}
    assert programs[0]["failures"] == 1 and programs[0]["phase"] == "acting"


# ------------------------------------------------------------------ streaming and usage
def test_streaming_hides_the_usage_chunk_the_client_did_not_ask_for(engine: FakeEngine) -> None:
    with gateway(engine) as gw:
        r = httpx.post(
            f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True, "program_id": "p"}
        )
        program = httpx.get(f"{gw.url}/programs/p").json()
    chunks = events(r.text)
    assert chunks[-1] == "data: [DONE]"
    assert len(chunks) == engine.chunks + 1
    assert all('"usage"' not in c for c in chunks)
    assert engine.last().body["stream_options"] == {"include_usage": True}
    assert program["completion_tokens"] == engine.chunks and program["prompt_tokens"] > 0


def test_a_stream_is_accounted_by_the_time_its_client_has_done(engine: FakeEngine) -> None:
    # The engine's body ends 2 s after `data: [DONE]`; the client (as OpenAI's does) stops
    # reading at [DONE] and sends its next request: the call must already be over.
    engine.eof_delay_s = 2.0
    with gateway(engine) as gw:
        with stream_chat(gw) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    break
            program = httpx.get(f"{gw.url}/programs/p").json()
    assert program["completion_tokens"] == engine.chunks and program["phase"] == "acting"


def test_streaming_keeps_the_usage_chunk_when_the_client_asked(engine: FakeEngine) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}, "program_id": "p"}
    with gateway(engine) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=body)
        program = httpx.get(f"{gw.url}/programs/p").json()
    usage_chunks = [c for c in events(r.text) if '"usage"' in c]
    assert len(usage_chunks) == 1
    assert program["context_tokens"] == json.loads(usage_chunks[0][6:])["usage"]["total_tokens"]


def test_stream_is_relayed_chunk_by_chunk(engine: FakeEngine) -> None:
    engine.chunks, engine.chunk_delay_s = 4, 0.3
    arrivals = []
    with gateway(engine) as gw:
        with httpx.stream(
            "POST", f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True}
        ) as r:
            for _ in r.iter_raw():
                arrivals.append(time.monotonic())
    # Several separate arrivals spread over the stream's life, not one buffered blob at the end.
    assert len(arrivals) >= 3 and arrivals[-1] - arrivals[0] >= 0.5


def test_non_streaming_usage_is_accounted(engine: FakeEngine) -> None:
    with gateway(engine) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "program_id": "p"})
        program = httpx.get(f"{gw.url}/programs/p").json()
    usage = r.json()["usage"]
    assert program["context_tokens"] == usage["total_tokens"] and program["steps"] == 1


def test_engine_dying_mid_stream_ends_the_stream_with_an_error_event(engine: FakeEngine) -> None:
    engine.chunks, engine.die_after_chunks = 5, 2
    with gateway(engine) as gw:
        r = httpx.post(
            f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True, "program_id": "p"}
        )
        program = httpx.get(f"{gw.url}/programs/p").json()
    last = events(r.text)[-1]
    assert last.startswith("data: ") and json.loads(last[6:])["error"]["code"] == "upstream_error"
    assert program["phase"] == "acting" and program["in_flight"] == 0 and program["failures"] == 1


def test_an_engine_ending_its_stream_with_its_own_error_event_fails_the_call(
    engine: FakeEngine,
) -> None:
    """vLLM streams `data: {"error": ...}` then `[DONE]` when its engine core dies under a
    live API server: relayed as sent, but the call counts as failed and the engine is probed."""
    engine.chunks, engine.error_after_chunks = 5, 2
    with gateway(engine) as gw:
        r = httpx.post(
            f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True, "program_id": "p"}
        )
        program = httpx.get(f"{gw.url}/programs/p").json()
    sent = events(r.text)
    assert json.loads(sent[-2][6:])["error"]["code"] == 500 and sent[-1] == "data: [DONE]"
    assert program["phase"] == "acting" and program["in_flight"] == 0 and program["failures"] == 1


def test_client_disconnect_cancels_the_upstream_request(engine: FakeEngine) -> None:
    engine.chunks, engine.chunk_delay_s = 50, 0.05
    with gateway(engine) as gw:
        with stream_chat(gw) as r:
            chunks = r.iter_raw()
            next(chunks)
            assert httpx.get(f"{gw.url}/programs/p").json()["in_flight"] == 1
        wait_until(
            lambda: engine.disconnects,
            5,
            message="the engine to see the disconnect",
        )
        program = httpx.get(f"{gw.url}/programs/p").json()
    assert engine.disconnects == 1
    assert program["in_flight"] == 0 and program["phase"] == "acting"


# ------------------------------------------------------------------ failures and retries
def test_connection_refused_before_any_byte_is_retried_on_another_backend() -> None:
    a, b = FakeEngine(), FakeEngine()
    with serving(b) as sb:
        b.url = sb.url
        sa = serving(a)
        server_a = sa.__enter__()
        a.url = server_a.url
        with gateway(a, b) as gw:
            # Two programs: one lands on each backend (fewest programs first).
            for pid in ("p0", "p1"):
                httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "program_id": pid})
            homes = {
                p["program_id"]: p["backend"]
                for p in httpx.get(f"{gw.url}/programs").json()["programs"]
            }
            on_a = next(pid for pid, home in homes.items() if home == "e0")
            sa.__exit__(None, None, None)  # engine a goes away
            r = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "program_id": on_a})
            moved = httpx.get(f"{gw.url}/programs/{on_a}").json()
            health = httpx.get(f"{gw.url}/health").json()
    assert r.status_code == 200
    assert moved["backend"] == "e1"
    assert [bk["healthy"] for bk in health["backends"]] == [False, True]


def test_no_healthy_backend_is_a_503() -> None:
    cfg = ThunderConfig(backends=[{"url": f"http://127.0.0.1:{free_port()}"}])
    with serving(create_app(cfg)) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "program_id": "p"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_backend"


# ------------------------------------------------------------------ bad input
def test_oversized_body_is_a_413(engine: FakeEngine) -> None:
    with gateway(engine, server={"max_body_bytes": 1000}) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "pad": "x" * 2000})
    assert r.status_code == 413 and r.json()["error"]["param"] == "body"
    assert engine.received == []


def test_non_json_body_is_a_400_naming_the_body(engine: FakeEngine) -> None:
    with gateway(engine) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", content=b"not json")
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": r.json()["error"]["message"],
        "type": "invalid_request_error",
        "param": "body",
        "code": "invalid_json",
    }


def test_non_object_json_is_a_400(engine: FakeEngine) -> None:
    with gateway(engine) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=[1, 2])
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_body"


def test_invalid_dynamo_context_names_the_field(engine: FakeEngine) -> None:
    body = {
        **CHAT,
        "nvext": {
            "agent_context": {"session_type_id": "a", "session_id": "b", "trajectory_id": ""}
        },
    }
    with gateway(engine) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "nvext.agent_context.trajectory_id"
    assert engine.received == []


# ------------------------------------------------------------------ requests without context
def _without_context_count(gw: ServerThread) -> float:
    text = httpx.get(f"{gw.url}/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == "thunder_mw_requests_without_context":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


def test_requests_without_context_become_separate_ephemeral_programs(engine: FakeEngine) -> None:
    engine.chunks, engine.chunk_delay_s = 20, 0.05
    with gateway(engine) as gw:
        # Keep the iterators referenced: a dropped one closes its connection.
        with httpx.stream(
            "POST", f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True}
        ) as r1:
            it1 = r1.iter_raw()
            next(it1)
            with httpx.stream(
                "POST", f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True}
            ) as r2:
                it2 = r2.iter_raw()
                next(it2)
                live = httpx.get(f"{gw.url}/programs").json()["programs"]
        time.sleep(0.3)
        after = httpx.get(f"{gw.url}/programs").json()["programs"]
        count = _without_context_count(gw)
    assert len(live) == 2 and all(p["ephemeral"] for p in live)
    assert live[0]["program_id"] != live[1]["program_id"]
    assert after == []  # one-step programs end with their request
    assert count == 2


def test_on_missing_reject_answers_400(engine: FakeEngine) -> None:
    with gateway(engine, agent_context={"on_missing": "reject"}) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT)
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_agent_context"


def test_on_missing_passthrough_forwards_without_a_program(engine: FakeEngine) -> None:
    with gateway(engine, agent_context={"on_missing": "passthrough"}) as gw:
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT)
        programs = httpx.get(f"{gw.url}/programs").json()["programs"]
    assert r.status_code == 200 and programs == []


# ------------------------------------------------------------------ other routes
def test_models_are_merged_across_backends_without_duplicates() -> None:
    a, b, c = FakeEngine(model="shared"), FakeEngine(model="shared"), FakeEngine(model="other")
    with serving(a) as sa, serving(b) as sb, serving(c) as sc:
        a.url, b.url, c.url = sa.url, sb.url, sc.url
        with gateway(a, b, c) as gw:
            r = httpx.get(f"{gw.url}/v1/models")
    assert sorted(m["id"] for m in r.json()["data"]) == ["other", "shared"]


def test_other_v1_routes_pass_through(engine: FakeEngine) -> None:
    with gateway(engine) as gw:
        r = httpx.post(f"{gw.url}/v1/embeddings?x=1", json={"input": "a", "program_id": "kept"})
    assert r.json() == {"echo": "/v1/embeddings", "method": "POST", "bytes": len(engine.last().raw)}
    assert engine.last().body["program_id"] == "kept"


# ------------------------------------------------------------------ admin API
def test_release_answers_like_thunderagent(engine: FakeEngine) -> None:
    with gateway(engine) as gw:
        httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "program_id": "p"})
        first = httpx.post(f"{gw.url}/programs/release", json={"program_id": "p"})
        second = httpx.post(f"{gw.url}/programs/release", json={"program_id": "p"})
        missing = httpx.get(f"{gw.url}/programs/p")
    assert first.json() == {"program_id": "p", "released": True}
    assert second.status_code == 200 and second.json() == {"program_id": "p", "released": False}
    assert missing.status_code == 404


def test_release_with_a_bad_body_names_the_field(engine: FakeEngine) -> None:
    with gateway(engine) as gw:
        r = httpx.post(f"{gw.url}/programs/release", json={"program_id": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "program_id"


def test_final_flag_ends_the_program_after_its_request(engine: FakeEngine) -> None:
    body = {
        **CHAT,
        "nvext": {
            "agent_context": {
                "session_type_id": "t",
                "session_id": "s",
                "trajectory_id": "tr",
                "trajectory_final": True,
            }
        },
    }
    with gateway(engine) as gw:
        httpx.post(f"{gw.url}/v1/chat/completions", json=body)
        programs = httpx.get(f"{gw.url}/programs").json()["programs"]
    assert programs == []


def test_admin_token_guards_admin_routes_but_not_health(engine: FakeEngine) -> None:
    with gateway(engine, server={"admin_token": "s3cret"}) as gw:
        denied = httpx.get(f"{gw.url}/programs")
        allowed = httpx.get(f"{gw.url}/programs", headers={"Authorization": "Bearer s3cret"})
        metrics = httpx.get(f"{gw.url}/metrics")
        health = httpx.get(f"{gw.url}/health")
    assert denied.status_code == 401 and denied.json()["error"]["param"] == "authorization"
    assert allowed.status_code == 200 and metrics.status_code == 401 and health.status_code == 200


def test_metrics_are_prometheus_text_with_request_counts(engine: FakeEngine) -> None:
    with gateway(engine) as gw:
        httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "program_id": "p"})
        text = httpx.get(f"{gw.url}/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert (
        samples[
            ("thunder_mw_requests_total", (("route", "/v1/chat/completions"), ("status", "200")))
        ]
        == 1
    )
    assert samples[("thunder_mw_programs", (("phase", "acting"), ("state", "active")))] == 1
    assert samples[("thunder_mw_backend_capacity_tokens", (("backend", "e0"),))] == 1600
