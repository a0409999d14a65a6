"""The admin API's public views: what each admin route answers and accepts, as msgspec structs
that the routes encode and that GET /openapi.json describes (one source for both).

A struct's docstring becomes its schema's description; fields that are absent on the wire
(rather than null) default to UNSET.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

__all__ = [
    "ID_RULES",
    "BackendView",
    "ContainerView",
    "DashboardBackend",
    "DashboardState",
    "Decision",
    "ErrorBody",
    "ErrorDetail",
    "HealthView",
    "PendingProgram",
    "ProfileList",
    "ProfileSummary",
    "ProfileView",
    "ProgramDetail",
    "ProgramList",
    "ProgramStateName",
    "ProgramView",
    "QueuedProgram",
    "ReleaseRequest",
    "Released",
    "SandboxRequest",
    "SandboxView",
    "StepProfile",
    "ToolsView",
    "TopProgram",
    "encode",
]

ID_RULES = (
    "Non-empty, not only whitespace, no control characters, at most "
    "`agent_context.max_id_length` characters (256 by default)."
)

ProgramStateName = Literal["active", "paused", "terminated"]


class ErrorDetail(Struct, kw_only=True):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(Struct, kw_only=True):
    """OpenAI-style error: `param` names the offending field where there is one."""

    error: ErrorDetail


# ---------------------------------------------------------------- health
class BackendView(Struct, kw_only=True):
    """One engine as the backend pool sees it."""

    name: str
    url: str | None
    type: str
    healthy: bool
    draining: bool = False  # leaving: admits nothing, finishes its calls, then goes
    capacity_tokens: int | None
    capacity_source: Literal["config", "engine", "plan"] | None
    last_error: str | None


class ToolsView(Struct, kw_only=True):
    """Present when the Docker tool manager is configured."""

    docker: dict[str, Any]


class HealthView(Struct, kw_only=True):
    """Gateway and backend health."""

    status: Literal["ok", "degraded"]
    version: str
    backends: list[BackendView]
    programs: int
    tools: ToolsView | UnsetType = UNSET


# ---------------------------------------------------------------- programs
class ContainerView(Struct, kw_only=True):
    """A container a program owns; `reason`, `attempts`, `last_error` while it is reclaimed."""

    id: str
    name: str
    state: str
    template: str | UnsetType = UNSET
    reason: str | UnsetType | None = UNSET
    attempts: int | UnsetType = UNSET
    last_error: str | UnsetType | None = UNSET


class ProgramView(Struct, kw_only=True):
    """A program as the scheduler holds it, with its age and idle time.

    What an operator acts on: identity, scheduling state, counters and the scheduler's
    estimates; not the core's bookkeeping (index versions, prompt sizes, reservation
    splits, monotonic-clock stamps, which mean nothing outside the process)."""

    program_id: str
    source: str | None
    parent_program_id: str | None
    session_id: str | None
    session_type: str | None
    ephemeral: bool
    priority: int
    state: ProgramStateName
    phase: Literal["reasoning", "acting"]
    backend: str | None
    context_tokens: int
    reserved_tokens: int
    steps: int
    in_flight: int
    waiting: int
    failures: int
    pause_pending: bool
    final_requested: bool
    paused_total_s: float
    pauses: int
    migrations: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    expected_output_tokens: int | None
    tool_time_ema_s: float | None
    docker_ids: list[str]
    age_s: float
    idle_s: float


class ProgramDetail(ProgramView, kw_only=True):
    """A live program; `containers` is present when the Docker tool manager is configured,
    `holder` with replicas sharing a Redis (`state.backend: redis`): the id of the replica
    that holds the program, which may be another than the one answering."""

    containers: list[ContainerView] | UnsetType = UNSET
    holder: str | UnsetType = UNSET


class PendingProgram(Struct, kw_only=True):
    """A program handed sandboxes before its first request: its containers are all there is."""

    program_id: str
    state: None = None
    containers: list[ContainerView]


class ProgramList(Struct, kw_only=True):
    programs: list[ProgramView]
    count: int


class ReleaseRequest(Struct, kw_only=True):
    """ThunderAgent-compatible: ends the program and reclaims its containers."""

    program_id: Annotated[str, Meta(min_length=1, description=ID_RULES)]


class Released(Struct, kw_only=True):
    """Whether a live program (or one holding sandboxes) was released."""

    program_id: str
    released: bool


class SandboxRequest(Struct, kw_only=True):
    template: Annotated[str, Meta(description="A name under `tools.docker.templates`.")]


class SandboxView(Struct, kw_only=True):
    """A started sandbox handed to a program (`warm`: it came from the warm pool)."""

    program_id: str
    container_id: str
    name: str
    template: str
    warm: bool
    ready_s: float


# ---------------------------------------------------------------- profiles
class StepProfile(Struct):
    """One recorded call of a program."""

    step: int  # 0-based index among the program's recorded calls
    started_at: float  # wall clock (epoch seconds) when the request arrived
    backend: str | None
    stream: bool
    status: int
    queue_s: float  # held: its program paused or not yet admitted
    total_s: float  # forwarded → last byte
    ttft_s: float | None = None  # streaming: forwarded → first body chunk
    decode_s: float | None = None  # streaming: first → last body chunk
    tool_s: float | None = None  # its answer → the program's next request
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None


class ProfileSummary(Struct, kw_only=True):
    """A program's profile totals (they cover every step, kept or not)."""

    program_id: str
    session_type: str | None
    parent_program_id: str | None
    created_at: float
    released_at: float | None
    release_reason: str | None
    steps_total: int
    steps_kept: int
    queue_s: float
    tool_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    # Warming requests the gateway sent for it (speculative prefill): not steps, and not in
    # its token counts, which are its own calls' only.
    speculative_prefills: int = 0


class ProfileView(ProfileSummary, kw_only=True):
    """A program's profile with its latest steps."""

    steps: list[StepProfile]


class ProfileList(Struct, kw_only=True):
    profiles: list[ProfileSummary]
    count: int


# ---------------------------------------------------------------- dashboard
class Decision(Struct, frozen=True):
    """One scheduling decision, as the decision log keeps it."""

    at: float  # wall clock, seconds since the epoch
    decision: str  # admit | resume | force-resume | migrate | pause | pause-marked | release | ...
    program_id: str
    backend: str | None
    reason: str


class DashboardBackend(Struct, kw_only=True):
    backend: str
    url: str | None
    healthy: bool
    capacity_tokens: int | None
    effective_capacity_tokens: int | None
    reserved_tokens: int
    programs: int
    engine_kv_usage: float | None
    engine_running: int | None
    engine_waiting: int | None
    engine_prefix_hit_rate: float | None
    engine_preemptions: float | None


class QueuedProgram(Struct, kw_only=True):
    program_id: str
    waited_s: float
    home: str | None
    context_tokens: int
    pauses: int
    waiting: int


class TopProgram(Struct, kw_only=True):
    program_id: str
    state: ProgramStateName
    phase: Literal["reasoning", "acting"]
    backend: str | None
    tokens: int
    context_tokens: int
    steps: int
    pauses: int
    migrations: int


class DashboardState(Struct, kw_only=True):
    """What the dashboard polls: backends, programs by state, queue, decisions.

    `history` rows are (wall clock, reasoning, acting, paused, queued)."""

    now: float
    backends: list[DashboardBackend]
    counts: dict[str, int]
    counters: dict[str, int]
    history: list[tuple[float, int, int, int, int]]
    queue: list[QueuedProgram]
    top: list[TopProgram]
    decisions: list[Decision]


def encode(view: Any) -> bytes:
    """JSON bytes of a view (one shared encoder)."""
    return _encoder.encode(view)


_encoder = msgspec.json.Encoder()
