"""The tool journal across a gateway killed with SIGKILL: orphans are reclaimed after the
grace period on restart, and nothing the gateway does not own is touched."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import yaml
from support.docker_fixtures import IMAGE, TEST_LABEL, exists
from support.fake_engine import FakeEngine
from support.polling import wait_until
from test_tools_docker import step

from thunder_mw.sim.ports import free_port

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container


@contextmanager
def gateway_process(config_path: Path, port: int) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "thunder_mw.cli.main", "serve", "--config", str(config_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(healthy, 60, message="the gateway to start")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def _config(tmp_path: Path, engine: FakeEngine, run: str, pool_size: int = 0) -> tuple[Path, int]:
    port = free_port()
    config = {
        "server": {"port": port, "log_level": "warning"},
        "backends": [{"name": "e0", "url": engine.url}],
        "tools": {
            "docker": {
                "enabled": True,
                "journal_path": str(tmp_path / "journal.sqlite3"),
                "grace_period_s": 1.0,
                "sweep_interval_s": 0.1,
                "stop_timeout_s": 0,
                "templates": [
                    {
                        "name": "box",
                        "image": IMAGE,
                        "command": ["sleep", "300"],
                        "labels": {TEST_LABEL: "1", "run": run},
                        "pool_size": pool_size,
                    }
                ],
            }
        },
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, port


class _Gw:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"


def test_sigkill_then_restart_reclaims_orphans_and_touches_nothing_else(
    tmp_path: Path,
    engine: FakeEngine,
    sandbox: Callable[..., Container],
    docker_client: docker.DockerClient,
) -> None:
    owned, bystander = sandbox(), sandbox()  # both managed; only one is ever adopted
    path, port = _config(tmp_path, engine, uuid.uuid4().hex)
    with gateway_process(path, port) as proc:
        assert step(_Gw(port), "p1", [owned.id]).status_code == 200
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert exists(docker_client, owned.id)  # killed: it reclaimed nothing
    started = time.monotonic()
    with gateway_process(path, port):
        assert wait_until(lambda: not exists(docker_client, owned.id), 30)
        waited = time.monotonic() - started
    assert waited >= 1.0  # not before the grace period
    assert exists(docker_client, bystander.id)


def test_a_program_that_returns_within_the_grace_period_keeps_its_container(
    tmp_path: Path,
    engine: FakeEngine,
    sandbox: Callable[..., Container],
    docker_client: docker.DockerClient,
) -> None:
    box = sandbox()
    path, port = _config(tmp_path, engine, uuid.uuid4().hex)
    with gateway_process(path, port) as proc:
        step(_Gw(port), "p1", [box.id])
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    with gateway_process(path, port):
        assert step(_Gw(port), "p1", [box.id]).status_code == 200
        time.sleep(1.5)  # past the grace period: a live program's container must stay
        assert exists(docker_client, box.id)
        httpx.post(f"{_Gw(port).url}/programs/release", json={"program_id": "p1"})
        assert wait_until(lambda: not exists(docker_client, box.id), 30)


def test_sigkill_while_the_warm_pool_fills_leaks_no_container(
    tmp_path: Path, engine: FakeEngine, docker_client: docker.DockerClient
) -> None:
    run = uuid.uuid4().hex
    path, port = _config(tmp_path, engine, run, pool_size=3)

    def ours() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = docker_client.api.containers(
            all=True, quiet=True, filters={"label": f"run={run}"}
        )
        return found

    with gateway_process(path, port) as proc:
        assert wait_until(lambda: len(ours()) >= 1, 30)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert ours()  # the kill left pool containers behind
    with gateway_process(path, port):
        assert wait_until(lambda: len(ours()) == 3, 30)  # the old ones went, a new pool came
    assert wait_until(lambda: ours() == [], 10)
