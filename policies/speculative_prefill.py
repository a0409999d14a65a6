"""Speculative prefill: warm a program's KV on the engine it will run on while its tool runs.

When a paused program is placed again while it is still ACTING (resumed, or moved to
another engine), its next call would recompute its whole context on arrival. This stage
emits a `Prefill` action instead: the gateway (or the benchmark harness) sends that engine
a one-token request with the program's last prompt and answer, so the recompute overlaps
the tool call and the next call hits the cache (Dynamo's `agent_hints.speculative_prefill`;
KVFlow's prefetch before an agent's next step).

With `prefetch_before_s` set, the stage also resumes paused, idle programs ahead of their
return — when nobody is queued and an engine has room for the program's next request — the
expected return being the tool-time estimate (policies/estimates.py). Pure policy: the
request itself is I/O (middleware/speculative_prefill.py live, benchmarks/des.py simulated).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from thunder_mw.policies.decisions import Count, Prefill, Resume, StageDecision
from thunder_mw.policies.program_table import Phase, ProgramState, Usage
from thunder_mw.policies.stage_contract import Decisions, Stage, StageView
from thunder_mw.policies.views import ProgramView

# Re-exported: stage authors and older code import these names from here.
from thunder_mw.schemas.stage_params import SpeculativePrefillParams as SpeculativePrefillParams
from thunder_mw.schemas.stage_params import StageParams as StageParams

__all__ = ["SpeculativePrefill", "SpeculativePrefillParams"]


class SpeculativePrefill(Stage):
    """Emits `Prefill(program, backend)` whenever a program is placed while ACTING."""

    name = "speculative_prefill"
    Params = SpeculativePrefillParams
    params: SpeculativePrefillParams

    def __init__(self, params: StageParams | None = None) -> None:
        super().__init__(params)
        # (expected return - lead, acting_since, program id): candidates to prefetch.
        self._returns: list[tuple[float, float, str]] = []
        self._prefetching = False

    def wants(self, program: ProgramView) -> bool:
        """The program's own hint, else the stage's default; and a context worth warming."""
        wanted = program.speculative_prefill
        if wanted is None:
            wanted = self.params.default
        return wanted and program.context_tokens >= self.params.min_context_tokens

    def on_resumed(
        self, view: StageView, program: ProgramView, previous: str | None, now: float
    ) -> Decisions:
        if (
            program.in_flight == 0
            and program.waiting == 0
            and program.steps > 0
            and program.phase is Phase.ACTING
            and program.backend is not None
            and self.wants(program)
        ):
            reason = "prefetch" if self._prefetching else "resume"
            return (
                Prefill(program.program_id, program.backend, program.context_tokens, reason),
                Count("speculative_prefills"),
            )
        return ()

    # -- prefetch
    def on_finished(
        self, view: StageView, program: ProgramView, usage: Usage | None, ok: bool, now: float
    ) -> Decisions:
        lead = self.params.prefetch_before_s
        if lead is None or not ok or program.in_flight or not self.wants(program):
            return ()
        due = now + view.expected_tool_time(program) - lead
        heapq.heappush(self._returns, (due, program.acting_since, program.program_id))
        return ()

    def on_tick(self, view: StageView, now: float) -> Iterator[StageDecision]:
        heap = self._returns
        # Due while still placed on its engine, in the same tool call: its KV is there and
        # nothing needs warming yet, but it may be paused before it returns (an engine
        # drained, pressure): kept for the next ticks, not dropped (a drain one tick after
        # the due time once left such a program cold).
        placed: list[tuple[float, float, str]] = []
        try:
            yield from self._prefetch_due(view, heap, placed, now)
        finally:
            for entry in placed:
                heapq.heappush(heap, entry)

    def _prefetch_due(
        self,
        view: StageView,
        heap: list[tuple[float, float, str]],
        placed: list[tuple[float, float, str]],
        now: float,
    ) -> Iterator[StageDecision]:
        while heap and heap[0][0] <= now:
            if view.queue_length() > 0:
                # Programs with a request waiting come first; a prefetch would take their room.
                return
            entry = heapq.heappop(heap)
            _, since, program_id = entry
            program = view.program(program_id)
            if (
                program is None
                or program.in_flight
                or program.waiting
                or program.acting_since != since
            ):
                continue  # released, or back with a request since
            if program.state is not ProgramState.PAUSED:
                placed.append(entry)
                continue
            target = self._room_for(view, program, now)
            if target is not None:
                yield Count("prefetch_resumes")
                # Applied while this hook waits: its `on_resumed` warms it as a prefetch.
                self._prefetching = True
                try:
                    yield Resume(program, target)
                finally:
                    self._prefetching = False

    def _room_for(self, view: StageView, program: ProgramView, now: float) -> str | None:
        """Its previous engine if that admits it with room for its next request; else (its
        engine gone, or `prefetch_elsewhere`) the admitting engine with the most room; None
        when none has room (no one is displaced)."""
        need = program.request_tokens or program.context_tokens
        fitting = [
            b
            for b in view.healthy_backends()
            if view.room(b) >= need and view.admits(program, b, now)
        ]
        if not fitting:
            return None
        home = next((b for b in fitting if b.label == program.backend), None)
        if home is not None:
            return home.label
        own = view.backends.get(program.backend) if program.backend else None
        if own is not None and own.healthy and not self.params.prefetch_elsewhere:
            return None  # it waits for room at home, where its KV may still be
        return max(fitting, key=view.room).label
