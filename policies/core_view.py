"""The scheduler core's state and its read-only queries, and `ReadOnlyCore`: the core as its
stages see it, what `StageView` promises them.

`SchedulerCore` (policies/core.py) is built on `CoreView`: the event handlers change the
state declared here. Stages get the core's one `ReadOnlyCore`, which answers `StageView`'s
queries and nothing else, with the live programs and engines behind read-only views
(`ReadOnlyProgram`, `ReadOnlyBackend`, each made once with its record); what leaves the
core is a frozen `ProgramSnapshot` (`snapshot`, `snapshots`), taken when it is asked for,
and engines as their read-only views (`backend_views`; docs/architecture.md, "The core's
boundary").
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from thunder_mw.policies._backend_state import BackendState, ReadOnlyBackend, is_live
from thunder_mw.policies._lazy_heap import LazyHeap
from thunder_mw.policies._reservations import Ledger
from thunder_mw.policies.decisions import Action
from thunder_mw.policies.estimates import TokenEstimator, ToolTimeModel
from thunder_mw.policies.program_table import (
    Phase,
    Program,
    ProgramSnapshot,
    ProgramState,
    ProgramTable,
)
from thunder_mw.policies.stage_contract import HOOKS, Stage, overriding
from thunder_mw.policies.views import BackendView, ProgramView

__all__ = ["CoreView", "Pick", "ReadOnlyCore"]

# A choice among the live programs, for `snapshots`: those to copy, in the order to keep.
Pick = Callable[[Iterable[ProgramView]], Iterable[ProgramView]]


class CoreView:
    """Programs, backends, the indexes over them, and the queries stages may ask."""

    def __init__(
        self,
        backends: Iterable[tuple[str, int | None]],
        stages: Iterable[Stage],
        default_output_tokens: int,
        chars_per_token: float,
    ) -> None:
        self.table = ProgramTable()
        self.backends: dict[str, BackendState] = {
            label: BackendState(label, capacity, True, is_live) for label, capacity in backends
        }
        # The engines' read-only views, kept in step with `backends` (an engine joins or
        # leaves: policies/_fleet_events.py), read through one read-only mapping.
        self._backend_views: dict[str, ReadOnlyBackend] = {
            label: backend.view for label, backend in self.backends.items()
        }
        self._read_backends: Mapping[str, ReadOnlyBackend] = MappingProxyType(self._backend_views)
        self.stages = list(stages)
        self.tokens = TokenEstimator(chars_per_token)
        self.tool_time = ToolTimeModel()
        self.default_output_tokens = default_output_tokens
        self.ledger = Ledger(self.backends)
        self.queue: LazyHeap[Program] = LazyHeap(is_live)
        self.queue_fifo: collections.deque[tuple[float, Program]] = collections.deque()
        self.idle: LazyHeap[Program] = LazyHeap(is_live)
        self.queued = 0
        # A queue head that fit nowhere still fits nowhere until room appears (the ledger's
        # epoch moves): skip re-placing it.
        self._blocked: tuple[int, int, int] | None = None
        self._actions: list[Action] = []
        # Index entries a stage consumed through `next_victim`, put back unless paused.
        self._consumed: list[tuple[LazyHeap[Program], bool, Program, int]] = []
        self._depth = 0  # hooks being run, nested through the decisions they return
        self.counters: collections.Counter[str] = collections.Counter()
        # Each hook, bound, of the stages that override it (the others have no opinion).
        hooks: dict[str, list[Callable[..., Any]]] = {
            name: overriding(self.stages, name) for name in HOOKS
        }
        self._place_hooks = hooks["place"]
        self._route_hooks = hooks["route"]
        self._victim_hooks = hooks["victim_key"]
        self._queue_hooks = hooks["queue_key"]
        self._ttl_hooks = hooks["kv_ttl"]
        self._share_hooks = hooks["idle_share"]
        self._admit_hooks = hooks["admits"]
        self._request_hooks = hooks["on_request"]
        self._finished_hooks = hooks["on_finished"]
        self._change_hooks = hooks["on_backend_change"]
        self._tick_hooks = hooks["on_tick"]
        self._blocked_hooks = hooks["on_queue_blocked"]
        self._release_hooks = hooks["on_release"]
        self._resumed_hooks = hooks["on_resumed"]
        self._wait_hooks = hooks["on_queue_wait"]
        # What every hook is given as its `view` (never the core itself).
        self._stage_view = ReadOnlyCore(self)

    # ================================================================ footprint, as bound
    @property
    def acting_weight(self) -> float:
        return self.ledger.acting_weight

    @property
    def buffer_tokens(self) -> int:
        return self.ledger.buffer_tokens

    @property
    def dedupe_prefixes(self) -> bool:
        return self.ledger.dedupe_prefixes

    # ================================================================ queries
    def program(self, program_id: str) -> Program | None:
        return self.table.get(program_id)

    def backend_views(self) -> Mapping[str, ReadOnlyBackend]:
        """The engines by label, each read-only and always current (the gauges, the
        dashboard and replication read these; the live `BackendState`s stay the core's)."""
        return self._read_backends

    def counts(self) -> Mapping[str, int]:
        """The core's event counters, read-only (the live Counter stays the core's own)."""
        return MappingProxyType(self.counters)

    def pipeline(self) -> tuple[Stage, ...]:
        """The stages, in pipeline order (for the I/O layers that pair with one)."""
        return tuple(self.stages)

    def program_count(self) -> int:
        return len(self.table)

    def programs_on(self, label: str) -> int:
        return self.table.programs_on(label)

    def programs(self) -> list[Program]:
        return list(self.table)

    # -- what leaves the core: frozen snapshots (the live `Program`s above are the stages')
    def snapshot(self, program_id: str) -> ProgramSnapshot | None:
        """`program_id` as it is now, frozen (None: not in the table)."""
        program = self.table.get(program_id)
        return None if program is None else program.snapshot()

    def snapshots(self, pick: Pick | None = None) -> list[ProgramSnapshot]:
        """Every program, frozen; or those `pick` chooses, as it orders them. `pick` reads the
        live programs (read-only, while the core does nothing else) and only what it returns
        is copied: the dashboard's ten largest of 10,000 programs cost ten copies, not
        10,000 (3 ms instead of 27 per dashboard state)."""
        if pick is None:
            return [program.snapshot() for program in self.table]
        chosen = (self.table.get(view.program_id) for view in pick(p.view for p in self.table))
        return [program.snapshot() for program in chosen if program is not None]

    def knows(self, program_id: str) -> bool:
        return program_id in self.table

    def speculative_prefill_hint(self, program_id: str) -> bool | None:
        """The speculative-prefill hint `program_id` last sent (None: none, or no such
        program). One field for the request path, where a snapshot would copy them all."""
        program = self.table.get(program_id)
        return None if program is None else program.speculative_prefill

    def held_count(self) -> int:
        """PAUSED programs with requests held: the queue as their clients see it."""
        return sum(
            1 for program in self.table if program.state is ProgramState.PAUSED and program.waiting
        )

    def state_counts(self) -> dict[ProgramState, dict[Phase, int]]:
        """Programs by state and phase. For gauges read at every scrape: no object is made
        per program (at 10,000 programs, one each made the scrape trigger full garbage
        collections, 70 ms instead of 4)."""
        counts = {state: dict.fromkeys(Phase, 0) for state in ProgramState}
        for program in self.table:
            counts[program.state][program.phase] += 1
        return counts

    def healthy_backends(self) -> list[BackendState]:
        return [b for b in self.backends.values() if b.healthy]

    def room(self, backend: Any, fraction: float = 1.0) -> float:
        limit = backend.limit(fraction)
        return float("inf") if limit is None else float(limit - backend.reserved)

    def admits(self, program: Any, backend: Any, now: float) -> bool:
        tokens = self.ledger.admit_tokens(program, backend)
        if not self._admit_hooks:
            return True
        view, read, engine = self._stage_view, program.view, backend.view
        return all(admits(view, read, engine, tokens, now) for admits in self._admit_hooks)

    def footprint_for_resume(self, program: Any) -> int:
        return self.ledger.footprint(program, for_resume=True)

    def queue_length(self) -> int:
        return self.queued

    def drained(self, label: str) -> bool:
        """No ACTIVE program is placed on `label` (a removed backend counts as drained)."""
        return self.table.programs_on(label) == 0

    def expected_tool_time(self, program: Any) -> float:
        return self.tool_time.expected(program.session_type, program.tool_time_ema_s)

    def victim_key(self, program: Any, acting: bool = True) -> Any:
        """The pipeline's pause-order key for `program`."""
        for key_of in self._victim_hooks:
            key = key_of(self._stage_view, program.view, acting)
            if key is not None:
                return key
        return (program.reserved_tokens,)

    # ================================================================ consuming reads
    def next_victim(self, backend: Any, acting: bool) -> Program | None:
        """The next program of `backend`'s pause order (ACTING or REASONING ones), taken off
        it; the hook's victims it does not pause are put back when it returns."""
        state = self.backends[backend.label]
        heap = state.acting if acting else state.reasoning
        top = heap.pop()
        if top is None:
            return None
        program = top[1]
        self._consumed.append((heap, acting, program, program.version))
        return program

    def _restore(self) -> None:
        consumed, self._consumed = self._consumed, []
        for heap, acting, program, stamp in consumed:
            if program.version == stamp and program.state is not ProgramState.TERMINATED:
                heap.push(self.victim_key(program, acting), program, stamp)

    def next_idle(self, ttl_s: float, now: float) -> Program | None:
        """The program idle longest, taken off the idle index, if idle `ttl_s` or more."""
        top = self.idle.peek()
        if top is None or top[0] + ttl_s > now:
            return None
        self.idle.pop()
        return top[1]

    def next_overdue(self, timeout_s: float, now: float) -> Program | None:
        """The program queued longest, taken off the arrival order, if queued `timeout_s`
        or more (entries left stale by a resume, release or re-queue are dropped)."""
        fifo = self.queue_fifo
        while fifo:
            queued_at, program = fifo[0]
            if program.queued_at != queued_at or program.state is ProgramState.TERMINATED:
                fifo.popleft()  # resumed, released or re-queued since
                continue
            if now - queued_at < timeout_s:
                return None
            fifo.popleft()
            return program
        return None


class ReadOnlyCore:
    """The core as its stages see it: `StageView`'s members and nothing else, one per core,
    made with it and given to every hook. Each query answers from the core's live state, a
    program as its `ReadOnlyProgram` and an engine as its `ReadOnlyBackend`; the views a
    stage hands back (`admits(program, backend)`...) are followed to the core's own records
    by their private back-references. No way to the core but its private `_core`: a stage
    reads, and returns decisions."""

    __slots__ = ("_core", "_stages")

    def __init__(self, core: CoreView) -> None:
        self._core = core
        self._stages = tuple(core.stages)

    def __repr__(self) -> str:
        return f"ReadOnlyCore({len(self._core.table)} programs)"

    @property
    def backends(self) -> Mapping[str, BackendView]:
        return self._core._read_backends

    @property
    def stages(self) -> Sequence[Stage]:
        return self._stages

    @property
    def acting_weight(self) -> float:
        return self._core.ledger.acting_weight

    def program(self, program_id: str) -> ProgramView | None:
        program = self._core.table.get(program_id)
        return None if program is None else program.view

    def program_count(self) -> int:
        return len(self._core.table)

    def programs(self) -> Sequence[ProgramView]:
        return [program.view for program in self._core.table]

    def programs_on(self, label: str) -> int:
        return self._core.table.programs_on(label)

    def healthy_backends(self) -> Sequence[BackendView]:
        return [b.view for b in self._core.backends.values() if b.healthy]

    def room(self, backend: BackendView, fraction: float = 1.0) -> float:
        return self._core.room(_live_backend(backend), fraction)

    def admits(self, program: ProgramView, backend: BackendView, now: float) -> bool:
        # The core's `admits`, with the views at hand (stages ask it of many engines).
        core = self._core
        tokens = core.ledger.admit_tokens(_live_program(program), _live_backend(backend))
        return all(admits(self, program, backend, tokens, now) for admits in core._admit_hooks)

    def footprint_for_resume(self, program: ProgramView) -> int:
        return self._core.ledger.footprint(_live_program(program), for_resume=True)

    def expected_tool_time(self, program: ProgramView | None = None) -> float:
        # None: a program the core knows nothing of (the fleet's usual tool time).
        if program is None:
            return self._core.tool_time.expected(None, None)
        return self._core.tool_time.expected(program.session_type, program.tool_time_ema_s)

    def remaining_tool_time(self, program: ProgramView, elapsed_s: float) -> float:
        return self._core.tool_time.remaining(self.expected_tool_time(program), elapsed_s)

    def prompt_tokens(self, chars: int, backend: str | None) -> int:
        return self._core.tokens.prompt_tokens(chars, backend)

    def queue_length(self) -> int:
        return self._core.queued

    def victim_key(self, program: ProgramView, acting: bool = True) -> Any:
        return self._core.victim_key(_live_program(program), acting)

    def next_victim(self, backend: BackendView, acting: bool) -> ProgramView | None:
        program = self._core.next_victim(backend, acting)
        return None if program is None else program.view

    def next_idle(self, ttl_s: float, now: float) -> ProgramView | None:
        program = self._core.next_idle(ttl_s, now)
        return None if program is None else program.view

    def next_overdue(self, timeout_s: float, now: float) -> ProgramView | None:
        program = self._core.next_overdue(timeout_s, now)
        return None if program is None else program.view


# The core's own program and engine behind the views a stage hands back: their private
# back-references, read by a C-level getter (stages ask `admits` and `room` per engine).
_live_program: Callable[[ProgramView], Program] = attrgetter("_program")
_live_backend: Callable[[BackendView], BackendState] = attrgetter("_backend")
