"""What makes the live scheduler one replica among several sharing a fleet (docs/replicas.md).

Each replica keeps its own pure SchedulerCore for its decisions; what must be shared is
authoritative in the injected store (state/store.py: Redis, or memory for in-process
replicas), and the live scheduler (middleware/live_scheduler.py) calls this at its seams:

- the admission gate: before a call is handed to an engine, the program's reservation is
  written by one atomic script that refuses an increase past capacity x high watermark
  summed over every live replica; a refused call waits (held, as a paused one) until a
  replica announces room;
- the other replicas' reservations are added to this core's view of each engine (its
  `reserved`), so the local admission decisions already count them; refreshed every tick
  and on every `room` announcement;
- program records: a replica that gets a request for a program it does not hold loads its
  record and takes it over where it runs (placement, reservation, counters), and tells the
  previous holder to let go of it; a restarted replica loads every record.

The core sees the other replicas only through events, given to `core.handle`:
`ForeignReservations` (their share of each engine), `ProgramAdopted` (a program's shared
record) and `TakenOver`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import msgspec

from thunder_mw.middleware.call_state import CallState
from thunder_mw.middleware.program_ownership import ProgramOwnership
from thunder_mw.middleware.scheduling import ClientGone, Rejected, until_disconnect
from thunder_mw.middleware.types import Receive
from thunder_mw.policies import Stage
from thunder_mw.policies import core_events as ev
from thunder_mw.policies.admission import Admission
from thunder_mw.policies.core import Action, ReclaimTools, Released, SchedulerCore
from thunder_mw.policies.decisions import Count
from thunder_mw.policies.events import ProgramHistory
from thunder_mw.policies.program_table import Phase, Program, ProgramSnapshot, ProgramState
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import StateSettings
from thunder_mw.state.store import ProgramRecord, SchedulerStore, StoreUnavailable, SyncItem

__all__ = ["FLUSH_DELAY_S", "RETRY_AFTER_DOWN_S", "ReplicaSettings", "Replication"]

log = logging.getLogger("thunder_mw.scheduler")
# Background writes wait this long first: a program's next call, arriving meanwhile, writes
# its state through the gate anyway (one round trip instead of two on the request path's loop).
FLUSH_DELAY_S = 0.005
# After the store did not answer, background writes retry this much later.
RETRY_AFTER_DOWN_S = 1.0


class ReplicaSettings(msgspec.Struct, frozen=True):
    """What a replica reads of the configuration, once, where it is built (_compose.py)."""

    # state.on_unavailable: whether a call the store cannot gate is refused (503) or the
    # replica's own decision stands.
    fail_closed: bool = False
    # The shared gate refuses an engine's reservations past capacity x this: the admission
    # stage's high watermark (None: no admission stage, no limit at the gate).
    high_watermark: float | None = None

    @classmethod
    def of(cls, state: StateSettings, pipeline: Sequence[Stage]) -> ReplicaSettings:
        high = None
        for stage in pipeline:
            if isinstance(stage, Admission):
                high = float(stage.params.high_watermark)
        return cls(state.on_unavailable == "fail_closed", high)


class Replication:
    """One replica's share of the fleet's state, for the live scheduler it is passed to."""

    def __init__(
        self,
        core: SchedulerCore,
        store: SchedulerStore,
        settings: ReplicaSettings,
        *,
        clock: Callable[[], float],
        tick_interval_s: float,
        carry_out: Callable[[list[Action]], None],
        ownership: ProgramOwnership | None = None,
    ) -> None:
        """`carry_out` is the live scheduler's: what the core answers to the other
        replicas' news wakes or answers its held requests and reaches its listeners."""
        self.core = core
        self.clock = clock
        self.tick_interval_s = tick_interval_s
        self.carry_out = carry_out
        self.store = store
        self.replica_id = store.replica_id
        self.fail_closed = settings.fail_closed
        self._high = settings.high_watermark
        # Calls waiting at the shared gate for room (the scheduler counts them as held).
        self.held = 0
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._room: list[asyncio.Future[None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._refreshing = False
        self._refresh_again = False
        self._was_down = False
        # Where `agent_context.program_owner: header`: bindings are shared.
        self.ownership = ownership

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        try:
            if self.ownership is not None:
                self.ownership.use_key(await self.store.owner_key())
            for record in await self.store.load_all():
                self._seed(record, None)
        except StoreUnavailable:
            log.warning("started without the shared program records: redis is unavailable")
        await self._refresh()
        self.store.listen(self._on_event)
        self._tasks = [
            asyncio.create_task(self._lease_loop(), name="thunder-mw-lease"),
            asyncio.create_task(self._flush_loop(), name="thunder-mw-state-flush"),
        ]

    async def halt(self) -> None:
        """Stops writing and reading in the background (before the scheduler stops)."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        """Writes what is left, ends this replica's lease (after the scheduler stopped)."""
        with contextlib.suppress(StoreUnavailable):
            await self._flush()
            await self.store.end_lease()
        await self.store.close()

    # ------------------------------------------------------------------ requests
    async def adopt(self, ctx: AgentContext) -> None:
        """Before a call is scheduled: a program another replica held continues here."""
        try:
            await self._adopt(ctx)
        except StoreUnavailable:
            if self.fail_closed:
                raise _unavailable() from None

    def announce_release(self, program_id: str) -> None:
        # The replica holding it (if another) releases it too, with its tools.
        self._spawn(self._publish("release", program_id, self.replica_id))

    async def _adopt(self, ctx: AgentContext) -> None:
        """A program this replica does not hold: carry on from its shared record."""
        program = self.core.snapshot(ctx.program_id)
        if program is not None and program.state is ProgramState.ACTIVE:
            return
        record = await self.store.load(ctx.program_id)
        if record is None or record.holder == self.replica_id:
            return
        owners = self.ownership.owners if self.ownership is not None else None
        if owners is not None and record.owner is not None:
            owner = bytes.fromhex(record.owner)
            requester = owners.owner_of(ctx.program_id)  # the middleware bound or matched it
            owners.bind(ctx.program_id, owner)
            if requester is not None and requester != owner:
                self._seed(record, ctx)
                raise Rejected(
                    403,
                    f"program {ctx.program_id!r} belongs to another API key",
                    "program_owned_by_another_key",
                )
        program = self._seed(record, ctx)
        home = self.core.backend_views().get(record.backend or "")
        if (
            record.state == ProgramState.ACTIVE.value
            and home is not None
            and home.healthy
            and not home.draining
            and program.state is not ProgramState.ACTIVE
            and program.waiting == 0
            and program.in_flight == 0
        ):
            # It is admitted and placed: take its reservation over as it is (moving it from
            # the others' share to this replica's), no new admission. Placed first, then
            # taken out of the others' share: the room never looks free in between.
            taken = ev.TakenOver(
                program.program_id, home.label, record.reserved_tokens, self.clock()
            )
            self._apply(self.core.handle(taken).actions)
        self._spawn(self._publish("claim", ctx.program_id, self.replica_id))

    async def gate(self, call: CallState, program_id: str, backend: str) -> None:
        """Writes the program's reservation through the shared gate; waits while it does
        not fit under the engine's limit summed over every live replica."""
        waited_from: float | None = None
        try:
            while True:
                program = self.core.snapshot(program_id)
                if (
                    program is None
                    or program.state is not ProgramState.ACTIVE
                    or program.backend != backend
                ):
                    return
                item = self._item(program, "claim")
                try:
                    (result,) = await self.store.sync([item], list(self.core.backend_views()))
                except StoreUnavailable:
                    if self.fail_closed:
                        raise _unavailable() from None
                    return  # fail open: this replica's own decision stands
                self._foreign(backend, result.foreign)
                if result.status == 1:
                    # Written as it is now, and the same program (not ended and made anew).
                    current = self.core.snapshot(program_id)
                    if (
                        current is not None
                        and current.created_at == program.created_at
                        and self._item(current, "claim") == item
                    ):
                        self._dirty.discard(program_id)  # just written as it is, record and all
                    return
                if waited_from is None:
                    waited_from = self.clock()
                    counted = ev.DecisionsApplied([Count("gate_waits")], waited_from)
                    self._apply(self.core.handle(counted).actions)
                await self._wait_for_room(call.receive)
        finally:
            if waited_from is not None:
                call.held_s = (call.held_s or 0.0) + self.clock() - waited_from

    async def _wait_for_room(self, receive: Receive | None) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._room.append(fut)
        gone = asyncio.ensure_future(until_disconnect(receive)) if receive else None
        self.held += 1
        try:
            waits: set[asyncio.Future[Any]] = {fut} if gone is None else {fut, gone}
            # Announcements can be lost (pub/sub has no backlog): the lease tick retries too.
            await asyncio.wait(waits, timeout=self.tick_interval_s, return_when="FIRST_COMPLETED")
            if gone is not None and gone.done():
                raise ClientGone()
        finally:
            self.held -= 1
            if gone is not None:
                gone.cancel()
            with contextlib.suppress(ValueError):
                self._room.remove(fut)

    def _signal_room(self) -> None:
        waiting, self._room = self._room, []
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------------ state to the store
    def changed(self, actions: list[Action]) -> None:
        """The scheduler carried out `actions`: their programs' records are written soon."""
        for action in actions:
            self._mark(action.program_id)

    def mark(self, program_id: str) -> None:
        """`program_id` changed here (held, resumed, a call ended): written soon."""
        self._mark(program_id)

    def _mark(self, program_id: str) -> None:
        self._dirty.add(program_id)
        self._wake.set()

    def _limit(self, label: str) -> float | None:
        backend = self.core.backend_views().get(label)
        if backend is None or backend.capacity is None or self._high is None:
            return None
        return backend.capacity * self._high

    def _item(self, program: ProgramSnapshot, mode: str) -> SyncItem:
        active = program.state is ProgramState.ACTIVE and program.backend is not None
        engine = (program.backend or "") if active else ""
        return SyncItem(
            program.program_id,
            mode,
            engine,
            program.reserved_tokens if active else 0,
            self._limit(engine) if active else None,
            self._record(program),
        )

    def _record(self, program: ProgramSnapshot) -> ProgramRecord:
        wall = time.time() - self.clock()  # this clock's reading -> wall-clock seconds
        waiting_since = None
        if program.queued_at is not None and program.state is not ProgramState.ACTIVE:
            waiting_since = wall + program.queued_at
        return ProgramRecord(
            program_id=program.program_id,
            holder=self.replica_id,
            state=program.state.value,
            phase=program.phase.value,
            backend=program.backend,
            reserved_tokens=program.reserved_tokens,
            context_tokens=program.context_tokens,
            steps=program.steps,
            prompt_tokens=program.prompt_tokens,
            completion_tokens=program.completion_tokens,
            cached_tokens=program.cached_tokens,
            failures=program.failures,
            pauses=program.pauses,
            migrations=program.migrations,
            session_id=program.session_id,
            session_type=program.session_type,
            parent_program_id=program.parent_program_id,
            source=program.source,
            tool_time_ema_s=program.tool_time_ema_s,
            expected_output_tokens=program.expected_output_tokens,
            owner=self._owner_hex(program.program_id),
            waiting_since=waiting_since,
            created_at=wall + program.created_at,
            last_active_at=wall + program.last_active_at,
            in_flight=program.in_flight,
            waiting=program.waiting,
            ephemeral=program.ephemeral,
            priority=program.priority,
            final_requested=program.final_requested,
            paused_total_s=program.paused_total_s,
            docker_ids=list(program.docker_ids),
        )

    async def shared_program(self, program_id: str) -> tuple[ProgramSnapshot, str] | None:
        """A program this replica does not know, as its shared record describes it (not
        taken into this replica's table), and the replica holding it."""
        try:
            record = await self.store.load(program_id)
        except StoreUnavailable:
            raise Rejected(
                503,
                "the shared state store (redis) is unavailable: the program's shared record "
                "cannot be read",
                "state_unavailable",
                [(b"retry-after", b"1")],
            ) from None
        if record is None:
            return None
        return _program_of(record, self.clock()), record.holder

    def _owner_hex(self, program_id: str) -> str | None:
        if self.ownership is None:
            return None
        digest = self.ownership.owners.owner_of(program_id)
        return None if digest is None else digest.hex()

    async def _flush_loop(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(FLUSH_DELAY_S)
            self._wake.clear()
            if not self._dirty:
                continue
            try:
                await self._flush()
            except StoreUnavailable:
                await asyncio.sleep(RETRY_AFTER_DOWN_S)
                self._wake.set()

    async def _flush(self) -> None:
        dirty, self._dirty = self._dirty, set()
        items = []
        for program_id in dirty:
            program = self.core.snapshot(program_id)
            items.append(
                SyncItem(program_id, "drop") if program is None else self._item(program, "update")
            )
        try:
            results = await self.store.sync(items, list(self.core.backend_views()))
        except StoreUnavailable:
            self._dirty |= dirty  # written once Redis answers again
            raise
        freed = False
        for item, result in zip(items, results, strict=True):
            if result.status == -1:
                self._let_go(item.program_id)  # another live replica holds it now
            elif item.engine and result.status == 1:
                self._foreign(item.engine, result.foreign)
            freed = freed or result.freed
        if freed:
            await self._publish("room", self.replica_id)

    def _let_go(self, program_id: str) -> None:
        """Another replica took the program over: forget it here without ending it (no
        release of its tools, no record deleted), unless a call of it is still here."""
        program = self.core.snapshot(program_id)
        if program is None or program.in_flight or program.waiting:
            return
        actions = self.core.handle(ev.ReleaseRequested(program_id, "moved", self.clock())).actions
        kept = [
            a
            for a in actions
            if not (isinstance(a, Released | ReclaimTools) and a.program_id == program_id)
        ]
        self.carry_out(kept)
        for action in kept:
            if action.program_id != program_id:
                self._mark(action.program_id)

    def _seed(self, record: ProgramRecord, ctx: AgentContext | None) -> ProgramSnapshot:
        """The program as its record describes it, in this replica's table (not placed)."""
        ctx = ctx or AgentContext(
            program_id=record.program_id,
            source=None,
            parent_program_id=record.parent_program_id,
            session_id=record.session_id,
            session_type=record.session_type,
        )
        adopted = ev.ProgramAdopted(ctx, _history_of(record), self.clock())
        program = self.core.handle(adopted).program
        assert program is not None  # adopted: in the table now
        if self.ownership is not None and record.owner is not None:
            self.ownership.owners.bind(record.program_id, bytes.fromhex(record.owner))
        return program

    # ------------------------------------------------------------------ the others
    def _foreign(self, label: str, tokens: int) -> None:
        """The other replicas' share of `label`, as the store last said: an event for the core."""
        self._apply(self.core.handle(ev.ForeignReservations(label, tokens, self.clock())).actions)

    def _apply(self, actions: list[Action]) -> None:
        """Carries the core's actions out and records what they changed (what the live
        scheduler does with the actions of its own events)."""
        self.carry_out(actions)
        self.changed(actions)

    async def _refresh(self) -> None:
        """Renews the lease and re-reads the others' reservations (coalesced)."""
        if self._refreshing:
            self._refresh_again = True
            return
        self._refreshing = True
        try:
            while True:
                self._refresh_again = False
                try:
                    snapshot = await self.store.snapshot(list(self.core.backend_views()))
                except StoreUnavailable:
                    self._was_down = True
                    return
                if self._was_down:
                    # Our lease may have lapsed while Redis was away: write everything again.
                    self._was_down = False
                    for program in self.core.snapshots():
                        self._mark(program.program_id)
                for label, (others, _total) in snapshot.items():
                    self._foreign(label, others)
                self._signal_room()
                if not self._refresh_again:
                    return
        finally:
            self._refreshing = False

    async def _lease_loop(self) -> None:
        interval = min(self.tick_interval_s, self.store.lease_ms / 3000)
        while True:
            await asyncio.sleep(interval)
            await self._refresh()

    def _on_event(self, words: list[str]) -> None:
        if not words:
            return
        kind, args = words[0], words[1:]
        if kind == "room" and args != [self.replica_id]:
            self._spawn(self._refresh())
        elif kind == "claim" and len(args) == 2 and args[1] != self.replica_id:
            self._let_go(args[0])
        elif kind == "release" and len(args) == 2 and args[1] != self.replica_id:
            if self.core.knows(args[0]):
                # Released here too, as an operator's release is, but not announced again.
                released = ev.ReleaseRequested(args[0], "release", self.clock())
                self._apply(self.core.handle(released).actions)

    async def _publish(self, *words: str) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.store.publish(*words)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _history_of(record: ProgramRecord) -> ProgramHistory:
    return ProgramHistory(
        source=record.source,
        backend=record.backend,
        steps=record.steps,
        context_tokens=record.context_tokens,
        prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens,
        cached_tokens=record.cached_tokens,
        failures=record.failures,
        pauses=record.pauses,
        migrations=record.migrations,
        tool_time_ema_s=record.tool_time_ema_s,
        expected_output_tokens=record.expected_output_tokens,
    )


def _program_of(record: ProgramRecord, now: float) -> ProgramSnapshot:
    """A program as a shared record describes it, its wall-clock stamps on this clock."""
    offset = now - time.time()  # wall-clock seconds -> this clock's reading
    created = now if record.created_at is None else record.created_at + offset
    active = created if record.last_active_at is None else record.last_active_at + offset
    return Program(
        program_id=record.program_id,
        source=record.source,
        parent_program_id=record.parent_program_id,
        session_id=record.session_id,
        session_type=record.session_type,
        ephemeral=record.ephemeral,
        priority=record.priority,
        state=ProgramState(record.state),
        phase=Phase(record.phase),
        backend=record.backend,
        context_tokens=record.context_tokens,
        reserved_tokens=record.reserved_tokens,
        steps=record.steps,
        in_flight=record.in_flight,
        waiting=record.waiting,
        failures=record.failures,
        final_requested=record.final_requested,
        created_at=created,
        last_active_at=active,
        paused_total_s=record.paused_total_s,
        pauses=record.pauses,
        migrations=record.migrations,
        prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens,
        cached_tokens=record.cached_tokens,
        expected_output_tokens=record.expected_output_tokens,
        tool_time_ema_s=record.tool_time_ema_s,
        docker_ids=list(record.docker_ids),
    ).snapshot()


def _unavailable() -> Rejected:
    return Rejected(
        503,
        "the shared state store (redis) is unavailable and state.on_unavailable is fail_closed",
        "state_unavailable",
        [(b"retry-after", b"1")],
    )
