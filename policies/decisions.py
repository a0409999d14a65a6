"""What the scheduler core decides: the answers to requests, the actions the caller carries
out, and the decisions stages return for the core to apply.

Data only: the core (policies/core.py) produces the first two kinds; a stage's hooks return
the third (policies/stage_contract.py), and the core applies each in one place.
"""

from __future__ import annotations

import msgspec

from thunder_mw.policies.views import ProgramView

__all__ = [
    "Action",
    "Count",
    "Decision",
    "Footprint",
    "Forward",
    "Hold",
    "Pause",
    "Paused",
    "PlanBackend",
    "Prefill",
    "ReclaimTools",
    "Reject",
    "Release",
    "Released",
    "Reorder",
    "Resume",
    "Resumed",
    "StageDecision",
]


# ---------------------------------------------------------------- answers and actions
class Forward(msgspec.Struct, frozen=True):
    program_id: str
    backend: str
    # Keep the call's KV resident this long after it ends (an engine with TTL pinning,
    # as Continuum's; None: the engine's own eviction). Set by a stage's `kv_ttl` hook.
    kv_ttl_s: float | None = None
    # False: the request is past every engine's limit by the scheduler's estimate only
    # (policies/context_limit.py); it goes to the engine unplanned, counted nowhere.
    planned: bool = True


class Hold(msgspec.Struct, frozen=True):
    program_id: str
    # Larger than every healthy engine's KV as planned: it could only run on an empty engine,
    # so it is held briefly (`server.alone_hold_s`), then placed (`HoldExpired`).
    alone: bool = False


class Reject(msgspec.Struct, frozen=True):
    """Answer the program's held requests (or the arriving one) with this error."""

    program_id: str
    status: int
    code: str
    message: str
    param: str | None = "program_id"


class Resumed(msgspec.Struct, frozen=True):
    """The program may run on `backend`: forward its held requests there."""

    program_id: str
    backend: str
    previous_backend: str | None
    forced: bool
    admitted: bool  # first placement of a new program, not a resume after a pause
    kv_ttl_s: float | None = None  # as Forward.kv_ttl_s, for the held requests

    @property
    def migrated(self) -> bool:
        return self.previous_backend is not None and self.previous_backend != self.backend


class Paused(msgspec.Struct, frozen=True):
    program_id: str
    backend: str
    reason: str  # "acting" (paused at once) or "after_reasoning" (when its call ends)
    pending: bool


class Released(msgspec.Struct, frozen=True):
    program_id: str
    reason: str  # release | final | ephemeral | expired | abandoned
    docker_ids: tuple[str, ...]


class ReclaimTools(msgspec.Struct, frozen=True):
    program_id: str
    container_ids: tuple[str, ...]
    reason: str
    hooks: tuple[str, ...]


class Prefill(msgspec.Struct, frozen=True):
    """Warm `backend`'s cache with the program's last prompt and answer while its tool runs:
    a one-token request the gateway sends itself (never a client's call, never its usage),
    so the program's next call finds its prefix cached. `tokens`: its context, for metrics."""

    program_id: str
    backend: str
    tokens: int
    reason: str  # "resume" (resumed or moved while ACTING) or "prefetch" (resumed early)


Action = Resumed | Reject | Paused | Released | ReclaimTools | Prefill
Decision = Forward | Hold | Reject


# ---------------------------------------------------------------- what stages return
class Pause(msgspec.Struct, frozen=True):
    """Pause `program`: at once when ACTING; after its call when REASONING."""

    program: ProgramView
    reason: str = "acting"


class Resume(msgspec.Struct, frozen=True):
    """Place `program` on `backend` now (`forced`: past the admission check)."""

    program: ProgramView
    backend: str
    forced: bool = False


class Release(msgspec.Struct, frozen=True):
    """End `program` (its held requests are refused, its tools reclaimed)."""

    program: ProgramView
    reason: str


class Count(msgspec.Struct, frozen=True):
    """Add one to the core's counter `name` (the dashboard's and the benchmarks' counts)."""

    name: str


class Footprint(msgspec.Struct, frozen=True):
    """How reservations are sized, set once when the pipeline is bound (None: unchanged)."""

    buffer_tokens: int | None = None  # reserved per program on top of its context
    acting_weight: float | None = None  # share of an ACTING program's context counted
    dedupe_prefixes: bool | None = None  # count a prefix shared on one backend once


class PlanBackend(msgspec.Struct, frozen=True):
    """A stage's correction of how a backend is planned (None: unchanged)."""

    label: str
    # Tokens past the watermark the cost-aware rule accepts (policies/overflow_cost.py).
    overflow_tokens: int | None = None
    # Share of the running reservations the engine's KV gauge says it holds.
    resident_ratio: float | None = None


class Reorder(msgspec.Struct, frozen=True):
    """The stage's pause-order keys changed for every program (its rule switched): the
    core re-keys every ACTIVE program's entry (O(n log n); for rare switches), and with
    `queue` every queued program's place in the resume order too."""

    queue: bool = False


StageDecision = (
    Pause | Resume | Release | Count | Footprint | PlanBackend | Reorder | ReclaimTools | Prefill
)
