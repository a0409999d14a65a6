"""The fleet at run time: engines that join and drain, and weight-update cycles across them.

RL rollout frameworks start and stop engines during training and update their weights between
steps. This module carries that out over the backend pool (I/O) and the live scheduler (whose
pure core decides where programs go): an engine added is probed like a configured one and
takes programs at once; a drained one admits nothing, finishes its calls and leaves; a weight
update holds new calls at the scheduler's gate, lets in-flight ones finish (or has the engines
abort them), forwards pause / update / resume to every engine in its own API's spelling, marks
every cache cold for the scheduler and releases the held calls, so no call fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from thunder_mw.engines.client import UpstreamError
from thunder_mw.engines.pool import Backend, BackendPool
from thunder_mw.middleware.live_scheduler import LiveScheduler
from thunder_mw.schemas.config import BackendSettings
from thunder_mw.schemas.rollout_views import EngineAnswer, GenerationState, PauseMode

__all__ = [
    "EngineCall",
    "Fleet",
    "FleetError",
    "flush_call",
    "pause_call",
    "resume_call",
    "sleep_call",
    "update_call",
    "wake_call",
]

log = logging.getLogger("thunder_mw.fleet")

# (method, path, query, JSON body) of one control call to one engine.
EngineCall = tuple[str, str, dict[str, str] | None, dict[str, Any] | None]
_CONTROL_TIMEOUT_S = 600.0  # loading weights from disk takes a while


class FleetError(Exception):
    """A fleet operation that cannot go ahead: answered as an OpenAI-style error."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


# ---------------------------------------------------------------- each engine's spelling
def pause_call(flavor: str, mode: PauseMode) -> EngineCall:
    if flavor == "sglang":
        return ("POST", "/pause_generation", None, {"mode": _SGLANG_MODE[mode]})
    return ("POST", "/pause", {"mode": "abort" if mode == "abort" else "keep"}, None)


_SGLANG_MODE: dict[str, str] = {"wait": "in_place", "keep": "in_place", "abort": "abort"}


def resume_call(flavor: str) -> EngineCall:
    if flavor == "sglang":
        return ("POST", "/continue_generation", None, {})
    return ("POST", "/resume", None, None)


def update_call(flavor: str, body: dict[str, Any]) -> EngineCall:
    if flavor == "sglang":
        return ("POST", "/update_weights_from_disk", None, body)
    # vLLM's weights are pushed by the trainer itself (collective RPC / NCCL); what the
    # gateway owes it is a cache that no longer serves the old weights' KV.
    return ("POST", "/reset_prefix_cache", None, None)


def flush_call(flavor: str) -> EngineCall:
    if flavor == "sglang":
        return ("POST", "/flush_cache", None, None)
    return ("POST", "/reset_prefix_cache", None, None)


def sleep_call(flavor: str, level: int) -> EngineCall:
    if flavor == "sglang":
        return ("POST", "/release_memory_occupation", None, {})
    return ("POST", "/sleep", {"level": str(level)}, None)


def wake_call(flavor: str) -> EngineCall:
    if flavor == "sglang":
        return ("POST", "/resume_memory_occupation", None, {})
    return ("POST", "/wake_up", None, None)


class Fleet:
    """Run-time changes to the engines; one weight-update cycle at a time."""

    def __init__(self, pool: BackendPool, scheduler: LiveScheduler) -> None:
        self.pool = pool
        self.scheduler = scheduler
        self.mode: PauseMode | None = None
        self.sleeping = False
        self._paused_for_sleep = False
        self._cycle = asyncio.Lock()
        self._leaving: dict[str, asyncio.Task[None]] = {}

    async def stop(self) -> None:
        for task in list(self._leaving.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------------ engines
    async def add(self, settings: BackendSettings) -> Backend:
        """Opens and probes the engine, then the scheduler may place programs on it."""
        problem = self.pool.conflict(settings)
        if problem is not None:
            raise FleetError(409, problem, "backend_exists", "name" if settings.name else "url")
        try:
            backend = await self.pool.add(settings)
        except ValueError as exc:  # lost a race with an add of the same name
            raise FleetError(409, str(exc), "backend_exists", "name") from None
        self.scheduler.add_backend(backend)
        return backend

    def drain(self, label: str) -> Backend:
        """Starts draining `label` (idempotent); it leaves once nothing runs or is placed there."""
        backend = self.pool.get(label)
        if backend is None or backend not in self.pool.backends:
            raise FleetError(404, f"no backend named {label!r}", "backend_not_found", "name")
        if not backend.draining:
            backend.draining = True
            self.scheduler.drain_backend(label)
            log.info("backend %s draining", label)
            task = asyncio.get_running_loop().create_task(self._leave(label))
            self._leaving[label] = task
            task.add_done_callback(lambda _: self._leaving.pop(label, None))
        return backend

    async def _leave(self, label: str) -> None:
        await self.scheduler.until(lambda: self.scheduler.drained(label))
        self.scheduler.remove_backend(label)
        await self.pool.remove(label)

    def by_url(self, url: str) -> Backend | None:
        url = url.rstrip("/")
        return next((b for b in self.pool.backends if b.url == url), None)

    # ------------------------------------------------------------------ generation gate
    async def pause(self, mode: PauseMode, timeout_s: float) -> GenerationState:
        async with self._cycle:
            answers = await self._pause(mode, timeout_s)
        return self.state(answers, "generation paused")

    async def resume(self) -> GenerationState:
        async with self._cycle:
            answers, released = await self._resume()
        return self.state(answers, "generation continues", released)

    async def update_weights(
        self, body: dict[str, Any], mode: PauseMode, timeout_s: float
    ) -> GenerationState:
        """The whole cycle; inside a pause the framework asked for, only update + cold."""
        async with self._cycle:
            was_paused = self.scheduler.paused_generation
            answers = [] if was_paused else await self._pause(mode, timeout_s)
            answers += await self._tell_all(lambda b: update_call(b.flavor, body))
            self.scheduler.mark_cache_cold()
            released = 0
            if not was_paused:
                resumed, released = await self._resume()
                answers += resumed
        return self.state(answers, "weights updated; every engine's cache is cold", released)

    async def flush_cache(self) -> GenerationState:
        async with self._cycle:
            answers = await self._tell_all(lambda b: flush_call(b.flavor))
            self.scheduler.mark_cache_cold()
        return self.state(answers, "caches flushed")

    async def sleep(self, level: int, timeout_s: float) -> GenerationState:
        async with self._cycle:
            answers: list[EngineAnswer] = []
            if not self.scheduler.paused_generation:
                answers = await self._pause("wait", timeout_s)
                self._paused_for_sleep = True
            answers += await self._tell_all(lambda b: sleep_call(b.flavor, level))
            self.sleeping = True
            self.scheduler.mark_cache_cold()  # sleeping engines discard their KV cache
        return self.state(answers, f"engines asleep (level {level})")

    async def wake_up(self) -> GenerationState:
        async with self._cycle:
            answers = await self._tell_all(lambda b: wake_call(b.flavor))
            self.sleeping = False
            released = 0
            if self._paused_for_sleep:
                self._paused_for_sleep = False
                resumed, released = await self._resume()
                answers += resumed
        return self.state(answers, "engines awake", released)

    def state(
        self, answers: list[EngineAnswer], message: str, released: int = 0
    ) -> GenerationState:
        scheduler = self.scheduler
        failed = [a for a in answers if not a.ok]
        if failed:
            message += "; not done by " + ", ".join(f"{a.backend} ({a.path})" for a in failed)
        held = scheduler.gated_calls
        return GenerationState(
            success=not failed,
            message=message,
            paused=scheduler.paused_generation,
            mode=self.mode if scheduler.paused_generation else None,
            held_calls=held,
            in_flight_calls=sum(scheduler.calls.values()),
            released_calls=released,
            num_paused_requests=held,
            cache_flushes=scheduler.core.counts().get("cache_flushes", 0),
            engines=answers,
        )

    async def _pause(self, mode: PauseMode, timeout_s: float) -> list[EngineAnswer]:
        scheduler = self.scheduler
        if scheduler.paused_generation:
            return []
        scheduler.pause_generation()
        self.mode = mode
        answers: list[EngineAnswer] = []
        if mode != "wait":
            # The engines abort (or keep, paused inside them) what runs now.
            answers = await self._tell_all(lambda b: pause_call(b.flavor, mode))
        if mode != "keep" and scheduler.calls:
            try:
                await asyncio.wait_for(scheduler.until(lambda: not scheduler.calls), timeout_s)
            except TimeoutError:
                await self._resume()
                raise FleetError(
                    504,
                    f"calls still in flight after {timeout_s:g} s; generation continues "
                    "(retry, or pause with mode abort)",
                    "pause_timeout",
                    "timeout_s",
                ) from None
        if mode == "wait":
            answers = await self._tell_all(lambda b: pause_call(b.flavor, mode))
        log.info("generation paused (%s)", mode)
        return answers

    async def _resume(self) -> tuple[list[EngineAnswer], int]:
        if not self.scheduler.paused_generation:
            return [], 0
        answers = await self._tell_all(lambda b: resume_call(b.flavor))
        self.mode = None
        released = self.scheduler.continue_generation()
        log.info("generation continues: %d held call(s) released", released)
        return answers, released

    async def _tell_all(self, call_for: Callable[[Backend], EngineCall]) -> list[EngineAnswer]:
        """Sends each healthy engine its call; an engine that fails is reported, not fatal
        (the cycle goes on, so no held call is left waiting on one engine)."""
        backends = [b for b in self.pool.backends if b.healthy and b.engine is not None]
        return list(await asyncio.gather(*(self._tell(b, call_for(b)) for b in backends)))

    async def _tell(self, backend: Backend, call: EngineCall) -> EngineAnswer:
        method, path, query, body = call
        assert backend.engine is not None
        try:
            answer = await backend.engine.control(
                method,
                path,
                query=query,
                json=body,
                headers=backend.control_headers,
                timeout_s=_CONTROL_TIMEOUT_S,
            )
        except UpstreamError as exc:
            return EngineAnswer(
                backend=backend.label, path=path, status=None, ok=False, detail=repr(exc)
            )
        ok = answer.status < 400
        detail = None if ok else answer.text[:300]
        return EngineAnswer(
            backend=backend.label, path=path, status=answer.status, ok=ok, detail=detail
        )
