"""The scheduler core: one owner of program and backend state, driven by events, returning actions.

Pure: no I/O, no wall clock (every event carries `now`). The live middleware and the
discrete-event harness feed it the same events, so benchmarks measure the shipped code.
Decisions are delegated to the pipeline's stages (policies/stages.py); this module keeps
the mechanics those stages share: reservations, the global queue, pause and resume.

Every index is a heap with lazy deletion keyed on a per-program version, so each event
costs O(log n) in the number of programs; nothing rescans the table per event.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from thunder_mw.policies import context_limit
from thunder_mw.policies.estimates import TokenEstimator, ToolTimeModel
from thunder_mw.policies.lazy_heap import LazyHeap
from thunder_mw.policies.program_table import Phase, Program, ProgramState, ProgramTable, Usage
from thunder_mw.policies.shared_prefix import SharedPrefixes
from thunder_mw.schemas.agent_context import AgentContext

if TYPE_CHECKING:
    from thunder_mw.policies.stages import Stage


# ---------------------------------------------------------------- decisions and actions
class Forward(msgspec.Struct, frozen=True):
    program_id: str
    backend: str
    # Keep the call's KV resident this long after it ends (an engine with TTL pinning,
    # as Continuum's; None: the engine's own eviction). Set by a stage's `kv_ttl` hook.
    kv_ttl_s: float | None = None
    # False: the request is past every engine's limit by the scheduler's estimate only
    # (policies/context_limit.py); it goes to the engine unplanned, counted nowhere.
    planned: bool = True


class Hold(msgspec.Struct, frozen=True):
    program_id: str
    # Larger than every healthy engine's KV as planned: it could only run on an empty engine,
    # so it is held briefly (`server.alone_hold_s`), then placed (`on_hold_expired`).
    alone: bool = False


class Reject(msgspec.Struct, frozen=True):
    """Answer the program's held requests (or the arriving one) with this error."""

    program_id: str
    status: int
    code: str
    message: str
    param: str | None = "program_id"


class Resumed(msgspec.Struct, frozen=True):
    """The program may run on `backend`: forward its held requests there."""

    program_id: str
    backend: str
    previous_backend: str | None
    forced: bool
    admitted: bool  # first placement of a new program, not a resume after a pause
    kv_ttl_s: float | None = None  # as Forward.kv_ttl_s, for the held requests

    @property
    def migrated(self) -> bool:
        return self.previous_backend is not None and self.previous_backend != self.backend


class Paused(msgspec.Struct, frozen=True):
    program_id: str
    backend: str
    reason: str  # "acting" (paused at once) or "after_reasoning" (when its call ends)
    pending: bool


class Released(msgspec.Struct, frozen=True):
    program_id: str
    reason: str  # release | final | ephemeral | expired | abandoned
    docker_ids: tuple[str, ...]


class ReclaimTools(msgspec.Struct, frozen=True):
    program_id: str
    container_ids: tuple[str, ...]
    reason: str
    hooks: tuple[str, ...]


class Prefill(msgspec.Struct, frozen=True):
    """Warm `backend`'s cache with the program's last prompt and answer while its tool runs:
    a one-token request the gateway sends itself (never a client's call, never its usage),
    so the program's next call finds its prefix cached. `tokens`: its context, for metrics."""

    program_id: str
    backend: str
    tokens: int
    reason: str  # "resume" (resumed or moved while ACTING) or "prefetch" (resumed early)


Action = Resumed | Reject | Paused | Released | ReclaimTools | Prefill
Decision = Forward | Hold | Reject


class RequestInfo(msgspec.Struct, frozen=True):
    """What the middleware knows of a request before it runs."""

    prompt_chars: int = 0
    max_tokens: int | None = None
    # The request's leading shared part (a system prompt; for the DES its session type's),
    # by a key and its length in characters: KV-aware placement sends new programs where it
    # is already cached. None: the request has no recognisable shared prefix.
    prefix_key: str | None = None
    prefix_chars: int = 0
    # Characters of the prompt-bearing fields alone (policies/context_limit.py), for the
    # lower bound that refuses a request too long for every engine; None: counted from
    # `prompt_body` if given, else `prompt_chars`.
    prompt_text_chars: int | None = None
    # The decoded body, read (never changed) to count those characters only for a request
    # whose size could make it too long: walking every body costs each request time.
    prompt_body: dict[str, Any] | None = None


class BackendMetrics(msgspec.Struct, frozen=True):
    """Live signals scraped from an engine; counters are totals since the engine started."""

    kv_usage: float | None = None
    running: int | None = None
    waiting: int | None = None
    preemptions_total: float | None = None
    prefix_hits_total: float | None = None
    prefix_queries_total: float | None = None
    # What a prefill and a decode step cost (policies/overflow_cost.py): vLLM's per-request
    # prefill/decode time histograms' sums over their token counts.
    prefill_seconds_total: float | None = None
    prefill_tokens_total: float | None = None
    decode_seconds_total: float | None = None
    decode_tokens_total: float | None = None
    # A host KV tier the engine reports (SGLang HiCache's host pool), tokens.
    host_kv_tokens: float | None = None


class BackendState:
    """One engine as the scheduler sees it."""

    __slots__ = (
        "acting",
        "capacity",
        "cold_since",
        "congested",
        "draining",
        "healthy",
        "hits_baseline",
        "host_kv_tokens",
        "host_load_tokens_per_s",
        "label",
        "max_model_len",
        "metrics",
        "overflow_tokens",
        "pending_release",
        "preemptions_seen",
        "queries_baseline",
        "reasoning",
        "reserved",
        "resident_ratio",
        "running_reserved",
        "scale",
        "shared",
    )

    def __init__(self, label: str, capacity: int | None, healthy: bool, is_live: Any) -> None:
        self.label = label
        self.capacity = capacity
        # The served model's longest prompt + output, as the engine reports it (None: unknown).
        self.max_model_len: int | None = None
        self.healthy = healthy
        self.reserved = 0  # tokens held by its ACTIVE programs
        # Of which held by programs with a call in the engine (what its KV gauge measures).
        self.running_reserved = 0
        # Share of `running_reserved` the engine's own KV gauge says it holds (a stage's
        # bounded correction, policies/resident.py; 1.0: trust the reservations).
        self.resident_ratio = 1.0
        self.pending_release = 0  # of which held by programs marked to pause after their call
        self.scale = 1.0  # shrinks when the engine preempts: our model of it was too generous
        self.congested = False
        # Tokens past the watermark the cost-aware rule currently accepts (admission and
        # pausing both plan with limit + this; 0: hold whenever it does not fit).
        self.overflow_tokens = 0
        # Host (and disk) KV tier below the GPU's, declared in the config (0: none known;
        # the engine's own report, metrics.host_kv_tokens, wins), and its reload speed.
        self.host_kv_tokens = 0
        self.host_load_tokens_per_s: float | None = None
        self.preemptions_seen: float | None = None
        self.metrics = BackendMetrics()
        # Draining: admits nothing (the core treats it as unhealthy whatever probes say); it
        # leaves once no program is placed on it.
        self.draining = False
        # The engine's cache was flushed (weights updated) at `cold_since`: the prefix-hit
        # counters are read from these baselines on, so the expected hit rate starts afresh.
        self.cold_since: float | None = None
        self.hits_baseline = 0.0
        self.queries_baseline = 0.0
        self.acting: LazyHeap[Program] = LazyHeap(is_live)
        self.reasoning: LazyHeap[Program] = LazyHeap(is_live)
        # Prefixes its programs share, counted once (policies/shared_prefix.py; None: every
        # reservation counts its whole context).
        self.shared: SharedPrefixes | None = None

    @property
    def unused(self) -> int:
        """Reserved tokens the engine does not hold: copies of a shared prefix it holds once
        (policies/shared_prefix.py), and what its KV gauge says (policies/resident.py)."""
        shared = self.shared
        if shared is None:  # the default, read several times per request: no credits
            return int((1.0 - self.resident_ratio) * max(0, self.running_reserved))
        return shared.credit + self.running_unused - shared.running_credit

    @property
    def running_unused(self) -> int:
        """Of `unused`, what is reserved by programs with a call in flight."""
        credit = self.shared.running_credit if self.shared is not None else 0
        running = max(0, self.running_reserved - credit)
        return credit + int((1.0 - self.resident_ratio) * running)

    @property
    def shared_credit(self) -> int:
        return self.shared.credit if self.shared is not None else 0

    @property
    def shared_running_credit(self) -> int:
        return self.shared.running_credit if self.shared is not None else 0

    @property
    def projected(self) -> int:
        """Reserved tokens once the programs already marked to pause have paused."""
        return self.reserved - self.pending_release

    def limit(self, fraction: float) -> float | None:
        if self.capacity is None:
            return None
        return self.capacity * self.scale * fraction

    def prefix_hit_rate(self) -> float | None:
        """The engine's prefix-cache hit rate since its cache was last cold (flushed by a
        weight update, or the engine started): hits / queries, in tokens."""
        hits, queries = self.metrics.prefix_hits_total, self.metrics.prefix_queries_total
        if hits is None or queries is None:
            return None
        queries -= self.queries_baseline
        return (hits - self.hits_baseline) / queries if queries > 0 else None


def _live(program: Program, stamp: int) -> bool:
    return program.version == stamp and program.state is not ProgramState.TERMINATED


class SchedulerCore:
    """Programs and backends; call the `on_*` methods with events, act on what they return."""

    def __init__(
        self,
        backends: Iterable[tuple[str, int | None]],
        stages: Sequence[Stage] = (),
        *,
        default_output_tokens: int = 256,
        chars_per_token: float = 4.0,
    ) -> None:
        self.table = ProgramTable()
        self.backends: dict[str, BackendState] = {
            label: BackendState(label, capacity, True, _live) for label, capacity in backends
        }
        self.stages = list(stages)
        self.tokens = TokenEstimator(chars_per_token)
        self.tool_time = ToolTimeModel()
        self.default_output_tokens = default_output_tokens
        # Footprint parameters; stages set them when bound.
        self.buffer_tokens = 0
        self.acting_weight = 1.0
        # Count a prefix shared by programs on one backend once (a stage turns it on).
        self.dedupe_prefixes = False
        self._prefix_slots: dict[str, tuple[SharedPrefixes, str, bool]] = {}
        self.queue: LazyHeap[Program] = LazyHeap(_live)
        self.queue_fifo: collections.deque[tuple[float, Program]] = collections.deque()
        self.idle: LazyHeap[Program] = LazyHeap(_live)
        self.queued = 0
        # Room can only appear when a reservation shrinks, a backend changes or time passes;
        # until then a queue head that fit nowhere still fits nowhere (skip re-placing it).
        self._room_epoch = 0
        self._blocked: tuple[int, int, int] | None = None
        self._actions: list[Action] = []
        self.counters: collections.Counter[str] = collections.Counter()
        for stage in self.stages:
            stage.bind(self)

    # ================================================================ events
    def on_request(
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
        too_large = self._too_large(ctx, info, healthy, known, prompt)
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
        program.last_active_at = now
        if info.prefix_key is not None:
            program.prefix_key = info.prefix_key
            program.prefix_tokens = self.tokens.prompt_tokens(info.prefix_chars, program.backend)
        request_tokens = self._request_tokens(program, info, prompt)
        # Stages see the arriving request's footprint (route decides per request on it).
        program.request_tokens = request_tokens
        for stage in self.stages:
            stage.on_request(self, program, now)
        backend = self.backends.get(program.backend) if program.backend else None
        if program.state is ProgramState.ACTIVE and backend is not None and backend.healthy:
            routed = self._route(program, now)
            if routed is not None and routed != program.backend:
                self._move(program, routed)
            program.in_flight += 1
            program.phase = Phase.REASONING
            self._reserve(program, max(request_tokens, program.reserved_tokens))
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

    def on_finished(
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
        for stage in self.stages:
            stage.on_finished(self, program, usage, ok, now)
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
                    self._reserve(program, 0)
                else:
                    self._reserve(program, self._footprint(program))
            self._reindex(program)
            if program.backend is not None:
                self._changed(program.backend, now)
        self._resume_pass(now)
        return self._take()

    def on_abandoned(self, program_id: str, now: float) -> list[Action]:
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

    def on_hold_expired(self, program_id: str, now: float, *, place: bool) -> list[Action]:
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
            self.resume(program, target.label, now, forced=True)
            return self._take()
        return self.on_abandoned(program_id, now)

    def on_release(self, program_id: str, reason: str, now: float) -> tuple[bool, list[Action]]:
        self._actions = []
        program = self.table.get(program_id)
        if program is None:
            return False, self._take()
        self._release(program, reason, now)
        self._resume_pass(now)
        return True, self._take()

    def on_tick(self, now: float) -> list[Action]:
        self._actions = []
        self._room_epoch += 1
        for stage in self.stages:
            stage.on_tick(self, now)
        self._resume_pass(now)
        self._drop_stale_entries()
        return self._take()

    def on_backend(
        self,
        label: str,
        *,
        healthy: bool | None = None,
        capacity: int | None = None,
        max_model_len: int | None = None,
        metrics: BackendMetrics | None = None,
        now: float,
    ) -> list[Action]:
        """A backend's health, capacity or live signals changed."""
        self._actions = []
        self._room_epoch += 1
        backend = self.backends.get(label)
        if backend is None:
            return self._take()
        if capacity is not None:
            backend.capacity = capacity
        if max_model_len is not None:
            backend.max_model_len = max_model_len
        if metrics is not None:
            self._learn_from_engine(backend, metrics)
        if healthy is not None and healthy != backend.healthy:
            if healthy:
                # A draining engine may answer its probes; it still admits nothing.
                backend.healthy = not backend.draining
            else:
                self._backend_down(backend, now)
        self._changed(label, now)
        self._resume_pass(now)
        return self._take()

    def add_backend(
        self, label: str, capacity: int | None, now: float, *, healthy: bool = True
    ) -> list[Action]:
        """An engine joined at run time: queued programs may be placed on it at once."""
        self._actions = []
        if label in self.backends:
            raise ValueError(f"backend {label!r} already exists")
        self.backends[label] = BackendState(label, capacity, healthy, _live)
        self.counters["backends_added"] += 1
        self._room_epoch += 1
        self._changed(label, now)
        self._resume_pass(now)
        return self._take()

    def drain_backend(self, label: str, now: float) -> list[Action]:
        """Stop admitting to `label`: its idle programs leave it now (their next request is
        placed elsewhere), paused programs homed there resume elsewhere, programs with a call
        in flight leave it when that call ends. `drained(label)` says when none is left."""
        self._actions = []
        backend = self.backends.get(label)
        if backend is None or backend.draining:
            return self._take()
        backend.draining = True
        self.counters["backends_drained"] += 1
        if backend.healthy:
            self._backend_down(backend, now)
        self._changed(label, now)
        self._resume_pass(now)
        return self._take()

    def drained(self, label: str) -> bool:
        """No ACTIVE program is placed on `label` (a removed backend counts as drained)."""
        return self.table.programs_on(label) == 0

    def remove_backend(self, label: str, now: float) -> list[Action]:
        """The engine leaves. Programs still placed on it (a drain cut short) are unplaced
        like an engine going down; nothing refers to the engine's state afterwards."""
        self._actions = []
        backend = self.backends.get(label)
        if backend is None:
            return self._take()
        backend.draining = True
        backend.healthy = False
        for program in list(self.table):
            if program.state is ProgramState.ACTIVE and program.backend == label:
                self._unplace(program, now)
                self._reindex(program)
        del self.backends[label]
        self.counters["backends_removed"] += 1
        self._room_epoch += 1
        self._resume_pass(now)
        return self._take()

    def declare_host_tier(
        self, label: str, tokens: int, load_tokens_per_s: float | None = None
    ) -> None:
        """A KV tier below the engine's GPU cache (host memory, disk), as the config declares
        it: evicted KV waits there and reloads at `load_tokens_per_s` instead of recomputing."""
        backend = self.backends.get(label)
        if backend is None:
            raise ValueError(f"unknown backend {label!r}")
        if tokens < 0 or (load_tokens_per_s is not None and load_tokens_per_s <= 0):
            raise ValueError("a host KV tier needs tokens >= 0 and a positive load speed")
        backend.host_kv_tokens = tokens
        backend.host_load_tokens_per_s = load_tokens_per_s
        self._room_epoch += 1

    def mark_cache_cold(self, now: float, labels: Iterable[str] | None = None) -> list[Action]:
        """The engines' KV caches were flushed (a weight update): nothing a program computed
        is resident any more. Hit-rate baselines restart from the engines' current counters,
        and programs not placed anywhere lose their home preference (recomputing costs the
        same everywhere now; a move is no migration)."""
        self._actions = []
        chosen = set(self.backends if labels is None else labels)
        for label in chosen:
            backend = self.backends.get(label)
            if backend is None:
                continue
            backend.cold_since = now
            backend.hits_baseline = backend.metrics.prefix_hits_total or 0.0
            backend.queries_baseline = backend.metrics.prefix_queries_total or 0.0
            self.counters["cache_flushes"] += 1
        for program in self.table:
            if program.state is not ProgramState.ACTIVE and program.backend in chosen:
                program.backend = None
                self._reindex(program)
        self._room_epoch += 1
        self._resume_pass(now)
        return self._take()

    def reroute(self, program_id: str, failed_backend: str, now: float) -> str | None:
        """The engine refused the connection before any byte: move the call elsewhere."""
        program = self.table.get(program_id)
        backend = self.backends.get(failed_backend)
        if backend is not None and backend.healthy:
            self._backend_down(backend, now)
        candidates = [b for b in self.healthy_backends() if b.label != failed_backend]
        if program is None or not candidates:
            return None
        target = max(candidates, key=self.room).label
        if program.state is ProgramState.ACTIVE:
            self._move(program, target)
            program.migrations += 1
            self._reindex(program)
        return target

    # ================================================================ queries
    def healthy_backends(self) -> list[BackendState]:
        return [b for b in self.backends.values() if b.healthy]

    def room(self, backend: BackendState, fraction: float = 1.0) -> float:
        limit = backend.limit(fraction)
        return float("inf") if limit is None else limit - backend.reserved

    def admits(self, program: Program, backend: BackendState, now: float) -> bool:
        tokens = self._footprint(program, for_resume=True)
        if backend.shared is not None and program.program_id not in self._prefix_slots:
            # What the engine already holds of it: its prefix, if others here share it.
            running = program.in_flight > 0 or program.waiting > 0
            tokens -= backend.shared.credit_for(program.prefix_key, running)
        return all(stage.admits(self, program, backend, tokens, now) for stage in self.stages)

    def programs(self) -> list[Program]:
        return list(self.table)

    def footprint_for_resume(self, program: Program) -> int:
        return self._footprint(program, for_resume=True)

    def queue_length(self) -> int:
        return self.queued

    # ================================================================ primitives for stages
    def pause(self, program: Program, now: float, reason: str = "acting") -> None:
        """Pause a program: at once when ACTING; after its call when REASONING."""
        if program.state is not ProgramState.ACTIVE or program.pause_pending:
            return
        backend = self.backends[program.backend] if program.backend else None
        if program.in_flight > 0 and backend is not None:
            program.pause_pending = True
            program.pending_tokens = program.reserved_tokens
            backend.pending_release += program.reserved_tokens
            self._actions.append(Paused(program.program_id, backend.label, "after_reasoning", True))
            self.counters["pauses_marked"] += 1
            self._reindex(program)
            return
        self._pause_now(program, now, reason)

    def resume(self, program: Program, backend: str, now: float, forced: bool = False) -> None:
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
        self._reserve(program, self._footprint(program))
        self._reindex(program)
        self.counters[
            "forced_resumes" if forced else ("admissions" if admitted else "resumes")
        ] += 1
        ttl = self._kv_ttl(program, now) if program.in_flight else None
        self._actions.append(Resumed(program.program_id, backend, previous, forced, admitted, ttl))
        for stage in self.stages:
            stage.on_resumed(self, program, previous, now)
        if waited is not None and not forced:
            for stage in self.stages:
                stage.on_queue_wait(self, program, waited, now)
        self._changed(backend, now)

    def release(self, program: Program, reason: str, now: float) -> None:
        self._release(program, reason, now)

    def emit(self, action: Action) -> None:
        self._actions.append(action)

    def victim_key(self, program: Program, acting: bool = True) -> Any:
        """The pipeline's pause-order key for `program` (to push back a popped victim)."""
        return self._victim_key(program, acting)

    def expected_tool_time(self, program: Program) -> float:
        return self.tool_time.expected(program.session_type, program.tool_time_ema_s)

    # ================================================================ mechanics
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
        estimate of its prompt's tokens."""
        home = known.backend if known is not None else None
        if known is not None:
            prompt = max(prompt, known.context_tokens)
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

    def _take(self) -> list[Action]:
        actions, self._actions = self._actions, []
        return actions

    def _request_tokens(self, program: Program, info: RequestInfo, prompt: int) -> int:
        output = (
            info.max_tokens
            or program.expected_output_tokens
            or (program.completion_tokens // program.steps if program.steps else 0)
            or self.default_output_tokens
        )
        return max(program.context_tokens, prompt) + output + self.buffer_tokens

    def _footprint(self, program: Program, for_resume: bool = False) -> int:
        if program.in_flight > 0 or (for_resume and program.waiting > 0):
            return max(program.request_tokens, program.context_tokens + self.buffer_tokens)
        return int(self.acting_weight * program.context_tokens) + self.buffer_tokens

    def _reserve(self, program: Program, tokens: int) -> None:
        if program.state is not ProgramState.ACTIVE or program.backend is None:
            return
        backend = self.backends[program.backend]
        if tokens < program.reserved_tokens:
            self._room_epoch += 1
        backend.reserved += tokens - program.reserved_tokens
        running = tokens if program.in_flight > 0 else 0
        backend.running_reserved += running - program.running_tokens
        program.running_tokens = running
        if self.dedupe_prefixes:
            self._hold_prefix(program, backend, running > 0)
        if program.pause_pending:
            backend.pending_release += tokens - program.pending_tokens
            program.pending_tokens = tokens
        program.reserved_tokens = tokens

    def _unreserve(self, program: Program) -> None:
        if program.reserved_tokens:
            self._room_epoch += 1
        if program.backend is not None and program.state is ProgramState.ACTIVE:
            backend = self.backends[program.backend]
            backend.reserved -= program.reserved_tokens
            backend.running_reserved -= program.running_tokens
            if program.pause_pending:
                backend.pending_release -= program.pending_tokens
                program.pending_tokens = 0
        program.reserved_tokens = 0
        program.running_tokens = 0
        program.pause_pending = False
        slot = self._prefix_slots.pop(program.program_id, None)
        if slot is not None:
            slot[0].remove(slot[1], slot[2])

    def _hold_prefix(self, program: Program, backend: BackendState, running: bool) -> None:
        """Keep `program`'s entry among the prefixes its backend holds once up to date."""
        key = program.prefix_key if program.prefix_tokens > 0 else None
        slot = self._prefix_slots.get(program.program_id)
        if slot is not None:
            if slot[0] is backend.shared and slot[1] == key and slot[2] == running:
                return
            slot[0].remove(slot[1], slot[2])
            del self._prefix_slots[program.program_id]
        if key is None:
            return
        if backend.shared is None:
            backend.shared = SharedPrefixes(self.acting_weight)
        backend.shared.add(key, program.prefix_tokens, running)
        self._prefix_slots[program.program_id] = (backend.shared, key, running)

    def _move(self, program: Program, target: str) -> None:
        tokens = program.reserved_tokens
        self._unreserve(program)
        self.table.uncount_active(program)
        program.backend = target
        self.table.count_active(program)
        self._reserve(program, tokens)

    def _pause_now(self, program: Program, now: float, reason: str) -> None:
        backend = program.backend or ""
        self._unreserve(program)
        self.table.uncount_active(program)
        program.state = ProgramState.PAUSED
        program.paused_at = now
        program.pauses += 1
        self.counters["pauses"] += 1
        self._actions.append(Paused(program.program_id, backend, reason, False))
        self._reindex(program)

    def _backend_down(self, backend: BackendState, now: float) -> None:
        """Rare event: one O(n) pass hands the engine's idle programs back to the queue side,
        so nothing stays counted against an engine the gateway no longer uses. Programs with
        a call in flight there leave it when that call ends (`on_finished`)."""
        backend.healthy = False
        self._room_epoch += 1
        for program in list(self.table):
            if (
                program.backend == backend.label
                and program.state is ProgramState.ACTIVE
                and program.in_flight == 0
            ):
                self._unplace(program, now)
                self._reindex(program)

    def _unplace(self, program: Program, now: float) -> None:
        self._unreserve(program)
        self.table.uncount_active(program)
        program.state = ProgramState.PAUSED
        program.paused_at = now

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
        self._unreserve(program)
        self.table.remove(program.program_id)
        self.counters[f"released_{reason}"] += 1
        self._actions.append(Released(program.program_id, reason, tuple(program.docker_ids)))
        for stage in self.stages:
            stage.on_release(self, program, reason, now)
        if backend is not None:
            self._changed(backend, now)

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
            # Only the migration stage pops this FIFO, and only from its front.
            self.queue_fifo = collections.deque(
                (queued_at, program)
                for queued_at, program in fifo
                if program.queued_at == queued_at and program.state is not ProgramState.TERMINATED
            )

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
                backend.acting.push(self._victim_key(program, acting=True), program, stamp)
            else:
                backend.reasoning.push(self._victim_key(program, acting=False), program, stamp)
        if program.waiting > 0 and program.state is not ProgramState.ACTIVE:
            assert program.queued_at is not None
            self.queue.push(self._queue_key(program), program, stamp)
        if program.in_flight == 0 and program.waiting == 0:
            self.idle.push(program.last_active_at, program, stamp)

    def _victim_key(self, program: Program, acting: bool) -> Any:
        for stage in self.stages:
            key = stage.victim_key(self, program, acting)
            if key is not None:
                return key
        return (program.reserved_tokens,)

    def _queue_key(self, program: Program) -> Any:
        for stage in self.stages:
            key = stage.queue_key(self, program)
            if key is not None:
                return key
        return (program.queued_at,)

    def _route(self, program: Program, now: float) -> str | None:
        for stage in self.stages:
            target = stage.route(self, program, now)
            if target is not None:
                return target
        return None

    def _kv_ttl(self, program: Program, now: float) -> float | None:
        for stage in self.stages:
            ttl = stage.kv_ttl(self, program, now)
            if ttl is not None:
                return ttl
        return None

    def _place(self, program: Program, now: float) -> str | None:
        for stage in self.stages:
            target = stage.place(self, program, now)
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
            blocked = (id(program), program.version, self._room_epoch)
            if blocked == self._blocked:
                return
            target = self._place(program, now)
            if target is None:
                # A stage may free room for the head (e.g. from programs idle in long tools).
                if any(stage.on_queue_blocked(self, program, now) for stage in self.stages):
                    target = self._place(program, now)
                if target is None:
                    self._blocked = (id(program), program.version, self._room_epoch)
                    return
            self.resume(program, target, now)

    def _changed(self, backend: str, now: float) -> None:
        state = self.backends.get(backend)
        if state is None:
            return
        for stage in self.stages:
            stage.on_backend_change(self, state, now)

    def _learn_from_engine(self, backend: BackendState, metrics: BackendMetrics) -> None:
        backend.metrics = metrics
        if (metrics.prefix_queries_total or 0.0) < backend.queries_baseline:
            # The engine restarted since its cache went cold: its counters start from zero.
            backend.hits_baseline = backend.queries_baseline = 0.0
        total = metrics.preemptions_total
        if total is None:
            return
        seen = backend.preemptions_seen
        backend.preemptions_seen = total
        if seen is None or total < seen:  # first scrape, or the engine restarted
            return
        if total > seen:
            # The engine is preempting: what we reserve does not fit in it. Plan with less.
            backend.scale = max(0.5, backend.scale * 0.9)
            self.counters["capacity_backoffs"] += 1
        else:
            backend.scale = min(1.0, backend.scale + 0.02)
