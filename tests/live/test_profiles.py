"""Per-program step profiles: what each call cost, bounded in memory, exportable as a trace."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.asgi_servers import ServerThread, serving, serving_gateway
from support.fake_engine import FakeEngine
from support.polling import wait_until

from thunder_mw.benchmarks.workloads import load_trace
from thunder_mw.middleware.app import create_app
from thunder_mw.observability.profiles import ProfileStore, Timing
from thunder_mw.policies.core import Released
from thunder_mw.policies.program_table import Usage
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import ProfileSettings, ThunderConfig

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}


@pytest.fixture
def gw() -> Iterator[ServerThread]:
    engine = FakeEngine(chunks=5, delay_s=0.2, chunk_delay_s=0.05)
    with serving(engine) as es:
        config = ThunderConfig(backends=[{"name": "e0", "url": es.url}])
        with serving(create_app(config)) as server:
            yield server


def post(gw: ServerThread, **body: Any) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, **body}, timeout=30)


def profile(gw: ServerThread, program_id: str) -> dict[str, Any]:
    r = httpx.get(f"{gw.url}/profiles/{program_id}")
    assert r.status_code == 200, r.text
    view: dict[str, Any] = r.json()
    return view


# ------------------------------------------------------------------ over the wire
def test_a_streaming_step_records_time_to_first_token_decode_time_and_tokens(
    gw: ServerThread,
) -> None:
    post(gw, program_id="s", stream=True)
    (step,) = profile(gw, "s")["steps"]
    assert step["stream"] is True and step["backend"] == "e0" and step["status"] == 200
    assert 0.2 <= step["ttft_s"] < step["total_s"]  # the engine thinks 0.2 s first
    assert step["decode_s"] >= 0.15  # five chunks 50 ms apart after the first
    assert step["ttft_s"] + step["decode_s"] == pytest.approx(step["total_s"], abs=1e-6)
    assert step["completion_tokens"] == 5 and step["prompt_tokens"] > 0
    assert step["cached_tokens"] == 0


def test_a_non_streaming_step_records_total_time_and_tokens(gw: ServerThread) -> None:
    post(gw, program_id="n")
    (step,) = profile(gw, "n")["steps"]
    assert step["stream"] is False
    assert step["ttft_s"] is None and step["decode_s"] is None
    assert step["total_s"] >= 0.2  # the engine thinks 0.2 s before answering
    assert step["completion_tokens"] == 5


def test_tool_time_is_the_gap_between_an_answer_and_the_next_request(gw: ServerThread) -> None:
    post(gw, program_id="t")
    time.sleep(0.3)  # the "tool" the agent runs between its calls
    post(gw, program_id="t")
    first, second = profile(gw, "t")["steps"]
    assert 0.3 <= first["tool_s"] < 1.5
    assert second["tool_s"] is None  # no next request yet
    assert profile(gw, "t")["tool_s"] == pytest.approx(first["tool_s"], abs=1e-5)  # views round


def test_profiles_lists_every_program_without_its_steps(gw: ServerThread) -> None:
    post(gw, program_id="a")
    post(gw, program_id="b", stream=True)
    body = httpx.get(f"{gw.url}/profiles").json()
    by_id = {p["program_id"]: p for p in body["profiles"]}
    assert {"a", "b"} <= set(by_id) and "steps" not in by_id["a"]
    assert by_id["b"]["steps_total"] == 1 and by_id["b"]["completion_tokens"] == 5


def test_a_final_call_is_in_the_profile_of_its_released_program(gw: ServerThread) -> None:
    dynamo = {"session_type_id": "swe", "session_id": "s", "trajectory_id": "f"}
    post(gw, nvext={"agent_context": dynamo})
    post(gw, nvext={"agent_context": {**dynamo, "trajectory_final": True}})
    view = profile(gw, "f")
    assert view["release_reason"] == "final" and view["steps_total"] == 2


def test_an_unknown_profile_is_a_404_naming_the_program(gw: ServerThread) -> None:
    r = httpx.get(f"{gw.url}/profiles/nobody")
    assert r.status_code == 404 and r.json()["error"]["code"] == "profile_not_found"


def test_profiles_are_behind_the_admin_token() -> None:
    with serving_gateway(FakeEngine(), server={"admin_token": "s3cret"}) as gw:
        denied = httpx.get(f"{gw.url}/profiles")
        allowed = httpx.get(f"{gw.url}/profiles", headers={"Authorization": "Bearer s3cret"})
    assert denied.status_code == 401 and allowed.status_code == 200


# ------------------------------------------------------------------ the store's bounds
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ctx(program_id: str) -> AgentContext:
    return AgentContext(program_id=program_id, source=None, session_type="swe-agent")


def call(store: ProfileStore, program_id: str, at: float, tokens: int = 100) -> None:
    """One answered non-streaming call of 0.5 s that arrived at perf time `at`."""
    store.opened(ctx(program_id))
    timing = Timing(
        started_at=at,
        arrived_at=at,
        queue_s=0.0,
        forwarded_at=at,
        first_body_at=None,
        ended_at=at + 0.5,
        status=200,
        stream=False,
    )
    store.record(ctx(program_id), timing, "b0", Usage(tokens, 10, tokens // 2))


def test_the_step_ring_keeps_the_latest_steps_and_counts_all() -> None:
    store = ProfileStore(ProfileSettings(ring_size=3), Clock())
    for i in range(5):
        call(store, "p", at=float(i))
    view = store.get("p")
    assert view is not None
    assert [s["step"] for s in view["steps"]] == [2, 3, 4]
    assert view["steps_total"] == 5 and view["prompt_tokens"] == 500  # totals cover all


def test_a_released_profile_stays_for_the_retention_then_goes() -> None:
    clock = Clock()
    store = ProfileStore(ProfileSettings(retention_s=60), clock)
    call(store, "p", at=0.0)
    store.on_action(Released("p", "release", ()))
    clock.now += 59
    assert store.get("p") is not None
    clock.now += 2
    assert store.get("p") is None and len(store) == 0


def test_expire_drops_released_profiles_past_retention_without_a_query() -> None:
    clock = Clock()
    store = ProfileStore(ProfileSettings(retention_s=60), clock)
    call(store, "gone", at=0.0)
    call(store, "live", at=0.0)
    store.on_action(Released("gone", "expired", ()))
    clock.now += 61
    store.expire()
    assert len(store) == 1  # only the live program's profile is left


def test_a_quiet_gateway_lets_released_profiles_go_on_its_tick() -> None:
    engine = FakeEngine()
    with serving(engine) as es:
        config = ThunderConfig(
            backends=[{"name": "e0", "url": es.url}],
            server={"tick_interval_s": 0.05},
            observability={"profiles": {"retention_s": 0.1}},
        )
        app = create_app(config)
        with serving(app) as server:
            r = httpx.post(
                f"{server.url}/v1/chat/completions", json={**CHAT, "program_id": "p"}, timeout=30
            )
            assert r.status_code == 200
            r = httpx.post(f"{server.url}/programs/release", json={"program_id": "p"})
            assert r.json()["released"] is True
            store = app.core.observability.profiles
            assert store is not None
            wait_until(lambda: len(store) == 0, 10, message="the profile to be dropped")
            assert len(store) == 0  # nothing asked for /profiles in between


def test_live_profiles_are_never_evicted_by_retention() -> None:
    clock = Clock()
    store = ProfileStore(ProfileSettings(retention_s=1), clock)
    call(store, "live", at=0.0)
    clock.now += 10_000
    assert store.get("live") is not None


def test_past_max_programs_released_profiles_go_first() -> None:
    store = ProfileStore(ProfileSettings(max_programs=2, retention_s=3600), Clock())
    call(store, "done", at=0.0)
    store.on_action(Released("done", "release", ()))
    call(store, "live", at=1.0)
    call(store, "new", at=2.0)
    assert store.get("done") is None
    assert store.get("live") is not None and store.get("new") is not None


def test_a_reused_program_id_after_release_starts_a_new_profile() -> None:
    store = ProfileStore(ProfileSettings(), Clock())
    call(store, "p", at=0.0)
    store.on_action(Released("p", "release", ()))
    call(store, "p", at=5.0)
    view = store.get("p")
    assert view is not None and view["steps_total"] == 1 and view["released_at"] is None


def test_the_export_is_a_replay_trace_the_benchmarks_load(tmp_path: Path) -> None:
    path = tmp_path / "profiles.jsonl"
    store = ProfileStore(ProfileSettings(export_path=str(path)), Clock())
    store.start()
    call(store, "p", at=0.0, tokens=1000)
    call(store, "p", at=2.0, tokens=1400)  # 1.5 s of tool time after the first answer
    store.on_action(Released("p", "final", ()))
    export = store.stop()
    assert export is not None
    export.close()
    (program,) = load_trace(path)
    assert program.program_id == "p" and program.session_type == "swe-agent"
    assert [c.output_tokens for c in program.calls] == [10, 10]
    assert program.context_tokens() == [1000, 1400]
    assert program.calls[0].tool_s == pytest.approx(1.5)


def test_an_export_waits_for_the_last_call_of_a_program_released_during_it(tmp_path: Path) -> None:
    path = tmp_path / "profiles.jsonl"
    store = ProfileStore(ProfileSettings(export_path=str(path)), Clock())
    store.start()
    store.opened(ctx("p"))
    store.on_action(Released("p", "final", ()))  # a `final` call releases before its end
    timing = Timing(0.0, 0.0, 0.0, 0.0, None, 0.5, 200, False)
    store.record(ctx("p"), timing, "b0", Usage(100, 10, 0))
    export = store.stop()
    assert export is not None
    export.close()
    (program,) = load_trace(path)
    assert len(program.calls) == 1
