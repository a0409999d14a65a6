"""SIGTERM: held requests are answered with 503 at once; a stream already running finishes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.asgi_servers import serving
from support.fake_engine import FakeEngine
from support.held_requests import BIG
from support.polling import wait_until

from thunder_mw.benchmarks.server_process import wait_until_healthy
from thunder_mw.sim.ports import free_port

pytestmark = pytest.mark.slow  # a `thunder-mw serve` process, signalled


def test_sigterm_answers_held_requests_with_503_and_lets_streams_finish(tmp_path: Path) -> None:
    engine = FakeEngine(chunks=20, chunk_delay_s=0.1)
    with serving(engine) as es:
        port = free_port()
        config = tmp_path / "c.yaml"
        config.write_text(
            f"server: {{port: {port}, log_level: warning}}\n"
            f"backends: [{{name: e, url: '{es.url}', capacity_tokens: 1000}}]\n"
            "policies:\n  - admission: {buffer_tokens_per_program: 0, overflow: hold}\n"
            "  - migration: {}\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "thunder_mw.cli.main", "serve", "--config", str(config)],
            env=os.environ.copy(),
        )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_healthy(url)
            results: dict[str, tuple[Any, ...]] = {}

            def stream() -> None:
                body = {**BIG, "stream": True, "program_id": "hog", "max_tokens": 800}
                with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
                    results["stream"] = (r.status_code, b"".join(r.iter_raw()))

            def held() -> None:
                body = {**BIG, "program_id": "held"}
                started = time.monotonic()
                r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
                results["held"] = (r.status_code, r.json(), time.monotonic() - started)

            hog = threading.Thread(target=stream)
            hog.start()
            wait_until(
                lambda: httpx.get(f"{url}/programs/hog").status_code == 200,
                30,
                message="the hog's program to exist",
            )
            waiter = threading.Thread(target=held)
            waiter.start()
            wait_until(
                lambda: httpx.get(f"{url}/programs/held").json().get("waiting") == 1,
                30,
                message="the held call to wait",
            )
            proc.send_signal(signal.SIGTERM)
            waiter.join(timeout=10)
            hog.join(timeout=30)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=40)
    status, body, waited = results["held"]
    assert status == 503 and body["error"]["code"] == "shutting_down"
    assert waited < 5  # answered at shutdown, not when the stream ended
    stream_status, raw = results["stream"]
    assert stream_status == 200 and raw.rstrip().endswith(b"data: [DONE]")
