"""Per-program, per-step profiles: where each call's time went and what it used.

A step is one forwarded call: time held in the queue, time to first token and decode time
(streaming), total time, the tool time that followed its answer (the gap until the
program's next request), tokens, backend. Memory is bounded: a ring of steps per program,
profiles dropped `retention_s` after their program is released, and a cap on profiles held.
A released program's profile can be appended to a JSONL file in the benchmarks' replay
trace format (benchmarks/workloads.py), by a writer thread, never on the event loop.
"""

from __future__ import annotations

import collections
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from thunder_mw.policies.core import Action, Prefill, Released
from thunder_mw.policies.program_table import Usage
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import ProfileSettings
from thunder_mw.schemas.views import StepProfile

__all__ = ["ProfileStore", "Timing", "TraceExport", "trace_line"]

log = logging.getLogger("thunder_mw.profiles")


class Timing(msgspec.Struct, frozen=True):
    """What the gateway measured of one call (perf_counter seconds, except `started_at`)."""

    started_at: float  # wall clock
    arrived_at: float
    queue_s: float
    forwarded_at: float
    first_body_at: float | None
    ended_at: float
    status: int
    stream: bool


class _Profile:
    __slots__ = (
        "created_at",
        "ended_clock",
        "open",
        "parent_program_id",
        "program_id",
        "release_reason",
        "released_at",
        "released_clock",
        "session_type",
        "steps",
        "steps_total",
        "totals",
    )

    def __init__(self, ctx: AgentContext, ring_size: int, now_wall: float) -> None:
        self.program_id = ctx.program_id
        self.session_type = ctx.session_type
        self.parent_program_id = ctx.parent_program_id
        self.created_at = now_wall
        self.steps: collections.deque[StepProfile] = collections.deque(maxlen=ring_size)
        self.steps_total = 0
        self.open = 0  # calls forwarded and not yet recorded
        self.ended_clock: float | None = None  # perf_counter of its last answer
        self.released_at: float | None = None  # wall
        self.released_clock: float | None = None  # the store's clock
        self.release_reason: str | None = None
        self.totals = {
            "queue_s": 0.0,
            "tool_s": 0.0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "completion_tokens": 0,
            "speculative_prefills": 0,
        }

    def summary(self) -> dict[str, Any]:
        return {
            "program_id": self.program_id,
            "session_type": self.session_type,
            "parent_program_id": self.parent_program_id,
            "created_at": self.created_at,
            "released_at": self.released_at,
            "release_reason": self.release_reason,
            "steps_total": self.steps_total,
            "steps_kept": len(self.steps),
            **{k: round(v, 6) if isinstance(v, float) else v for k, v in self.totals.items()},
        }

    def view(self) -> dict[str, Any]:
        return {**self.summary(), "steps": msgspec.to_builtins(list(self.steps))}


def trace_line(profile: _Profile) -> dict[str, Any]:
    """The program in the replay trace format of benchmarks/workloads.py: `prompt_tokens`
    (whole prompt), `output_tokens`, `tool_s` per call; the measured timings ride along
    as extra keys, which the trace loader ignores."""
    steps = list(profile.steps)
    calls = []
    for step in steps:
        calls.append(
            {
                "prompt_tokens": step.prompt_tokens or 0,
                "output_tokens": max(1, step.completion_tokens or 0),
                "tool_s": round(step.tool_s or 0.0, 6),
                "cached_tokens": step.cached_tokens,
                "queue_s": round(step.queue_s, 6),
                "ttft_s": step.ttft_s,
                "decode_s": step.decode_s,
                "total_s": round(step.total_s, 6),
                "backend": step.backend,
                "stream": step.stream,
            }
        )
    return {
        "program_id": profile.program_id,
        "session_type": profile.session_type or "trace",
        "system_tokens": 0,
        "arrival_s": round(steps[0].started_at if steps else profile.created_at, 6),
        "start_s": 0.0,
        "parent_id": profile.parent_program_id,
        "calls": calls,
        "steps_total": profile.steps_total,
        "release_reason": profile.release_reason,
    }


class TraceExport:
    """Appends trace lines to a JSONL file from a daemon thread (the event loop only queues)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._queue: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="thunder-mw-profile-export")
        self._thread.daemon = True
        self._thread.start()

    def put(self, line: dict[str, Any]) -> None:
        self._queue.put(line)

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush what is queued and stop (blocking: call it from a worker thread)."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                try:
                    f.write(json.dumps(item, separators=(",", ":")) + "\n")
                    if self._queue.empty():
                        f.flush()
                except (OSError, TypeError, ValueError):
                    log.exception("profile export to %s failed", self.path)


class ProfileStore:
    """Profiles of live and recently released programs."""

    def __init__(
        self,
        settings: ProfileSettings,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.wall = wall_clock
        self._profiles: dict[str, _Profile] = {}
        # Released programs in release order, so eviction pops from the front: O(evicted).
        self._released: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.export: TraceExport | None = None

    def start(self) -> None:
        if self.settings.export_path and self.export is None:
            self.export = TraceExport(self.settings.export_path)

    def stop(self) -> TraceExport | None:
        """Hands back the export for the caller to close off the loop."""
        export, self.export = self.export, None
        return export

    def __len__(self) -> int:
        return len(self._profiles)

    # ------------------------------------------------------------------ events
    def opened(self, ctx: AgentContext) -> None:
        """A call of `ctx.program_id` is being forwarded now."""
        profile = self._profiles.get(ctx.program_id)
        if profile is None or (profile.released_clock is not None and profile.open == 0):
            # A first call, or a program id reused after its release: a new run.
            self._evict(self.clock(), room_for_one=True)
            if profile is not None:
                self._released.pop(ctx.program_id, None)
            profile = _Profile(ctx, self.settings.ring_size, self.wall())
            self._profiles[ctx.program_id] = profile
        profile.open += 1

    def record(
        self, ctx: AgentContext, timing: Timing, backend: str | None, usage: Usage | None
    ) -> None:
        """The call opened for `ctx.program_id` ended (answered, failed or abandoned)."""
        profile = self._profiles.get(ctx.program_id)
        if profile is None:
            return
        profile.open = max(0, profile.open - 1)
        previous = profile.steps[-1] if profile.steps else None
        if previous is not None and previous.tool_s is None and profile.ended_clock is not None:
            gap = max(0.0, timing.arrived_at - profile.ended_clock)
            previous.tool_s = gap
            profile.totals["tool_s"] += gap
        step = StepProfile(
            step=profile.steps_total,
            started_at=timing.started_at,
            backend=backend,
            stream=timing.stream,
            status=timing.status,
            queue_s=timing.queue_s,
            total_s=timing.ended_at - timing.forwarded_at,
        )
        if timing.stream and timing.first_body_at is not None:
            step.ttft_s = timing.first_body_at - timing.forwarded_at
            step.decode_s = timing.ended_at - timing.first_body_at
        if usage is not None:
            step.prompt_tokens = usage.prompt_tokens
            step.cached_tokens = usage.cached_tokens
            step.completion_tokens = usage.completion_tokens
            profile.totals["prompt_tokens"] += usage.prompt_tokens
            profile.totals["cached_tokens"] += usage.cached_tokens
            profile.totals["completion_tokens"] += usage.completion_tokens
        profile.totals["queue_s"] += timing.queue_s
        profile.steps.append(step)
        profile.steps_total += 1
        profile.ended_clock = timing.ended_at
        if profile.released_clock is not None and profile.open == 0:
            self._export(profile)
            # Evicted from the release order while its last call ran: back in line.
            self._released.setdefault(ctx.program_id, profile.released_clock)

    def on_action(self, action: Action) -> None:
        if isinstance(action, Prefill):
            warmed = self._profiles.get(action.program_id)
            if warmed is not None:
                warmed.totals["speculative_prefills"] += 1
            return
        if not isinstance(action, Released):
            return
        profile = self._profiles.get(action.program_id)
        if profile is None:
            return
        now = self.clock()
        profile.released_at = self.wall()
        profile.released_clock = now
        profile.release_reason = action.reason
        self._released[action.program_id] = now
        self._released.move_to_end(action.program_id)
        if profile.open == 0:
            # Otherwise its last call (a `final` one) is still going out: exported with it.
            self._export(profile)
        self._evict(now)

    def expire(self) -> None:
        """Drops released profiles past `retention_s` (called on every scheduler tick)."""
        self._evict(self.clock())

    # ------------------------------------------------------------------ queries
    def summaries(self) -> list[dict[str, Any]]:
        self._evict(self.clock())
        return [p.summary() for p in self._profiles.values()]

    def get(self, program_id: str) -> dict[str, Any] | None:
        self._evict(self.clock())
        profile = self._profiles.get(program_id)
        return profile.view() if profile is not None else None

    # ------------------------------------------------------------------ bounds
    def _export(self, profile: _Profile) -> None:
        if self.export is not None and profile.steps:
            self.export.put(trace_line(profile))

    def _evict(self, now: float, room_for_one: bool = False) -> None:
        retention = self.settings.retention_s
        while self._released:
            program_id, released = next(iter(self._released.items()))
            if released + retention > now:
                break
            self._drop_released(program_id)
        limit = self.settings.max_programs - (1 if room_for_one else 0)
        while len(self._profiles) > limit:
            if self._released:
                self._drop_released(next(iter(self._released)))
            else:
                # Nothing released to drop: the oldest live profile goes (dicts keep order).
                self._profiles.pop(next(iter(self._profiles)))

    def _drop_released(self, program_id: str) -> None:
        del self._released[program_id]
        profile = self._profiles.get(program_id)
        if profile is not None and profile.released_clock is not None and profile.open == 0:
            del self._profiles[program_id]
