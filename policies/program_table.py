"""The record of every live agent program: what it is, where it runs, what it has used. Pure state.

The scheduler core owns one table; what leaves the core is a frozen `ProgramSnapshot` of a
program (`Program.snapshot()`), never the live record, and what its stages read is the
program's `ReadOnlyProgram`, made once with it. Times come from the caller's clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from operator import attrgetter

import msgspec

from thunder_mw.schemas.agent_context import AgentContext

__all__ = [
    "Phase",
    "Program",
    "ProgramSnapshot",
    "ProgramState",
    "ProgramTable",
    "ReadOnlyProgram",
    "Usage",
]


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


class Program(msgspec.Struct, kw_only=True, dict=True):
    """The core's live record of a program. `view`, made once with it (not a field: no
    part of its equality, repr or encoding; `dict=True` gives it a place), is what the
    core hands its stages."""

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
    # Its place in the order this core first saw programs (0, 1, ...): arrival order where
    # arrival times tie (a batch offered at one instant), for the drain's fixed order.
    arrival: int = 0
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

    def __post_init__(self) -> None:
        self.view = ReadOnlyProgram(self)

    def snapshot(self) -> ProgramSnapshot:
        """This program as it is now, frozen: what the core hands out of itself."""
        return ProgramSnapshot(
            program_id=self.program_id,
            source=self.source,
            parent_program_id=self.parent_program_id,
            session_id=self.session_id,
            session_type=self.session_type,
            ephemeral=self.ephemeral,
            priority=self.priority,
            state=self.state,
            phase=self.phase,
            backend=self.backend,
            context_tokens=self.context_tokens,
            reserved_tokens=self.reserved_tokens,
            request_tokens=self.request_tokens,
            steps=self.steps,
            in_flight=self.in_flight,
            waiting=self.waiting,
            failures=self.failures,
            pause_pending=self.pause_pending,
            final_requested=self.final_requested,
            created_at=self.created_at,
            arrival=self.arrival,
            last_active_at=self.last_active_at,
            acting_since=self.acting_since,
            queued_at=self.queued_at,
            paused_total_s=self.paused_total_s,
            pauses=self.pauses,
            migrations=self.migrations,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            expected_output_tokens=self.expected_output_tokens,
            tool_time_ema_s=self.tool_time_ema_s,
            last_prompt_chars=self.last_prompt_chars,
            prefix_key=self.prefix_key,
            prefix_tokens=self.prefix_tokens,
            speculative_prefill=self.speculative_prefill,
            docker_ids=tuple(self.docker_ids),
        )


class ProgramSnapshot(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A program as it was when the core answered: what leaves the core (an event's
    `Outcome`, the queries of the middleware, the dashboard and other replicas). Frozen, so a
    caller holding one after later events still reads the state it was given; the core's
    own `Program` keeps changing. Every field of `ProgramView`, plus the record the admin
    API and the shared store carry; not the core's bookkeeping (the ledger's splits of the
    reservation, the index version). Untracked by the garbage collector (`gc=False`: it
    holds no container that could form a cycle), so a snapshot of every program per
    scrape or dashboard sample triggers no collection."""

    program_id: str
    source: str | None
    parent_program_id: str | None
    session_id: str | None
    session_type: str | None
    ephemeral: bool
    priority: int
    state: ProgramState
    phase: Phase
    backend: str | None
    context_tokens: int
    reserved_tokens: int
    request_tokens: int
    steps: int
    in_flight: int
    waiting: int
    failures: int
    pause_pending: bool
    final_requested: bool
    created_at: float
    arrival: int
    last_active_at: float
    acting_since: float
    queued_at: float | None
    paused_total_s: float
    pauses: int
    migrations: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    expected_output_tokens: int | None
    tool_time_ema_s: float | None
    last_prompt_chars: int
    prefix_key: str | None
    prefix_tokens: int
    speculative_prefill: bool | None
    docker_ids: tuple[str, ...]


class ReadOnlyProgram:
    """A live program as stages read it: each field of a `ProgramSnapshot` (every field of
    `ProgramView`, policies/views.py) as a read-only property over the core's `Program`, so a
    read is always current and an assignment raises AttributeError. One per program, made
    with it: handing it to a hook copies nothing (the simulator calls hooks millions of
    times). Only the core follows its private back-reference, to apply a decision that
    names it (policies/_placement.py)."""

    __slots__ = ("_program",)

    # Each field below becomes a property reading the program's field of that name (a C-level
    # getter, installed after the class); `docker_ids` reads as a tuple, never the live list.
    program_id: str
    source: str | None
    parent_program_id: str | None
    session_id: str | None
    session_type: str | None
    ephemeral: bool
    priority: int
    state: ProgramState
    phase: Phase
    backend: str | None
    context_tokens: int
    reserved_tokens: int
    request_tokens: int
    steps: int
    in_flight: int
    waiting: int
    failures: int
    pause_pending: bool
    final_requested: bool
    created_at: float
    arrival: int
    last_active_at: float
    acting_since: float
    queued_at: float | None
    paused_total_s: float
    pauses: int
    migrations: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    expected_output_tokens: int | None
    tool_time_ema_s: float | None
    last_prompt_chars: int
    prefix_key: str | None
    prefix_tokens: int
    speculative_prefill: bool | None
    docker_ids: tuple[str, ...]

    def __init__(self, program: Program) -> None:
        self._program = program

    def __repr__(self) -> str:
        return f"ReadOnlyProgram({self._program.program_id!r})"


for _field in ReadOnlyProgram.__annotations__:
    setattr(ReadOnlyProgram, _field, property(attrgetter(f"_program.{_field}")))
ReadOnlyProgram.docker_ids = property(  # type: ignore[assignment]
    lambda view: tuple(view._program.docker_ids)
)
del _field


class ProgramTable:
    """Programs by id, with per-backend counts kept incrementally (no scans per event)."""

    def __init__(self) -> None:
        self._programs: dict[str, Program] = {}
        self._per_backend: dict[str, int] = {}
        self._arrivals = 0  # programs created so far: the next one's `arrival`

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
                arrival=self._arrivals,
                last_active_at=now,
                acting_since=now,
            )
            self._arrivals += 1
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
