"""The record of every live agent program: what it is, where it runs, what it has used. Pure state.

The scheduler core owns one table; the middleware reads snapshots of it for /programs.
Times come from the caller's clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

import msgspec

from thunder_mw.schemas.agent_context import AgentContext


class ProgramState(enum.StrEnum):
    ACTIVE = "active"  # placed on a backend, its tokens reserved there
    PAUSED = "paused"  # no reservation; its requests wait in the global queue
    TERMINATED = "terminated"


class Phase(enum.StrEnum):
    REASONING = "reasoning"  # at least one request in flight
    ACTING = "acting"  # between requests: running a tool


class Usage(msgspec.Struct, frozen=True):
    """Token usage of one finished call, as the engine reported it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # The gateway's timing of the call from forwarding it (None: not timed): first token
    # (streamed answers only: a non-streamed one's first byte is its last) and the whole.
    ttft_s: float | None = None
    duration_s: float | None = None


class Program(msgspec.Struct, kw_only=True):
    program_id: str
    source: str | None
    parent_program_id: str | None = None
    session_id: str | None = None
    session_type: str | None = None
    ephemeral: bool = False
    priority: int = 0
    state: ProgramState = ProgramState.PAUSED
    phase: Phase = Phase.ACTING
    backend: str | None = None  # where it is placed (ACTIVE) or last ran (PAUSED)
    context_tokens: int = 0  # prompt + completion of its last answered call
    reserved_tokens: int = 0  # what it holds on `backend` while ACTIVE
    request_tokens: int = 0  # estimated footprint of its latest request (context + output)
    pending_tokens: int = 0  # of `reserved_tokens`, counted as about to be released
    running_tokens: int = 0  # of `reserved_tokens`, counted as held by a call in the engine
    # Its whole context as counted in its backend's `contexts` while ACTIVE (GPU and host
    # tier together: what the engine must keep of it to recompute nothing).
    held_context: int = 0
    steps: int = 0
    in_flight: int = 0
    waiting: int = 0  # requests held until it is admitted or resumed
    failures: int = 0
    pause_pending: bool = False  # pause once its in-flight calls end
    final_requested: bool = False
    created_at: float = 0.0
    last_active_at: float = 0.0
    acting_since: float = 0.0
    queued_at: float | None = None
    paused_at: float | None = None
    paused_total_s: float = 0.0
    pauses: int = 0
    migrations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    expected_output_tokens: int | None = None
    tool_time_ema_s: float | None = None
    last_prompt_chars: int = 0
    prefix_key: str | None = None  # its requests' shared leading part (RequestInfo.prefix_key)
    prefix_tokens: int = 0  # that part's estimated length
    # Share of its context its reservation counts while ACTING, as the idle-fate rule
    # decided when its last call ended (a stage's `idle_share`; None: the ledger's weight).
    idle_share: float | None = None
    # `nvext.agent_hints.speculative_prefill` as it last sent it (None: never sent).
    speculative_prefill: bool | None = None
    docker_ids: list[str] = msgspec.field(default_factory=list)
    version: int = 0  # bumped whenever index entries for it go stale


class ProgramTable:
    """Programs by id, with per-backend counts kept incrementally (no scans per event)."""

    def __init__(self) -> None:
        self._programs: dict[str, Program] = {}
        self._per_backend: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._programs)

    def __iter__(self) -> Iterator[Program]:
        return iter(self._programs.values())

    def __contains__(self, program_id: object) -> bool:
        return program_id in self._programs

    def get(self, program_id: str) -> Program | None:
        return self._programs.get(program_id)

    def programs_on(self, backend: str) -> int:
        return self._per_backend.get(backend, 0)

    def touch(self, ctx: AgentContext, now: float) -> tuple[Program, bool]:
        """The program a request belongs to (created on its first request), and if it is new."""
        program = self._programs.get(ctx.program_id)
        created = program is None
        if program is None:
            program = Program(
                program_id=ctx.program_id,
                source=ctx.source.value if ctx.source else None,
                parent_program_id=ctx.parent_program_id,
                session_id=ctx.session_id,
                session_type=ctx.session_type,
                ephemeral=ctx.ephemeral,
                created_at=now,
                last_active_at=now,
                acting_since=now,
            )
            self._programs[ctx.program_id] = program
        program.priority = ctx.priority
        if ctx.speculative_prefill is not None:
            program.speculative_prefill = ctx.speculative_prefill
        if ctx.expected_output_tokens is not None:
            program.expected_output_tokens = ctx.expected_output_tokens
        for ref in ctx.docker_ids:
            if ref not in program.docker_ids:
                program.docker_ids.append(ref)
        return program, created

    def count_active(self, program: Program) -> None:
        if program.backend is not None:
            self._per_backend[program.backend] = self._per_backend.get(program.backend, 0) + 1

    def uncount_active(self, program: Program) -> None:
        if program.backend is not None and program.state is ProgramState.ACTIVE:
            self._per_backend[program.backend] -= 1

    def remove(self, program_id: str) -> Program | None:
        program = self._programs.pop(program_id, None)
        if program is not None:
            self.uncount_active(program)
            program.state = ProgramState.TERMINATED
            program.version += 1
        return program
