"""The scheduler core: one owner of program and backend state, driven by events, returning actions.

Pure: no I/O, no wall clock (every event carries `now`). The live middleware and the
discrete-event harness feed it the same events, so benchmarks measure the shipped code.
Every state change enters through `handle(event)` (the events: policies/core_events.py),
which dispatches to a private `_on_*` method here or in policies/_fleet_events.py;
the pipeline's stages (policies/stage_contract.py) read the core through its queries
(policies/core_view.py) and return decisions, applied in policies/_placement.py.

Every index is a heap with lazy deletion keyed on a per-program version, so each event
costs O(log n) in the number of programs; nothing rescans the table per event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from thunder_mw.policies import context_limit
from thunder_mw.policies import core_events as ev
from thunder_mw.policies._backend_state import BackendState as BackendState
from thunder_mw.policies._fleet_events import FleetEvents
from thunder_mw.policies.decisions import Action as Action
from thunder_mw.policies.decisions import Decision as Decision
from thunder_mw.policies.decisions import Forward as Forward
from thunder_mw.policies.decisions import Hold as Hold
from thunder_mw.policies.decisions import Pause, Release, Resume, StageDecision
from thunder_mw.policies.decisions import Paused as Paused
from thunder_mw.policies.decisions import Prefill as Prefill
from thunder_mw.policies.decisions import ReclaimTools as ReclaimTools
from thunder_mw.policies.decisions import Reject as Reject
from thunder_mw.policies.decisions import Released as Released
from thunder_mw.policies.decisions import Resumed as Resumed
from thunder_mw.policies.events import BackendMetrics as BackendMetrics
from thunder_mw.policies.events import ProgramHistory
from thunder_mw.policies.events import RequestInfo as RequestInfo
from thunder_mw.policies.program_table import Phase, Program, ProgramState, ReadOnlyProgram, Usage
from thunder_mw.policies.stage_contract import Stage
from thunder_mw.schemas.agent_context import AgentContext

__all__ = [
    "Action",
    "BackendMetrics",
    "Decision",
    "Forward",
    "Hold",
    "Paused",
    "Prefill",
    "ReclaimTools",
    "Reject",
    "Released",
    "RequestInfo",
    "Resumed",
    "SchedulerCore",
]


class SchedulerCore(FleetEvents):
    """Programs and backends; `handle(event)` applies an event and returns its `Outcome`
    (the `_on_*` methods behind it are private), whose actions the caller carries out."""

    def __init__(
        self,
        backends: Iterable[tuple[str, int | None]],
        stages: Sequence[Stage] = (),
        *,
        default_output_tokens: int = 256,
        chars_per_token: float = 4.0,
    ) -> None:
        super().__init__(backends, stages, default_output_tokens, chars_per_token)
        for stage in self.stages:
            self._run(stage.bind(self._stage_view), 0.0)
        # One dict lookup per event: cheaper than a `match` over seventeen types.
        self._handlers: dict[type[ev.Event], Callable[[Any], ev.Outcome]] = {
            ev.RequestArrived: self._handle_request,
            ev.CallFinished: lambda e: ev.Outcome(
                self._on_finished(e.program_id, e.usage, e.ok, e.now)
            ),
            ev.ClientLeft: lambda e: ev.Outcome(self._on_abandoned(e.program_id, e.now)),
            ev.HoldExpired: lambda e: ev.Outcome(
                self._on_hold_expired(e.program_id, e.now, place=e.place)
            ),
            ev.ReleaseRequested: self._handle_release,
            ev.Tick: lambda e: ev.Outcome(self._on_tick(e.now)),
            ev.ProgramAdopted: lambda e: ev.Outcome(
                [], program=self._on_adopted(e.ctx, e.history, e.now).snapshot()
            ),
            ev.TakenOver: lambda e: ev.Outcome(
                self._on_taken_over(e.program_id, e.backend, e.reserved_tokens, e.now)
            ),
            ev.BackendChanged: lambda e: ev.Outcome(
                self._on_backend(
                    e.label,
                    healthy=e.healthy,
                    capacity=e.capacity,
                    max_model_len=e.max_model_len,
                    metrics=e.metrics,
                    now=e.now,
                )
            ),
            ev.ForeignReservations: lambda e: ev.Outcome(
                self._on_foreign_reservations(e.label, e.tokens, e.now)
            ),
            ev.BackendAdded: lambda e: ev.Outcome(
                self._on_backend_added(e.label, e.capacity, e.now, healthy=e.healthy)
            ),
            ev.BackendDrained: lambda e: ev.Outcome(self._on_backend_drained(e.label, e.now)),
            ev.BackendRemoved: lambda e: ev.Outcome(self._on_backend_removed(e.label, e.now)),
            ev.CachesFlushed: lambda e: ev.Outcome(self._on_caches_flushed(e.now, e.labels)),
            ev.ConnectionRefused: lambda e: ev.Outcome(
                [], backend=self._on_connection_refused(e.program_id, e.failed_backend, e.now)
            ),
            ev.HostTierDeclared: self._handle_host_tier,
            ev.DecisionsApplied: lambda e: ev.Outcome(
                self._on_decisions_applied(e.decisions, e.now)
            ),
        }

    def handle(self, event: ev.Event) -> ev.Outcome:
        """The one entry point: apply `event`, return what was decided (one shape for all)."""
        return self._handlers[type(event)](event)

    def _handle_request(self, event: ev.RequestArrived) -> ev.Outcome:
        decision, actions = self._on_request(event.ctx, event.info, event.now)
        return ev.Outcome(actions, decision=decision)

    def _handle_release(self, event: ev.ReleaseRequested) -> ev.Outcome:
        found, actions = self._on_release(event.program_id, event.reason, event.now)
        return ev.Outcome(actions, found=found)

    def _handle_host_tier(self, event: ev.HostTierDeclared) -> ev.Outcome:
        self._on_host_tier_declared(event.label, event.tokens, event.load_tokens_per_s)
        return ev.Outcome([])

    # ================================================================ program events
    def _on_request(
        self, ctx: AgentContext, info: RequestInfo, now: float
    ) -> tuple[Decision, list[Action]]:
        """A request of `ctx.program_id` arrived: forward it, hold it, or reject it."""
        self._actions = []
        healthy = [b for b in self.backends.values() if b.healthy]
        if not healthy:
            # Fail fast rather than hold a client on a fleet that is entirely down.
            reject = Reject(ctx.program_id, 503, "no_backend", "no healthy backend is available")
            return reject, []
        known = self.table.get(ctx.program_id)
        # The prompt's estimate on the program's engine (`touch` below keeps its engine).
        home = known.backend if known is not None else None
        prompt = self.tokens.prompt_tokens(info.prompt_chars, home)
        # A body shorter than the program's last one is a rewritten conversation (compacted,
        # summarised, reset): an append never shrinks it. Its context is then this prompt,
        # not the longer one the engine last reported, which must neither make it too large
        # to plan (sent unplanned, or held for an empty engine) nor reserve room for it.
        rewritten = known is not None and info.prompt_chars < known.last_prompt_chars
        floor = prompt if known is None or rewritten else max(prompt, known.context_tokens)
        too_large = self._too_large(ctx, info, healthy, known, floor)
        if too_large is not None:
            return too_large, []
        program, created = self.table.touch(ctx, now)
        if ctx.final:
            program.final_requested = True
        if not created and program.in_flight == 0 and program.waiting == 0 and program.steps > 0:
            gap = max(0.0, now - program.acting_since)
            program.tool_time_ema_s = self.tool_time.observe(
                program.session_type, program.tool_time_ema_s, gap
            )
        program.last_prompt_chars = info.prompt_chars
        if rewritten:
            program.context_tokens = prompt
        program.last_active_at = now
        if info.prefix_key is not None:
            program.prefix_key = info.prefix_key
            program.prefix_tokens = self.tokens.prompt_tokens(info.prefix_chars, program.backend)
        request_tokens = self._request_tokens(program, info, prompt)
        # Stages see the arriving request's footprint (route decides per request on it).
        program.request_tokens = request_tokens
        for on_request in self._request_hooks:
            decisions = on_request(self._stage_view, program.view, now)
            if decisions or self._consumed:  # most hooks decide nothing: ()
                self._run(decisions, now)
        backend = self.backends.get(program.backend) if program.backend else None
        if program.state is ProgramState.ACTIVE and backend is not None and backend.healthy:
            routed = self._route(program, now)
            if routed is not None and routed != program.backend:
                self._move(program, routed)
            program.in_flight += 1
            program.phase = Phase.REASONING
            kept = 0 if rewritten else program.reserved_tokens
            self.ledger.reserve(program, max(request_tokens, kept))
            self._reindex(program)
            assert program.backend is not None
            self._changed(program.backend, now)
            forward = Forward(program.program_id, program.backend, self._kv_ttl(program, now))
            return forward, self._take()
        if program.state is ProgramState.ACTIVE:
            self._unplace(program, now)  # its backend is down: wait to be placed elsewhere
        program.waiting += 1
        if program.queued_at is None:
            program.queued_at = now
            self.queued += 1
            self.queue_fifo.append((now, program))
        self._reindex(program)
        self._resume_pass(now)
        if program.state is ProgramState.ACTIVE and program.backend is not None:
            # Admitted in this very event: the arriving request runs now.
            forward = Forward(program.program_id, program.backend, self._kv_ttl(program, now))
            return forward, self._take()
        limits = [b.limit(1.0) for b in self.backends.values() if b.healthy]
        alone = all(limit is not None and request_tokens > limit for limit in limits)
        return Hold(program.program_id, alone), self._take()

    def _on_finished(
        self, program_id: str, usage: Usage | None, ok: bool, now: float
    ) -> list[Action]:
        """A forwarded call ended: answered (ok), failed, or its client went away."""
        self._actions = []
        program = self.table.get(program_id)
        if program is None or program.in_flight == 0:
            return self._take()
        program.in_flight -= 1
        program.last_active_at = now
        if ok:
            program.steps += 1
            if usage is not None:
                program.context_tokens = usage.prompt_tokens + usage.completion_tokens
                program.prompt_tokens += usage.prompt_tokens
                program.completion_tokens += usage.completion_tokens
                program.cached_tokens += usage.cached_tokens
                if program.backend is not None:
                    self.tokens.learn(
                        program.backend, program.last_prompt_chars, usage.prompt_tokens
                    )
        else:
            program.failures += 1
        if program.in_flight == 0:
            program.phase = Phase.ACTING
            program.acting_since = now
        for on_finished in self._finished_hooks:
            decisions = on_finished(self._stage_view, program.view, usage, ok, now)
            if decisions or self._consumed:  # most hooks decide nothing: ()
                self._run(decisions, now)
        if program.in_flight == 0 and self._share_hooks:
            program.idle_share = self._idle_share(program, now)
        if program.in_flight == 0 and (program.ephemeral or program.final_requested):
            self._release(program, "ephemeral" if program.ephemeral else "final", now)
        else:
            if program.state is ProgramState.ACTIVE:
                home = self.backends.get(program.backend) if program.backend else None
                if program.in_flight == 0 and home is not None and not home.healthy:
                    # Its engine is down: nothing stays counted against it; the program's
                    # next request is placed afresh on a healthy one.
                    self._unplace(program, now)
                elif program.pause_pending and program.in_flight == 0:
                    self._pause_now(program, now, "after_reasoning")
                elif program.steps == 0 and program.in_flight == 0:
                    # No call of it ever succeeded: the engine holds no context of it worth
                    # keeping room for, so the failed call's reservation goes whole.
                    self.ledger.reserve(program, 0)
                else:
                    self.ledger.reserve(program, self.ledger.footprint(program))
            self._reindex(program)
            if program.backend is not None:
                self._changed(program.backend, now)
        self._resume_pass(now)
        return self._take()

    def _on_abandoned(self, program_id: str, now: float) -> list[Action]:
        """A held request's client went away before it ran."""
        self._actions = []
        program = self.table.get(program_id)
        if program is None or program.waiting == 0:
            return self._take()
        program.waiting -= 1
        if program.waiting == 0:
            self._dequeue(program)
            if (
                program.steps == 0
                and program.in_flight == 0
                and program.state is not ProgramState.ACTIVE
            ):
                self._release(program, "abandoned", now)
                return self._take()
        self._reindex(program)
        self._resume_pass(now)
        return self._take()

    def _on_hold_expired(self, program_id: str, now: float, *, place: bool) -> list[Action]:
        """A held request waited past its deadline. `place`: put its program on the healthy
        engine with the most room now (its home first), as a forced resume — the request
        could only ever run alone and the engine copes with it as its own scheduler can;
        otherwise (or with no healthy engine) it leaves the queue, as if abandoned."""
        program = self.table.get(program_id)
        healthy = self.healthy_backends()
        if place and program is not None and healthy and program.state is not ProgramState.ACTIVE:
            self._actions = []
            home = self.backends.get(program.backend) if program.backend else None
            target = home if home is not None and home.healthy else max(healthy, key=self.room)
            self._resume(program, target.label, now, forced=True)
            return self._take()
        return self._on_abandoned(program_id, now)

    def _on_release(self, program_id: str, reason: str, now: float) -> tuple[bool, list[Action]]:
        self._actions = []
        program = self.table.get(program_id)
        if program is None:
            return False, self._take()
        self._release(program, reason, now)
        self._resume_pass(now)
        return True, self._take()

    def _on_tick(self, now: float) -> list[Action]:
        self._actions = []
        self.ledger.room_epoch += 1
        for on_tick in self._tick_hooks:
            self._run(on_tick(self._stage_view, now), now)
        self._resume_pass(now)
        self._drop_stale_entries()
        return self._take()

    def _on_adopted(self, ctx: AgentContext, history: ProgramHistory, now: float) -> Program:
        """Another replica's program is known here: carry its history into this table (the
        newer record wins; `ctx` creates it if new), not placed; its home is where placement
        looks first."""
        program = self.table.get(ctx.program_id)
        if program is None:
            program, _ = self.table.touch(ctx, now)
            program.source = history.source
        if history.steps >= program.steps:
            program.steps = history.steps
            program.context_tokens = history.context_tokens
            program.prompt_tokens = history.prompt_tokens
            program.completion_tokens = history.completion_tokens
            program.cached_tokens = history.cached_tokens
            program.failures = history.failures
            program.pauses = history.pauses
            program.migrations = history.migrations
            program.tool_time_ema_s = history.tool_time_ema_s
            if history.expected_output_tokens is not None:
                program.expected_output_tokens = history.expected_output_tokens
        if program.state is not ProgramState.ACTIVE and history.backend in self.backends:
            program.backend = history.backend
        return program

    def _on_taken_over(
        self, program_id: str, backend: str, reserved_tokens: int, now: float
    ) -> list[Action]:
        """An admitted program another replica placed on `backend` continues here: it is
        placed there as it is, no new admission, and its `reserved_tokens` leave the other
        replicas' share. Placed first, then taken out of it: the room never looks free in
        between."""
        self._actions = []
        program = self.table.get(program_id)
        if program is None or program.state is ProgramState.ACTIVE or backend not in self.backends:
            return self._take()
        self._resume(program, backend, now)
        actions = self._take()
        self.counters["takeovers"] += 1
        share = self.backends[backend].foreign_reserved - reserved_tokens
        return actions + self._on_foreign_reservations(backend, share, now)

    def _on_decisions_applied(self, decisions: Iterable[StageDecision], now: float) -> list[Action]:
        """Decisions made outside the pipeline (an operator's, a test's), applied as a
        stage's would be."""
        self._actions = []
        self._run([d for d in map(self._on_live_program, decisions) if d is not None], now)
        return self._take()

    def _on_live_program(self, decision: StageDecision) -> StageDecision | None:
        """`decision` on the core's own program, named as a stage's would (by its view): one
        made outside the core names its program by a snapshot, the only kind that leaves it
        (None: the program has gone since)."""
        if not isinstance(decision, Pause | Resume | Release):
            return decision
        if isinstance(decision.program, ReadOnlyProgram):
            return decision
        program = self.table.get(decision.program.program_id)
        if program is None:
            return None
        return msgspec.structs.replace(decision, program=program.view)

    # ================================================================ request arithmetic
    def _too_large(
        self,
        ctx: AgentContext,
        info: RequestInfo,
        eligible: list[BackendState],
        known: Program | None,
        prompt: int,
    ) -> Reject | Forward | None:
        """A request past every healthy engine's limit never waits for room (it would wait
        forever, and pause others for it): refused, or sent to an engine unplanned.
        `eligible`: the healthy engines; `known`: its program, if any; `prompt`: the
        estimate of its prompt's tokens, at least its context as the engine last reported
        unless the conversation was rewritten."""
        home = known.backend if known is not None else None
        estimate = prompt + (info.max_tokens or 0)
        text = info.prompt_text_chars
        if text is None and info.prompt_body is None:
            text = info.prompt_chars
        if text is None:
            # First with a bound on the characters the body's size allows: only a request
            # that bound would refuse has its prompt fields counted.
            bound = context_limit.prompt_chars_bound(info.prompt_chars)
            verdict = context_limit.check(eligible, bound, info.max_tokens, estimate)
            if isinstance(verdict, context_limit.Refusal):
                text = context_limit.prompt_text_chars(info.prompt_body or {})
        if text is not None:
            verdict = context_limit.check(eligible, text, info.max_tokens, estimate)
        if isinstance(verdict, context_limit.Refusal):
            self.counters["context_length_refusals"] += 1
            return Reject(
                ctx.program_id, 400, "context_length_exceeded", verdict.message, verdict.param
            )
        if isinstance(verdict, context_limit.Unplanned):
            self.counters["unplanned_forwards"] += 1
            target = self.backends[verdict.backend]
            own = self.backends.get(home) if home is not None else None
            if own is not None and own.healthy and own.max_model_len == target.max_model_len:
                target = own  # as long a model at home, where its prefix may be cached
            return Forward(ctx.program_id, target.label, planned=False)
        return None

    def _request_tokens(self, program: Program, info: RequestInfo, prompt: int) -> int:
        output = (
            info.max_tokens
            or program.expected_output_tokens
            or (program.completion_tokens // program.steps if program.steps else 0)
            or self.default_output_tokens
        )
        return max(program.context_tokens, prompt) + output + self.buffer_tokens
