"""Where programs run: placing queued programs, pausing and resuming them, the indexes
that keep each of those O(log n), and the one place where stages' decisions are applied."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any, cast

from thunder_mw.policies._backend_state import BackendState
from thunder_mw.policies.core_view import CoreView, ReadOnlyCore
from thunder_mw.policies.decisions import (
    Count,
    Footprint,
    Pause,
    Paused,
    PlanBackend,
    Reject,
    Release,
    Released,
    Reorder,
    Resume,
    Resumed,
    StageDecision,
)
from thunder_mw.policies.program_table import Phase, Program, ProgramState
from thunder_mw.policies.views import ProgramView

__all__ = ["Placement"]


class Placement(CoreView):
    """The mechanics the pipeline's stages share: reservations, the global queue, pause and
    resume. Every method here changes state; it is called by an event or a decision."""

    # ================================================================ stages' decisions
    def _run(self, decisions: Iterable[StageDecision], now: float) -> bool:
        """Applies a hook's decisions in the order it returns them; True if it made any.
        Victims the hook took off a pause order and left unpaused go back once the
        outermost hook of the event is done (a list-returning hook took them before)."""
        self._depth += 1
        made = False
        try:
            for decision in decisions:
                made = True
                self._apply(decision, now)
        finally:
            self._depth -= 1
        if self._consumed and not self._depth:
            self._restore()
        return made

    def _apply(self, decision: StageDecision, now: float) -> None:
        kind = type(decision)
        # A decision names a program by the view its stage was given (or, made outside the
        # core, by the view `_on_decisions_applied` found): applied to the core's own.
        if kind is Pause:
            pause = cast(Pause, decision)
            self._pause(_program(pause.program), now, pause.reason)
        elif kind is PlanBackend:
            plan = cast(PlanBackend, decision)
            backend = self.backends[plan.label]
            if plan.overflow_tokens is not None:
                backend.overflow_tokens = plan.overflow_tokens
            if plan.resident_ratio is not None:
                backend.resident_ratio = plan.resident_ratio
        elif kind is Resume:
            resume = cast(Resume, decision)
            self._resume(_program(resume.program), resume.backend, now, resume.forced)
        elif kind is Release:
            release = cast(Release, decision)
            self._release(_program(release.program), release.reason, now)
        elif kind is Count:
            self.counters[cast(Count, decision).name] += 1
        elif kind is Footprint:
            footprint, ledger = cast(Footprint, decision), self.ledger
            if footprint.buffer_tokens is not None:
                ledger.buffer_tokens = footprint.buffer_tokens
            if footprint.acting_weight is not None:
                ledger.acting_weight = footprint.acting_weight
            if footprint.dedupe_prefixes is not None:
                ledger.dedupe_prefixes = footprint.dedupe_prefixes
        elif kind is Reorder:
            queue = cast(Reorder, decision).queue
            for program in [
                p for p in self.table if p.state is ProgramState.ACTIVE or (queue and p.waiting > 0)
            ]:
                self._reindex(program)
        else:  # an action for the caller (ReclaimTools, Prefill)
            self._actions.append(decision)  # type: ignore[arg-type]

    # ================================================================ pause and resume
    def _pause(self, program: Program, now: float, reason: str = "acting") -> None:
        """Pause a program: at once when ACTING; after its call when REASONING."""
        if program.state is not ProgramState.ACTIVE or program.pause_pending:
            return
        backend = self.backends[program.backend] if program.backend else None
        if program.in_flight > 0 and backend is not None:
            self.ledger.mark_pending(program, backend)
            self._actions.append(Paused(program.program_id, backend.label, "after_reasoning", True))
            self.counters["pauses_marked"] += 1
            self._reindex(program)
            return
        self._pause_now(program, now, reason)

    def _pause_now(self, program: Program, now: float, reason: str) -> None:
        backend = program.backend or ""
        self.ledger.unreserve(program)
        self.table.uncount_active(program)
        program.state = ProgramState.PAUSED
        program.paused_at = now
        program.pauses += 1
        self.counters["pauses"] += 1
        self._actions.append(Paused(program.program_id, backend, reason, False))
        self._reindex(program)

    def _resume(self, program: Program, backend: str, now: float, forced: bool = False) -> None:
        waited = now - program.queued_at if program.queued_at is not None else None
        self._dequeue(program)
        previous = program.backend
        admitted = program.steps == 0 and program.in_flight == 0 and previous is None
        program.state = ProgramState.ACTIVE
        program.backend = backend
        self.table.count_active(program)
        if program.paused_at is not None:
            program.paused_total_s += now - program.paused_at
            program.paused_at = None
        if previous is not None and previous != backend:
            program.migrations += 1
            self.counters["migrations"] += 1
        program.in_flight += program.waiting
        program.waiting = 0
        if program.in_flight:
            program.phase = Phase.REASONING
        self.ledger.reserve(program, self.ledger.footprint(program))
        self._reindex(program)
        self.counters[
            "forced_resumes" if forced else ("admissions" if admitted else "resumes")
        ] += 1
        ttl = self._kv_ttl(program, now) if program.in_flight else None
        self._actions.append(Resumed(program.program_id, backend, previous, forced, admitted, ttl))
        for resumed in self._resumed_hooks:
            decisions = resumed(self._stage_view, program.view, previous, now)
            if decisions or self._consumed:  # most hooks decide nothing: ()
                self._run(decisions, now)
        if waited is not None and not forced:
            for queue_wait in self._wait_hooks:
                decisions = queue_wait(self._stage_view, program.view, waited, now)
                if decisions or self._consumed:  # most hooks decide nothing: ()
                    self._run(decisions, now)
        self._changed(backend, now)

    def _move(self, program: Program, target: str) -> None:
        tokens = program.reserved_tokens
        self.ledger.unreserve(program)
        self.table.uncount_active(program)
        program.backend = target
        self.table.count_active(program)
        self.ledger.reserve(program, tokens)

    def _unplace(self, program: Program, now: float) -> None:
        self.ledger.unreserve(program)
        self.table.uncount_active(program)
        program.state = ProgramState.PAUSED
        program.paused_at = now

    def _backend_down(self, backend: BackendState, now: float) -> None:
        """Rare event: one O(n) pass hands the engine's idle programs back to the queue side,
        so nothing stays counted against an engine the gateway no longer uses. Programs with
        a call in flight there leave it when that call ends (`CallFinished`)."""
        backend.healthy = False
        self.ledger.room_epoch += 1
        for program in list(self.table):
            if (
                program.backend == backend.label
                and program.state is ProgramState.ACTIVE
                and program.in_flight == 0
            ):
                self._unplace(program, now)
                self._reindex(program)

    def _release(self, program: Program, reason: str, now: float) -> None:
        if program.waiting:
            self._actions.append(
                Reject(
                    program.program_id,
                    409,
                    "program_released",
                    f"program {program.program_id!r} was released ({reason}) while its "
                    "request was waiting to be scheduled",
                )
            )
            program.waiting = 0
        self._dequeue(program)
        backend = program.backend if program.state is ProgramState.ACTIVE else None
        self.ledger.unreserve(program)
        self.table.remove(program.program_id)
        self.counters[f"released_{reason}"] += 1
        self._actions.append(Released(program.program_id, reason, tuple(program.docker_ids)))
        for released in self._release_hooks:
            decisions = released(self._stage_view, program.view, reason, now)
            if decisions or self._consumed:  # most hooks decide nothing: ()
                self._run(decisions, now)
        if backend is not None:
            self._changed(backend, now)

    # ================================================================ the global queue
    def _place(self, program: Program, now: float) -> str | None:
        for place in self._place_hooks:
            target: str | None = place(self._stage_view, program.view, now)
            if target is not None:
                return target if target != "" else None
        # Default: sticky, fewest programs, among backends that admit it.
        healthy = self.healthy_backends()
        home = self.backends.get(program.backend) if program.backend else None
        if home is not None and home.healthy and self.admits(program, home, now):
            return home.label
        fitting = [b for b in healthy if self.admits(program, b, now)]
        if not fitting:
            return None
        return min(fitting, key=lambda b: self.table.programs_on(b.label)).label

    def _resume_pass(self, now: float) -> None:
        """Resume queued programs in queue order while the head fits somewhere.

        Strict order (no back-filling past a head that does not fit) keeps large programs
        from starving and bounds the work per event by the number of programs resumed."""
        while True:
            top = self.queue.peek()
            if top is None:
                return
            program = top[1]
            blocked = (id(program), program.version, self.ledger.room_epoch)
            if blocked == self._blocked:
                return
            target = self._place(program, now)
            if target is None:
                # A stage may free room for the head (e.g. from programs idle in long tools).
                for queue_blocked in self._blocked_hooks:
                    if self._run(queue_blocked(self._stage_view, program.view, now), now):
                        target = self._place(program, now)
                        break
                if target is None:
                    self._blocked = (id(program), program.version, self.ledger.room_epoch)
                    return
            self._resume(program, target, now)

    def _dequeue(self, program: Program) -> None:
        if program.queued_at is not None:
            program.queued_at = None
            self.queued -= 1
            program.version += 1  # drop its queue entries

    def _reindex(self, program: Program) -> None:
        program.version += 1
        stamp = program.version
        if program.state is ProgramState.ACTIVE and not program.pause_pending and program.backend:
            backend = self.backends[program.backend]
            if program.in_flight == 0:
                backend.acting.push(self.victim_key(program, True), program, stamp)
            else:
                backend.reasoning.push(self.victim_key(program, False), program, stamp)
        if program.waiting > 0 and program.state is not ProgramState.ACTIVE:
            assert program.queued_at is not None
            self.queue.push(self._queue_key(program), program, stamp)
        if program.in_flight == 0 and program.waiting == 0:
            self.idle.push(program.last_active_at, program, stamp)

    def _drop_stale_entries(self) -> None:
        """Compacts the indexes once stale entries outnumber live ones, so a program that
        ended (expired above all: no later event touches it) is referenced by none of them
        within a tick, whatever the pipeline. Amortised O(1) per entry pushed."""
        live = len(self.table)
        self.idle.compact_if_sparse(live)
        self.queue.compact_if_sparse(live)
        for backend in self.backends.values():
            backend.acting.compact_if_sparse(live)
            backend.reasoning.compact_if_sparse(live)
        fifo = self.queue_fifo
        if len(fifo) > 2 * self.queued:
            # Only `next_overdue` pops this FIFO, and only from its front.
            self.queue_fifo = collections.deque(
                (queued_at, program)
                for queued_at, program in fifo
                if program.queued_at == queued_at and program.state is not ProgramState.TERMINATED
            )

    # ================================================================ stages' answers
    def _queue_key(self, program: Program) -> Any:
        for key_of in self._queue_hooks:
            key = key_of(self._stage_view, program.view)
            if key is not None:
                return key
        return (program.queued_at,)

    def _route(self, program: Program, now: float) -> str | None:
        target: str | None = _first_answer(self._route_hooks, self._stage_view, program, now)
        return target

    def _idle_share(self, program: Program, now: float) -> float | None:
        share: float | None = _first_answer(self._share_hooks, self._stage_view, program, now)
        return share

    def _kv_ttl(self, program: Program, now: float) -> float | None:
        ttl: float | None = _first_answer(self._ttl_hooks, self._stage_view, program, now)
        return ttl

    def _changed(self, backend: str, now: float) -> None:
        state = self.backends.get(backend)
        if state is None:
            return
        for changed in self._change_hooks:
            decisions = changed(self._stage_view, state.view, now)
            if decisions or self._consumed:  # most hooks decide nothing: ()
                self._run(decisions, now)


def _first_answer(
    hooks: list[Callable[..., Any]], view: ReadOnlyCore, program: Program, now: float
) -> Any:
    """A question hook's answer: the first stage's that is not None (None: no opinion)."""
    for hook in hooks:
        answer = hook(view, program.view, now)
        if answer is not None:
            return answer
    return None


# The core's own program behind the view a decision names (its private back-reference:
# only the core follows it).
_program: Callable[[ProgramView], Program] = attrgetter("_program")
