"""Waiting for a started server: the one /health poll that benchmarks and tests share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.asgi_servers import serving
from support.fake_engine import FakeEngine

from thunder_mw.benchmarks.server_process import ServerNotReady, wait_until_healthy
from thunder_mw.sim.ports import free_port


def test_a_server_answering_health_is_ready() -> None:
    with serving(FakeEngine()) as server:
        wait_until_healthy(server.url, timeout_s=5)


def test_a_process_that_exits_ends_the_wait_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("boom: no such model\n")
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    with pytest.raises(ServerNotReady, match=r"exited with 3(.|\n)*boom: no such model"):
        wait_until_healthy(
            f"http://127.0.0.1:{free_port()}", timeout_s=30, process=process, log_path=log
        )


def test_nothing_listening_is_not_ready_after_the_timeout() -> None:
    with pytest.raises(ServerNotReady, match="not healthy within"):
        wait_until_healthy(f"http://127.0.0.1:{free_port()}", timeout_s=0.3)


def test_readiness_can_ask_more_than_a_200() -> None:
    with serving(FakeEngine()) as server, pytest.raises(ServerNotReady):
        wait_until_healthy(server.url, timeout_s=0.3, ready=lambda r: r.json()["never"])
