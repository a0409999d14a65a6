"""Starts what several gateway replicas run on: a real redis-server, nginx in front (with the
shipped config/nginx-replicas.conf), and `thunder-mw serve` replicas sharing the Redis.

For tests/real/test_replicas.py and lab/replicas.py. Every process runs on free loopback
ports from a temporary directory; no system service is started.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis

from thunder_mw.benchmarks.live import Gateway
from thunder_mw.benchmarks.server_process import stop_process
from thunder_mw.sim.ports import free_port

__all__ = [
    "LISTEN",
    "NGINX_CONFIG",
    "UPSTREAMS",
    "Nginx",
    "RedisServer",
    "holders",
    "kill_replica",
    "missing_binaries",
    "nginx_or",
    "replica_config",
    "reservations",
    "sim_engine",
    "started",
]

NGINX_CONFIG = Path(__file__).resolve().parents[1] / "config" / "nginx-replicas.conf"
# The shipped file's own ports, replaced by free ones.
LISTEN, UPSTREAMS = "127.0.0.1:8300", ("127.0.0.1:8301", "127.0.0.1:8302")


def missing_binaries() -> list[str]:
    """What scripts/setup_redis_nginx.sh installs, where it is not here."""
    return [name for name in ("redis-server", "nginx") if nginx_or(name) is None]


def nginx_or(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")


class RedisServer:
    """A redis-server on a free loopback port, data in a temporary directory (no persistence)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="thunder-mw-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        argv = [nginx_or("redis-server") or "redis-server", "--port", str(self.port)]
        argv += ["--bind", "127.0.0.1", "--dir", self._dir.name, "--save", ""]
        argv += ["--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]
        self._proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        client = self.client()
        deadline = time.monotonic() + 15
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                time.sleep(0.05)
        client.close()
        return self

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True, socket_timeout=5)

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def close(self) -> None:
        self.kill()
        self._dir.cleanup()


class Nginx:
    """nginx with the shipped config, its ports replaced, under a temporary prefix."""

    def __init__(self, upstream_ports: list[int]) -> None:
        assert len(upstream_ports) == len(UPSTREAMS)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory(prefix="thunder-mw-nginx-")
        text = NGINX_CONFIG.read_text()
        for old, port in zip(UPSTREAMS, upstream_ports, strict=True):
            text = text.replace(old, f"127.0.0.1:{port}")
        self.config_text = text.replace(LISTEN, f"127.0.0.1:{self.port}")
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Nginx:
        prefix = Path(self._dir.name)
        # Started as root, nginx's workers run as `nobody`: they must reach the temp folder.
        prefix.chmod(0o755)
        (prefix / "tmp").mkdir(mode=0o1777)
        (prefix / "tmp").chmod(0o1777)
        conf = prefix / "nginx.conf"
        conf.write_text(self.config_text)
        argv = [nginx_or("nginx") or "nginx", "-p", str(prefix), "-c", str(conf)]
        with open(prefix / "stderr.log", "wb") as stderr:  # the child keeps its own
            self._proc = subprocess.Popen(
                [*argv, "-g", "daemon off;"],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        deadline = time.monotonic() + 15
        while True:
            try:
                httpx.get(f"{self.url}/health", timeout=2)
                return self
            except httpx.HTTPError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    log = (
                        (prefix / "error.log").read_text()
                        if (prefix / "error.log").exists()
                        else ""
                    )
                    raise RuntimeError(f"nginx did not start: {log[-1000:]}") from None
                time.sleep(0.05)

    def close(self) -> None:
        if self._proc is not None:
            stop_process(self._proc)
        self._dir.cleanup()


def replica_config(
    engine_urls: list[str],
    redis_url: str,
    *,
    port: int | None = None,
    policies: list[dict[str, Any]] | None = None,
    on_unavailable: str = "fail_open",
    lease_ttl_s: float = 2.0,
    tick_interval_s: float = 0.25,
    probe_interval_s: float = 0.25,
    key_prefix: str = "thunder-mw:",
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "server": {
            "host": "127.0.0.1",
            "port": port or free_port(),
            "log_level": "warning",
            "tick_interval_s": tick_interval_s,
            "probe_interval_s": probe_interval_s,
        },
        "backends": [
            {"name": f"e{i}", "type": "vllm", "url": url} for i, url in enumerate(engine_urls)
        ],
        "state": {
            "backend": "redis",
            "url": redis_url,
            "key_prefix": key_prefix,
            "on_unavailable": on_unavailable,
            "lease_ttl_s": lease_ttl_s,
        },
    }
    if policies is not None:
        config["policies"] = policies
    return config


def kill_replica(gateway: Gateway) -> None:
    """SIGKILL: no shutdown, no lease given back, requests it held are lost."""
    assert gateway.pid is not None
    os.kill(gateway.pid, signal.SIGKILL)
    os.waitpid(gateway.pid, 0)


def reservations(client: redis.Redis, prefix: str = "thunder-mw:") -> dict[str, dict[str, int]]:
    """engine -> program -> tokens, as Redis holds them now."""
    found: dict[str, dict[str, int]] = {}
    for key in client.scan_iter(f"{prefix}resv:*"):
        found[str(key)[len(prefix) + len("resv:") :]] = {
            str(k): int(v) for k, v in client.hgetall(key).items()
        }
    return found


def holders(client: redis.Redis, prefix: str = "thunder-mw:") -> set[str]:
    """The replicas that hold any reservation now."""
    found: set[str] = set()
    for key in client.scan_iter(f"{prefix}holder:*"):
        found.update(str(v) for v in client.hvals(key))
    return found


@contextmanager
def started(thing: Any) -> Iterator[Any]:
    try:
        yield thing.start()
    finally:
        thing.close()


@contextmanager
def sim_engine(
    *, num_blocks: int, block_size: int = 16, time_scale: float = 1.0, seed: int = 0
) -> Iterator[str]:
    """One `thunder-mw sim-engine` process (vLLM flavour, the h100-8b profile); its URL."""
    import sys
    from functools import partial

    from thunder_mw.benchmarks.peers import Process, answers_ok

    port = free_port()
    argv = [sys.executable, "-m", "thunder_mw.cli.main", "sim-engine", "--flavor", "vllm"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--num-blocks", str(num_blocks)]
    argv += ["--block-size", str(block_size), "--profile", "h100-8b"]
    argv += ["--time-scale", str(time_scale), "--seed", str(seed), "--log-level", "warning"]
    proc = Process(argv, f"sim-engine-{port}")
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_ready(partial(answers_ok, f"{url}/health"))
        yield url
    finally:
        proc.close()
