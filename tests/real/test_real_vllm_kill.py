"""The real vLLM engine SIGKILLed in the middle of a stream relayed by thunder-mw.

It runs its own engine (never the session's shared `vllm_engine`, which other tests keep
using) with a simulated engine beside it as the healthy backend to fall back on.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.asgi_servers import ServerThread, serving
from support.fake_engine import FakeEngine
from support.polling import wait_until
from support.real_vllm import RealVllm, missing_prerequisites, start_vllm

from thunder_mw.middleware.app import ThunderGateway, create_app
from thunder_mw.policies.program_table import ProgramState
from thunder_mw.schemas.config import ThunderConfig

pytestmark = pytest.mark.real_vllm

REQUIRE_REAL_ENV = "THUNDER_MW_REQUIRE_REAL"  # as in conftest.py: CI fails, never skips
# Longer than the stream could take to end once its engine is dead: a hung relay fails here.
NO_HANG_TIMEOUT_S = 30.0


@pytest.fixture
def doomed_engine(tmp_path: Path) -> Iterator[RealVllm]:
    """A real engine of this test's own, which the test kills."""
    reason = missing_prerequisites()
    if reason:
        if os.environ.get(REQUIRE_REAL_ENV) == "1":
            pytest.fail(f"{reason} ({REQUIRE_REAL_ENV}=1 forbids skipping)")
        pytest.skip(reason)
    with start_vllm(num_blocks=24, log_dir=tmp_path, startup_timeout_s=240) as engine:
        yield engine


def test_real_engine_killed_mid_stream_ends_the_stream_and_the_program_moves_on(
    doomed_engine: RealVllm,
) -> None:
    fallback = FakeEngine()  # 1,600 tokens of KV: less room than the real engine's 3,072
    with serving(fallback) as fallback_server:
        backends = [
            {"name": "vllm", "url": doomed_engine.url},
            {"name": "fallback", "url": fallback_server.url},
        ]
        # No periodic probe: the failed stream itself must make the gateway look again.
        config = ThunderConfig(backends=backends, server={"probe_interval_s": 3600})
        app = create_app(config)
        with serving(app) as gw:
            body = {
                "model": doomed_engine.model,
                "prompt": "Once upon a time",
                "max_tokens": 1500,
                "ignore_eos": True,
                "stream": True,
                "program_id": "victim",
            }
            events: list[str] = []
            with httpx.stream(
                "POST", f"{gw.url}/v1/completions", json=body, timeout=NO_HANG_TIMEOUT_S
            ) as response:
                status = response.status_code
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        if len(events) == 3:
                            os.killpg(doomed_engine.pid, signal.SIGKILL)
            during = httpx.get(f"{gw.url}/programs/victim").json()
            # The probe the failure triggered finds the engine gone; its programs leave it.
            left = _until(gw, app, lambda snapshot: not snapshot["healthy"])
            again = httpx.post(
                f"{gw.url}/v1/completions",
                json={**body, "stream": False, "max_tokens": 4},
                timeout=NO_HANG_TIMEOUT_S,
            )
            after = httpx.get(f"{gw.url}/programs/victim").json()

    assert status == 200 and len(events) >= 3
    # The stream ends in an error, never a hang or a silent finish: either the connection
    # broke (thunder-mw's own error event, no [DONE]), or vLLM's API server outlived its engine
    # core long enough to end the stream with vLLM's own error event and [DONE] (its
    # completion stream does so on an engine error) — both happen on a busy host.
    if events[-1] == "[DONE]":
        assert json.loads(events[-2])["error"]["code"] >= 500
    else:
        error = json.loads(events[-1])["error"]
        assert error["code"] == "upstream_error" and error["type"] == "upstream_error"
        assert "[DONE]" not in events  # the stream did not pretend to finish
    assert during["phase"] == "acting" and during["in_flight"] == 0 and during["failures"] == 1
    assert left == {"healthy": False, "reserved": 0, "programs": 0, "victim": ProgramState.PAUSED}
    assert again.status_code == 200 and len(fallback.received) == 1
    assert after["backend"] == "fallback" and after["state"] == "active"
    assert after["phase"] == "acting" and after["migrations"] == 1


def _until(
    gw: ServerThread, app: ThunderGateway, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The core's view of the killed engine and its program, once `done` holds (10 s)."""
    core = app.core.scheduler.core

    async def snapshot() -> dict[str, Any]:
        victim = core.table.get("victim")
        return {
            "healthy": core.backends["vllm"].healthy,
            "reserved": core.backends["vllm"].reserved,
            "programs": core.table.programs_on("vllm"),
            "victim": victim.state if victim else None,
        }

    views: list[dict[str, Any]] = []

    def settled() -> dict[str, Any] | None:
        views.append(gw.call(snapshot()))
        return views[-1] if done(views[-1]) else None

    return wait_until(settled, 10, message=lambda: f"the view to settle: {views[-1]}")
