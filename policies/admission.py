"""The admission stage: who may run on which engine, and how far past its KV capacity a
program may be let in before it waits: by default the working-set limit the controller moves
on measured goodput (policies/operating_point.py), else the cost-aware rule
(policies/overflow_cost.py, also the controller's starting point) or a fixed watermark."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from thunder_mw.policies.decisions import Footprint, PlanBackend, StageDecision
from thunder_mw.policies.operating_point import Bounds, OperatingPoint
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
from thunder_mw.schemas.stage_params import AdmissionParams

__all__ = ["Admission", "host_tier_tokens", "tiered_fleet"]


def host_tier_tokens(backend: BackendView) -> int:
    """The backend's host (and disk) KV tier: the engine's own report, else what the config
    declared for it."""
    reported = backend.metrics.host_kv_tokens
    return int(reported) if reported is not None else backend.host_kv_tokens


def tiered_fleet(backends: Iterable[BackendView]) -> bool:
    """Has any of `backends` a host KV tier? (The rules that choose by what a resume costs:
    the migration stage's `started_first: null`, the pause stage's `drain_victim: null`.)"""
    return any(host_tier_tokens(b) for b in backends)


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
        # adaptive: each backend's controller (made once its first call is timed) and the
        # output tokens of the calls seen finish there (goodput where the engine counts none).
        self.points: dict[str, OperatingPoint] = {}
        self.output_tokens: dict[str, float] = {}
        self.admit_limit: dict[str, float] = {}
        self._learns = self.params.overflow != "hold"
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
        if self.params.fill_idle_engine and backend.running_reserved <= 0 and tokens <= high:
            # No call in flight: every program placed there runs a tool, and the engine
            # idles until one returns. Holding the head cannot raise throughput then; it only
            # keeps the idle programs' cached KV, which admitting leaves to the engine's LRU
            # (and the pause stage to its victim rule). Work conservation, as an empty
            # engine's admission above.
            return True
        if congested:
            return False
        high = self.admit_limit.get(backend.label, high)  # adaptive: the controller's
        if reserved + tokens <= high:
            return True
        if self.params.overflow == "hold":
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
        tier = host_tier_tokens(backend)
        return OverflowView(
            capacity=high,
            reserved=backend.reserved - backend.unused,
            running=backend.running_reserved - backend.running_unused,
            batch=running if running else view.programs_on(backend.label),
            # The tier holds idle programs' whole contexts, which reservations count at
            # the ACTING weight: in reserved tokens it holds that share of its size.
            host_tokens=int(tier * view.acting_weight) if self.params.host_tier else 0,
            max_overflow=self.params.max_overflow if self._recomputes(backend) else 0.0,
            duty=duty(self._costs(view, backend), view.expected_tool_time()),
            tier_reload=self.params.tier_reload and self.params.host_tier,
            contexts=backend.contexts,
            tier_tokens=tier if self.params.host_tier else 0,
        )

    def _recomputes(self, backend: BackendView) -> bool:
        """May this backend be filled past its limit with KV to recompute, and its controller
        probe past it? Not with `recompute_overflow` off and no host tier: there the
        overflow would all be recomputed, which loses to holding (docs/benchmarks.md)."""
        if self.params.recompute_overflow:
            return True
        return self.params.host_tier and host_tier_tokens(backend) > 0

    def _typical(self, view: StageView, backend: BackendView) -> int:
        """The mean reservation of the programs on `backend` (0: none)."""
        programs = view.programs_on(backend.label)
        return backend.reserved // programs if programs else 0

    def _budget_s(
        self, view: StageView, backend: BackendView, program: ProgramView | None
    ) -> float:
        return budget(self._costs(view, backend), view.expected_tool_time(program))

    def on_finished(
        self, view: StageView, program: ProgramView, usage: Usage | None, ok: bool, now: float
    ) -> Decisions:
        if usage is None or program.backend is None or not self._learns:
            return ()
        label = program.backend
        self.output_tokens[label] = self.output_tokens.get(label, 0.0) + usage.completion_tokens
        self._costs(view, view.backends[label]).observe_call(
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
        if program.backend is not None and self._learns:
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
        (None: unchanged; the controller's point once it runs, set on ticks)."""
        if not self._learns:
            return None
        m = backend.metrics
        costs = self._costs(view, backend)
        if fresh:
            computed = None
            if m.prefix_queries_total is not None and m.prefix_hits_total is not None:
                computed = m.prefix_queries_total - m.prefix_hits_total
            costs.observe_counters(
                m.prefill_seconds_total,
                m.prefill_tokens_total,
                m.decode_seconds_total,
                m.decode_tokens_total,
                m.steps_total,
                m.inter_token_seconds_total,
                m.inter_tokens_total,
                computed,
            )
        high = backend.limit(self.params.high_watermark)
        if high is None:
            return (
                PlanBackend(backend.label, overflow_tokens=0) if backend.overflow_tokens else None
            )
        typical = self._typical(view, backend)
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
        if not self._learns:
            return
        for backend in view.backends.values():
            yield from self.on_backend_change(view, backend, now)
            if self.params.overflow == "adaptive" and self._recomputes(backend):
                plan = self._steer(view, backend, now)
                if plan is not None:
                    yield plan

    # -- adaptive: the controller (policies/operating_point.py) moves the limit
    def _steer(self, view: StageView, backend: BackendView, now: float) -> PlanBackend | None:
        """One controller tick for `backend`: the limit admission holds to, and the pause
        threshold above it (as the allowance past the high watermark the pause stage reads;
        None: unchanged)."""
        capacity = backend.limit(1.0)
        high = backend.limit(self.params.high_watermark)
        costs = self.costs.get(backend.label)
        if capacity is None or high is None or capacity <= 0 or costs is None:
            return None
        call_s = costs.call_s
        if call_s is None or costs.prefill_s_per_token is None:
            # Until a call is timed and a recompute priced, the cost-aware rule alone runs.
            return None
        point = self.points.get(backend.label)
        if point is None:
            # It starts where the rules of 0.2.0 stand (the high watermark), which then run
            # inside its limit: at m = high_watermark the two are the same.
            bounds = Bounds(
                floor=self.params.low_watermark,
                ceiling=self.params.max_limit,
                idle_floor=self.params.high_watermark,
            )
            point = self.points[backend.label] = OperatingPoint(self.params.high_watermark, bounds)
        limit = capacity * point.factor()
        reserved = backend.reserved - backend.unused
        queued = view.queue_length()
        m = backend.metrics
        # Calls that want this engine: at it (running or in its queue), or held for the fleet.
        demand = (m.running or 0) + (m.waiting or 0) + queued / max(1, len(view.healthy_backends()))
        factor = point.tick(
            now,
            self.output_tokens.get(backend.label, 0.0),
            demand,
            reserved / capacity,
            queued > 0 or reserved >= 0.95 * limit,
            call_s + view.expected_tool_time(),
        )
        limit = self.admit_limit[backend.label] = capacity * factor
        # Inside the limit the cost-aware rule still decides, per program, what may run past
        # it and how far past it pausing waits (its allowance). Pausing follows the point,
        # not a lower probe: a probe down only stops admitting, so probing costs no pauses
        # (each one a recompute when its program returns).
        typical = self._typical(view, backend)
        pause_at = max(limit, capacity * point.point)
        past = allowance(
            costs,
            self._overflow_view(view, backend, limit),
            typical,
            self._budget_s(view, backend, None),
        )
        extra = int(pause_at + past - high)
        if extra == backend.overflow_tokens:
            return None
        return PlanBackend(backend.label, overflow_tokens=extra)
