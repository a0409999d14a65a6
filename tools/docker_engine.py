"""The Docker engine as the tool manager sees it: blocking SDK calls, run on a bounded pool
of worker threads so the event loop never waits on the engine."""

from __future__ import annotations

import asyncio
import functools
import importlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions

from thunder_mw.schemas.config import SandboxTemplate

__all__ = [
    "ContainerGone",
    "ContainerInfo",
    "CustomHook",
    "DockerEngine",
    "EngineDown",
    "load_hook",
]

T = TypeVar("T")
_PROVISIONAL_API_VERSION = "1.41"  # replaced by the engine's own before the first real call
CustomHook = Callable[[Any, str, str], None]


class ContainerGone(Exception):
    """The engine has no such container."""


class EngineDown(Exception):
    """The engine did not answer, or failed: the call may succeed later."""


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    labels: dict[str, str]
    image_id: str


def load_hook(spec: str) -> CustomHook:
    """`package.module:function`, resolved once at start-up so a typo fails early."""
    module, _, attr = spec.partition(":")
    fn = getattr(importlib.import_module(module), attr, None)
    if not callable(fn):
        raise ValueError(f"reclaim hook {spec!r} is not a callable")
    return fn  # type: ignore[no-any-return]


def _classified(fn: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except docker.errors.NotFound as exc:
            raise ContainerGone(str(exc)) from None
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise EngineDown(f"{type(exc).__name__}: {exc}") from None

    return wrapper


class DockerEngine:
    def __init__(self, url: str | None, max_calls: int, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_calls, thread_name_prefix="thunder-mw-docker")
        self._max_calls = max_calls
        self._client: docker.DockerClient | None = None
        self._client_lock = threading.Lock()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()

    # ------------------------------------------------------------------ blocking calls
    @property
    def client(self) -> docker.DockerClient:
        with self._client_lock:
            if self._client is None:
                self._client = self._connect()
        return self._client

    def _connect(self) -> docker.DockerClient:
        kwargs: dict[str, Any] = {
            "timeout": int(self.timeout_s),
            "max_pool_size": self._max_calls,
        }
        # The engine is reached at the configured address only: requests' session would
        # otherwise send a tcp:// engine's calls through HTTP(S)_PROXY and read ~/.netrc.
        # The SDK asks the engine its API version while constructing the client, so that
        # question waits until the session ignores the environment.
        kwargs["version"] = _PROVISIONAL_API_VERSION
        client = (
            docker.DockerClient(base_url=self.url, **kwargs)
            if self.url
            else docker.from_env(**kwargs)
        )
        client.api.trust_env = False
        # The SDK has no public way to re-ask the version once the session is fixed.
        client.api._version = client.api._retrieve_server_version()  # type: ignore[attr-defined]
        return client

    @_classified
    def ping(self) -> str:
        self.client.ping()
        return str(self.client.version().get("Version", "?"))

    @_classified
    def inspect(self, ref: str) -> ContainerInfo:
        c = self.client.containers.get(ref)
        return ContainerInfo(
            c.id or "", c.name or "", dict(c.labels or {}), c.attrs.get("Image", "")
        )

    @_classified
    def create(self, template: SandboxTemplate, name: str, labels: dict[str, str]) -> ContainerInfo:
        kwargs: dict[str, Any] = {
            "name": name,
            "detach": True,
            "labels": {**template.labels, **labels},
            "environment": template.environment,
            "network_mode": template.network,
        }
        if template.mem_limit:
            kwargs["mem_limit"] = template.mem_limit
        if template.cpus:
            kwargs["nano_cpus"] = int(template.cpus * 1e9)
        if template.pids_limit:
            kwargs["pids_limit"] = template.pids_limit
        c = self.client.containers.run(template.image, template.command, **kwargs)
        return ContainerInfo(c.id, c.name, dict(c.labels or {}), c.attrs.get("Image", ""))

    @_classified
    def force_remove(self, ref: str) -> None:
        """Kills and removes at once (volumes too); a container already gone is fine."""
        try:
            self.client.api.remove_container(ref, v=True, force=True)
        except docker.errors.NotFound:
            pass

    @_classified
    def reclaim(
        self,
        container_id: str,
        steps: Sequence[str],
        custom: dict[str, CustomHook],
        program_id: str,
        reason: str,
        stop_timeout_s: float,
    ) -> None:
        """Runs the reclaim steps in order; a container already gone counts as reclaimed."""
        try:
            container = self.client.containers.get(container_id)
        except docker.errors.NotFound:
            return
        for step in steps:
            try:
                if step == "stop":
                    container.stop(timeout=int(stop_timeout_s))
                elif step == "remove":
                    container.remove(v=True, force=True)
                else:
                    custom[step](container, program_id, reason)
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                # Started with `--rm` (mini-SWE-agent's default): stopping it makes the
                # engine remove it itself, and our remove then meets that removal.
                if exc.status_code == 409 and "already in progress" in str(exc.explanation):
                    return
                raise

    @_classified
    def remove_image_if_unused(self, image_id: str) -> bool:
        """Removes the image when no container (running or not) uses it; True if removed."""
        if self.client.api.containers(all=True, quiet=True, filters={"ancestor": image_id}):
            return False
        try:
            self.client.api.remove_image(image_id)
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # another container, or several tags, still need it
                return False
            raise
        return True

    @_classified
    def managed_disk_bytes(self, label: str | None, name_prefix: str | None) -> tuple[int, int]:
        """Writable-layer bytes of the managed containers, from the engine's own size
        accounting (`docker ps --size`), and how many there are."""
        filters = {"label": label} if label else {}
        rows = self.client.api.containers(all=True, size=True, filters=filters)
        if name_prefix:
            rows = [
                r for r in rows if any(n.lstrip("/").startswith(name_prefix) for n in r["Names"])
            ]
        return sum(int(r.get("SizeRw") or 0) for r in rows), len(rows)
