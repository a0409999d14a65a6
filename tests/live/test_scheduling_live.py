"""SchedulingMiddleware over real sockets: held requests, release while held, clients giving up."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from support.asgi_servers import ServerThread, serving, serving_gateway
from support.fake_engine import FakeEngine
from support.held_requests import BIG, SMALL, start_hog, wait_for
from support.polling import wait_until

from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import ThunderConfig


@pytest.fixture
def tight() -> Iterator[ServerThread]:
    """One engine whose KV holds 1,000 tokens; a slow first program fills it."""
    engine = FakeEngine(chunks=30, chunk_delay_s=0.1)
    policies = [
        {"admission": {"buffer_tokens_per_program": 0, "overflow": "hold"}},
        {"state_aware_pause": {}},
        {"migration": {}},
        {"gc_hooks": {}},
    ]
    with serving_gateway(engine, {"capacity_tokens": 1000}, policies=policies) as gw:
        yield gw


@pytest.mark.slow  # ~3 s: holds behind a 3 s stream
def test_a_request_that_does_not_fit_waits_and_then_runs(tight: ServerThread) -> None:
    hog = start_hog(tight.url)
    started = time.monotonic()
    r = httpx.post(
        f"{tight.url}/v1/chat/completions", json={**BIG, "program_id": "late"}, timeout=30
    )
    waited = time.monotonic() - started
    hog.join()
    assert r.status_code == 200
    assert waited > 1.0  # it waited for the hog's call to end; the client saw only latency


@pytest.mark.slow  # ~3 s: holds behind a 3 s stream
def test_releasing_a_program_while_its_request_is_held_answers_409(tight: ServerThread) -> None:
    hog = start_hog(tight.url)
    answer: dict[str, httpx.Response] = {}

    def held() -> None:
        answer["r"] = httpx.post(
            f"{tight.url}/v1/chat/completions", json={**BIG, "program_id": "held"}, timeout=30
        )

    thread = threading.Thread(target=held)
    thread.start()
    program = wait_for(tight.url, "held", waiting=1)
    assert program["state"] == "paused"
    release = httpx.post(f"{tight.url}/programs/release", json={"program_id": "held"})
    thread.join(timeout=5)
    hog.join()
    assert release.json() == {"program_id": "held", "released": True}
    r = answer["r"]
    assert r.status_code == 409 and r.json()["error"]["code"] == "program_released"


@pytest.mark.slow  # ~3 s: holds behind a 3 s stream
def test_a_client_that_gives_up_while_held_leaves_the_queue(tight: ServerThread) -> None:
    hog = start_hog(tight.url)

    def impatient() -> None:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{tight.url}/v1/chat/completions", json={**BIG, "program_id": "gone"}, timeout=0.5
            )

    thread = threading.Thread(target=impatient)
    thread.start()
    thread.join()
    wait_until(
        lambda: httpx.get(f"{tight.url}/programs/gone").status_code == 404,
        5,
        message="the abandoned program to leave the queue",
    )
    hog.join()
    # The hog's program is unaffected and nothing is left reserved for the one that left.
    assert httpx.get(f"{tight.url}/programs/hog").json()["phase"] == "acting"


def test_programs_view_shows_scheduling_state(tight: ServerThread) -> None:
    httpx.post(f"{tight.url}/v1/chat/completions", json={**SMALL, "program_id": "p"})
    view = httpx.get(f"{tight.url}/programs/p").json()
    for field in (
        "state",
        "phase",
        "backend",
        "context_tokens",
        "reserved_tokens",
        "steps",
        "paused_total_s",
    ):
        assert field in view
    assert view["state"] == "active" and view["phase"] == "acting" and view["backend"] == "e"


@pytest.mark.slow  # ~3 s: holds behind a 3 s stream
def test_past_the_held_request_limit_new_requests_get_429_with_retry_after() -> None:
    engine = FakeEngine(chunks=30, chunk_delay_s=0.1)
    with serving(engine) as es:
        config = ThunderConfig(
            server={"max_held_requests": 1},
            backends=[{"name": "e", "url": es.url, "capacity_tokens": 1000}],
            policies=[
                {"admission": {"buffer_tokens_per_program": 0, "overflow": "hold"}},
                {"migration": {}},
            ],
        )
        with serving(create_app(config)) as gw:
            hog = start_hog(gw.url)
            first = threading.Thread(
                target=lambda: httpx.post(
                    f"{gw.url}/v1/chat/completions", json={**BIG, "program_id": "w1"}, timeout=30
                )
            )
            first.start()
            wait_for(gw.url, "w1", waiting=1)
            r = httpx.post(f"{gw.url}/v1/chat/completions", json={**BIG, "program_id": "w2"})
            gone = httpx.get(f"{gw.url}/programs/w2").status_code
            first.join()
            hog.join()
    assert r.status_code == 429 and r.headers["retry-after"] == "5"
    assert r.json()["error"]["code"] == "queue_full"
    assert gone == 404  # the refused program left nothing behind
