"""The shared state of several gateway replicas in Redis: program records, per-engine
reservations with the atomic admission gate, replica leases, and the events channel.

Every change that can admit is one Lua script, so it is atomic on the Redis server: two
replicas can never both reserve past an engine's limit. Keys (all under `key_prefix`):

- `lease:{replica}`: exists while the replica lives (PX `lease_ttl_s`, renewed each tick).
- `resv:{engine}` program -> tokens reserved there; `holder:{engine}` program -> replica.
  A reservation whose holder's lease is gone is deleted by the next script that reads the
  engine (reaped), so a dead replica stops counting within `lease_ttl_s` plus one tick.
- `prog:{program}`: the program's record (JSON: holder, state, backend, tokens, counters),
  PX the program's idle expiry, renewed on every change.
- `queue`: sorted set of programs waiting for room, scored by when they started waiting.
- channel `events`: `room REPLICA` (a reservation shrank), `claim PROGRAM REPLICA` (another
  replica took a program over), `release PROGRAM REPLICA` (an operator released it).

Keys are built inside the scripts from the prefix, so this needs one Redis (or a primary
with replicas), not Redis Cluster.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from thunder_mw.schemas.config import StateSettings
from thunder_mw.state.store import ProgramRecord as ProgramRecord
from thunder_mw.state.store import StoreUnavailable as StoreUnavailable
from thunder_mw.state.store import SyncItem as SyncItem
from thunder_mw.state.store import SyncResult as SyncResult

__all__ = ["RETRY_AFTER_DOWN_S", "SNAPSHOT", "SYNC", "RedisStore"]

log = logging.getLogger("thunder_mw.state")
RETRY_AFTER_DOWN_S = 1.0


_RECORD = msgspec.json.Encoder()
_RECORD_DECODER = msgspec.json.Decoder(ProgramRecord)

# Sums the reservations live replicas hold on one engine (all but program `skip`), deleting
# those of replicas whose lease has lapsed; `alive` caches each replica's lease check.
_TALLY = """
local function tally(P, me, engine, skip, alive)
  local resv, hk = P .. 'resv:' .. engine, P .. 'holder:' .. engine
  local h = redis.call('HGETALL', hk)
  local foreign, total = 0, 0
  for i = 1, #h, 2 do
    local f, r = h[i], h[i + 1]
    if f ~= skip then
      local ok = alive[r]
      if ok == nil then
        ok = (r == me) or (redis.call('EXISTS', P .. 'lease:' .. r) == 1)
        alive[r] = ok
      end
      if ok then
        local t = tonumber(redis.call('HGET', resv, f) or '0')
        total = total + t
        if r ~= me then foreign = foreign + t end
      else
        redis.call('HDEL', hk, f)
        redis.call('HDEL', resv, f)
      end
    end
  end
  return foreign, total
end
"""

# ARGV: prefix, me, program, mode, engine, tokens, limit (-1: none), record json ("": keep),
# record ttl ms, waiting score ("": not waiting), then every engine label.
SYNC = (
    _TALLY
    + """
local P, me, prog, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local engine, tokens, limit = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local rec, ttl, waiting = ARGV[8], tonumber(ARGV[9]), ARGV[10]
local rkey = P .. 'prog:' .. prog
local old = redis.call('GET', rkey)
if old and mode ~= 'claim' then
  local holder = cjson.decode(old)['holder']
  if holder ~= me and redis.call('EXISTS', P .. 'lease:' .. holder) == 1 then
    return {-1, 0, 0}
  end
end
local freed = 0
for i = 11, #ARGV do
  local e = ARGV[i]
  if e ~= engine or mode == 'drop' then
    if redis.call('HDEL', P .. 'resv:' .. e, prog) == 1 then freed = 1 end
    redis.call('HDEL', P .. 'holder:' .. e, prog)
  end
end
if mode == 'drop' then
  redis.call('DEL', rkey)
  redis.call('ZREM', P .. 'queue', prog)
  return {1, 0, freed}
end
local foreign = 0
if engine ~= '' then
  local resv, hk = P .. 'resv:' .. engine, P .. 'holder:' .. engine
  local total
  foreign, total = tally(P, me, engine, prog, {})
  local current = tonumber(redis.call('HGET', resv, prog) or '0')
  -- An engine nobody else reserves admits any program (as the admission stage does).
  if tokens > current and limit >= 0 and total > 0 and total + tokens > limit then
    return {0, foreign, freed}
  end
  if tokens < current then freed = 1 end
  redis.call('HSET', resv, prog, tokens)
  redis.call('HSET', hk, prog, me)
end
if rec ~= '' then redis.call('SET', rkey, rec, 'PX', ttl) end
if waiting ~= '' then
  redis.call('ZADD', P .. 'queue', waiting, prog)
else
  redis.call('ZREM', P .. 'queue', prog)
end
return {1, foreign, freed}
"""
)

# ARGV: prefix, me, lease ms, then every engine label. Renews the lease, reaps the dead
# replicas' reservations; returns per engine: tokens other live replicas reserve, and the
# total reserved by all live replicas.
SNAPSHOT = (
    _TALLY
    + """
local P, me, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
redis.call('SET', P .. 'lease:' .. me, '1', 'PX', lease)
local out = {}
local alive = {}
for i = 4, #ARGV do
  local foreign, total = tally(P, me, ARGV[i], nil, alive)
  table.insert(out, foreign)
  table.insert(out, total)
end
return out
"""
)


class RedisStore:
    """One replica's connection to the shared state; every call raises StoreUnavailable
    when Redis does not answer, and for a second after that does not try again."""

    shared = True  # other replicas on the same Redis hold programs

    def __init__(
        self, settings: StateSettings, replica_id: str, record_ttl_ms: int = 1_800_000
    ) -> None:
        """`record_ttl_ms`: how long a program's record outlives its last change (the
        pipeline's idle expiry, gc_hooks' `idle_ttl_s`, where it has one)."""
        assert settings.url is not None
        self.replica_id = replica_id
        self.record_ttl_ms = record_ttl_ms
        self.prefix = settings.key_prefix
        self.lease_ms = int(settings.lease_ttl_s * 1000)
        self.channel = f"{self.prefix}events"
        self.client = aioredis.Redis.from_url(
            settings.url.get_secret_value(),
            socket_timeout=settings.timeout_s,
            socket_connect_timeout=settings.timeout_s,
            decode_responses=True,
        )
        self._sync = self.client.register_script(SYNC)
        self._snapshot = self.client.register_script(SNAPSHOT)
        self._down_until = 0.0
        self._listener: asyncio.Task[None] | None = None
        self.available = True

    # ------------------------------------------------------------------ calls
    async def _call(self, make: Callable[[], Any]) -> Any:
        now = time.monotonic()
        if now < self._down_until:
            raise StoreUnavailable("redis was unavailable a moment ago")
        try:
            result = await make()
        except (TimeoutError, RedisError, OSError) as exc:
            self._down_until = time.monotonic() + RETRY_AFTER_DOWN_S
            if self.available:
                log.warning("the shared state store is unavailable: %s", exc)
            self.available = False
            raise StoreUnavailable(str(exc)) from exc
        if not self.available:
            log.warning("the shared state store answers again")
        self.available = True
        return result

    async def sync(self, items: Sequence[SyncItem], engines: Sequence[str]) -> list[SyncResult]:
        """Writes each item in one round trip (one atomic script per item)."""
        if not items:
            return []
        args = [self._args(item, engines) for item in items]
        if len(args) == 1:
            raw = [await self._call(lambda: self._sync(args=args[0]))]
        else:

            async def pipelined() -> Any:
                async with self.client.pipeline(transaction=False) as pipe:
                    for a in args:
                        await self._sync(args=a, client=pipe)
                    return await pipe.execute()

            raw = await self._call(pipelined)
        return [SyncResult(int(r[0]), int(r[1]), bool(int(r[2]))) for r in raw]

    def _args(self, item: SyncItem, engines: Sequence[str]) -> list[Any]:
        record = item.record
        ttl_ms = 0
        rec = ""
        waiting = ""
        if record is not None:
            rec = _RECORD.encode(record).decode()
            ttl_ms = self.record_ttl_ms
            if record.waiting_since is not None:
                waiting = repr(record.waiting_since)
        limit = -1 if item.limit is None else int(item.limit)
        return [
            self.prefix,
            self.replica_id,
            item.program_id,
            item.mode,
            item.engine,
            item.tokens,
            limit,
            rec,
            ttl_ms,
            waiting,
            *engines,
        ]

    async def snapshot(self, engines: Sequence[str]) -> dict[str, tuple[int, int]]:
        """Renews this replica's lease; per engine, (others' tokens, all live replicas')."""
        args: list[str | int] = [self.prefix, self.replica_id, self.lease_ms, *engines]
        raw = await self._call(lambda: self._snapshot(args=args))
        return {label: (int(raw[2 * i]), int(raw[2 * i + 1])) for i, label in enumerate(engines)}

    async def load(self, program_id: str) -> ProgramRecord | None:
        raw = await self._call(lambda: self.client.get(f"{self.prefix}prog:{program_id}"))
        return None if raw is None else _RECORD_DECODER.decode(raw)

    async def load_all(self) -> list[ProgramRecord]:
        async def scan() -> list[ProgramRecord]:
            keys = [k async for k in self.client.scan_iter(f"{self.prefix}prog:*", count=500)]
            found = []
            for start in range(0, len(keys), 500):
                for raw in await self.client.mget(keys[start : start + 500]):
                    if raw is not None:
                        found.append(_RECORD_DECODER.decode(raw))
            return found

        result: list[ProgramRecord] = await self._call(scan)
        return result

    async def owner_key(self) -> bytes:
        """The key every replica digests owner keys with (made by the first replica)."""
        key = f"{self.prefix}owner-key"

        async def get_or_make() -> bytes:
            await self.client.set(key, secrets.token_hex(32), nx=True)
            return bytes.fromhex(str(await self.client.get(key)))

        found: bytes = await self._call(get_or_make)
        return found

    async def publish(self, *words: str) -> None:
        await self._call(lambda: self.client.publish(self.channel, " ".join(words)))

    async def end_lease(self) -> None:
        """A clean stop: this replica's reservations stop counting at once."""
        await self._call(lambda: self.client.delete(f"{self.prefix}lease:{self.replica_id}"))

    # ------------------------------------------------------------------ events
    def listen(self, on_event: Callable[[list[str]], None]) -> None:
        self._listener = asyncio.create_task(self._listen(on_event), name="thunder-mw-state")

    async def _listen(self, on_event: Callable[[list[str]], None]) -> None:
        while True:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None and message["type"] == "message":
                        on_event(str(message["data"]).split())
            except (TimeoutError, RedisError, OSError):
                await asyncio.sleep(RETRY_AFTER_DOWN_S)  # Redis away: subscribe again
            finally:
                # Untyped in some redis releases (the ignore), typed in newer ones.
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            try:
                await self._listener
            except asyncio.CancelledError:
                pass
        await self.client.aclose()
