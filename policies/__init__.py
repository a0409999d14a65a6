"""Pure scheduling decisions. A stage author's whole contract is exported here: subclass
`Stage`, read the core through `StageView` / `ProgramView` / `BackendView`, and return the
decisions below (policies/stage_contract.py explains each hook).

The core's one entry point is `SchedulerCore.handle(event) -> Outcome`; its events and
the outcome are exported too (policies/core_events.py); a program leaves the core as a
frozen `ProgramSnapshot`."""

from thunder_mw.policies.core_events import (
    BackendAdded,
    BackendChanged,
    BackendDrained,
    BackendRemoved,
    CachesFlushed,
    CallFinished,
    ClientLeft,
    ConnectionRefused,
    DecisionsApplied,
    Event,
    ForeignReservations,
    HoldExpired,
    HostTierDeclared,
    Outcome,
    ProgramAdopted,
    ReleaseRequested,
    RequestArrived,
    TakenOver,
    Tick,
)
from thunder_mw.policies.decisions import (
    Count,
    Footprint,
    Pause,
    PlanBackend,
    Prefill,
    ReclaimTools,
    Release,
    Reorder,
    Resume,
    StageDecision,
)
from thunder_mw.policies.program_table import Phase, ProgramSnapshot, ProgramState, Usage
from thunder_mw.policies.stage_contract import Decisions, Stage, StageView
from thunder_mw.policies.views import BackendView, ProgramView
from thunder_mw.schemas.stage_params import StageParams

__all__ = [
    "BackendAdded",
    "BackendChanged",
    "BackendDrained",
    "BackendRemoved",
    "BackendView",
    "CachesFlushed",
    "CallFinished",
    "ClientLeft",
    "ConnectionRefused",
    "Count",
    "Decisions",
    "DecisionsApplied",
    "Event",
    "Footprint",
    "ForeignReservations",
    "HoldExpired",
    "HostTierDeclared",
    "Outcome",
    "Pause",
    "Phase",
    "PlanBackend",
    "Prefill",
    "ProgramAdopted",
    "ProgramSnapshot",
    "ProgramState",
    "ProgramView",
    "ReclaimTools",
    "Release",
    "ReleaseRequested",
    "Reorder",
    "RequestArrived",
    "Resume",
    "Stage",
    "StageDecision",
    "StageParams",
    "StageView",
    "TakenOver",
    "Tick",
    "Usage",
]
