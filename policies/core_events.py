"""The scheduler core's events and its one answer shape: `SchedulerCore.handle(event) -> Outcome`.

One frozen struct per event, so every caller (the live gateway, the DES, other replicas)
speaks to the core the same way and what it was told can be logged and replayed.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from thunder_mw.policies.decisions import Action, Decision, StageDecision
from thunder_mw.policies.events import BackendMetrics, ProgramHistory, RequestInfo
from thunder_mw.policies.program_table import ProgramSnapshot, Usage
from thunder_mw.schemas.agent_context import AgentContext

__all__ = [
    "BackendAdded",
    "BackendChanged",
    "BackendDrained",
    "BackendRemoved",
    "CachesFlushed",
    "CallFinished",
    "ClientLeft",
    "ConnectionRefused",
    "DecisionsApplied",
    "Event",
    "ForeignReservations",
    "HoldExpired",
    "HostTierDeclared",
    "Outcome",
    "ProgramAdopted",
    "ReleaseRequested",
    "RequestArrived",
    "TakenOver",
    "Tick",
]


class RequestArrived(msgspec.Struct, frozen=True):
    """A request of `ctx.program_id` arrived; the outcome's `decision` answers it."""

    ctx: AgentContext
    info: RequestInfo
    now: float


class CallFinished(msgspec.Struct, frozen=True):
    """A forwarded call ended: answered (ok), failed, or its client went away."""

    program_id: str
    usage: Usage | None
    ok: bool
    now: float


class ClientLeft(msgspec.Struct, frozen=True):
    """A held request's client went away before it ran."""

    program_id: str
    now: float


class HoldExpired(msgspec.Struct, frozen=True):
    """A held request waited past its deadline; `place`: force it onto an engine."""

    program_id: str
    now: float
    place: bool


class ReleaseRequested(msgspec.Struct, frozen=True):
    """The program ends (`reason`); the outcome's `found` says whether it was known."""

    program_id: str
    reason: str
    now: float


class Tick(msgspec.Struct, frozen=True):
    now: float


class ProgramAdopted(msgspec.Struct, frozen=True):
    """Another replica's program is known here; the outcome's `program` is its snapshot."""

    ctx: AgentContext
    history: ProgramHistory
    now: float


class TakenOver(msgspec.Struct, frozen=True):
    """An admitted program another replica placed on `backend` continues here."""

    program_id: str
    backend: str
    reserved_tokens: int
    now: float


class BackendChanged(msgspec.Struct, frozen=True):
    """A backend's health, capacity or live signals changed (None: unchanged)."""

    label: str
    now: float
    healthy: bool | None = None
    capacity: int | None = None
    max_model_len: int | None = None
    metrics: BackendMetrics | None = None


class ForeignReservations(msgspec.Struct, frozen=True):
    """Other replicas' programs now hold `tokens` on `label`."""

    label: str
    tokens: int
    now: float


class BackendAdded(msgspec.Struct, frozen=True):
    label: str
    capacity: int | None
    now: float
    healthy: bool = True


class BackendDrained(msgspec.Struct, frozen=True):
    label: str
    now: float


class BackendRemoved(msgspec.Struct, frozen=True):
    label: str
    now: float


class CachesFlushed(msgspec.Struct, frozen=True):
    """The engines' KV caches were flushed; `labels` None: every engine's."""

    now: float
    labels: tuple[str, ...] | None = None


class ConnectionRefused(msgspec.Struct, frozen=True):
    """The engine refused the call's connection: the outcome's `backend` is where it goes now."""

    program_id: str
    failed_backend: str
    now: float


class HostTierDeclared(msgspec.Struct, frozen=True):
    """A KV tier below an engine's GPU cache, as the config declares it."""

    label: str
    tokens: int
    load_tokens_per_s: float | None = None


class DecisionsApplied(msgspec.Struct, frozen=True):
    """Decisions made outside the pipeline (an operator's, a test's), applied as a stage's."""

    decisions: Sequence[StageDecision]
    now: float


Event = (
    RequestArrived
    | CallFinished
    | ClientLeft
    | HoldExpired
    | ReleaseRequested
    | Tick
    | ProgramAdopted
    | TakenOver
    | BackendChanged
    | ForeignReservations
    | BackendAdded
    | BackendDrained
    | BackendRemoved
    | CachesFlushed
    | ConnectionRefused
    | HostTierDeclared
    | DecisionsApplied
)


class Outcome(msgspec.Struct, frozen=True):
    """What the core did with one event: the actions for the caller, and the event's answer
    where it has one (`decision` for a request, `found` for a release, `program` for an
    adoption, `backend` for a refused connection). `program` is a frozen snapshot taken when
    the event was applied: later events never change it."""

    actions: list[Action]
    decision: Decision | None = None
    found: bool = False
    program: ProgramSnapshot | None = None
    backend: str | None = None
