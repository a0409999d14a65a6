"""The contract between the scheduler core and its pipeline stages: what a stage may read,
the hooks it answers, and the decisions it returns.

A stage never changes the core. Its hooks receive a read-only `StageView` of the core (and
`ProgramView` / `BackendView` records; read-only at run time too: an assignment raises) and
either answer a question (`place`, `route`, `victim_key`, `queue_key`, `kv_ttl`, `admits`)
or return the decisions it wants applied
(`Pause`, `Resume`, `Release`, `Count`, `Footprint`, `PlanBackend`, `Reorder`, or an action
such as `ReclaimTools` / `Prefill` for the caller; policies/decisions.py). The core applies each
decision in one place, in the order returned; a hook written as a generator sees the
effect of each decision it yielded before it computes the next. A stage's own fields (its
learned estimates, its indexes) are its own to change.

Three views consume the core's indexes as they are read, so that a stage walking them
costs O(log n) per program it looks at: `next_victim` (a backend's pause order; victims
the hook leaves unpaused are put back when it returns), `next_idle` and `next_overdue`.

Hooks, called at fixed points (first stage with an answer wins; None: no opinion):
- `bind(view)`: once, when the core is built (return a `Footprint` to size reservations);
  `unused_hooks()`: those of its hooks its params leave unused (the core never calls them);
- `place(view, program, now)`: the backend a queued program is admitted or resumed on
  ("": nowhere now); `route(view, program, now)`: per request of an ACTIVE program;
- `victim_key` / `queue_key`: sort keys of the pause order and of the global queue;
- `kv_ttl(view, program, now)`: seconds an engine should keep the request's KV;
- `idle_share(view, program, now)`: when a program's call ends, the share of its context
  its reservation counts while its tool runs;
- `admits(view, program, backend, tokens, now)`: a veto; every stage must agree;
- reactions, each returning decisions: `on_request`, `on_finished`, `on_backend_change`,
  `on_tick`, `on_queue_blocked` (the queue's head fits nowhere: return the decisions that
  free room for it, or none), `on_release`, `on_resumed`, `on_queue_wait`.

Third-party stages subclass `Stage` and are named by import path in the YAML
(`my_pkg.my_policy:MyPolicy`); everything they need is exported by `thunder_mw.policies`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from thunder_mw.policies.decisions import StageDecision
from thunder_mw.policies.program_table import Usage
from thunder_mw.policies.views import BackendView, ProgramView
from thunder_mw.schemas.stage_params import StageParams

__all__ = ["HOOKS", "Decisions", "Stage", "StageView", "overriding"]


class StageView(Protocol):
    """The scheduler core as its stages see it (policies/core_view.py's `ReadOnlyCore`, one
    per core, given to every hook)."""

    @property
    def backends(self) -> Mapping[str, BackendView]: ...
    @property
    def stages(self) -> Sequence[Stage]: ...
    @property
    def acting_weight(self) -> float: ...

    def program(self, program_id: str) -> ProgramView | None: ...
    def program_count(self) -> int: ...
    def programs(self) -> Sequence[ProgramView]: ...
    def programs_on(self, label: str) -> int: ...
    def healthy_backends(self) -> Sequence[BackendView]: ...
    def room(self, backend: BackendView, fraction: float = 1.0) -> float: ...
    def admits(self, program: ProgramView, backend: BackendView, now: float) -> bool: ...
    def footprint_for_resume(self, program: ProgramView) -> int: ...
    def expected_tool_time(self, program: ProgramView | None = None) -> float: ...
    def remaining_tool_time(self, program: ProgramView, elapsed_s: float) -> float: ...
    def prompt_tokens(self, chars: int, backend: str | None) -> int: ...
    def queue_length(self) -> int: ...
    def victim_key(self, program: ProgramView, acting: bool = True) -> Any: ...

    # -- consuming reads (see the module's docstring)
    def next_victim(self, backend: BackendView, acting: bool) -> ProgramView | None: ...
    def next_idle(self, ttl_s: float, now: float) -> ProgramView | None: ...
    def next_overdue(self, timeout_s: float, now: float) -> ProgramView | None: ...


Decisions = Iterable[StageDecision]


class Stage:
    """Base class: every hook has no opinion and returns no decision until a stage
    overrides it."""

    name: ClassVar[str] = "stage"
    Params: ClassVar[type[StageParams]] = StageParams

    def __init__(self, params: StageParams | None = None) -> None:
        self.params = params if params is not None else self.Params()

    def bind(self, view: StageView) -> Decisions:
        """Called once when the core is built (return a `Footprint` to size reservations)."""
        return ()

    def unused_hooks(self) -> frozenset[str]:
        """Hooks this stage overrides but, with its params, never needs: the core does not
        call them (a rule that an option turns on costs nothing on the hot path when off)."""
        return frozenset()

    # -- decisions (first stage with an answer wins; None = no opinion)
    def place(self, view: StageView, program: ProgramView, now: float) -> str | None:
        """Backend for a queued program to be admitted/resumed on; "" = nowhere now."""
        return None

    def route(self, view: StageView, program: ProgramView, now: float) -> str | None:
        """Backend for one request of an ACTIVE program (request-level balancers only)."""
        return None

    def victim_key(self, view: StageView, program: ProgramView, acting: bool) -> Any:
        """Sort key of pause victims on a backend: the smallest is paused first."""
        return None

    def queue_key(self, view: StageView, program: ProgramView) -> Any:
        """Sort key of the global queue: the smallest is resumed first."""
        return None

    def kv_ttl(self, view: StageView, program: ProgramView, now: float) -> float | None:
        """Seconds the engine should keep this request's KV after it ends (an engine with
        TTL pinning); None = no opinion, 0 = no pin."""
        return None

    def idle_share(self, view: StageView, program: ProgramView, now: float) -> float | None:
        """`program`'s last call ended and it runs a tool: the share of its context its
        reservation counts until its next call (1: kept resident; 0: let go, to be reloaded
        or recomputed); None = no opinion (the pipeline's `Footprint` acting weight)."""
        return None

    # -- vetoes (every stage must agree)
    def admits(
        self, view: StageView, program: ProgramView, backend: BackendView, tokens: int, now: float
    ) -> bool:
        return True

    # -- reactions
    def on_request(self, view: StageView, program: ProgramView, now: float) -> Decisions:
        return ()

    def on_finished(
        self, view: StageView, program: ProgramView, usage: Usage | None, ok: bool, now: float
    ) -> Decisions:
        return ()

    def on_backend_change(self, view: StageView, backend: BackendView, now: float) -> Decisions:
        return ()

    def on_tick(self, view: StageView, now: float) -> Decisions:
        return ()

    def on_queue_blocked(self, view: StageView, program: ProgramView, now: float) -> Decisions:
        """The queue's head fits nowhere: the decisions that free room for it (none: no
        room freed; the next stage is asked)."""
        return ()

    def on_release(
        self, view: StageView, program: ProgramView, reason: str, now: float
    ) -> Decisions:
        return ()

    def on_resumed(
        self, view: StageView, program: ProgramView, previous: str | None, now: float
    ) -> Decisions:
        """`program` was just placed on `program.backend` (admitted, resumed or moved from
        `previous`); its held requests, if any, go there."""
        return ()

    def on_queue_wait(
        self, view: StageView, program: ProgramView, waited_s: float, now: float
    ) -> Decisions:
        """A queued program was placed after waiting `waited_s` (not a forced resume)."""
        return ()


HOOKS = (
    "place",
    "route",
    "victim_key",
    "queue_key",
    "kv_ttl",
    "idle_share",
    "admits",
    "on_request",
    "on_finished",
    "on_backend_change",
    "on_tick",
    "on_queue_blocked",
    "on_release",
    "on_resumed",
    "on_queue_wait",
)


def overriding(stages: Sequence[Stage], hook: str) -> list[Any]:
    """The bound `hook` methods of the stages that override it, in pipeline order: the core
    calls only these (a base hook has no opinion and returns nothing)."""
    base = getattr(Stage, hook)
    return [
        getattr(s, hook)
        for s in stages
        if getattr(type(s), hook) is not base and hook not in s.unused_hooks()
    ]
