"""Idle keep-alive connections closed under a request: no call is lost, no engine taken out.

Agents call in bursts separated by tool gaps of seconds, the idle times at which servers close
keep-alive connections. Each race is reproduced deterministically by `ClosingEngine`, which
closes a connection exactly when a request arrives on it (or when one arrives after a chosen
idle time), on the gateway's engine side and on the client side of the replay client and the
conformance suite.
"""

from __future__ import annotations

import asyncio
import io
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.asgi_servers import ServerThread, free_port, serving
from support.closing_engine import ClosingEngine

from thunder_mw.benchmarks.http_load import closed_loop
from thunder_mw.benchmarks.replay import Replayer
from thunder_mw.benchmarks.replay_cli import run_replay
from thunder_mw.benchmarks.server_process import wait_until_healthy
from thunder_mw.benchmarks.workloads import Call, ProgramSpec, generate
from thunder_mw.cli.main import build_parser
from thunder_mw.conformance.session import Session
from thunder_mw.engines import pool as pool_module
from thunder_mw.engines.pool import BackendPool
from thunder_mw.engines.pooled_connections import keep_alive_timeout
from thunder_mw.middleware.app import ThunderGateway, create_app
from thunder_mw.schemas.config import BackendSettings, ServerSettings, ThunderConfig

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
# The pool keeps connections longer than any gap in these tests unless a test says otherwise:
# what is tested is what happens when the engine closes one first.
LONG_KEEP_ALIVE_S = 30.0


class Gateway:
    def __init__(self, app: ThunderGateway, server: ServerThread) -> None:
        self.app = app
        self.server = server
        self.url = server.url
        self.client = httpx.Client(timeout=10)

    def chat(self, program_id: str, **body: Any) -> httpx.Response:
        return self.client.post(
            f"{self.url}/v1/chat/completions", json={**CHAT, **body, "program_id": program_id}
        )

    def healthy(self) -> bool:
        """The engine's health as the pool publishes it (/health)."""
        healthy: bool = self.client.get(f"{self.url}/health").json()["backends"][0]["healthy"]
        return healthy

    def healthy_in_core(self) -> bool:
        """The engine's health as the scheduler counts it."""

        async def read() -> bool:
            return self.app.core.scheduler.core.backends["e"].healthy

        return self.server.call(read())

    def stale_retries(self) -> float:
        text = self.client.get(f"{self.url}/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "thunder_mw_backend_stale_connection_retries_total":
                    return sample.value
        raise AssertionError("no thunder_mw_backend_stale_connection_retries_total series")


@contextmanager
def gateway(
    engine: ClosingEngine, keep_alive_s: float = LONG_KEEP_ALIVE_S, **server: Any
) -> Iterator[Gateway]:
    config = ThunderConfig(
        backends=[{"name": "e", "url": engine.url, "pool_keep_alive_s": keep_alive_s}],
        # Only the start-up probe: what decides health here is the calls and their own probes.
        server={"probe_interval_s": 3600, **server},
    )
    app = create_app(config)
    with serving(app) as served:
        gw = Gateway(app, served)
        try:
            yield gw
        finally:
            gw.client.close()


def chat_posts(requests: list[str]) -> int:
    return sum(1 for r in requests if r == "POST /v1/chat/completions")


# ------------------------------------------------------------------ engine side: resend
@pytest.mark.parametrize("close_with", ["fin", "reset"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_call_on_a_pooled_connection_the_engine_closed_is_resent_on_a_fresh_one(
    close_with: str, stream: bool
) -> None:
    with ClosingEngine(close_reused=True, close_with=close_with) as engine:  # type: ignore[arg-type]
        with gateway(engine) as gw:
            answers = [gw.chat(f"p{i % 2}", stream=stream) for i in range(4)]
            retries = gw.stale_retries()
            healthy, core_healthy = gw.healthy(), gw.healthy_in_core()
    assert [r.status_code for r in answers] == [200] * 4
    assert all(("data: [DONE]" in r.text) == stream for r in answers)
    # Calls 2 and 4 went out on the pooled connection and met the close; each was resent once.
    assert chat_posts(engine.dropped) == 2 and chat_posts(engine.answered) == 4
    assert retries == 2
    assert healthy and core_healthy


def test_a_connection_idle_past_pool_keep_alive_s_is_retired_before_the_engine_closes_it() -> None:
    with ClosingEngine(idle_limit_s=0.5) as engine:  # closes a connection idle > 0.5 s
        with gateway(engine, keep_alive_s=0.2) as gw:
            first = gw.chat("p")
            time.sleep(0.8)
            second = gw.chat("p")
            retries = gw.stale_retries()
    assert first.status_code == 200 and second.status_code == 200
    assert engine.dropped == [] and retries == 0  # the second call never met the close


def test_a_keep_alive_timeout_the_engine_announces_retires_connections_sooner() -> None:
    # The engine says it keeps idle connections 1 s, and does; the gateway would keep them 30 s.
    with ClosingEngine(idle_limit_s=1.0, keep_alive_header="timeout=1, max=100") as engine:
        with gateway(engine) as gw:
            first = gw.chat("p")
            time.sleep(1.3)
            second = gw.chat("p")
            retries = gw.stale_retries()
    assert first.status_code == 200 and second.status_code == 200
    assert engine.dropped == [] and retries == 0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("timeout=5, max=1000", 5.0), ("max=3,timeout=2", 2.0), ("Timeout = 7", 7.0)],
)
def test_keep_alive_header_timeout_is_read(value: str, seconds: float) -> None:
    assert keep_alive_timeout(value) == seconds


@pytest.mark.parametrize("value", ["max=100", "timeout=soon", "timeout=-1", ""])
def test_keep_alive_header_without_a_usable_timeout_is_ignored(value: str) -> None:
    assert keep_alive_timeout(value) is None


def test_a_call_lost_on_a_fresh_connection_is_not_resent() -> None:
    # The engine took the request on a connection opened for it: it may have seen it.
    with ClosingEngine(drop_fresh=1) as engine:
        with gateway(engine) as gw:
            lost = gw.chat("p")
            retries = gw.stale_retries()
    assert lost.status_code == 502 and lost.json()["error"]["code"] == "upstream_error"
    assert chat_posts(engine.dropped) == 1 and chat_posts(engine.answered) == 0
    assert retries == 0


def test_a_call_whose_engine_died_under_it_on_a_pooled_connection_goes_to_another() -> None:
    # The pooled connection closes under the call because the engine is dying, not idling:
    # the fresh connection is refused, and the call goes elsewhere as a refused one does.
    with (
        ClosingEngine(close_reused=True, die_on_stale=True) as a,
        ClosingEngine(close_reused=True, die_on_stale=True) as b,
    ):
        config = ThunderConfig(
            backends=[
                {"name": "a", "url": a.url, "pool_keep_alive_s": LONG_KEEP_ALIVE_S},
                {"name": "b", "url": b.url, "pool_keep_alive_s": LONG_KEEP_ALIVE_S},
            ],
            server={"probe_interval_s": 3600},
        )
        with serving(create_app(config)) as served, httpx.Client(timeout=10) as client:
            calls = [
                client.post(f"{served.url}/v1/chat/completions", json={**CHAT, "program_id": "p"})
                for _ in range(2)
            ]
            health = {
                bk["name"]: bk["healthy"]
                for bk in client.get(f"{served.url}/health").json()["backends"]
            }
    assert [c.status_code for c in calls] == [200, 200]
    dead, alive = (a, b) if a.dropped else (b, a)
    assert chat_posts(dead.dropped) == 1 and chat_posts(dead.answered) == 1
    assert chat_posts(alive.answered) == 1
    assert health == {"a": alive is a, "b": alive is b}


# ------------------------------------------------------------------ health from evidence
def test_one_failed_call_makes_the_engine_suspect_not_down() -> None:
    # /health answers slowly, so the probe the failure triggers is still on its way while
    # the next calls come: they must go to the engine, not get 503 "no healthy backend".
    with ClosingEngine(drop_fresh=1, health_delay_s=0.5) as engine:
        with gateway(engine) as gw:
            lost = gw.chat("p")
            during_probe = (gw.healthy(), gw.healthy_in_core())
            next_call = gw.chat("p")
            other = gw.chat("q")
    assert lost.status_code == 502
    assert during_probe == (True, True)
    assert next_call.status_code == 200 and other.status_code == 200


def test_failures_to_open_calls_failing_in_a_row_take_the_engine_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No recheck within the test: a recheck is a new probe, started after the third failure,
    # and would rightly bring back an engine whose /health answers; on a loaded machine the
    # three calls outlast the first recheck's second (seen once with both cores busy).
    monkeypatch.setattr(pool_module, "SUSPECT_RECHECKS_S", (3600.0,))
    with ClosingEngine(drop_fresh=100) as engine:
        with gateway(engine, failures_to_open=3) as gw:
            statuses, health = [], []
            for _ in range(3):
                statuses.append(gw.chat("p").status_code)
                health.append(gw.healthy())
            # The probes the first two failures started found /health well; they are older
            # than the third failure and must not bring the engine back.
            time.sleep(0.3)
            after = (gw.healthy(), gw.healthy_in_core())
            refused = gw.chat("p")
    assert statuses == [502, 502, 502]
    assert health == [True, True, False]
    assert after == (False, False)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "no_backend"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@contextmanager
def closing_engine_pool(**server: Any) -> Iterator[tuple[ClosingEngine, BackendPool]]:
    with ClosingEngine() as engine:
        settings = ServerSettings(probe_interval_s=3600, **server)
        yield engine, BackendPool([BackendSettings(name="e", url=engine.url)], settings)


@pytest.mark.anyio
async def test_an_answered_call_ends_a_run_of_failures() -> None:
    with closing_engine_pool(failures_to_open=2) as (_, pool):
        await pool.start()
        try:
            backend = pool.get("e")
            assert backend is not None
            pool.record_failure(backend, "one")
            pool.record_answer(backend)
            pool.record_failure(backend, "two")
            still_up = backend.healthy
            pool.record_failure(backend, "three")
            down = not backend.healthy
        finally:
            await pool.stop()
    assert still_up and down


@pytest.mark.anyio
async def test_a_failure_after_failure_window_s_starts_a_new_run() -> None:
    with closing_engine_pool(failures_to_open=2, failure_window_s=0.2) as (_, pool):
        await pool.start()
        try:
            backend = pool.get("e")
            assert backend is not None
            pool.record_failure(backend, "one")
            await asyncio.sleep(0.3)
            pool.record_failure(backend, "two, but outside the window")
            still_up = backend.healthy
            pool.record_failure(backend, "three, right after two")
            down = not backend.healthy
        finally:
            await pool.stop()
    assert still_up and down


@pytest.mark.anyio
async def test_a_refused_connection_marks_the_engine_down_at_once() -> None:
    with closing_engine_pool() as (_, pool):
        await pool.start()
        try:
            backend = pool.get("e")
            assert backend is not None
            seen: list[bool] = []
            pool.listeners.append(lambda b, metrics: seen.append(b.healthy))
            pool.record_failure(backend, "connection refused", refused=True)
            down = not backend.healthy
        finally:
            await pool.stop()
    assert down and seen == [False]  # the scheduler was told at once


# ------------------------------------------------------------------ client side
@pytest.mark.slow  # a `thunder-mw serve` subprocess
def test_thunder_mw_serve_keeps_idle_client_connections_for_server_client_keep_alive_s(
    tmp_path: Path,
) -> None:
    """The gateway closes an idle client connection after `server.client_keep_alive_s`, not
    uvicorn's 5 s; by default later than httpx's (the OpenAI client's) and aiohttp's pools keep
    theirs."""
    assert ServerSettings().client_keep_alive_s > max(httpx.Limits().keepalive_expiry or 0, 15.0)
    with ClosingEngine() as engine:
        port = free_port()
        config = tmp_path / "c.yaml"
        config.write_text(
            f"server:\n  port: {port}\n  log_level: warning\n  client_keep_alive_s: 1.5\n"
            f"backends:\n  - name: e\n    url: {engine.url}\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "thunder_mw.cli.main", "serve", "--config", str(config)]
        )
        try:
            wait_until_healthy(f"http://127.0.0.1:{port}")
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                assert _get_health(sock).startswith(b"HTTP/1.1 200")
                time.sleep(0.5)  # idle, but well within client_keep_alive_s
                assert _get_health(sock).startswith(b"HTTP/1.1 200")
                time.sleep(2.5)  # idle past client_keep_alive_s: the gateway closes it
                closed = sock.recv(1) == b""
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
    assert closed


def _get_health(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(65536)
    top, _, body = head.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in top.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return top


def _programs(n: int, calls: int) -> list[ProgramSpec]:
    steps = tuple(Call(growth_tokens=8, output_tokens=2, tool_s=0.01) for _ in range(calls))
    return [ProgramSpec(f"p{i}", "chat", 8, steps) for i in range(n)]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_the_replay_client_resends_requests_lost_on_a_connection_the_server_closed(
    stream: bool,
) -> None:
    # The stand-in plays a server that closes every pooled connection under the next request,
    # the release at the end of each program included.
    with ClosingEngine(close_reused=True) as server:
        replayer = Replayer(server.url, stream=stream)
        result = asyncio.run(replayer.run(_programs(3, calls=3)))
    statuses = [c.status for p in result.programs for c in p.calls]
    assert statuses == [200] * 9
    assert not any(p.failed or p.release_error for p in result.programs)
    assert server.dropped and result.stale_retries == len(server.dropped)
    assert server.answered.count("POST /programs/release") == 3


def test_replay_writes_partial_results_and_reports_a_release_that_fails(tmp_path: Path) -> None:
    # Every release is dropped, fresh connection or not: the run's results must survive it.
    with ClosingEngine(drop_paths=("/programs/release",)) as server:
        output = tmp_path / "replay.json"
        err = io.StringIO()
        args = [
            "replay", "--url", server.url, "--workload", "chat", "--programs", "2",
            "--time-scale", "1000", "--no-progress", "--output", str(output),
        ]  # fmt: skip
        code = run_replay(build_parser().parse_args(args), err)
    report = json.loads(output.read_text())
    assert code == 1
    assert report["result"]["programs_completed"] == 2 and report["result"]["steps"] > 0
    assert sorted(report["release_errors"]) == [p.program_id for p in generate("chat", 2)]
    assert "release of" in err.getvalue()


def test_the_conformance_client_resends_a_request_lost_on_a_connection_the_server_closed() -> None:
    async def run(url: str) -> list[int]:
        async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
            session = Session(url, backend=None, client=client)  # type: ignore[arg-type]
            session.check_id = "stale"
            return [(await session.post(session.chat("hi"))).status for _ in range(3)]

    with ClosingEngine(close_reused=True) as server:
        statuses = asyncio.run(run(server.url))
    assert statuses == [200, 200, 200]
    assert len(server.dropped) >= 1  # the race happened, and cost nothing


def test_the_conformance_client_does_not_resend_a_request_lost_on_a_fresh_connection() -> None:
    async def run(url: str) -> None:
        async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
            session = Session(url, backend=None, client=client)  # type: ignore[arg-type]
            session.check_id = "fresh"
            await session.post(session.chat("hi"))

    with ClosingEngine(drop_fresh=1) as server:
        with pytest.raises(httpx.RemoteProtocolError):
            asyncio.run(run(server.url))
    assert len(server.dropped) == 1 and server.answered == []


def test_the_load_generator_reconnects_when_the_server_closed_its_connection() -> None:
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 2\r\n\r\n{}"
    )
    with ClosingEngine(close_reused=True) as server:
        result = asyncio.run(
            closed_loop(
                "127.0.0.1", server.port, [request] * 2, stream=False, warmup_s=0.05, duration_s=0.3
            )
        )
    assert result.errors == 0 and result.first_error is None
    assert result.requests > 0 and len(server.dropped) > 0
