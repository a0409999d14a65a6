"""The scheduler core's events about engines: health, capacity and signals changing, engines
joining, draining and leaving, caches flushed, and other replicas' reservations."""

from __future__ import annotations

from collections.abc import Iterable

from thunder_mw.policies._backend_state import BackendState, is_live, learn_from_engine
from thunder_mw.policies._placement import Placement
from thunder_mw.policies.decisions import Action
from thunder_mw.policies.events import BackendMetrics
from thunder_mw.policies.program_table import ProgramState

__all__ = ["FleetEvents"]


class FleetEvents(Placement):
    """Each `_on_*` method is one event `handle` dispatches: it changes state and returns
    the actions."""

    def _take(self) -> list[Action]:
        actions, self._actions = self._actions, []
        return actions

    def _on_backend(
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
        self.ledger.room_epoch += 1
        backend = self.backends.get(label)
        if backend is None:
            return self._take()
        if capacity is not None:
            backend.capacity = capacity
        if max_model_len is not None:
            backend.max_model_len = max_model_len
        if metrics is not None and learn_from_engine(backend, metrics):
            self.counters["capacity_backoffs"] += 1
        if healthy is not None and healthy != backend.healthy:
            if healthy:
                # A draining engine may answer its probes; it still admits nothing.
                backend.healthy = not backend.draining
            else:
                self._backend_down(backend, now)
        self._changed(label, now)
        self._resume_pass(now)
        return self._take()

    def _on_foreign_reservations(self, label: str, tokens: int, now: float) -> list[Action]:
        """Other gateway replicas' programs now hold `tokens` on `label` (their share of the
        engine, read from the shared store): admission counts them as reserved. When the
        share shrinks, room appeared: queued programs may be placed."""
        backend = self.backends.get(label)
        if backend is None or not self.ledger.set_foreign(backend, tokens):
            return []
        return self._on_backend(label, now=now)

    def foreign_reserved(self, label: str) -> int:
        backend = self.backends.get(label)
        return backend.foreign_reserved if backend is not None else 0

    def _on_backend_added(
        self, label: str, capacity: int | None, now: float, *, healthy: bool = True
    ) -> list[Action]:
        """An engine joined at run time: queued programs may be placed on it at once."""
        self._actions = []
        if label in self.backends:
            raise ValueError(f"backend {label!r} already exists")
        backend = self.backends[label] = BackendState(label, capacity, healthy, is_live)
        self._backend_views[label] = backend.view
        self.counters["backends_added"] += 1
        self.ledger.room_epoch += 1
        self._changed(label, now)
        self._resume_pass(now)
        return self._take()

    def _on_backend_drained(self, label: str, now: float) -> list[Action]:
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

    def _on_backend_removed(self, label: str, now: float) -> list[Action]:
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
        del self._backend_views[label]
        self.counters["backends_removed"] += 1
        self.ledger.room_epoch += 1
        self._resume_pass(now)
        return self._take()

    def _on_host_tier_declared(
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
        self.ledger.room_epoch += 1

    def _on_caches_flushed(self, now: float, labels: Iterable[str] | None = None) -> list[Action]:
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
        self.ledger.room_epoch += 1
        self._resume_pass(now)
        return self._take()

    def _on_connection_refused(
        self, program_id: str, failed_backend: str, now: float
    ) -> str | None:
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
