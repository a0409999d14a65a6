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

from thunder_mw.policies._failed_expiry import FailedExpiry
from thunder_mw.policies._lazy_heap import LazyHeap
from thunder_mw.policies.admission import Admission as Admission
from thunder_mw.policies.admission import host_tier_tokens, tiered_fleet
from thunder_mw.policies.arrival_pace import ArrivalPace
from thunder_mw.policies.decisions import (
    Footprint,
    Pause,
    ReclaimTools,
    Release,
    Reorder,
    Resume,
    StageDecision,
)
from thunder_mw.policies.overflow_cost import keeps_idle_context, move_pays, tier_has_room
from thunder_mw.policies.program_table import ProgramState, Usage
from thunder_mw.policies.stage_contract import Decisions, Stage, StageView
from thunder_mw.policies.views import BackendView, ProgramView

# Re-exported: stage authors and older code import these names from here.
from thunder_mw.schemas.stage_params import AdmissionParams as AdmissionParams
from thunder_mw.schemas.stage_params import GcParams as GcParams
from thunder_mw.schemas.stage_params import MigrationParams as MigrationParams
from thunder_mw.schemas.stage_params import PauseParams as PauseParams
from thunder_mw.schemas.stage_params import StageParams as StageParams

__all__ = [
    "BUILTIN_STAGES",
    "Admission",
    "AdmissionParams",
    "GcHooks",
    "Migration",
    "RoundRobin",
    "StageParams",
    "StateAwarePause",
    "Sticky",
]

# ---------------------------------------------------------------------------- pausing
_STREAM_HOOKS = frozenset({"on_request", "on_release"})
# The fixed orders: calls in flight marked by arrival, the queue resumed by it (queue_key).
_FIXED_ORDERS = frozenset({"fcfs", "new_first"})
# The rules that follow the pace of new programs (ArrivalPace).
_PACED = frozenset({"auto", "new_first"})


class StateAwarePause(Stage):
    """On overflow pause ACTING programs first (their GPU is idle anyway), then mark
    REASONING ones to pause after their call, until the projected use is back under high.

    Victim rules:
    - `shortest_first` (the original): the fewest tokens first.
    - `cost_benefit`: lowest priority first; then the program whose tool call is
      expected to run longest from now (EMA of its own tool gaps, else its session type's),
      i.e. the most memory freed for the longest time per recompute it will cost; REASONING
      programs (`reasoning_victim`): the largest first, so the fewest programs pay a pause,
      or the smallest first: each pause then costs the least recompute when the program
      returns, and the programs furthest along run to completion instead of every program
      taking turns through the cache (docs/scheduling.md, "Which call pauses").
    - `fcfs`: program-level first come, first served (Continuum's order): ACTING programs
      as `cost_benefit`; among REASONING ones lowest priority, then the program that
      arrived last is marked first; the migration stage resumes paused programs in arrival
      order; no yield. One fixed order for marking and resuming lets the programs ahead in
      it run to completion and free their KV, where rotating every program through the
      cache keeps each one's grown context waiting in the host tier (or nowhere) until it
      overflows.
    - `new_first`: `fcfs`, except that programs not yet begun resume before paused ones
      (then each kind in arrival order). A drain ends when its last program does, and a
      program not yet begun has every call and tool still ahead: started late, its whole
      chain ends late, where a paused program has run part of its own (docs/benchmarks.md,
      "Programs not yet begun first").
    - `auto` (default): `shortest_first`, yielding nothing, while new programs keep arriving
      (policies/arrival_pace.py): with more work coming, the programs furthest along are
      the ones to finish, and a yield only lets a newcomer churn the cache; `drain_victim`
      (`cost_benefit`, `fcfs` or `new_first`) once arrivals stop, where the drain's last
      program sets the makespan. A switch re-keys the pause order (`Reorder`), and the
      resume order too where it changes with the rule (`fcfs`, `new_first`).
      `drain_victim: null` (default) chooses by the host tier, as the migration stage's
      `started_first` does: `fcfs` while a backend has one, else `cost_benefit`. With a
      tier a paused program's context waits there, in an LRU: rotating every held program
      through the engine (`cost_benefit`'s order by wait) resumes them in the order the
      tier loses their contexts, where one fixed order keeps the contexts of the programs
      behind waiting untouched (docs/benchmarks.md, "The drain's order"); without one a
      paused context is gone either way, and `cost_benefit`'s batches were the shorter.
    """

    name = "state_aware_pause"
    Params = PauseParams
    params: PauseParams

    def bind(self, view: StageView) -> Decisions:
        self._pace = ArrivalPace(self.params.stream_patience)
        self._streaming = False  # `auto`: the rule in force (keys in the pause order use it)
        # `auto`'s rule once arrivals stop; for null read again at the first request (a
        # tier the config declares is known by then) and whenever backends change.
        self._drain = self._drain_rule(view)
        self._drain_read = self.params.drain_victim is not None
        self._offering_over = False  # `new_first`: new programs resume first (queue keys)
        victim = self.params.victim
        self._may_new_first = victim == "new_first" or (
            victim == "auto" and self.params.drain_victim == "new_first"
        )
        self._high = self.params.high_watermark
        if self._high is None:
            admission = next((s for s in view.stages if isinstance(s, Admission)), None)
            self._high = admission.params.high_watermark if admission else 1.0
        # min_waste prices a kept context with what the admission stage learned per engine.
        self._admission = next((s for s in view.stages if isinstance(s, Admission)), None)
        return (Footprint(acting_weight=self.params.acting_token_weight),)

    def unused_hooks(self) -> frozenset[str]:
        # Arrivals and ends only feed the pace (`auto`'s switch, `new_first`'s offering).
        unused = frozenset() if self.params.victim in _PACED else _STREAM_HOOKS
        return unused if self.params.idle_fate != "weight" else unused | {"idle_share"}

    def idle_share(self, view: StageView, program: ProgramView, now: float) -> float | None:
        """min_waste: the whole context while keeping it wastes less than letting it go
        (policies/overflow_cost.py `keeps_idle_context`), else none of it; no opinion until
        the engine's prefill price is learned (nor, `tiered_min_waste`, on a backend
        without a host tier: the weight there)."""
        label = program.backend
        costs = self._admission.costs.get(label) if self._admission and label else None
        if costs is None or costs.prefill_s_per_token is None:
            return None
        backend = view.backends[label]  # type: ignore[index]
        tier = host_tier_tokens(backend)
        if tier <= 0 and self.params.idle_fate == "tiered_min_waste":
            return None
        speed = backend.host_load_tokens_per_s
        # Swapping is a fate only while the tier has room: past GPU + tier, what falls to it
        # pushes another program's context out, to be recomputed.
        room = tier_has_room(backend.contexts, backend.capacity or 0, tier)
        reload = 1.0 / speed if speed and tier > 0 and room else None
        batch = backend.running_reserved - backend.running_unused
        remaining = view.expected_tool_time(program)
        keep = keeps_idle_context(remaining, batch, costs.prefill_s_per_token, reload)
        return 1.0 if keep else 0.0

    def rule(self) -> str:
        """The victim rule in force: `auto` resolves to `shortest_first` or `drain_victim`."""
        if self.params.victim != "auto":
            return self.params.victim
        return "shortest_first" if self._streaming else self._drain

    def _drain_rule(self, view: StageView) -> str:
        """`drain_victim`, or for null by the host tier (read where backends change: a tier
        reported later switches the rule then)."""
        if self.params.drain_victim is not None:
            return self.params.drain_victim
        return "fcfs" if tiered_fleet(view.healthy_backends()) else "cost_benefit"

    def new_first(self) -> bool:
        """Do programs not yet begun resume before paused ones now (Migration.queue_key)?
        Under `new_first`, once the offering is over (ArrivalPace.over), not in every drain:
        in a lull of a stream more new programs follow, and starting them ahead of paused
        ones only grows the set of programs under way."""
        return self._offering_over

    def _switch(self, now: float) -> Decisions:
        """`auto`: latch whether programs keep arriving; `new_first`: whether the offering is
        over. On a change, re-key the order."""
        if self.params.victim not in _PACED:
            return ()
        queue = False
        changed = False
        if self.params.victim == "auto":
            streaming = self._pace.streaming(now)
            if streaming != self._streaming:
                self._streaming = streaming
                changed = True
                # The resume order follows the rule only under a fixed order (queue_key).
                queue = self._drain in _FIXED_ORDERS
        over = self._may_new_first and self.rule() == "new_first" and self._pace.over(now)
        if over != self._offering_over:
            self._offering_over = over
            changed = queue = True
        return (Reorder(queue=queue),) if changed else ()

    def on_request(self, view: StageView, program: ProgramView, now: float) -> Decisions:
        # A program's first request: created in this event, nothing sent or held yet.
        fresh = not (program.steps or program.in_flight or program.waiting)
        if fresh and program.created_at == now:
            self._pace.arrived(now)
        if not self._drain_read:
            self._drain_read = True
            self._drain = self._drain_rule(view)
        return self._switch(now)

    def on_release(
        self, view: StageView, program: ProgramView, reason: str, now: float
    ) -> Decisions:
        self._pace.ended()
        return ()

    def victim_key(self, view: StageView, program: ProgramView, acting: bool) -> Any:
        rule = self.rule()
        if rule == "shortest_first":
            return (program.reserved_tokens,)
        if rule in _FIXED_ORDERS and not acting:
            # A call's KV is in use: of those, the program that arrived last goes back to
            # the queue. A program in a tool (below) goes by its tool, as cost_benefit: its
            # KV idles meanwhile, and the longest tool frees the most for the longest.
            return (program.priority, -program.arrival)
        if acting:
            expected_end = program.acting_since + view.expected_tool_time(program)
            return (program.priority, -expected_end, -program.reserved_tokens)
        if self.params.reasoning_victim == "smallest":
            return (program.priority, program.reserved_tokens)
        return (program.priority, -program.reserved_tokens)

    def on_backend_change(self, view: StageView, backend: BackendView, now: float) -> Decisions:
        switch = self._switch(now)
        drain = self._drain_rule(view)
        if drain != self._drain:
            self._drain = drain
            if self.params.victim == "auto" and not self._streaming:
                # The rule in force changed: re-key the pause order and the queue.
                switch = (Reorder(queue=True),)
        if self.params.check != "event":
            return switch
        if switch:
            return self._reorder_then_relieve(switch, view, backend, now)
        return self.relieve(view, backend, now)

    def _reorder_then_relieve(
        self, switch: Decisions, view: StageView, backend: BackendView, now: float
    ) -> Iterator[StageDecision]:
        yield from switch  # the Reorder, applied before the victims below are picked
        yield from self.relieve(view, backend, now)

    def on_queue_blocked(self, view: StageView, program: ProgramView, now: float) -> Decisions:
        """Work conservation: a program idle in a long tool call holds KV that a waiting
        program could use now; pause such programs on the backend where that frees enough
        (the previous backend first), and only if it frees enough for the head."""
        threshold = self.params.yield_idle_after_s
        if threshold is None or self.rule() != "cost_benefit":
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
                remaining = view.remaining_tool_time(victim, elapsed)
                victims.append(victim)
                if remaining < threshold:
                    break
                shortfall -= victim.reserved_tokens
            if shortfall <= 0 and victims:
                return [Pause(victim, "yield_to_queue") for victim in victims]
            # not enough here: the victims looked at stay as they were
        return ()

    def on_tick(self, view: StageView, now: float) -> Iterator[StageDecision]:
        yield from self._switch(now)
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
_TIER_HOOKS = frozenset({"on_resumed", "on_release", "on_queue_blocked"})


class Migration(Stage):
    """One global queue of paused and new programs across backends.

    Order: programs under way before new ones where `started_first` (by default, while the
    fleet has a host KV tier), then priority raised by waiting (ageing), then largest first
    (best-fit-decreasing); while the pause stage's rule is `fcfs`, arrival order instead (its
    fixed order), and under `new_first` the programs not yet begun first, then arrival
    order. Placement: the previous backend when it admits the program, else
    the admitting backend with the most room. A program queued past `resume_timeout_s` is
    force-resumed so nothing starves.

    `tier_aware` (on by default; nothing changes without a tier): a program whose previous
    backend has a host KV tier has its context there, and a tier belongs to one engine, so
    it waits for that backend; the programs behind it go on elsewhere meanwhile
    (`on_queue_blocked`), and it moves only to room none of them could use, where the wait
    outweighs a full recompute (`_move_pays`).
    """

    name = "migration"
    Params = MigrationParams
    params: MigrationParams

    def queue_key(self, view: StageView, program: ProgramView) -> Any:
        assert program.queued_at is not None
        band = math.floor(program.queued_at / self.params.aging_s - program.priority)
        # started_first: a program under way goes ahead of one not yet begun whatever their
        # waits. Admitting new programs past paused ones grows the set of programs started
        # beyond what the fleet runs, and each one started holds KV (in a host tier, if any)
        # and sandboxes while it waits; ageing alone puts the new ones first, having waited
        # since they arrived while a paused one waits only since its pause.
        first = self.params.started_first
        if first is None:
            # By what a resume costs: with a host tier a paused program's context waits
            # there and comes back at reload speed, and each program started past what the
            # fleet runs pushes an older one's out of the tier; without one it is gone by
            # the time it resumes (a full recompute, dearer than a new program's first
            # prompt), and arrival order is kept. Read when the program is queued: a tier
            # reported later orders only the programs queued after it.
            first = tiered_fleet(view.healthy_backends())
        tier = (0 if program.steps else 1) if first else 0
        key: tuple[Any, ...]
        pause = self._pause
        if pause is not None and pause.rule() in _FIXED_ORDERS:
            # The pause stage's fixed order (Continuum's program-level FCFS): the earliest
            # arrival resumes first, no ageing (the force-resume timeout still bounds a wait);
            # under `new_first`, once the offering is over, a program not yet begun ahead of
            # every paused one, whatever the host tier: its whole chain is still ahead of it.
            if pause.new_first():
                tier = 1 if program.steps else 0
            key = (tier, -program.priority, program.arrival)
        elif self.params.placement == "best_fit_decreasing":
            key = (tier, band, -program.request_tokens, program.queued_at)
        elif self.params.placement == "mru":
            key = (tier, band, -program.queued_at)
        else:
            key = (tier, band, program.queued_at)
        if self.params.tier_aware:
            self._index(view, program, key)
        return key

    def bind(self, view: StageView) -> Decisions:
        # tier_aware prices a move with what the admission stage learned per engine.
        self._admission = next((s for s in view.stages if isinstance(s, Admission)), None)
        # Under the pause stage's fixed orders the resume order is its (queue_key).
        self._pause = next((s for s in view.stages if isinstance(s, StateAwarePause)), None)
        # tier_aware: the queued programs again, by the engine whose host tier holds their
        # context (None: the rest, new programs among them), in the core's queue order; the
        # program at the head of the queue waiting for its home, if any.
        self._queues: dict[str | None, LazyHeap[ProgramView]] = {}
        self._stamps: dict[str, int] = {}
        self._pushed = 0
        self._waits_home: str | None = None
        return ()

    def unused_hooks(self) -> frozenset[str]:
        # Only tier_aware keeps the index those hooks feed and read.
        return frozenset() if self.params.tier_aware else _TIER_HOOKS

    def place(self, view: StageView, program: ProgramView, now: float) -> str | None:
        self._waits_home = None
        if self.params.prefer_home_backend and program.backend is not None:
            home = view.backends.get(program.backend)
            if home is not None and home.healthy and view.admits(program, home, now):
                return home.label
        if self.params.tier_aware and self._tiered_home(view, program) is not None:
            # Its context is in its home's tier: it waits for that engine, and moves only
            # where the room would otherwise go unused and the move pays (on_queue_blocked).
            self._waits_home = program.program_id
            return ""
        fitting = [b for b in view.healthy_backends() if view.admits(program, b, now)]
        if not fitting:
            return ""
        return max(fitting, key=view.room).label

    @staticmethod
    def _tiered_home(view: StageView, program: ProgramView) -> BackendView | None:
        """The healthy engine whose host tier holds `program`'s context, if any."""
        home = view.backends.get(program.backend) if program.backend else None
        if home is None or not home.healthy or not host_tier_tokens(home):
            return None
        return home

    # -- tier_aware: waiting for home without holding up the rest of the queue
    def _index(self, view: StageView, program: ProgramView, key: tuple[Any, ...]) -> None:
        home = view.backends.get(program.backend) if program.backend else None
        bucket = home.label if home is not None and host_tier_tokens(home) else None
        queue = self._queues.get(bucket)
        if queue is None:
            queue = self._queues[bucket] = LazyHeap(self._queued)
        self._pushed += 1
        self._stamps[program.program_id] = self._pushed
        queue.push(key, program, self._pushed)

    def _queued(self, program: ProgramView, stamp: int) -> bool:
        """An entry is live while its program is still queued under the key it was given."""
        return (
            self._stamps.get(program.program_id) == stamp
            and program.queued_at is not None
            and program.state is ProgramState.PAUSED
        )

    def on_resumed(
        self, view: StageView, program: ProgramView, previous: str | None, now: float
    ) -> Decisions:
        self._stamps.pop(program.program_id, None)
        return ()

    def on_release(
        self, view: StageView, program: ProgramView, reason: str, now: float
    ) -> Decisions:
        self._stamps.pop(program.program_id, None)
        return ()

    def on_queue_blocked(self, view: StageView, program: ProgramView, now: float) -> Decisions:
        """The head of the queue waits for its home (tier_aware). The queue is strict so
        that no program is passed over for good, but holding every other program behind a
        wait for one engine idles the others (measured: swe-agent-knee's long window fell
        from 397.8 to 348.8 steady steps/min when no program ever moved and nobody passed
        the head). So the rest go on elsewhere first, each engine's programs in the core's
        order; only the engines that someone earlier in the queue waits for are closed to
        those behind it (backfilling that never delays an earlier program, as a batch
        scheduler backfills around a reservation). Then the head moves only where room is
        still left, which no program behind it could use, and only if the move pays
        (`_move_pays`): while others can use an engine's room, a wait for home costs the
        fleet no work, while a move always costs a full recompute."""
        if self._waits_home != program.program_id or program.backend is None:
            return ()
        return self._backfill(view, program, now)

    def _backfill(self, view: StageView, head: ProgramView, now: float) -> Iterator[StageDecision]:
        assert head.backend is not None
        closed = {head.backend}
        yield from self._fill_others(view, closed, now)
        fitting = [
            b
            for b in view.healthy_backends()
            if b.label not in closed and view.admits(head, b, now)
        ]
        if fitting:
            target = max(fitting, key=view.room)
            if self._move_pays(view, head, target, None):
                yield Resume(head, target.label)

    def _fill_others(self, view: StageView, closed: set[str], now: float) -> Iterator[Resume]:
        """Resumes queued programs in the core's order on the engines not `closed`, closing
        each engine that one of them waits for; returns at the first program with no home
        tier that fits on no open engine (as the strict queue would: nobody passes it)."""
        open_queues = {b: q for b, q in self._queues.items() if b not in closed}
        while open_queues:
            best: tuple[Any, str | None, ProgramView] | None = None
            for bucket, queue in open_queues.items():
                top = queue.peek()
                if top is not None and (best is None or top[0] < best[0]):
                    best = (top[0], bucket, top[1])
            if best is None:
                return
            _, bucket, program = best
            target = self._backfill_target(view, program, closed, now)
            if target is not None:
                yield Resume(program, target)  # applied before the next is chosen
            elif bucket is None:
                return
            else:
                closed.add(bucket)  # it waits for its home: so do those behind it there
                del open_queues[bucket]

    def _backfill_target(
        self, view: StageView, program: ProgramView, closed: set[str], now: float
    ) -> str | None:
        """`place`'s rule among the engines not closed (None: it waits): a program whose
        context is in its home's tier goes home or waits for it (it is not at the head of
        the queue: a move would take room someone before it may want)."""
        home = self._tiered_home(view, program)
        if home is not None:
            ok = home.label not in closed and view.admits(program, home, now)
            return home.label if ok else None
        if self.params.prefer_home_backend and program.backend is not None:
            own = view.backends.get(program.backend)
            if own is not None and own.healthy and own.label not in closed:
                if view.admits(program, own, now):
                    return own.label
        fitting = [
            b
            for b in view.healthy_backends()
            if b.label not in closed and view.admits(program, b, now)
        ]
        return max(fitting, key=view.room).label if fitting else None

    def on_tick(self, view: StageView, now: float) -> Iterator[StageDecision]:
        timeout = self.params.resume_timeout_s
        while (program := view.next_overdue(timeout, now)) is not None:
            healthy = view.healthy_backends()
            if not healthy:
                return
            home = view.backends.get(program.backend) if program.backend else None
            target = home if home is not None and home.healthy else max(healthy, key=view.room)
            if self.params.tier_aware and target is home and program.queued_at is not None:
                # Forced onto its home past that engine's room, or moved where it fits now:
                # the rule of `place`, the wait for home being what it has waited.
                fitting = [b for b in healthy if view.admits(program, b, now)]
                waited = now - program.queued_at
                if fitting:
                    roomiest = max(fitting, key=view.room)
                    if self._move_pays(view, program, roomiest, waited):
                        target = roomiest
            yield Resume(program, target.label, forced=True)

    def _move_pays(
        self, view: StageView, program: ProgramView, target: BackendView, waited: float | None
    ) -> bool:
        """tier_aware: does resuming `program` on `target` pay, against waiting for its
        previous backend? Only a home with a host KV tier keeps a paused program's context
        (a tier belongs to one engine): elsewhere a move costs nothing that resuming at home
        would not, and the answer is yes. With a tier, overflow_cost.move_pays decides: the
        wait for home plus the reload at home's host link speed, against a full recompute
        at the target's learned prefill price. The wait: for a program overdue, what it has
        waited (`waited`); else the admission stage's learned hold on that engine, or until
        one is seen a cycle of the program (room appears there when a tool call ends). No
        price learned yet: nothing shows that a move pays, and the program waits."""
        home = view.backends.get(program.backend) if program.backend else None
        if home is None or target is home or not home.healthy or not host_tier_tokens(home):
            return True
        costs = self._admission.costs if self._admission is not None else {}
        at_home, there = costs.get(home.label), costs.get(target.label)
        price = there.prefill_s_per_token if there is not None else None
        if price is None and at_home is not None:
            price = at_home.prefill_s_per_token  # its home's, until the target's is seen
        if price is None:
            return False
        if waited is not None:
            wait = waited
        elif at_home is not None and at_home.hold_s is not None:
            wait = at_home.hold_s
        else:
            call = at_home.call_s if at_home is not None and at_home.call_s else 0.0
            wait = view.expected_tool_time(program) + call
        speed = home.host_load_tokens_per_s
        return move_pays(
            program.context_tokens,
            wait,
            price,
            _batch(view, target),
            1.0 / speed if speed else 0.0,
            _batch(view, home),
        )


def _batch(view: StageView, backend: BackendView) -> int:
    """Sequences `backend` runs (its engine's count, else the programs placed on it): the
    sequences each prefill or reload step there stalls."""
    running = backend.metrics.running
    return running if running else view.programs_on(backend.label)


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
