"""The real peers the conformance suite is run against in CI: the vLLM router and SGLang's model
gateway (both Rust routers shipped on PyPI; the `peers` extra installs them)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from support.asgi_servers import free_port
from support.polling import wait_until
from thunder_mw.benchmarks.server_process import stop_process

REQUIRE_REAL_ENV = "THUNDER_MW_REQUIRE_REAL"


@dataclass(frozen=True)
class Peer:
    name: str  # also its conformance profile
    executable: str
    version: str  # the one pinned in pyproject.toml's `peers` extra
    # vllm-router binds its port only once a worker answers (it logs "Waiting for 1 unique
    # hosts ... to become healthy"); smg listens at once.
    listens_before_workers: bool = True

    def command(self, backend_url: str, port: int, metrics_port: int) -> list[str]:
        common = [
            "--worker-urls",
            backend_url,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(metrics_port),
        ]
        if self.name == "vllm-router":
            return [
                self.executable,
                *common,
                "--enable-program-scheduling",
                "--log-level",
                "warning",
            ]
        return [
            self.executable,
            "launch",
            *common,
            "--policy",
            "cache_aware",
            "--log-level",
            "warn",
        ]


VLLM_ROUTER = Peer("vllm-router", "vllm-router", "0.1.17", listens_before_workers=False)
SMG = Peer("smg", "smg", "1.13.0")


def require(peer: Peer) -> str:
    """The peer's executable, or skip (a failure under THUNDER_MW_REQUIRE_REAL=1)."""
    path = shutil.which(peer.executable)
    if path is None:
        reason = f"{peer.executable} is not installed (pip install -e '.[peers]')"
        if os.environ.get(REQUIRE_REAL_ENV) == "1":
            pytest.fail(f"{reason}; {REQUIRE_REAL_ENV}=1 forbids skipping")
        pytest.skip(reason)
    return path


@contextlib.contextmanager
def running_peer(peer: Peer, backend_port: int, log: Path) -> Iterator[str]:
    """Starts the peer in front of 127.0.0.1:backend_port; yields its URL once it listens, or
    at once for a peer that listens only once its workers answer: there the caller starts the
    backend and waits for the peer (the conformance suite's `wait_s`)."""
    require(peer)
    port, metrics_port = free_port(), free_port()
    command = peer.command(f"http://127.0.0.1:{backend_port}", port, metrics_port)
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:

        def listening() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"{peer.name} exited: {log.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{url}/health", timeout=1)
                return True  # listening (its workers may still be starting: the suite waits)
            return False

        if peer.listens_before_workers:
            wait_until(listening, 30, interval_s=0.2, message=f"{peer.name} to listen on {url}")
        yield url
    finally:
        stop_process(process)
