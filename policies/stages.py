"""The scheduler's pipeline stages: each a named class with typed params and narrow hooks.

The YAML `policies:` list names stages in order; the core calls every stage's hooks at fixed
points (a request arrives, a call ends, a backend changes, a tick, a release). The hooks,
the read-only view they get and the decisions they return are the stage contract
(policies/stage_contract.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from thunder_mw.policies.decisions import (
    Footprint,
    Pause,
    PlanBackend,
    ReclaimTools,
    Release,
    Resume,
    StageDecision,
)
from thunder_mw.policies.failed_expiry import FailedExpiry
from thunder_mw.policies.overflow_cost import (
    EngineCosts,
    OverflowView,
    admit_past_capacity,
    allowance,
    budget,
    duty,
)
from thunder_mw.policies.program_table import Usage
from thunder_mw.policies.resident import resident_ratio
from thunder_mw.policies.stage_contract import Decisions, Stage, StageView
from thunder_mw.policies.views import BackendView, ProgramView

# Re-exported: stage authors and older code import these names from here.
from thunder_mw.schemas.stage_params import AdmissionParams as AdmissionParams
from thunder_mw.schemas.stage_params import GcParams as GcParams
from thunder_mw.schemas.stage_params import MigrationParams as MigrationParams
from thunder_mw.schemas.stage_params import PauseParams as PauseParams
from thunder_mw.schemas.stage_params import StageParams as StageParams


# ---------------------------------------------------------------------------- admission
class Admission(Stage):
    """Admit a new or resumed program only if it fits under the high watermark, with
    hysteresis: a backend that went over high admits nothing until it is back under low.
    An empty backend admits any program, however large."""

    name = "admission"
    Params = AdmissionParams
    params: AdmissionParams

    def bind(self, view: StageView) -> Decisions:
        if self.params.low_watermark > self.params.high_watermark:
            raise ValueError("low_watermark must not exceed high_watermark")
        self.costs: dict[str, EngineCosts] = {}
        self._seen: dict[str, object] = {}
        # The hysteresis: a backend that went over high admits nothing until back under low.
        self.congested: dict[str, bool] = {}
        return (
            Footprint(
                buffer_tokens=self.params.buffer_tokens_per_program,
                dedupe_prefixes=self.params.shared_prefix,
            ),
        )

    def admits(
        self, view: StageView, program: ProgramView, backend: BackendView, tokens: int, now: float
    ) -> bool:
        high = backend.limit(self.params.high_watermark)
        if high is None:  # capacity not known (yet): nothing to plan against
            return True
        low = backend.limit(self.params.low_watermark)
        assert low is not None
        extra = backend.overflow_tokens
        reserved = backend.reserved - backend.unused  # what the engine says it holds
        if reserved > high + extra:
            self.congested[backend.label] = congested = True
        elif reserved <= low + extra:
            self.congested[backend.label] = congested = False
        else:
            congested = self.congested.get(backend.label, False)
        if backend.reserved == 0:
            # A program larger than the watermark still runs on an empty engine; otherwise
            # it would block the head of the queue until its resume timeout.
            return True
        if congested:
            return False
        if reserved + tokens <= high:
            return True
        if self.params.overflow != "cost_aware":
            return False
        return admit_past_capacity(
            self._costs(view, backend),
            self._overflow_view(view, backend, high),
            tokens,
            self._budget_s(view, backend, program),
        )

    # -- cost-aware overflow (policies/overflow_cost.py): learn, and keep the allowance fresh
    def _costs(self, view: StageView, backend: BackendView) -> EngineCosts:
        costs = self.costs.get(backend.label)
        if costs is None:
            costs = self.costs[backend.label] = EngineCosts()
        speed = backend.host_load_tokens_per_s
        costs.host_s_per_token = 1.0 / speed if speed else None
        return costs

    def _overflow_view(self, view: StageView, backend: BackendView, high: float) -> OverflowView:
        running = backend.metrics.running
        host = backend.metrics.host_kv_tokens
        tier = int(host) if host is not None else backend.host_kv_tokens
        return OverflowView(
            capacity=high,
            reserved=backend.reserved - backend.unused,
            running=backend.running_reserved - backend.running_unused,
            batch=running if running else view.programs_on(backend.label),
            # The tier holds idle programs' whole contexts, which reservations count at
            # the ACTING weight: in reserved tokens it holds that share of its size.
            host_tokens=int(tier * view.acting_weight) if self.params.host_tier else 0,
            max_overflow=self.params.max_overflow,
            duty=duty(self._costs(view, backend), view.tool_time.expected(None, None)),
        )

    def _budget_s(
        self, view: StageView, backend: BackendView, program: ProgramView | None
    ) -> float:
        tool = (
            view.expected_tool_time(program)
            if program is not None
            else view.tool_time.expected(None, None)
        )
        return budget(self._costs(view, backend), tool)

    def on_finished(
        self, view: StageView, program: ProgramView, usage: Usage | None, ok: bool, now: float
    ) -> Decisions:
        if usage is None or program.backend is None or self.params.overflow != "cost_aware":
            return ()
        self._costs(view, view.backends[program.backend]).observe_call(
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.completion_tokens,
            usage.ttft_s,
            usage.duration_s,
        )
        return ()

    def on_queue_wait(
        self, view: StageView, program: ProgramView, waited_s: float, now: float
    ) -> Decisions:
        if program.backend is not None and self.params.overflow == "cost_aware":
            self._costs(view, view.backends[program.backend]).observe_hold(waited_s)
        return ()

    def on_backend_change(self, view: StageView, backend: BackendView, now: float) -> Decisions:
        if self.params.resident_floor is not None:
            return self._correct_and_plan(view, backend)
        # No gauge correction: the plan needs no decision applied first, so no generator.
        m = backend.metrics
        fresh = m is not self._seen.get(backend.label)
        if fresh:
            self._seen[backend.label] = m
        plan = self._plan(view, backend, fresh)
        return () if plan is None else (plan,)

    def _correct_and_plan(self, view: StageView, backend: BackendView) -> Iterator[StageDecision]:
        m = backend.metrics
        fresh = m is not self._seen.get(backend.label)
        if fresh:  # a scrape: the engine's own signals
            self._seen[backend.label] = m
            floor = self.params.resident_floor
            if floor is not None:
                ratio = resident_ratio(
                    backend.resident_ratio,
                    m.kv_usage,
                    backend.capacity,
                    # what the gauge can see: each shared prefix once
                    backend.running_reserved - backend.shared_running_credit,
                    floor,
                )
                if ratio != backend.resident_ratio:
                    yield PlanBackend(backend.label, resident_ratio=ratio)
        plan = self._plan(view, backend, fresh)
        if plan is not None:
            yield plan

    def _plan(self, view: StageView, backend: BackendView, fresh: bool) -> PlanBackend | None:
        """The cost-aware rule's allowance past the watermark, learned from a fresh scrape
        (None: unchanged)."""
        if self.params.overflow != "cost_aware":
            return None
        m = backend.metrics
        costs = self._costs(view, backend)
        if fresh:
            costs.observe_counters(
                m.prefill_seconds_total,
                m.prefill_tokens_total,
                m.decode_seconds_total,
                m.decode_tokens_total,
            )
        high = backend.limit(self.params.high_watermark)
        if high is None:
            return (
                PlanBackend(backend.label, overflow_tokens=0) if backend.overflow_tokens else None
            )
        programs = view.programs_on(backend.label)
        typical = backend.reserved // programs if programs else 0
        extra = allowance(
            costs,
            self._overflow_view(view, backend, high),
            typical,
            self._budget_s(view, backend, None),
        )
        if extra != backend.overflow_tokens:
            return PlanBackend(backend.label, overflow_tokens=extra)
        return None

    def on_tick(self, view: StageView, now: float) -> Iterator[StageDecision]:
        if self.params.overflow == "cost_aware":
            for backend in view.backends.values():
                yield from self.on_backend_change(view, backend, now)


# ---------------------------------------------------------------------------- pausing
class StateAwarePause(Stage):
    """On overflow pause ACTING programs first (their GPU is idle anyway), then mark
    REASONING ones to pause after their call, until the projected use is back under high.

    Victim rules:
    - `shortest_first` (the original): the fewest tokens first.
    - `cost_benefit` (default): lowest priority first; then the program whose tool call is
      expected to run longest from now (EMA of its own tool gaps, else its session type's),
      i.e. the most memory freed for the longest time per recompute it will cost; REASONING
      programs (`reasoning_victim`): the largest first, so the fewest programs pay a pause,
      or the smallest first: each pause then costs the least recompute when the program
      returns, and the programs furthest along run to completion instead of every program
      taking turns through the cache (docs/scheduling.md, "Which call pauses").
    """

    name = "state_aware_pause"
    Params = PauseParams
    params: PauseParams

    def bind(self, view: StageView) -> Decisions:
        self._high = self.params.high_watermark
        if self._high is None:
            admission = next((s for s in view.stages if isinstance(s, Admission)), None)
            self._high = admission.params.high_watermark if admission else 1.0
        return (Footprint(acting_weight=self.params.acting_token_weight),)

    def victim_key(self, view: StageView, program: ProgramView, acting: bool) -> Any:
        if self.params.victim == "shortest_first":
            return (program.reserved_tokens,)
        if acting:
            expected_end = program.acting_since + view.expected_tool_time(program)
            return (program.priority, -expected_end, -program.reserved_tokens)
        if self.params.reasoning_victim == "smallest":
            return (program.priority, program.reserved_tokens)
        return (program.priority, -program.reserved_tokens)

    def on_backend_change(self, view: StageView, backend: BackendView, now: float) -> Decisions:
        if self.params.check == "event":
            return self.relieve(view, backend, now)
        return ()

    def on_queue_blocked(self, view: StageView, program: ProgramView, now: float) -> Decisions:
        """Work conservation: a program idle in a long tool call holds KV that a waiting
        program could use now; pause such programs on the backend where that frees enough
        (the previous backend first), and only if it frees enough for the head."""
        threshold = self.params.yield_idle_after_s
        if threshold is None or self.params.victim != "cost_benefit":
            return ()
        assert self._high is not None
        need = view.footprint_for_resume(program)
        backends = sorted(
            view.healthy_backends(),
            key=lambda b: (b.label != program.backend, -view.room(b, self._high or 1.0)),
        )
        for backend in backends:
            limit = backend.limit(self._high)
            if limit is None:
                continue
            shortfall = backend.reserved - backend.unused + need - limit - backend.overflow_tokens
            victims: list[ProgramView] = []
            while shortfall > 0:
                victim = view.next_victim(backend, acting=True)
                if victim is None:
                    break
                elapsed = now - victim.acting_since
                remaining = view.tool_time.remaining(view.expected_tool_time(victim), elapsed)
                victims.append(victim)
                if remaining < threshold:
                    break
                shortfall -= victim.reserved_tokens
            if shortfall <= 0 and victims:
                return [Pause(victim, "yield_to_queue") for victim in victims]
            # not enough here: the victims looked at stay as they were
        return ()

    def on_tick(self, view: StageView, now: float) -> Iterator[StageDecision]:
        if self.params.check == "tick":
            for backend in view.backends.values():
                yield from self.relieve(view, backend, now)

    def relieve(self, view: StageView, backend: BackendView, now: float) -> Decisions:
        assert self._high is not None
        limit = backend.limit(self._high)
        if limit is None:
            return ()
        limit += backend.overflow_tokens  # what the cost-aware rule lets run past capacity
        use = backend.projected if self.params.reduce_projection else backend.reserved
        use -= backend.unused  # what the engine says it does not hold
        if use <= limit:
            return ()  # the common case: no generator to run
        return self._pauses(view, backend, use, limit)

    def _pauses(
        self, view: StageView, backend: BackendView, use: float, limit: float
    ) -> Iterator[StageDecision]:
        """Pauses victims on `backend` until its use is back under `limit`."""
        while use > limit:
            program = view.next_victim(backend, acting=True) if self.params.pause_acting else None
            if program is not None:
                freed = program.reserved_tokens
                yield Pause(program, "acting")
                use -= freed
                continue
            program = view.next_victim(backend, acting=False)
            if program is None:
                return
            yield Pause(program, "after_reasoning")
            if self.params.reduce_projection:
                use -= program.reserved_tokens
            else:
                # The original marks without lowering its projection: keep marking.
                continue


# ---------------------------------------------------------------------------- migration
class Migration(Stage):
    """One global queue of paused and new programs across backends.

    Order: strict-priority tier, then priority raised by waiting (ageing), then largest
    first (best-fit-decreasing). Placement: the previous backend when it admits the program,
    else the admitting backend with the most room. A program queued past
    `resume_timeout_s` is force-resumed so nothing starves.
    """

    name = "migration"
    Params = MigrationParams
    params: MigrationParams

    def queue_key(self, view: StageView, program: ProgramView) -> Any:
        assert program.queued_at is not None
        band = math.floor(program.queued_at / self.params.aging_s - program.priority)
        if self.params.placement == "best_fit_decreasing":
            return (band, -program.request_tokens, program.queued_at)
        if self.params.placement == "mru":
            return (band, -program.queued_at)
        return (band, program.queued_at)

    def place(self, view: StageView, program: ProgramView, now: float) -> str | None:
        if self.params.prefer_home_backend and program.backend is not None:
            home = view.backends.get(program.backend)
            if home is not None and home.healthy and view.admits(program, home, now):
                return home.label
        fitting = [b for b in view.healthy_backends() if view.admits(program, b, now)]
        if not fitting:
            return ""
        return max(fitting, key=view.room).label

    def on_tick(self, view: StageView, now: float) -> Iterator[StageDecision]:
        timeout = self.params.resume_timeout_s
        while (program := view.next_overdue(timeout, now)) is not None:
            healthy = view.healthy_backends()
            if not healthy:
                return
            home = view.backends.get(program.backend) if program.backend else None
            target = home if home is not None and home.healthy else max(healthy, key=view.room)
            yield Resume(program, target.label, forced=True)


# ---------------------------------------------------------------------------- GC hooks
class GcHooks(Stage):
    """Ends programs on idle expiry and turns every program end into a reclaim of its tools."""

    name = "gc_hooks"
    Params = GcParams
    params: GcParams

    def __init__(self, params: StageParams | None = None) -> None:
        super().__init__(params)
        self.unanswered = FailedExpiry(self.params.failed_ttl_s)

    def on_request(self, view: StageView, program: ProgramView, now: float) -> Decisions:
        self.unanswered.seen(program)
        return ()

    def on_finished(
        self, view: StageView, program: ProgramView, usage: Usage | None, ok: bool, now: float
    ) -> Decisions:
        self.unanswered.seen(program)
        return ()

    def on_tick(self, view: StageView, now: float) -> Iterator[StageDecision]:
        for unanswered in self.unanswered.due(now, view.program_count()):
            yield Release(unanswered, "failed")
        ttl = self.params.idle_ttl_s
        while (idle := view.next_idle(ttl, now)) is not None:
            if idle.in_flight == 0 and idle.waiting == 0:
                yield Release(idle, "expired")

    def on_release(
        self, view: StageView, program: ProgramView, reason: str, now: float
    ) -> Decisions:
        if not program.docker_ids:
            return ()
        return (
            ReclaimTools(
                program.program_id,
                tuple(program.docker_ids),
                reason,
                tuple(self.params.reclaim),
            ),
        )


# ---------------------------------------------------------------------------- baselines
class RoundRobin(Stage):
    """Baseline: a plain load balancer. Every request goes to the next backend in turn."""

    name = "round_robin"

    def __init__(self, params: StageParams | None = None) -> None:
        super().__init__(params)
        self._next = 0

    def _pick(self, view: StageView) -> str | None:
        healthy = view.healthy_backends()
        if not healthy:
            return None
        self._next = (self._next + 1) % len(healthy)
        return healthy[self._next].label

    def route(self, view: StageView, program: ProgramView, now: float) -> str | None:
        return self._pick(view)

    def place(self, view: StageView, program: ProgramView, now: float) -> str | None:
        return self._pick(view) or ""


class Sticky(Stage):
    """Baseline: program affinity without admission control — the original's default mode.
    A program stays on its backend; a new one goes to the backend with the fewest programs."""

    name = "sticky"

    def place(self, view: StageView, program: ProgramView, now: float) -> str | None:
        if program.backend is not None:
            home = view.backends.get(program.backend)
            if home is not None and home.healthy:
                return home.label
        healthy = view.healthy_backends()
        if not healthy:
            return ""
        return min(healthy, key=lambda b: view.programs_on(b.label)).label


# ---------------------------------------------------------------------------- registry
BUILTIN_STAGES: dict[str, type[Stage]] = {
    cls.name: cls for cls in (Admission, StateAwarePause, Migration, GcHooks, RoundRobin, Sticky)
}
