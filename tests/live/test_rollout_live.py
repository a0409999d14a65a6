"""Live RL rollout on simulated SGLang engines, through SGLang's native /generate: an engine
added mid-run receives new programs, a drained one finishes its calls and leaves with no
program lost, and a weight-update cycle holds new calls until the engines are updated."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.asgi_servers import ServerThread, serving
from support.polling import wait_until

from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import ThunderConfig

pytestmark = pytest.mark.slow  # a gateway and three simulated engines, seconds of traffic

SIM = {
    "flavor": "sglang",
    "num_blocks": 2048,
    "block_size": 16,
    "time_scale": 4.0,
    "profile": "h100-8b",
}


def sim_backend(name: str) -> dict[str, Any]:
    return {"name": name, "type": "sim", "sim": dict(SIM)}


@pytest.fixture
def gateway() -> Iterator[ServerThread]:
    config = ThunderConfig(
        backends=[sim_backend("sim-0"), sim_backend("sim-1")],
        server={"probe_interval_s": 0.5, "tick_interval_s": 0.2},
        tools={"docker": {"enabled": False}},
    )
    with serving(create_app(config)) as server:
        yield server


def generate(url: str, program: str, step: int, tokens: int = 8, **extra: Any) -> httpx.Response:
    body = {
        "text": f"{program} step {step}: " + "observation " * 20,
        "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
        "rid": f"{program}::{step}",
        **extra,
    }
    return httpx.post(f"{url}/generate", json=body, timeout=60)


def home(url: str, program: str) -> str | None:
    backend: str | None = httpx.get(f"{url}/programs/{program}", timeout=10).json()["backend"]
    return backend


def in_flight(url: str) -> int:
    calls: int = httpx.get(f"{url}/generation", timeout=10).json()["in_flight_calls"]
    return calls


def backends(url: str) -> dict[str, dict[str, Any]]:
    listed = httpx.get(f"{url}/backends", timeout=10).json()["backends"]
    return {b["name"]: b for b in listed}


def test_generate_is_scheduled_as_its_rid_program_and_accounts_meta_info(
    gateway: ServerThread,
) -> None:
    answer = generate(gateway.url, "prog-a", 0, tokens=5)
    assert answer.status_code == 200, answer.text
    meta = answer.json()["meta_info"]
    assert meta["id"] == "prog-a::0"  # the rid reaches the engine unchanged
    program = httpx.get(f"{gateway.url}/programs/prog-a", timeout=10).json()
    assert program["steps"] == 1
    assert program["prompt_tokens"] == meta["prompt_tokens"] > 0
    assert program["completion_tokens"] == meta["completion_tokens"] == 5


def test_a_streamed_generate_is_relayed_event_by_event_with_its_usage_counted(
    gateway: ServerThread,
) -> None:
    body = {
        "text": "hello " * 10,
        "sampling_params": {"max_new_tokens": 6, "ignore_eos": True},
        "program_id": "prog-s",
        "stream": True,
    }
    with httpx.stream("POST", f"{gateway.url}/generate", json=body, timeout=60) as answer:
        assert answer.status_code == 200
        events = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) >= 3  # relayed as the engine produced them, not one lump
    assert '"program_id"' not in "".join(events)
    program = httpx.get(f"{gateway.url}/programs/prog-s", timeout=10).json()
    assert program["completion_tokens"] == 6 and program["steps"] == 1


def test_an_engine_added_mid_run_receives_new_programs(gateway: ServerThread) -> None:
    url = gateway.url
    for i in range(4):
        assert generate(url, f"old-{i}", 0).status_code == 200
    added = httpx.post(f"{url}/backends", json=sim_backend("sim-2"), timeout=30)
    assert added.status_code == 201, added.text
    assert added.json()["backend"]["healthy"] is True
    assert added.json()["backend"]["capacity_tokens"] == 2047 * 16  # discovered, as configured
    assert generate(url, "new-0", 0).status_code == 200
    assert home(url, "new-0") == "sim-2"
    health = httpx.get(f"{url}/health", timeout=10).json()
    assert "sim-2" in {b["name"] for b in health["backends"]}
    assert 'backend="sim-2"' in httpx.get(f"{url}/metrics", timeout=10).text
    workers = httpx.get(f"{url}/list_workers", timeout=10).json()["urls"]
    assert added.json()["backend"]["url"] in workers


def test_a_drained_engine_finishes_its_calls_and_leaves_with_no_program_lost(
    gateway: ServerThread,
) -> None:
    url = gateway.url
    programs = [f"p{i}" for i in range(6)]
    for p in programs:
        assert generate(url, p, 0).status_code == 200
    on_sim0 = [p for p in programs if home(url, p) == "sim-0"]
    assert on_sim0, "the scheduler spread programs over both engines"
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        # A long call in flight on sim-0 while it drains: it must finish there.
        long_call = pool.submit(generate, url, on_sim0[0], 1, 600)
        wait_until(lambda: in_flight(url) == 1, 10)
        drained = httpx.delete(f"{url}/backends/sim-0", timeout=10)
        assert drained.status_code == 202 and drained.json()["backend"]["draining"] is True
        assert "sim-0" in backends(url)  # still there: its call runs
        steps = [pool.submit(generate, url, p, 1) for p in programs if p != on_sim0[0]]
        answers = [f.result() for f in steps] + [long_call.result()]
    assert [a.status_code for a in answers] == [200] * len(programs)
    wait_until(lambda: "sim-0" not in backends(url), 10)
    for p in programs:
        view = httpx.get(f"{url}/programs/{p}", timeout=10).json()
        assert view["steps"] == 2 and view["failures"] == 0
    assert generate(url, on_sim0[0], 2).status_code == 200
    assert home(url, on_sim0[0]) == "sim-1"


def test_a_weight_update_cycle_holds_new_calls_and_releases_them_after(
    gateway: ServerThread,
) -> None:
    url = gateway.url
    assert generate(url, "warm", 0).status_code == 200
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = pool.submit(generate, url, "runner", 0, 2000)
        wait_until(lambda: in_flight(url) == 1, 10)
        update = pool.submit(
            httpx.post,
            f"{url}/weights/update",
            json={"mode": "wait", "model_path": "/ckpt/step-1", "weight_version": "v1"},
            timeout=60,
        )
        wait_until(lambda: httpx.get(f"{url}/generation", timeout=10).json()["paused"], 10)
        assert in_flight(url) == 1  # the running call goes on
        held = pool.submit(generate, url, "late", 0)
        wait_until(lambda: httpx.get(f"{url}/generation", timeout=10).json()["held_calls"] == 1, 10)
        assert not held.done()  # held at the gate, not failed
        result = update.result()
        finished = running.result()
        late = held.result()
    assert result.status_code == 200, result.text
    cycle = result.json()
    assert cycle["success"] is True and cycle["paused"] is False
    assert cycle["released_calls"] == 1 and cycle["cache_flushes"] == 2
    assert {a["path"] for a in cycle["engines"]} >= {
        "/pause_generation",
        "/update_weights_from_disk",
        "/continue_generation",
    }
    assert finished.status_code == 200 and late.status_code == 200
    assert late.json()["meta_info"]["weight_version"] == "v1"  # it ran after the update


def test_sglang_and_vllm_spellings_pause_and_resume_the_gateway(gateway: ServerThread) -> None:
    url = gateway.url
    paused = httpx.post(f"{url}/pause_generation", json={"mode": "in_place"}, timeout=10)
    assert paused.status_code == 200 and paused.json()["paused"] is True
    assert httpx.get(f"{url}/is_paused", timeout=10).json() == {"is_paused": True}
    resumed = httpx.post(f"{url}/continue_generation", json={}, timeout=10)
    assert resumed.json()["paused"] is False
    bad = httpx.post(f"{url}/pause_generation", json={"mode": "later"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "mode"
    assert httpx.post(f"{url}/pause?mode=wait", timeout=10).json()["paused"] is True
    assert httpx.post(f"{url}/resume", timeout=10).json()["paused"] is False
    assert generate(url, "after", 0).status_code == 200


def test_sglang_router_worker_api_adds_lists_and_removes_engines(gateway: ServerThread) -> None:
    url = gateway.url
    sim1 = backends(url)["sim-1"]["url"]
    listed = httpx.get(f"{url}/workers", timeout=10).json()
    assert listed["total"] == 2 and listed["stats"]["regular_count"] == 2
    again = httpx.post(f"{url}/add_worker", params={"url": sim1}, timeout=10)
    assert again.status_code == 200 and again.json()["status"] == "success"
    assert len(backends(url)) == 2  # the same URL twice is one engine
    removed = httpx.post(f"{url}/remove_worker", params={"url": sim1}, timeout=10)
    assert removed.status_code == 200 and sim1 not in removed.json()["worker_urls"]
    missing = httpx.delete(f"{url}/workers/nope", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "backend_not_found"
    no_url = httpx.post(f"{url}/add_worker", timeout=10)
    assert no_url.status_code == 400 and no_url.json()["error"]["param"] == "url"
    bad = httpx.post(f"{url}/backends", json={"type": "vllm"}, timeout=10)
    assert bad.status_code == 400 and "url" in bad.json()["error"]["message"]
