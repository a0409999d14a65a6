"""The state gateway replicas share, behind one interface: program records, per-engine
reservations with the admission gate, replica leases and announcements.

`SchedulerStore` is what the live scheduler needs of it (middleware/replication.py);
`MemoryStore` keeps it in this process (one gateway: nothing is shared, and the live
scheduler does no store work on the request path), `RedisStore` in Redis for several
replicas (state/redis_store.py). Both pass the same contract tests
(tests/real/test_scheduler_store.py). The gate's rule, whatever the store: a reservation may
grow only while the engine's reservations summed over every live replica stay within the
limit, and an engine nobody else reserves admits any program (as the admission stage does).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

__all__ = [
    "MemoryState",
    "MemoryStore",
    "ProgramRecord",
    "SchedulerStore",
    "StoreUnavailable",
    "SyncItem",
    "SyncResult",
]


class StoreUnavailable(Exception):
    """Redis did not answer (or answered with an error): the caller applies on_unavailable."""


class ProgramRecord(msgspec.Struct, kw_only=True):
    """What a replica needs to carry on a program another one placed."""

    program_id: str
    holder: str
    state: str  # active | paused
    phase: str
    backend: str | None
    reserved_tokens: int = 0
    context_tokens: int = 0
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    failures: int = 0
    pauses: int = 0
    migrations: int = 0
    session_id: str | None = None
    session_type: str | None = None
    parent_program_id: str | None = None
    source: str | None = None
    tool_time_ema_s: float | None = None
    expected_output_tokens: int | None = None
    owner: str | None = None  # hex HMAC digest of the owner key (program_owner: header)
    waiting_since: float | None = None  # wall clock: it has requests waiting for room
    # What GET /programs/{id} shows on a replica that does not hold it (docs/replicas.md).
    created_at: float | None = None  # wall clock
    last_active_at: float | None = None  # wall clock
    in_flight: int = 0
    waiting: int = 0
    ephemeral: bool = False
    priority: int = 0
    final_requested: bool = False
    paused_total_s: float = 0.0
    docker_ids: list[str] = msgspec.field(default_factory=list)


class SyncItem(msgspec.Struct, frozen=True):
    """One program's state to write: `engine` "" means it holds no reservation."""

    program_id: str
    mode: str  # claim | update | drop
    engine: str = ""
    tokens: int = 0
    limit: float | None = None
    record: ProgramRecord | None = None


class SyncResult(msgspec.Struct, frozen=True):
    status: int  # 1 written, 0 refused (does not fit), -1 another live replica holds it
    foreign: int  # tokens other live replicas reserve on the item's engine
    freed: bool  # a reservation shrank or went away (others may have room now)


class SchedulerStore(Protocol):
    """What replicas share. Every call may raise StoreUnavailable."""

    replica_id: str
    lease_ms: int

    @property
    def shared(self) -> bool:
        """Whether other replicas may hold programs (False: the live scheduler leaves the
        store alone, a single gateway's behaviour)."""
        ...

    async def sync(self, items: Sequence[SyncItem], engines: Sequence[str]) -> list[SyncResult]: ...
    async def snapshot(self, engines: Sequence[str]) -> dict[str, tuple[int, int]]: ...
    async def load(self, program_id: str) -> ProgramRecord | None: ...
    async def load_all(self) -> list[ProgramRecord]: ...
    async def owner_key(self) -> bytes: ...
    async def publish(self, *words: str) -> None: ...
    def listen(self, on_event: Callable[[list[str]], None]) -> None: ...
    async def end_lease(self) -> None: ...
    async def close(self) -> None: ...


class MemoryState:
    """What in-process replicas share (one per fleet): `MemoryStore`s built on the same one
    see each other, as replicas on one Redis do."""

    def __init__(self) -> None:
        self.records: dict[str, ProgramRecord] = {}
        # engine -> program -> (tokens, holder)
        self.reservations: dict[str, dict[str, tuple[int, str]]] = {}
        self.leases: set[str] = set()
        self.listeners: list[tuple[str, Callable[[list[str]], None]]] = []
        self.key: bytes | None = None


class MemoryStore:
    """The store in this process. Alone (the default), it is a single gateway's: `shared`
    is False and the live scheduler never calls it. Over a `MemoryState` shared with other
    MemoryStores, it is one replica among them (tests run replicas this way)."""

    def __init__(self, replica_id: str = "local", state: MemoryState | None = None) -> None:
        self.replica_id = replica_id
        self._shared = state is not None
        self.state = state if state is not None else MemoryState()
        self.lease_ms = 10_000
        self.state.leases.add(replica_id)

    @property
    def shared(self) -> bool:
        return self._shared

    def _alive(self, replica: str) -> bool:
        return replica == self.replica_id or replica in self.state.leases

    def _tally(self, engine: str, skip: str | None) -> tuple[int, int]:
        held = self.state.reservations.get(engine, {})
        foreign = total = 0
        for program_id, (tokens, holder) in list(held.items()):
            if program_id == skip:
                continue
            if not self._alive(holder):
                del held[program_id]  # reaped: its replica's lease is gone
                continue
            total += tokens
            if holder != self.replica_id:
                foreign += tokens
        return foreign, total

    async def sync(self, items: Sequence[SyncItem], engines: Sequence[str]) -> list[SyncResult]:
        return [self._sync(item, engines) for item in items]

    def _sync(self, item: SyncItem, engines: Sequence[str]) -> SyncResult:
        state, prog = self.state, item.program_id
        old = state.records.get(prog)
        if old is not None and item.mode != "claim":
            if old.holder != self.replica_id and old.holder in state.leases:
                return SyncResult(-1, 0, False)
        freed = False
        for engine in engines:
            if engine != item.engine or item.mode == "drop":
                held = state.reservations.get(engine)
                if held is not None and held.pop(prog, None) is not None:
                    freed = True
        if item.mode == "drop":
            state.records.pop(prog, None)
            return SyncResult(1, 0, freed)
        foreign = 0
        if item.engine:
            foreign, total = self._tally(item.engine, prog)
            held = state.reservations.setdefault(item.engine, {})
            current = held.get(prog, (0, ""))[0]
            limit = -1 if item.limit is None else int(item.limit)
            if item.tokens > current and limit >= 0 and total > 0 and total + item.tokens > limit:
                return SyncResult(0, foreign, freed)
            if item.tokens < current:
                freed = True
            held[prog] = (item.tokens, self.replica_id)
        if item.record is not None:
            state.records[prog] = item.record
        return SyncResult(1, foreign, freed)

    async def snapshot(self, engines: Sequence[str]) -> dict[str, tuple[int, int]]:
        self.state.leases.add(self.replica_id)
        return {engine: self._tally(engine, None) for engine in engines}

    async def load(self, program_id: str) -> ProgramRecord | None:
        return self.state.records.get(program_id)

    async def load_all(self) -> list[ProgramRecord]:
        return list(self.state.records.values())

    async def owner_key(self) -> bytes:
        if self.state.key is None:
            self.state.key = secrets.token_bytes(32)
        return self.state.key

    async def publish(self, *words: str) -> None:
        # Delivered on the loop's next turn, as a pub/sub message arrives: never inside
        # the publisher's own call.
        loop = asyncio.get_running_loop()
        for _replica, on_event in self.state.listeners:
            loop.call_soon(on_event, list(words))

    def listen(self, on_event: Callable[[list[str]], None]) -> None:
        self.state.listeners.append((self.replica_id, on_event))

    async def end_lease(self) -> None:
        self.state.leases.discard(self.replica_id)

    async def close(self) -> None:
        self.state.listeners = [
            (replica, fn) for replica, fn in self.state.listeners if replica != self.replica_id
        ]
