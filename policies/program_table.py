"""The record of every live agent program: what it is, where it runs, what it has used. Pure state.

The scheduler core (and until it lands, the pass-through placement) owns one table; the
middleware reads snapshots of it for /programs. Times come from the caller's clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

import msgspec
from thunder_mw.schemas.agent_context import AgentContext


class ProgramState(enum.StrEnum):
    ACTIVE = "active"  # placed on a backend
    PAUSED = "paused"  # waiting in the global queue
    TERMINATED = "terminated"


class Phase(enum.StrEnum):
    REASONING = "reasoning"  # at least one request in flight
    ACTING = "acting"  # between requests: running a tool


class Usage(msgspec.Struct, frozen=True):
    """Token usage of one finished call, as the engine reported it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class Program(msgspec.Struct, kw_only=True):
    program_id: str
    source: str | None
    parent_program_id: str | None = None
    session_id: str | None = None
    session_type: str | None = None
    ephemeral: bool = False
    state: ProgramState = ProgramState.ACTIVE
    phase: Phase = Phase.ACTING
    backend: str | None = None
    context_tokens: int = 0
    steps: int = 0
    in_flight: int = 0
    failures: int = 0
    created_at: float = 0.0
    last_active_at: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    docker_ids: list[str] = msgspec.field(default_factory=list)


class ProgramTable:
    """Programs by id, with per-backend counts kept incrementally (no scans per event)."""

    def __init__(self) -> None:
        self._programs: dict[str, Program] = {}
        self._per_backend: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._programs)

    def __iter__(self) -> Iterator[Program]:
        return iter(self._programs.values())

    def get(self, program_id: str) -> Program | None:
        return self._programs.get(program_id)

    def programs_on(self, backend: str) -> int:
        return self._per_backend.get(backend, 0)

    def touch(self, ctx: AgentContext, now: float) -> Program:
        """The program a request belongs to, created on its first request."""
        program = self._programs.get(ctx.program_id)
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
            )
            self._programs[ctx.program_id] = program
        for ref in ctx.docker_ids:
            if ref not in program.docker_ids:
                program.docker_ids.append(ref)
        return program

    def place(self, program: Program, backend: str) -> None:
        if program.backend == backend:
            return
        if program.backend is not None:
            self._per_backend[program.backend] -= 1
        program.backend = backend
        self._per_backend[backend] = self._per_backend.get(backend, 0) + 1

    def start_call(self, program: Program, now: float) -> None:
        program.in_flight += 1
        program.phase = Phase.REASONING
        program.last_active_at = now

    def end_call(self, program: Program, usage: Usage | None, ok: bool, now: float) -> None:
        """A call ended (answered, failed or abandoned): the program is back to ACTING
        once nothing else of it is in flight, so a failure can never leave it REASONING."""
        program.in_flight = max(0, program.in_flight - 1)
        program.last_active_at = now
        if program.in_flight == 0:
            program.phase = Phase.ACTING
        if not ok:
            program.failures += 1
            return
        program.steps += 1
        if usage is not None:
            program.context_tokens = usage.prompt_tokens + usage.completion_tokens
            program.prompt_tokens += usage.prompt_tokens
            program.completion_tokens += usage.completion_tokens
            program.cached_tokens += usage.cached_tokens

    def remove(self, program_id: str) -> Program | None:
        program = self._programs.pop(program_id, None)
        if program is not None:
            program.state = ProgramState.TERMINATED
            if program.backend is not None:
                self._per_backend[program.backend] -= 1
        return program
