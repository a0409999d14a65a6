"""SIGTERM stops a real `thunder-mw serve` process within `server.shutdown_timeout_s`, whatever
its calls or embedded engines are doing; a second Ctrl-C exits at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.asgi_servers import serving
from support.fake_engine import FakeEngine
from support.polling import wait_until

from thunder_mw.benchmarks.server_process import wait_until_healthy
from thunder_mw.sim.ports import free_port

pytestmark = pytest.mark.slow  # `thunder-mw serve` processes, signalled

# Past the bound, the time a loaded 2-core machine may take to end and reap a process.
EXIT_SLACK_S = 1.5
CALL = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "program_id": "p"}


@contextmanager
def gateway(
    tmp_path: Path, shutdown_timeout_s: float, backends: str
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A `thunder-mw serve` process on `backends` (YAML flow list), its log in tmp_path."""
    port = free_port()
    path = tmp_path / "c.yaml"
    path.write_text(
        f"server: {{port: {port}, log_level: info, shutdown_timeout_s: {shutdown_timeout_s}}}\n"
        f"backends: {backends}\n"
    )
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "thunder_mw.cli", "serve", "--config", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process=proc, log_path=log)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def one_backend(url: str) -> str:
    return f"[{{name: e, url: '{url}'}}]"


def call_in_background(url: str, body: dict[str, Any]) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
            result["answer"] = (r.status_code, r.json())
        except httpx.HTTPError as exc:  # a connection cut off is an answer too, not a hang
            result["answer"] = (None, repr(exc))
        result["at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def exit_after(proc: subprocess.Popen[bytes], sig: int, timeout_s: float = 60) -> float:
    started = time.monotonic()
    proc.send_signal(sig)
    proc.wait(timeout=timeout_s)
    return time.monotonic() - started


def test_sigterm_exits_within_shutdown_timeout_while_a_call_never_finishes(tmp_path: Path) -> None:
    engine = FakeEngine(silent=True)  # never answers a call
    with serving(engine) as es, gateway(tmp_path, 3, one_backend(es.url)) as (proc, url):
        thread, result = call_in_background(url, CALL)
        wait_until(lambda: engine.received, 15)  # the call is at the engine, which never answers
        signalled = time.monotonic()
        took = exit_after(proc, signal.SIGTERM)
        thread.join(timeout=5)
    assert took < 3 + EXIT_SLACK_S, f"exited {took:.1f} s after SIGTERM (bound: 3 s)"
    # uvicorn's graceful shutdown stopped it: it re-raises the SIGTERM it handled.
    assert proc.returncode == -signal.SIGTERM
    # The call cut off at shutdown is answered in OpenAI's error shape, not a plain-text 500.
    status, body = result["answer"]
    assert status == 503 and body["error"]["code"] == "shutting_down", result
    assert result["at"] - signalled < 3 + EXIT_SLACK_S


def test_sigterm_stops_the_demo_while_its_embedded_engine_never_finishes_a_call(
    tmp_path: Path,
) -> None:
    # One simulated second per 100,000 wall seconds: the call is generating for good.
    sim = "{name: sim-0, type: sim, sim: {time_scale: 0.00001, num_blocks: 512}}"
    # 6 s: calls get 3 s, the stop (the embedded engine's 1 s among it) the other 3 s.
    with gateway(tmp_path, 6, f"[{sim}]") as (proc, url):
        thread, result = call_in_background(url, {**CALL, "model": "sim-model"})
        wait_until(lambda: httpx.get(f"{url}/programs/p").json().get("in_flight") == 1, 15)
        signalled = time.monotonic()
        took = exit_after(proc, signal.SIGTERM)
        thread.join(timeout=5)
    log = (tmp_path / "gateway.log").read_text()
    assert took < 6 + EXIT_SLACK_S, f"exited {took:.1f} s after SIGTERM (bound: 6 s)\n{log}"
    assert proc.returncode == -signal.SIGTERM, log
    status, body = result["answer"]
    assert status == 503 and body["error"]["code"] == "shutting_down", result
    assert result["at"] - signalled < 6 + EXIT_SLACK_S


def test_a_second_ctrl_c_exits_at_once(tmp_path: Path) -> None:
    engine = FakeEngine(silent=True)  # never answers a call
    with serving(engine) as es, gateway(tmp_path, 600, one_backend(es.url)) as (proc, url):
        thread, result = call_in_background(url, CALL)
        wait_until(lambda: engine.received, 15)
        proc.send_signal(signal.SIGINT)
        log = tmp_path / "gateway.log"
        wait_until(lambda: "Waiting for connections to close" in log.read_text(), 15)
        took = exit_after(proc, signal.SIGINT, timeout_s=30)
        thread.join(timeout=5)
    assert took < EXIT_SLACK_S, f"exited {took:.1f} s after the second Ctrl-C"
    assert proc.returncode == 128 + signal.SIGINT
    assert "SIGINT again: exiting now" in log.read_text()
    assert result["answer"][0] is None  # its connection closed with the process


HANGING_STOP = textwrap.dedent(
    """
    import asyncio, sys
    import uvicorn
    from thunder_mw.cli.serve import GatewayServer, listening_socket

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await asyncio.Event().wait()  # a stop that never ends
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    port = int(sys.argv[1])
    config = uvicorn.Config(app, lifespan="on", timeout_graceful_shutdown=1)
    server = GatewayServer(config, on_exit=lambda: None, shutdown_timeout_s=2)
    server.run(sockets=[listening_socket("127.0.0.1", port)])
    """
)


def test_the_process_exits_at_the_deadline_when_its_own_stop_hangs(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", HANGING_STOP, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ},
    )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process=proc)
        took = exit_after(proc, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
        out = proc.communicate()[0].decode()
    assert took < 2 + EXIT_SLACK_S, f"exited {took:.1f} s after SIGTERM (bound: 2 s)"
    assert proc.returncode == 1
    assert "shutdown still unfinished after server.shutdown_timeout_s (2 s)" in out
