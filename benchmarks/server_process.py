"""Waiting until a server that a benchmark or a test started answers its /health probe."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx

__all__ = ["ServerNotReady", "stop_process", "wait_until_healthy"]


class ServerNotReady(RuntimeError):
    """The server exited, or did not answer in time; the message carries its log's tail."""


def wait_until_healthy(
    url: str,
    *,
    timeout_s: float = 30.0,
    process: subprocess.Popen[bytes] | None = None,
    log_path: Path | None = None,
    ready: Callable[[httpx.Response], bool] = lambda response: response.status_code == 200,
) -> None:
    """Polls GET `url`/health until `ready` accepts the answer (by default: any 200).

    With `process`, its exit ends the wait at once; with `log_path`, the error names the log
    and quotes its last lines.
    """
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2, trust_env=False) as client:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise ServerNotReady(
                    f"{process.args!r} exited with {process.returncode} during start-up"
                    + _log_tail(log_path)
                )
            try:
                if ready(client.get(f"{url}/health")):
                    return
            except (httpx.HTTPError, ValueError, KeyError):  # not up, or not ready yet
                pass
            time.sleep(0.1)
    raise ServerNotReady(f"{url} not healthy within {timeout_s:.0f} s" + _log_tail(log_path))


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if the process is still there after `timeout_s`; reaped."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _log_tail(log_path: Path | None, lines: int = 60) -> str:
    if log_path is None:
        return ""
    try:
        tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"; no log at {log_path}"
    return f"; log {log_path}:\n" + "\n".join(tail)
