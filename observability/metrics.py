"""Prometheus series of the gateway, on a registry of its own (several apps may share a process)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from thunder_mw.engines.pool import BackendPool
from thunder_mw.policies.program_table import Phase, ProgramState

__all__ = ["KNOWN_ROUTES", "GatewayMetrics", "ProgramCounts"]

# `_created` series double the scrape for nothing an operator reads.
disable_created_metrics()  # type: ignore[no-untyped-call]

KNOWN_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models"})

# Live programs by state and phase (policies/core_view.py's `state_counts`).
ProgramCounts = Callable[[], Mapping[ProgramState, Mapping[Phase, int]]]


class _LiveState(Collector):
    """Gauges read at scrape time from the scheduler and pool, so nothing is kept twice."""

    def __init__(self, program_counts: ProgramCounts, pool: BackendPool) -> None:
        self._program_counts = program_counts
        self._pool = pool

    def collect(self) -> Iterable[Metric]:
        by_state = GaugeMetricFamily(
            "thunder_mw_programs", "Live programs by state and phase", labels=["state", "phase"]
        )
        # Counted by the core (`SchedulerCore.state_counts`), with no object made per program.
        for state, phases in self._program_counts().items():
            for phase, n in phases.items():
                if n:
                    by_state.add_metric([state.value, phase.value], n)
        yield by_state
        healthy = GaugeMetricFamily(
            "thunder_mw_backend_healthy",
            "1 when the backend's circuit is closed",
            labels=["backend"],
        )
        capacity = GaugeMetricFamily(
            "thunder_mw_backend_capacity_tokens", "KV capacity in tokens", labels=["backend"]
        )
        retries = CounterMetricFamily(
            "thunder_mw_backend_stale_connection_retries",
            "Calls resent once on a fresh connection because the engine had closed the pooled "
            "one they went out on (it saw nothing of them)",
            labels=["backend"],
        )
        for b in self._pool.backends:
            healthy.add_metric([b.label], 1.0 if b.healthy else 0.0)
            if b.capacity_tokens is not None:
                capacity.add_metric([b.label], b.capacity_tokens)
            if b.engine is not None:
                retries.add_metric([b.label], b.engine.stale_retries)
        yield healthy
        yield capacity
        yield retries


class _ToolState(Protocol):
    enabled: bool
    disk_bytes: int

    def counts(self) -> dict[str, int]: ...


class _ToolGauges(Collector):
    """The tool manager's containers and their disk use, read at scrape time."""

    def __init__(self, tools: _ToolState) -> None:
        self._tools = tools

    def collect(self) -> Iterable[Metric]:
        if not self._tools.enabled:
            return
        owned = GaugeMetricFamily(
            "thunder_mw_tool_containers",
            "Containers the gateway is responsible for, by state (owned, reclaiming, pool)",
            labels=["state"],
        )
        for state, n in sorted(self._tools.counts().items()):
            owned.add_metric([state], n)
        yield owned
        yield GaugeMetricFamily(
            "thunder_mw_tool_disk_bytes",
            "Writable-layer bytes of managed containers, from the engine's size accounting",
            value=self._tools.disk_bytes,
        )


class GatewayMetrics:
    """The gateway's series, on its own registry. The live gauges read `program_counts`, `pool`
    and the tool manager (`tools`, where Docker tools are on) at scrape time; their
    collectors are registered here, at construction, as every other component's series are
    when it is built on this `registry` (prometheus_client's own registration)."""

    def __init__(
        self,
        program_counts: ProgramCounts,
        pool: BackendPool,
        tools: _ToolState | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "thunder_mw_requests",
            "Requests answered, by route and HTTP status",
            ["route", "status"],
            registry=self.registry,
        )
        self.without_context = Counter(
            "thunder_mw_requests_without_context",
            "Inference requests that carried no agent context (the fail-open symptom)",
            registry=self.registry,
        )
        self.programs_released = Counter(
            "thunder_mw_programs_released",
            "Programs ended, by reason",
            ["reason"],
            registry=self.registry,
        )

        self.containers_reclaimed = Counter(
            "thunder_mw_tool_containers_reclaimed",
            "Containers reclaimed (stopped/removed) after their program ended, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.reclaim_failures = Counter(
            "thunder_mw_tool_reclaim_failures",
            "Reclaim attempts that failed (each is retried with backoff)",
            registry=self.registry,
        )
        # After the counters, in this order: the order of the exposition page.
        self.registry.register(_LiveState(program_counts, pool))
        if tools is not None:
            self.registry.register(_ToolGauges(tools))

    def count_request(self, path: str, status: int) -> None:
        route = path if path in KNOWN_ROUTES else "other"
        self.requests.labels(route, str(status)).inc()
