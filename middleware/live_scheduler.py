"""The live side of the scheduler: feeds the pure core real events and carries out its actions.

It holds requests whose program is paused or not yet admitted (one future per held request),
wakes them on `Resumed`, answers them on `Reject`, drops them when their client leaves, runs
the core's timers, and turns engine probes into backend events. All state lives in the core;
this class owns only the futures and the timer task, all on one event loop (no locks).

One replica of several (`state.backend: redis`) is given a `Replication`
(middleware/replication.py, built by the composition root over the shared store): it writes
through the store's admission gate and keeps the core told of the other replicas. A single
gateway has none, and the request path does no store work.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from thunder_mw.engines.pool import Backend, BackendPool
from thunder_mw.middleware.call_state import CallState, Outcome, RequestBody
from thunder_mw.middleware.replication import Replication
from thunder_mw.middleware.scheduling import ClientGone, Rejected, until_disconnect
from thunder_mw.middleware.types import Receive
from thunder_mw.policies import core_events as ev
from thunder_mw.policies.core import (
    Action,
    BackendMetrics,
    Forward,
    Hold,
    Reject,
    RequestInfo,
    Resumed,
    SchedulerCore,
)
from thunder_mw.policies.kv_placement import KvPlacement
from thunder_mw.policies.program_table import ProgramSnapshot, Usage
from thunder_mw.schemas.config import ServerSettings

__all__ = [
    "RETRY_AFTER_S",
    "HoldLimits",
    "LiveScheduler",
    "request_info",
    "shared_prefix",
    "timed_usage",
]

log = logging.getLogger("thunder_mw.scheduler")
RETRY_AFTER_S = b"5"


def request_info(body: RequestBody | None, prefix_keys: bool = True) -> RequestInfo:
    """What the core is told of a request; `prefix_keys`: key its shared prefix (only a
    pipeline that places by prefix or counts shared prefixes once needs it: hashing a long
    system prompt costs time)."""
    if body is None:
        return RequestInfo()
    data = body.data
    limit = (
        data.get("max_tokens") or data.get("max_completion_tokens") or data.get("max_output_tokens")
    )
    prefix = shared_prefix(data) if prefix_keys else None
    return RequestInfo(
        prompt_chars=len(body.raw),
        max_tokens=limit if isinstance(limit, int) and not isinstance(limit, bool) else None,
        prefix_key=None if prefix is None else f"{zlib.crc32(prefix.encode()):08x}:{len(prefix)}",
        prefix_chars=0 if prefix is None else len(prefix),
        prompt_body=data,  # its prompt fields are counted only if it may be too long
    )


def shared_prefix(data: dict[str, Any]) -> str | None:
    """The leading text programs of one kind share, for KV-aware placement: a chat's system
    (or developer) message, the Responses API's `instructions`; None when there is none."""
    messages = data.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], dict):
        first = messages[0]
        content = first.get("content")
        if first.get("role") in ("system", "developer") and isinstance(content, str):
            return content or None
    instructions = data.get("instructions")
    return instructions if isinstance(instructions, str) and instructions else None


class HoldLimits(msgspec.Struct, frozen=True):
    """Bounds on the requests held for capacity (server settings of the same names)."""

    max_held_requests: int = 10_000
    max_held_bytes: int = 256 * 1024 * 1024
    max_hold_s: float = 600.0
    alone_hold_s: float = 10.0

    @classmethod
    def of(cls, server: ServerSettings) -> HoldLimits:
        return cls(
            server.max_held_requests, server.max_held_bytes, server.max_hold_s, server.alone_hold_s
        )


class LiveScheduler:
    def __init__(
        self,
        pool: BackendPool,
        core: SchedulerCore,
        clock: Callable[[], float] = time.monotonic,
        tick_interval_s: float = 1.0,
        limits: HoldLimits | None = None,
        *,
        listeners: Sequence[Callable[[Action], None]] = (),
        tick_listeners: Sequence[Callable[[], None]] = (),
        replication: Replication | None = None,
    ) -> None:
        """`core` is the pure core over `pool`'s engines; `listeners` see each action it
        returns, in order; the pool's probes reach `on_probe`; `replication` makes this one
        replica of several (the composition root builds all of them, middleware/_compose.py)."""
        self.pool = pool
        self.clock = clock
        self.tick_interval_s = tick_interval_s
        self.limits = limits or HoldLimits()
        self._held = 0  # held for capacity or at the generation gate (see `held`)
        self.held_bytes = 0  # body bytes of the held requests
        self.draining = False
        self.core = core
        # Key requests by their shared prefix only for stages that use it (it costs a hash):
        # KV-aware placement, and admission counting shared prefixes once.
        self._prefix_keys = self.core.dedupe_prefixes or any(
            isinstance(stage, KvPlacement) for stage in self.core.pipeline()
        )
        self._waiters: dict[str, list[asyncio.Future[str]]] = {}
        # Calls handed to each engine and not yet ended (a drain or a weight update waits
        # for them), and the calls held at the gate while generation is paused.
        self.calls: collections.Counter[str] = collections.Counter()
        self._call_ended = asyncio.Event()
        self.paused_generation = False
        self._gated: list[asyncio.Future[None]] = []
        self._timer: asyncio.Task[None] | None = None
        self.listeners = list(listeners)
        # Timers of other components (profile retention) ride on the scheduler's tick, so a
        # gateway that goes quiet still lets go of what it only keeps for a while.
        self.tick_listeners = list(tick_listeners)
        # One replica of several (a shared store): the gate, records and the others' share;
        # with `program_owner: header`, the owners' bindings travel in the shared records.
        self.replication = replication

    @property
    def held(self) -> int:
        """Requests waiting here: for capacity, at the generation gate, and (one replica of
        several) at the shared admission gate; bounded by `max_held_requests` together."""
        gated = self.replication.held if self.replication is not None else 0
        return self._held + gated

    @property
    def replica_id(self) -> str | None:
        """This replica's id in the shared store (None: one gateway, nothing shared)."""
        return self.replication.replica_id if self.replication is not None else None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        for backend in self.pool.backends:
            self._declare_host_tier(backend)
            self.on_probe(backend, None)
        self._timer = asyncio.create_task(self._tick_loop(), name="thunder-mw-scheduler")
        if self.replication is not None:
            await self.replication.start()

    async def stop(self) -> None:
        if self.replication is not None:
            await self.replication.halt()
        await self._stop()
        if self.replication is not None:
            await self.replication.close()

    async def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        for futures in self._waiters.values():
            for fut in futures:
                if not fut.done():
                    fut.set_exception(
                        Rejected(503, "the gateway is shutting down", "shutting_down")
                    )
        self._waiters.clear()
        self._open_gate(Rejected(503, "the gateway is shutting down", "shutting_down"))

    def drain(self) -> None:
        """Shutting down: answer every held request with 503 now (in-flight calls go on)
        rather than keep clients waiting until the server gives up on them."""
        self.draining = True
        now = self.clock()
        for program_id, futures in list(self._waiters.items()):
            for fut in futures:
                if not fut.done():
                    fut.set_exception(
                        Rejected(503, "the gateway is shutting down", "shutting_down")
                    )
                    self._apply(self.core.handle(ev.ClientLeft(program_id, now)).actions)
        self._waiters.clear()
        self._open_gate(Rejected(503, "the gateway is shutting down", "shutting_down"))

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.tick_interval_s)
            self._apply(self.core.handle(ev.Tick(self.clock())).actions)
            for listener in self.tick_listeners:
                listener()

    def on_probe(self, backend: Backend, metrics: BackendMetrics | None) -> None:
        changed = ev.BackendChanged(
            backend.label,
            self.clock(),
            healthy=backend.healthy,
            capacity=backend.capacity_tokens,
            max_model_len=backend.max_model_len,
            metrics=metrics,
        )
        self._apply(self.core.handle(changed).actions)

    # ------------------------------------------------------------------ the Scheduler protocol
    async def admit(self, call: CallState) -> str:
        replication = self.replication
        if replication is None:
            backend = await self._admit(call)
            self.calls[backend] += 1
            return backend
        ctx = call.context
        assert ctx is not None
        await replication.adopt(ctx)
        backend = await self._admit(call)
        self.calls[backend] += 1
        try:
            await replication.gate(call, ctx.program_id, backend)
        except BaseException:
            # The call never reaches the engine: it ends here, counted as failed.
            self.calls[backend] -= 1
            if self.calls[backend] <= 0:
                del self.calls[backend]
            if call.planned:
                failed = ev.CallFinished(ctx.program_id, None, False, self.clock())
                self._apply(self.core.handle(failed).actions)
            raise
        return backend

    async def _admit(self, call: CallState) -> str:
        ctx = call.context
        assert ctx is not None
        if self.paused_generation:
            await self._wait_at_gate(call)
        info = request_info(call.body, self._prefix_keys)
        answer = self.core.handle(ev.RequestArrived(ctx, info, self.clock()))
        self._apply(answer.actions)
        decision = answer.decision
        if isinstance(decision, Forward):
            call.planned = decision.planned
            return decision.backend
        if isinstance(decision, Reject):
            raise Rejected(decision.status, decision.message, decision.code, param=decision.param)
        assert isinstance(decision, Hold)
        size = len(call.body.raw) if call.body is not None else 0
        refusal = self._hold_refusal(size)
        if refusal is not None:
            # Refused rather than held: the program keeps whatever it already had.
            self._apply(self.core.handle(ev.ClientLeft(ctx.program_id, self.clock())).actions)
            raise refusal
        held_at = self.clock()
        self.held_bytes += size
        try:
            return await self._hold(ctx.program_id, call.receive, decision.alone)
        finally:
            self.held_bytes -= size
            call.held_s = self.clock() - held_at

    def _hold_refusal(self, size: int) -> Rejected | None:
        """Why a request may not be held (shutting down, or past a bound on held requests:
        memory is bounded by count and by bytes), or None."""
        if self.draining:
            return Rejected(503, "the gateway is shutting down", "shutting_down")
        retry = [(b"retry-after", RETRY_AFTER_S)]
        if self.held >= self.limits.max_held_requests:
            message = f"{self.held} requests are already waiting for capacity; retry later"
            return Rejected(429, message, "queue_full", retry)
        if self.held_bytes + size > self.limits.max_held_bytes:
            message = (
                f"the requests waiting for capacity already hold {self.held_bytes} body bytes "
                f"(server.max_held_bytes: {self.limits.max_held_bytes}); retry later"
            )
            return Rejected(503, message, "held_bytes_full", retry)
        return None

    async def _hold(self, program_id: str, receive: Receive | None, alone: bool = False) -> str:
        """Waits for the program's `Resumed`, its client leaving, or the hold deadline:
        `alone_hold_s` for a request that could only run on an empty engine (then it is
        placed anyway), else `max_hold_s` (then 503 `hold_timeout`)."""
        if self.replication is not None:
            self.replication.mark(program_id)  # it joins (and then leaves) the shared queue
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(program_id, []).append(fut)
        gone = asyncio.ensure_future(until_disconnect(receive)) if receive else None
        deadline = self.limits.alone_hold_s if alone else self.limits.max_hold_s
        self._held += 1
        try:
            waiting: set[asyncio.Future[Any]] = {fut} if gone is None else {fut, gone}
            await asyncio.wait(waiting, timeout=deadline, return_when=asyncio.FIRST_COMPLETED)
            if not fut.done() and (gone is None or not gone.done()):
                # Past the deadline: placed now (it could only run alone), else let go.
                expired = ev.HoldExpired(program_id, self.clock(), place=alone)
                self._apply(self.core.handle(expired).actions)
                if not fut.done():
                    self._drop_waiter(program_id, fut)
                    raise Rejected(
                        503,
                        f"no engine had room for this request within {deadline:g} s; retry later",
                        "hold_timeout",
                        [(b"retry-after", RETRY_AFTER_S)],
                    )
            if fut.done():
                return fut.result()
            # The client left while held: it leaves the queue now, not when it would run.
            self._drop_waiter(program_id, fut)
            self._apply(self.core.handle(ev.ClientLeft(program_id, self.clock())).actions)
            raise ClientGone()
        finally:
            self._held -= 1
            if gone is not None:
                gone.cancel()
            if self.replication is not None:
                self.replication.mark(program_id)

    # ------------------------------------------------------------------ the Admission protocol
    def finish(self, call: CallState, outcome: Outcome) -> None:
        assert call.context is not None
        if call.backend is not None:
            self.calls[call.backend] -= 1
            if self.calls[call.backend] <= 0:
                del self.calls[call.backend]
        self._call_ended.set()
        program_id = call.context.program_id
        # Sent unplanned (past every engine's limit), the call was never counted by the core.
        if call.planned:
            usage = timed_usage(call, call.usage)
            ended = ev.CallFinished(program_id, usage, outcome == "ok", self.clock())
            self._apply(self.core.handle(ended).actions)
        if self.replication is not None:
            self.replication.mark(program_id)

    def reroute(self, call: CallState, failed_backend: str) -> Backend | None:
        assert call.context is not None
        if call.planned:
            refused = ev.ConnectionRefused(call.context.program_id, failed_backend, self.clock())
            target = self.core.handle(refused).backend
            backend = self.pool.get(target) if target else None
        else:
            backend = self.pool.any_healthy(exclude=failed_backend)
        if backend is not None:
            # The call moves (the forwarder sets call.backend to it next): so does its count.
            self.calls[failed_backend] -= 1
            if self.calls[failed_backend] <= 0:
                del self.calls[failed_backend]
            self.calls[backend.label] += 1
        return backend

    def release(self, program_id: str, announce: bool = True) -> bool:
        """An operator (or, `announce` False, another replica) released the program."""
        answer = self.core.handle(ev.ReleaseRequested(program_id, "release", self.clock()))
        self._apply(answer.actions)
        released = answer.found
        if announce and self.replication is not None:
            self.replication.announce_release(program_id)
        return released

    def programs(self) -> list[ProgramSnapshot]:
        return self.core.snapshots()

    def program(self, program_id: str) -> ProgramSnapshot | None:
        return self.core.snapshot(program_id)

    async def shared_program(self, program_id: str) -> tuple[ProgramSnapshot, str] | None:
        """A program another replica holds, from its shared record, and that replica."""
        if self.replication is None:
            return None
        return await self.replication.shared_program(program_id)

    # ------------------------------------------------------------------ the fleet at run time
    def add_backend(self, backend: Backend) -> None:
        """A backend the pool has just opened and probed joins the scheduler."""
        added = ev.BackendAdded(
            backend.label, backend.capacity_tokens, self.clock(), healthy=backend.healthy
        )
        self._apply(self.core.handle(added).actions)
        self._declare_host_tier(backend)

    def _declare_host_tier(self, backend: Backend) -> None:
        tokens, speed = backend.host_tier
        if tokens and backend.label in self.core.backend_views():
            self.core.handle(ev.HostTierDeclared(backend.label, tokens, speed))

    def drain_backend(self, label: str) -> None:
        self._apply(self.core.handle(ev.BackendDrained(label, self.clock())).actions)

    def remove_backend(self, label: str) -> None:
        self._apply(self.core.handle(ev.BackendRemoved(label, self.clock())).actions)

    def mark_cache_cold(self) -> None:
        self._apply(self.core.handle(ev.CachesFlushed(self.clock())).actions)

    def drained(self, label: str) -> bool:
        """No program placed on `label` and no call in flight there: it may leave."""
        return self.core.drained(label) and self.calls[label] == 0

    async def until(self, done: Callable[[], bool]) -> None:
        """Returns once `done()` holds; re-checked whenever a call ends."""
        while not done():
            self._call_ended.clear()
            await self._call_ended.wait()

    # ------------------------------------------------------------------ the generation gate
    @property
    def gated_calls(self) -> int:
        return sum(1 for fut in self._gated if not fut.done())

    def pause_generation(self) -> None:
        """New calls wait at the gate (held, not failed) until `continue_generation`."""
        self.paused_generation = True

    def continue_generation(self) -> int:
        """Opens the gate: every held call goes on to be scheduled. Returns how many."""
        self.paused_generation = False
        return self._open_gate(None)

    def _open_gate(self, error: Exception | None) -> int:
        released = 0
        gated, self._gated = self._gated, []
        for fut in gated:
            if not fut.done():
                released += 1
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)
        return released

    async def _wait_at_gate(self, call: CallState) -> None:
        refusal = self._hold_refusal(0)
        if refusal is not None:
            raise refusal
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._gated.append(fut)
        receive = call.receive
        gone = asyncio.ensure_future(until_disconnect(receive)) if receive else None
        self._held += 1
        held_at = self.clock()
        try:
            if gone is None:
                await fut
                return
            await asyncio.wait((fut, gone), return_when=asyncio.FIRST_COMPLETED)
            if fut.done():
                fut.result()
                return
            with contextlib.suppress(ValueError):
                self._gated.remove(fut)
            raise ClientGone()
        finally:
            self._held -= 1
            call.held_s = (call.held_s or 0.0) + self.clock() - held_at
            if gone is not None:
                gone.cancel()

    # ------------------------------------------------------------------ actions
    def _drop_waiter(self, program_id: str, fut: asyncio.Future[str]) -> None:
        futures = self._waiters.get(program_id)
        if futures and fut in futures:
            futures.remove(fut)
            if not futures:
                del self._waiters[program_id]

    def apply(self, actions: list[Action]) -> None:
        """Carries out the core's actions (and, with replicas, records what they changed)."""
        self._apply(actions)

    def _apply(self, actions: list[Action]) -> None:
        self.carry_out(actions)
        if self.replication is not None:
            self.replication.changed(actions)

    def carry_out(self, actions: list[Action]) -> None:
        """Wakes or answers the held requests the actions name and tells the listeners."""
        for action in actions:
            if isinstance(action, Resumed):
                for fut in self._waiters.pop(action.program_id, ()):
                    if not fut.done():
                        fut.set_result(action.backend)
            elif isinstance(action, Reject):
                for fut in self._waiters.pop(action.program_id, ()):
                    if not fut.done():
                        fut.set_exception(Rejected(action.status, action.message, action.code))
            # Decisions are counted and logged by a listener (observability/decisions.py).
            for listener in self.listeners:
                listener(action)


def timed_usage(call: CallState, usage: Usage | None) -> Usage | None:
    """The call's usage with the gateway's timing of it (what the cost-aware overflow rule
    learns a prefill token's and a decode step's cost from where the engine reports none):
    from forwarding to its first body (streamed answers only) and to now."""
    if usage is None or call.forwarded_at is None:
        return usage
    now = time.perf_counter()
    ttft = None
    if call.stream and call.first_body_at is not None:
        ttft = call.first_body_at - call.forwarded_at
    return msgspec.structs.replace(usage, ttft_s=ttft, duration_s=now - call.forwarded_at)
