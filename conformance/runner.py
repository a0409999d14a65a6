"""Runs a profile's checks against a target that forwards to the recording backend.

`run_checks` is the core (target and backend already up); `run_conformance_suite` also starts
the recording backend on the given port, the target itself for `--self`, and waits for the
target to answer before the first check.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

import httpx

from thunder_mw.conformance._self_target import thunder_mw_target
from thunder_mw.conformance.recording_backend import (
    BackendServer,
    Flavor,
    Recorded,
    RecordingBackend,
)
from thunder_mw.conformance.registry import CheckBody, checks_for
from thunder_mw.conformance.session import Fail, NotApplicable, Session, WithoutContext
from thunder_mw.sim.ports import free_port

__all__ = [
    "CHECK_TIMEOUT_S",
    "CheckResult",
    "Status",
    "SuiteResult",
    "TargetUnavailable",
    "run_checks",
    "run_conformance_suite",
    "serving_backend",
    "wait_for_target",
]

Status = Literal["pass", "fail", "n/a"]
CHECK_TIMEOUT_S = 30.0


@dataclass
class CheckResult:
    id: str
    statement: str
    status: Status
    detail: str = ""


@dataclass
class SuiteResult:
    target: str
    profile: str
    started_at: str
    checks: list[CheckResult] = field(default_factory=list)
    recorded: list[Recorded] = field(default_factory=list)

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == "fail"]


class TargetUnavailable(RuntimeError):
    """The server under test never answered (or the recording backend could not start)."""


async def run_checks(
    target: str,
    backend: RecordingBackend,
    profile: str,
    *,
    without_context: WithoutContext = "forward",
    only: Iterable[str] | None = None,
) -> SuiteResult:
    chosen = checks_for(profile)
    if only is not None:
        wanted = set(only)
        unknown = wanted - {c.id for c in chosen}
        if unknown:
            raise ValueError(f"not checks of profile {profile}: {', '.join(sorted(unknown))}")
        chosen = [c for c in chosen if c.id in wanted]
    result = SuiteResult(target, profile, datetime.now(UTC).isoformat(timespec="seconds"))
    async with httpx.AsyncClient(timeout=CHECK_TIMEOUT_S, trust_env=False) as client:
        session = Session(target, backend, client, without_context)
        for chosen_check in chosen:
            session.check_id = chosen_check.id
            status, detail = await _run_one(chosen_check.run, session)
            result.checks.append(
                CheckResult(chosen_check.id, chosen_check.statement, status, detail)
            )
    result.recorded = list(backend.requests)
    return result


async def _run_one(run: CheckBody, session: Session) -> tuple[Status, str]:
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            detail = await run(session)
    except Fail as exc:
        return "fail", exc.detail()
    except NotApplicable as exc:
        return "n/a", str(exc)
    except TimeoutError:
        return "fail", f"no answer within {CHECK_TIMEOUT_S:.0f} s"
    except httpx.HTTPError as exc:
        return "fail", f"transport error talking to the target: {exc!r}"
    except Exception as exc:  # a crashing check is a finding, not a crash of the suite
        return "fail", f"the check could not complete: {exc!r}"
    return "pass", detail or ""


async def wait_for_target(
    url: str, timeout_s: float, gone: Callable[[], bool] | None = None
) -> None:
    """Until GET {url}/v1/models answers 2xx: up, and able to reach its backend."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
        while time.monotonic() < deadline:
            if gone is not None and gone():
                raise TargetUnavailable("the target process exited during start-up")
            try:
                response = await client.get(url.rstrip("/") + "/v1/models")
                if 200 <= response.status_code < 300:
                    return
                last = f"GET /v1/models answered {response.status_code}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            await asyncio.sleep(0.2)
    raise TargetUnavailable(f"{url} was not ready within {timeout_s:.0f} s ({last})")


@contextlib.asynccontextmanager
async def serving_backend(port: int, flavor: Flavor) -> AsyncIterator[BackendServer]:
    server = BackendServer(RecordingBackend(flavor), port)
    try:
        await server.start()
    except OSError as exc:
        raise TargetUnavailable(str(exc)) from None
    try:
        yield server
    finally:
        await server.stop()


async def run_conformance_suite(
    *,
    target: str | None,
    backend_port: int | None,
    profile: str,
    flavor: Flavor = "vllm",
    self_mode: bool = False,
    without_context: WithoutContext = "forward",
    only: Iterable[str] | None = None,
    wait_s: float = 60.0,
) -> SuiteResult:
    """Start the recording backend (and thunder-mw for `self_mode`), then run the checks."""
    port = backend_port or free_port()
    async with serving_backend(port, flavor) as backend_server:
        if self_mode:
            async with thunder_mw_target(port, flavor) as process:
                try:
                    await wait_for_target(process.url, wait_s, process.exited)
                except TargetUnavailable as exc:
                    raise TargetUnavailable(f"{exc}\n{process.log_tail()}") from None
                return await run_checks(
                    process.url,
                    backend_server.backend,
                    profile,
                    without_context=without_context,
                    only=only,
                )
        if target is None:
            raise ValueError("--target is required unless --self is given")
        await wait_for_target(target, wait_s)
        return await run_checks(
            target, backend_server.backend, profile, without_context=without_context, only=only
        )
