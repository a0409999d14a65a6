"""One engine as the scheduler sees it: capacity, reservations, health, live signals; and the
read-only view of it that stages and the layers outside the core read."""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from thunder_mw.policies._lazy_heap import LazyHeap
from thunder_mw.policies.events import BackendMetrics
from thunder_mw.policies.program_table import Program, ProgramState
from thunder_mw.policies.shared_prefix import SharedPrefixes

__all__ = ["BackendState", "ReadOnlyBackend", "is_live", "learn_from_engine"]


class BackendState:
    """One engine as the scheduler sees it."""

    __slots__ = (
        "acting",
        "capacity",
        "cold_since",
        "contexts",
        "draining",
        "foreign_reserved",
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
        "view",
    )

    def __init__(self, label: str, capacity: int | None, healthy: bool, is_live: Any) -> None:
        self.label = label
        self.capacity = capacity
        # The served model's longest prompt + output, as the engine reports it (None: unknown).
        self.max_model_len: int | None = None
        self.healthy = healthy
        self.reserved = 0  # tokens held by its ACTIVE programs, and by other replicas'
        # Of which other gateway replicas' programs hold (`ForeignReservations`).
        self.foreign_reserved = 0
        # Of which held by programs with a call in the engine (what its KV gauge measures).
        self.running_reserved = 0
        # Share of `running_reserved` the engine's own KV gauge says it holds (a stage's
        # bounded correction, policies/resident.py; 1.0: trust the reservations).
        self.resident_ratio = 1.0
        self.pending_release = 0  # of which held by programs marked to pause after their call
        # The whole contexts of its ACTIVE programs, whatever their reservations count: what
        # the engine keeps between its GPU cache and its host tier without recomputing any.
        self.contexts = 0
        self.scale = 1.0  # shrinks when the engine preempts: our model of it was too generous
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
        self.view = ReadOnlyBackend(self)

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


class ReadOnlyBackend:
    """An engine as stages (`BackendView`, policies/views.py) and the layers outside the core
    read it: read-only properties over the core's `BackendState`, always current; an
    assignment raises AttributeError. One per engine, made with its state; only the core
    follows its private back-reference."""

    __slots__ = ("_backend",)

    # Each field below becomes a property reading the state's attribute of that name (a
    # C-level getter, installed after the class). `BackendView`'s, then the two the gauges
    # and replication read.
    label: str
    capacity: int | None
    healthy: bool
    reserved: int
    running_reserved: int
    contexts: int
    resident_ratio: float
    overflow_tokens: int
    host_kv_tokens: int
    host_load_tokens_per_s: float | None
    metrics: BackendMetrics
    cold_since: float | None
    unused: int
    running_unused: int
    shared_running_credit: int
    projected: int
    scale: float
    draining: bool

    def __init__(self, backend: BackendState) -> None:
        self._backend = backend

    def __repr__(self) -> str:
        return f"ReadOnlyBackend({self._backend.label!r})"

    def limit(self, fraction: float) -> float | None:
        backend = self._backend  # BackendState.limit's arithmetic, one call fewer per read
        if backend.capacity is None:
            return None
        return backend.capacity * backend.scale * fraction


for _field in ReadOnlyBackend.__annotations__:
    setattr(ReadOnlyBackend, _field, property(attrgetter(f"_backend.{_field}")))
del _field


def is_live(program: Program, stamp: int) -> bool:
    """An index entry for `program` pushed at `stamp` still stands."""
    return program.version == stamp and program.state is not ProgramState.TERMINATED


def learn_from_engine(backend: BackendState, metrics: BackendMetrics) -> bool:
    """Takes in a scrape of the engine's signals; True when it preempted since the last one
    (the planning scale then shrinks: what we reserve does not fit in it)."""
    backend.metrics = metrics
    if (metrics.prefix_queries_total or 0.0) < backend.queries_baseline:
        # The engine restarted since its cache went cold: its counters start from zero.
        backend.hits_baseline = backend.queries_baseline = 0.0
    total = metrics.preemptions_total
    if total is None:
        return False
    seen = backend.preemptions_seen
    backend.preemptions_seen = total
    if seen is None or total < seen:  # first scrape, or the engine restarted
        return False
    if total > seen:
        backend.scale = max(0.5, backend.scale * 0.9)
        return True
    backend.scale = min(1.0, backend.scale + 0.02)
    return False
