"""The scheduler's pipeline stages: each a named class with typed params and narrow hooks.

The YAML `policies:` list names stages in order; the core calls every stage's hooks at fixed
points (a request arrives, a call ends, a backend changes, a tick, a release). A hook that
has no opinion returns None. Third-party stages subclass `Stage` and are named by import
path (`my_pkg.my_policy:MyPolicy`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from thunder_mw.policies.failed_expiry import FailedExpiry
from thunder_mw.policies.overflow_cost import (
    EngineCosts,
    OverflowView,
    admit_past_capacity,
    allowance,
    budget,
    duty,
)
from thunder_mw.policies.program_table import Program, ProgramState, Usage
from thunder_mw.policies.resident import resident_ratio

# Re-exported: stage authors and older code import these names from here.
from thunder_mw.schemas.stage_params import AdmissionParams as AdmissionParams
from thunder_mw.schemas.stage_params import GcParams as GcParams
from thunder_mw.schemas.stage_params import MigrationParams as MigrationParams
from thunder_mw.schemas.stage_params import PauseParams as PauseParams
from thunder_mw.schemas.stage_params import StageParams as StageParams

if TYPE_CHECKING:
    from thunder_mw.policies.core import BackendState, SchedulerCore


class Stage:
    """Base class: every hook is a no-op until a stage overrides it."""

    name: ClassVar[str] = "stage"
    Params: ClassVar[type[StageParams]] = StageParams

    def __init__(self, params: StageParams | None = None) -> None:
        self.params = params if params is not None else self.Params()

    def bind(self, core: SchedulerCore) -> None:
        """Called once when the core is built (set footprint parameters here)."""

    # -- decisions (first stage with an answer wins; None = no opinion)
    def place(self, core: SchedulerCore, program: Program, now: float) -> str | None:
        """Backend for a queued program to be admitted/resumed on; "" = nowhere now."""
        return None

    def route(self, core: SchedulerCore, program: Program, now: float) -> str | None:
        """Backend for one request of an ACTIVE program (request-level balancers only)."""
        return None

    def victim_key(self, core: SchedulerCore, program: Program, acting: bool) -> Any:
        """Sort key of pause victims on a backend: the smallest is paused first."""
        return None

    def queue_key(self, core: SchedulerCore, program: Program) -> Any:
        """Sort key of the global queue: the smallest is resumed first."""
        return None

    def kv_ttl(self, core: SchedulerCore, program: Program, now: float) -> float | None:
        """Seconds the engine should keep this request's KV after it ends (an engine with
        TTL pinning); None = no opinion, 0 = no pin."""
        return None

    # -- vetoes (every stage must agree)
    def admits(
        self, core: SchedulerCore, program: Program, backend: BackendState, tokens: int, now: float
    ) -> bool:
        return True

    # -- reactions
    def on_request(self, core: SchedulerCore, program: Program, now: float) -> None: ...

    def on_finished(
        self, core: SchedulerCore, program: Program, usage: Usage | None, ok: bool, now: float
    ) -> None: ...

    def on_backend_change(self, core: SchedulerCore, backend: BackendState, now: float) -> None: ...

    def on_tick(self, core: SchedulerCore, now: float) -> None: ...

    def on_queue_blocked(self, core: SchedulerCore, program: Program, now: float) -> bool:
        """The queue's head fits nowhere; return True after freeing room for it."""
        return False

    def on_release(
        self, core: SchedulerCore, program: Program, reason: str, now: float
    ) -> None: ...

    def on_resumed(
        self, core: SchedulerCore, program: Program, previous: str | None, now: float
    ) -> None:
        """`program` was just placed on `program.backend` (admitted, resumed or moved from
        `previous`); its held requests, if any, go there."""

    def on_queue_wait(
        self, core: SchedulerCore, program: Program, waited_s: float, now: float
    ) -> None:
        """A queued program was placed after waiting `waited_s` (not a forced resume)."""


# ---------------------------------------------------------------------------- admission
class Admission(Stage):
    """Admit a new or resumed program only if it fits under the high watermark, with
    hysteresis: a backend that went over high admits nothing until it is back under low.
    An empty backend admits any program, however large."""

    name = "admission"
    Params = AdmissionParams
    params: AdmissionParams

    def bind(self, core: SchedulerCore) -> None:
        if self.params.low_watermark > self.params.high_watermark:
            raise ValueError("low_watermark must not exceed high_watermark")
        core.buffer_tokens = self.params.buffer_tokens_per_program
        core.dedupe_prefixes = self.params.shared_prefix
        self.costs: dict[str, EngineCosts] = {}
        self._seen: dict[str, object] = {}

    def admits(
        self, core: SchedulerCore, program: Program, backend: BackendState, tokens: int, now: float
    ) -> bool:
        high = backend.limit(self.params.high_watermark)
        if high is None:  # capacity not known (yet): nothing to plan against
            return True
        low = backend.limit(self.params.low_watermark)
        assert low is not None
        extra = backend.overflow_tokens
        reserved = backend.reserved - backend.unused  # what the engine says it holds
        if reserved > high + extra:
            backend.congested = True
        elif reserved <= low + extra:
            backend.congested = False
        if backend.reserved == 0:
            # A program larger than the watermark still runs on an empty engine; otherwise
            # it would block the head of the queue until its resume timeout.
            return True
        if backend.congested:
            return False
        if reserved + tokens <= high:
            return True
        if self.params.overflow != "cost_aware":
            return False
        return admit_past_capacity(
            self._costs(core, backend),
            self._view(core, backend, high),
            tokens,
            self._budget_s(core, backend, program),
        )

    # -- cost-aware overflow (policies/overflow_cost.py): learn, and keep the allowance fresh
    def _costs(self, core: SchedulerCore, backend: BackendState) -> EngineCosts:
        costs = self.costs.get(backend.label)
        if costs is None:
            costs = self.costs[backend.label] = EngineCosts()
        speed = backend.host_load_tokens_per_s
        costs.host_s_per_token = 1.0 / speed if speed else None
        return costs

    def _view(self, core: SchedulerCore, backend: BackendState, high: float) -> OverflowView:
        running = backend.metrics.running
        host = backend.metrics.host_kv_tokens
        tier = int(host) if host is not None else backend.host_kv_tokens
        return OverflowView(
            capacity=high,
            reserved=backend.reserved - backend.unused,
            running=backend.running_reserved - backend.running_unused,
            batch=running if running else core.table.programs_on(backend.label),
            # The tier holds idle programs' whole contexts, which reservations count at
            # the ACTING weight: in reserved tokens it holds that share of its size.
            host_tokens=int(tier * core.acting_weight) if self.params.host_tier else 0,
            max_overflow=self.params.max_overflow,
            duty=duty(self._costs(core, backend), core.tool_time.expected(None, None)),
        )

    def _budget_s(
        self, core: SchedulerCore, backend: BackendState, program: Program | None
    ) -> float:
        tool = (
            core.expected_tool_time(program)
            if program is not None
            else core.tool_time.expected(None, None)
        )
        return budget(self._costs(core, backend), tool)

    def on_finished(
        self, core: SchedulerCore, program: Program, usage: Usage | None, ok: bool, now: float
    ) -> None:
        if usage is None or program.backend is None or self.params.overflow != "cost_aware":
            return
        self._costs(core, core.backends[program.backend]).observe_call(
            usage.prompt_tokens,
            usage.cached_tokens,
            usage.completion_tokens,
            usage.ttft_s,
            usage.duration_s,
        )

    def on_queue_wait(
        self, core: SchedulerCore, program: Program, waited_s: float, now: float
    ) -> None:
        if program.backend is not None and self.params.overflow == "cost_aware":
            self._costs(core, core.backends[program.backend]).observe_hold(waited_s)

    def on_backend_change(self, core: SchedulerCore, backend: BackendState, now: float) -> None:
        m = backend.metrics
        fresh = m is not self._seen.get(backend.label)
        if fresh:  # a scrape: the engine's own signals
            self._seen[backend.label] = m
            floor = self.params.resident_floor
            if floor is not None:
                backend.resident_ratio = resident_ratio(
                    backend.resident_ratio,
                    m.kv_usage,
                    backend.capacity,
                    # what the gauge can see: each shared prefix once
                    backend.running_reserved - backend.shared_running_credit,
                    floor,
                )
        if self.params.overflow != "cost_aware":
            return
        costs = self._costs(core, backend)
        if fresh:
            costs.observe_counters(
                m.prefill_seconds_total,
                m.prefill_tokens_total,
                m.decode_seconds_total,
                m.decode_tokens_total,
            )
        high = backend.limit(self.params.high_watermark)
        if high is None:
            backend.overflow_tokens = 0
            return
        programs = core.table.programs_on(backend.label)
        typical = backend.reserved // programs if programs else 0
        backend.overflow_tokens = allowance(
            costs, self._view(core, backend, high), typical, self._budget_s(core, backend, None)
        )

    def on_tick(self, core: SchedulerCore, now: float) -> None:
        if self.params.overflow == "cost_aware":
            for backend in core.backends.values():
                self.on_backend_change(core, backend, now)


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

    def bind(self, core: SchedulerCore) -> None:
        core.acting_weight = self.params.acting_token_weight
        self._high = self.params.high_watermark
        if self._high is None:
            admission = next((s for s in core.stages if isinstance(s, Admission)), None)
            self._high = admission.params.high_watermark if admission else 1.0

    def victim_key(self, core: SchedulerCore, program: Program, acting: bool) -> Any:
        if self.params.victim == "shortest_first":
            return (program.reserved_tokens,)
        if acting:
            expected_end = program.acting_since + core.expected_tool_time(program)
            return (program.priority, -expected_end, -program.reserved_tokens)
        if self.params.reasoning_victim == "smallest":
            return (program.priority, program.reserved_tokens)
        return (program.priority, -program.reserved_tokens)

    def on_backend_change(self, core: SchedulerCore, backend: BackendState, now: float) -> None:
        if self.params.check == "event":
            self.relieve(core, backend, now)

    def on_queue_blocked(self, core: SchedulerCore, program: Program, now: float) -> bool:
        """Work conservation: a program idle in a long tool call holds KV that a waiting
        program could use now; pause such programs on the backend where that frees enough
        (the previous backend first), and only if it frees enough for the head."""
        threshold = self.params.yield_idle_after_s
        if threshold is None or self.params.victim != "cost_benefit":
            return False
        assert self._high is not None
        need = core.footprint_for_resume(program)
        backends = sorted(
            core.healthy_backends(),
            key=lambda b: (b.label != program.backend, -core.room(b, self._high or 1.0)),
        )
        for backend in backends:
            limit = backend.limit(self._high)
            if limit is None:
                continue
            shortfall = backend.reserved - backend.unused + need - limit - backend.overflow_tokens
            victims: list[Program] = []
            while shortfall > 0:
                top = backend.acting.pop()
                if top is None:
                    break
                victim = top[1]
                elapsed = now - victim.acting_since
                remaining = core.tool_time.remaining(core.expected_tool_time(victim), elapsed)
                victims.append(victim)
                if remaining < threshold:
                    break
                shortfall -= victim.reserved_tokens
            if shortfall <= 0 and victims:
                for victim in victims:
                    core.pause(victim, now, "yield_to_queue")
                return True
            for victim in victims:  # not enough here: leave them as they were
                backend.acting.push(self.victim_key(core, victim, True), victim, victim.version)
        return False

    def on_tick(self, core: SchedulerCore, now: float) -> None:
        if self.params.check == "tick":
            for backend in core.backends.values():
                self.relieve(core, backend, now)

    def relieve(self, core: SchedulerCore, backend: BackendState, now: float) -> None:
        assert self._high is not None
        limit = backend.limit(self._high)
        if limit is None:
            return
        limit += backend.overflow_tokens  # what the cost-aware rule lets run past capacity
        use = backend.projected if self.params.reduce_projection else backend.reserved
        use -= backend.unused  # what the engine says it does not hold
        while use > limit:
            popped = backend.acting.pop() if self.params.pause_acting else None
            if popped is not None:
                program = popped[1]
                freed = program.reserved_tokens
                core.pause(program, now, "acting")
                use -= freed
                continue
            popped = backend.reasoning.pop()
            if popped is None:
                return
            program = popped[1]
            core.pause(program, now, "after_reasoning")
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

    def queue_key(self, core: SchedulerCore, program: Program) -> Any:
        assert program.queued_at is not None
        band = math.floor(program.queued_at / self.params.aging_s - program.priority)
        if self.params.placement == "best_fit_decreasing":
            return (band, -program.request_tokens, program.queued_at)
        if self.params.placement == "mru":
            return (band, -program.queued_at)
        return (band, program.queued_at)

    def place(self, core: SchedulerCore, program: Program, now: float) -> str | None:
        if self.params.prefer_home_backend and program.backend is not None:
            home = core.backends.get(program.backend)
            if home is not None and home.healthy and core.admits(program, home, now):
                return home.label
        fitting = [b for b in core.healthy_backends() if core.admits(program, b, now)]
        if not fitting:
            return ""
        return max(fitting, key=core.room).label

    def on_tick(self, core: SchedulerCore, now: float) -> None:
        fifo = core.queue_fifo
        timeout = self.params.resume_timeout_s
        while fifo:
            queued_at, program = fifo[0]
            if program.queued_at != queued_at or program.state is ProgramState.TERMINATED:
                fifo.popleft()  # resumed, released or re-queued since
                continue
            if now - queued_at < timeout:
                return
            fifo.popleft()
            healthy = core.healthy_backends()
            if not healthy:
                return
            home = core.backends.get(program.backend) if program.backend else None
            target = home if home is not None and home.healthy else max(healthy, key=core.room)
            core.resume(program, target.label, now, forced=True)


# ---------------------------------------------------------------------------- GC hooks
class GcHooks(Stage):
    """Ends programs on idle expiry and turns every program end into a reclaim of its tools."""

    name = "gc_hooks"
    Params = GcParams
    params: GcParams

    def __init__(self, params: StageParams | None = None) -> None:
        super().__init__(params)
        self.unanswered = FailedExpiry(self.params.failed_ttl_s)

    def on_request(self, core: SchedulerCore, program: Program, now: float) -> None:
        self.unanswered.seen(program)

    def on_finished(
        self, core: SchedulerCore, program: Program, usage: Usage | None, ok: bool, now: float
    ) -> None:
        self.unanswered.seen(program)

    def on_tick(self, core: SchedulerCore, now: float) -> None:
        for program in self.unanswered.due(now, len(core.table)):
            core.release(program, "failed", now)
        ttl = self.params.idle_ttl_s
        while True:
            top = core.idle.peek()
            if top is None or top[0] + ttl > now:
                return
            program = top[1]
            core.idle.pop()
            if program.in_flight == 0 and program.waiting == 0:
                core.release(program, "expired", now)

    def on_release(self, core: SchedulerCore, program: Program, reason: str, now: float) -> None:
        from thunder_mw.policies.core import ReclaimTools

        if program.docker_ids:
            core.emit(
                ReclaimTools(
                    program.program_id,
                    tuple(program.docker_ids),
                    reason,
                    tuple(self.params.reclaim),
                )
            )


# ---------------------------------------------------------------------------- baselines
class RoundRobin(Stage):
    """Baseline: a plain load balancer. Every request goes to the next backend in turn."""

    name = "round_robin"

    def __init__(self, params: StageParams | None = None) -> None:
        super().__init__(params)
        self._next = 0

    def _pick(self, core: SchedulerCore) -> str | None:
        healthy = core.healthy_backends()
        if not healthy:
            return None
        self._next = (self._next + 1) % len(healthy)
        return healthy[self._next].label

    def route(self, core: SchedulerCore, program: Program, now: float) -> str | None:
        return self._pick(core)

    def place(self, core: SchedulerCore, program: Program, now: float) -> str | None:
        return self._pick(core) or ""


class Sticky(Stage):
    """Baseline: program affinity without admission control — the original's default mode.
    A program stays on its backend; a new one goes to the backend with the fewest programs."""

    name = "sticky"

    def place(self, core: SchedulerCore, program: Program, now: float) -> str | None:
        if program.backend is not None:
            home = core.backends.get(program.backend)
            if home is not None and home.healthy:
                return home.label
        healthy = core.healthy_backends()
        if not healthy:
            return ""
        return min(healthy, key=lambda b: core.table.programs_on(b.label)).label


# ---------------------------------------------------------------------------- registry
BUILTIN_STAGES: dict[str, type[Stage]] = {
    cls.name: cls for cls in (Admission, StateAwarePause, Migration, GcHooks, RoundRobin, Sticky)
}
