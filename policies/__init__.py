"""Pure scheduling decisions. A stage author's whole contract is exported here: subclass
`Stage`, read the core through `StageView` / `ProgramView` / `BackendView`, and return the
decisions below (policies/stage_contract.py explains each hook)."""

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
from thunder_mw.policies.program_table import Phase, ProgramState, Usage
from thunder_mw.policies.stage_contract import Decisions, Stage, StageView
from thunder_mw.policies.views import BackendView, ProgramView
from thunder_mw.schemas.stage_params import StageParams

__all__ = [
    "BackendView",
    "Count",
    "Decisions",
    "Footprint",
    "Pause",
    "Phase",
    "PlanBackend",
    "Prefill",
    "ProgramState",
    "ProgramView",
    "ReclaimTools",
    "Release",
    "Reorder",
    "Resume",
    "Stage",
    "StageDecision",
    "StageParams",
    "StageView",
    "Usage",
]
