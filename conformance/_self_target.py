"""`--self`: runs thunder-mw itself (as `thunder-mw serve`) in front of the recording backend."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import yaml

from thunder_mw.sim.ports import free_port

__all__ = ["ThunderMwProcess", "self_config", "thunder_mw_target"]


def self_config(backend_port: int, flavor: str, port: int) -> dict[str, object]:
    """The one-backend configuration the self run serves: default agent-context settings plus
    the coding-agent headers (off by default), so `full` covers every convention."""
    return {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning"},
        "agent_context": {
            "conventions": [
                "thunderagent",
                "dynamo_body",
                "dynamo_headers",
                "vllm_router",
                "litellm",
                "coding_agents",
            ]
        },
        "backends": [
            {"name": "recorder", "type": flavor, "url": f"http://127.0.0.1:{backend_port}"}
        ],
    }


class ThunderMwProcess:
    """A `thunder-mw serve` subprocess; its log is kept for the report when it fails."""

    def __init__(self, workdir: Path, backend_port: int, flavor: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "thunder-mw.yaml"
        self.log_path = workdir / "thunder-mw.log"
        self.config_path.write_text(
            yaml.safe_dump(self_config(backend_port, flavor, self.port), sort_keys=False)
        )
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log_path.open("wb") as log:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "thunder_mw.cli.main",
                "serve",
                "--config",
                str(self.config_path),
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )

    def exited(self) -> bool:
        return self._process is not None and self._process.returncode is not None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    async def stop(self) -> None:
        if self._process is None or self._process.returncode is not None:
            return
        self._process.terminate()
        try:
            await asyncio.wait_for(self._process.wait(), timeout=15)
        except TimeoutError:
            self._process.kill()
            await self._process.wait()


@contextlib.asynccontextmanager
async def thunder_mw_target(
    backend_port: int, flavor: str = "vllm"
) -> AsyncIterator[ThunderMwProcess]:
    with tempfile.TemporaryDirectory(prefix="thunder-mw-conformance-") as tmp:
        process = ThunderMwProcess(Path(tmp), backend_port, flavor)
        await process.start()
        try:
            yield process
        finally:
            await process.stop()
