"""The engines thunder-mw forwards to: pooled clients, health circuits and capacity discovery.

Each backend gets one engine client on aiohttp (engines/client.py): forwarded calls on its
pool of kept-alive connections, probes, model lists and admin calls on connections of their
own (why: `EngineClient.control`). A probe loop re-reads health and KV capacity, so an
engine that starts late or restarts is picked up again. Health comes from
evidence: a failed call makes an engine suspect and probes it; it is marked down when the
probe fails, a connection is refused, or `failures_to_open` calls fail in a row.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlencode

import msgspec

from thunder_mw.engines.capacity import (
    CAPACITY_SERIES,
    exposition_capacity,
    models_max_len,
    planned_capacity,
    server_info_capacity,
)
from thunder_mw.engines.client import EngineClient, UpstreamError
from thunder_mw.engines.exposition import Exposition, read_exposition
from thunder_mw.policies.core import BackendMetrics
from thunder_mw.schemas.config import BackendSettings, ServerSettings
from thunder_mw.schemas.views import BackendView

__all__ = [
    "SCRAPED_SAMPLES",
    "SUSPECT_RECHECKS_S",
    "SUSPECT_RECHECK_S",
    "Backend",
    "BackendPool",
    "parse_signals",
    "restricted_page_target",
    "signals",
]

log = logging.getLogger("thunder_mw.backends")

# The live signals the scheduler reads, by engine flavour: (field, metric names in preference).
_SIGNALS: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "preemptions_total": ("vllm:num_preemptions_total",),
        "prefix_hits_total": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        "prefix_queries_total": (
            "vllm:prefix_cache_queries_total",
            "vllm:gpu_prefix_cache_queries_total",
        ),
        # What a prefill token and a decode step cost (policies/overflow_cost.py).
        "prefill_seconds_total": ("vllm:request_prefill_time_seconds_sum",),
        "prefill_tokens_total": ("vllm:request_prefill_kv_computed_tokens_sum",),
        "decode_seconds_total": ("vllm:request_decode_time_seconds_sum",),
        "decode_tokens_total": ("vllm:generation_tokens_total",),
        "steps_total": ("vllm:iteration_tokens_total_count",),
        "inter_token_seconds_total": ("vllm:inter_token_latency_seconds_sum",),
        "inter_tokens_total": ("vllm:inter_token_latency_seconds_count",),
    },
    "sglang": {
        "kv_usage": ("sglang:token_usage",),
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "preemptions_total": ("sglang:num_retracted_requests_total",),
        "prefix_hits_total": ("sglang:cached_tokens_total",),
        "prefix_queries_total": ("sglang:prompt_tokens_total",),
        # HiCache's host pool: a KV tier below the GPU's, counted in the scheduler's pool.
        "host_kv_tokens": ("sglang:hicache_host_total_tokens",),
    },
}


# Per flavor, every sample a probe reads from the page: the signals and the capacity.
SCRAPED_SAMPLES = {
    flavor: frozenset(n for names in fields.values() for n in names) | CAPACITY_SERIES
    for flavor, fields in _SIGNALS.items()
}


def restricted_page_target(names: frozenset[str]) -> str:
    """The engine's Prometheus page restricted to `names`, as prometheus_client's exposition
    app serves it: its documented `name[]` filter, on the app's own mount (`/metrics/`).
    vLLM mounts that app there behind the instrumentator's `/metrics` route, which renders
    the whole page whatever is asked (tests/real pins both); SGLang mounts it at /metrics."""
    return "/metrics/?" + urlencode([("name[]", name) for name in sorted(names)])


_RESTRICTED = {flavor: restricted_page_target(names) for flavor, names in SCRAPED_SAMPLES.items()}


def parse_signals(flavor: str, text: bytes) -> BackendMetrics:
    """The scheduler's live signals from a Prometheus text page (summed over label sets)."""
    return signals(flavor, read_exposition(text, SCRAPED_SAMPLES[_flavor_key(flavor)]))


def _flavor_key(flavor: str) -> str:
    return "sglang" if flavor == "sglang" else "vllm"


def signals(flavor: str, page: Exposition) -> BackendMetrics:
    found: dict[str, Any] = {}
    for field, names in _SIGNALS[_flavor_key(flavor)].items():
        for name in names:
            if name in page.totals:
                value = page.totals[name]
                found[field] = int(value) if field in ("running", "waiting") else value
                break
    return BackendMetrics(**found)


# Seconds after a suspect engine's first good probe that it is probed once more.
# A suspect engine that still answers /health is looked at again after each of these waits
# (7 s in all), then left to the periodic probe: a killed engine's API server outlives its
# engine core for a moment, longer on a loaded host (seen past 1 s with both cores busy).
SUSPECT_RECHECKS_S = (1.0, 2.0, 4.0)
SUSPECT_RECHECK_S = SUSPECT_RECHECKS_S[0]


class Backend:
    """One engine as the gateway sees it."""

    def __init__(self, settings: BackendSettings, url: str, label: str) -> None:
        self.settings = settings
        self.label = label
        self.url = url
        self.flavor = settings.sim.flavor if settings.type == "sim" else settings.type
        # Forwarded requests (the data plane) and probes, model lists, admin calls.
        self.engine: EngineClient | None = None
        self.healthy = False
        # The current run of failed calls (no call answered since) and when it began.
        self.consecutive_failures = 0
        self.first_failure_at = 0.0
        self.down_since = 0.0  # when failed calls last marked it down
        self.last_error: str | None = None
        self.discovered_capacity: int | None = None
        self.planned_capacity: int | None = None
        # The served model's longest prompt + output (`/v1/models`), read once per healthy run.
        self.max_model_len: int | None = None
        # Whether the engine answers a Prometheus page restricted to the samples read
        # (BackendPool._read_page; None: not tried since it was last seen up).
        self.restricted_metrics: bool | None = None
        self.draining = False  # leaving the pool: takes no new call, finishes its own
        self.auth_header: tuple[bytes, bytes] | None = (
            (b"authorization", f"Bearer {settings.api_key.get_secret_value()}".encode())
            if settings.api_key
            else None
        )

    @property
    def control_headers(self) -> dict[str, str] | None:
        """The engine's API key on a control-plane call, where one is configured."""
        if self.auth_header is None:
            return None
        name, value = self.auth_header
        return {name.decode("latin-1"): value.decode("latin-1")}

    @property
    def capacity_tokens(self) -> int | None:
        """KV capacity in tokens: the YAML override, else what the engine reports, else the
        capacity planned from the model and hardware."""
        return self.settings.capacity_tokens or self.discovered_capacity or self.planned_capacity

    @property
    def host_tier(self) -> tuple[int, float | None]:
        """The KV tier below the GPU's (tokens, reload tokens/s): the YAML's, else the sim
        engine's, else the capacity plan's offload tier (the numbers `thunder-mw plan` uses)."""
        s = self.settings
        tokens = s.host_kv_tokens
        speed = s.host_kv_load_tokens_per_s
        if tokens is None and s.type == "sim":
            tokens = s.sim.host_kv_tokens
            speed = speed or s.sim.host_kv_load_tokens_per_s
        if tokens is None and s.plan is not None:
            tokens = s.plan.offload_tokens
        return tokens or 0, speed

    def describe(self) -> BackendView:
        return BackendView(
            name=self.label,
            url=self.url,
            type=self.settings.type,
            healthy=self.healthy,
            draining=self.draining,
            capacity_tokens=self.capacity_tokens,
            capacity_source="config"
            if self.settings.capacity_tokens
            else "engine"
            if self.discovered_capacity
            else "plan"
            if self.planned_capacity
            else None,
            last_error=self.last_error,
        )


class BackendPool:
    """Owns the backends' clients and their health; started and stopped with the app."""

    def __init__(
        self,
        backends: list[BackendSettings],
        server: ServerSettings,
        listeners: Sequence[Callable[[Backend, BackendMetrics | None], None]] = (),
    ) -> None:
        """`listeners` hear each probe's result and each engine marked down."""
        self._settings = backends
        self._server = server
        self._probe_interval_s = server.probe_interval_s
        self.labels = [b.name or b.url or f"sim-{i}" for i, b in enumerate(backends)]
        self.listeners = list(listeners)
        self.backends: list[Backend] = []
        self._by_label: dict[str, Backend] = {}
        self._embedded: dict[str, Any] = {}  # label -> its embedded simulated engine
        self._probe_task: asyncio.Task[None] | None = None
        self._suspect_probes: dict[str, asyncio.Task[None]] = {}
        # Engines that failed again while their suspect check was already running.
        self._check_again: set[str] = set()
        self._stopping = False
        # Set by stop(): a suspect's recheck waiting between probes ends at once.
        self._stopped = asyncio.Event()
        self._rr = 0

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        for label, settings in zip(self.labels, self._settings, strict=True):
            backend = await self._open(settings, label)
            self.backends.append(backend)
            self._by_label[backend.label] = backend
        await asyncio.gather(*(self.probe(b) for b in self.backends))
        self._probe_task = asyncio.create_task(self._probe_loop(), name="thunder-mw-probe")

    async def stop(self) -> None:
        self._stopping = True
        self._stopped.set()
        if self._probe_task is not None:
            self._probe_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe_task
        probes = list(self._suspect_probes.values())
        if probes:
            # A suspect's probe in flight ends by itself within the connect timeout; cancelled
            # mid-connect, its socket can outlive the pool (an unclosed transport).
            await asyncio.wait(probes, timeout=self._server.connect_timeout_s)
        for task in list(self._suspect_probes.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for b in self.backends:
            if b.engine is not None:
                await b.engine.aclose()
        for engine in self._embedded.values():
            await engine.stop()

    async def _open(self, settings: BackendSettings, label: str) -> Backend:
        """A backend's clients (and its embedded engine, for `type: sim`), not yet probed."""
        if settings.type == "sim":
            url = await self._start_embedded(settings, label)
        else:
            assert settings.url is not None
            url = settings.url
        backend = Backend(settings, url, label)
        if settings.plan is not None:
            backend.planned_capacity = await asyncio.to_thread(planned_capacity, settings.plan)
        backend.engine = EngineClient(
            url,
            max_connections=self._server.max_connections_per_backend,
            connect_timeout_s=self._server.connect_timeout_s,
            read_timeout_s=self._server.read_timeout_s,
            first_byte_timeout_s=self._server.first_byte_timeout_s,
            keep_alive_s=settings.pool_keep_alive_s,
        )
        return backend

    # ------------------------------------------------------------------ run-time changes
    def conflict(self, settings: BackendSettings) -> str | None:
        """Why `settings` cannot join the pool (a name or URL already in it), else None."""
        label = settings.label
        if label in self._by_label:
            return f"a backend named {label!r} already exists"
        if settings.url is not None and any(b.url == settings.url for b in self.backends):
            return f"a backend at {settings.url} already exists"
        return None

    async def add(self, settings: BackendSettings) -> Backend:
        """An engine joins at run time: opened, probed for health and capacity as configured
        ones are, then listed (health, metrics and the dashboard see it at once)."""
        problem = self.conflict(settings)
        if problem is not None:
            raise ValueError(problem)
        label = settings.label
        # Reserved now: a second add of the same name while this one probes is refused.
        self._by_label[label] = backend = await self._open(settings, label)
        try:
            await self.probe(backend, notify=False)
        except BaseException:
            await self._close(backend)
            raise
        self.backends.append(backend)
        state = "healthy" if backend.healthy else "down"
        log.info("backend %s added at %s (%s)", label, backend.url, state)
        return backend

    async def remove(self, label: str) -> None:
        """The engine leaves: unlisted, its clients closed, its embedded engine stopped."""
        backend = self._by_label.pop(label, None)
        if backend is None:
            return
        if backend in self.backends:
            self.backends.remove(backend)
        task = self._suspect_probes.pop(label, None)
        if task is not None:
            task.cancel()
        await self._close(backend)
        log.info("backend %s removed", label)

    async def _close(self, backend: Backend) -> None:
        if backend.engine is not None:
            await backend.engine.aclose()
        engine = self._embedded.pop(backend.label, None)
        if engine is not None:
            await engine.stop()

    async def _start_embedded(self, settings: BackendSettings, label: str) -> str:
        # Imported here: only demo configs need the simulator, and policies/middleware must
        # not depend on benchmarks/ otherwise.
        from thunder_mw.sim.embedded import EmbeddedEngine

        engine = EmbeddedEngine(settings.sim)
        url = await engine.start()
        self._embedded[label] = engine
        log.info("embedded simulated engine %s serving at %s", label, url)
        return url

    # ------------------------------------------------------------------ queries
    def configured(self) -> list[tuple[str, int | None]]:
        """(label, capacity override) of every configured backend, known before start()."""
        return [
            (label, b.capacity_tokens) for label, b in zip(self.labels, self._settings, strict=True)
        ]

    def get(self, label: str) -> Backend | None:
        return self._by_label.get(label)

    def healthy_labels(self) -> list[str]:
        return [b.label for b in self.backends if b.healthy]

    def any_healthy(self, exclude: str | None = None) -> Backend | None:
        """A healthy backend for requests no program owns, round-robin (never a draining one)."""
        candidates = [
            b for b in self.backends if b.healthy and not b.draining and b.label != exclude
        ]
        if not candidates:
            return None
        self._rr = (self._rr + 1) % len(candidates)
        return candidates[self._rr]

    # ------------------------------------------------------------------ health
    def record_failure(self, backend: Backend, error: str, refused: bool = False) -> None:
        """A call got no answer. One failure is not evidence enough to take an engine out
        (it may be the call's own bad luck): the engine is suspect, probed at once, and keeps
        getting calls unless the probe fails. A refused connection, or `failures_to_open`
        failures in a row within `failure_window_s`, mark it down (the scheduler then stops
        counting on it); the periodic probe brings it back."""
        now = time.monotonic()
        if (
            backend.consecutive_failures == 0
            or now - backend.first_failure_at > self._server.failure_window_s
        ):
            backend.consecutive_failures = 0
            backend.first_failure_at = now
        backend.consecutive_failures += 1
        backend.last_error = error
        if refused or backend.consecutive_failures >= self._server.failures_to_open:
            if backend.healthy:
                backend.healthy = False
                backend.down_since = now
                log.warning("backend %s marked unhealthy: %s", backend.label, error)
                for listener in self.listeners:
                    listener(backend, None)
            return
        log.info("backend %s suspect, probing it: %s", backend.label, error)
        self.suspect(backend)

    def record_answer(self, backend: Backend) -> None:
        """A call was answered: a run of failed calls, if any, is over."""
        if backend.consecutive_failures:
            backend.consecutive_failures = 0

    def suspect(self, backend: Backend) -> None:
        """Probe `backend` now rather than at the next interval (a call on it failed), so a
        dead engine's programs leave it within a round trip, not a probe interval."""
        label = backend.label
        if backend.engine is None or self._stopping:
            return
        if label in self._suspect_probes:
            # The check in flight may have passed /health before this failure happened.
            self._check_again.add(label)
            return
        task = asyncio.get_running_loop().create_task(self._check(backend))
        self._suspect_probes[label] = task

        def done(_: asyncio.Task[None]) -> None:
            if self._suspect_probes.get(label) is task:
                del self._suspect_probes[label]
            if label in self._check_again:
                self._check_again.discard(label)
                if self._by_label.get(label) is backend:
                    self.suspect(backend)

        task.add_done_callback(done)

    async def _check(self, backend: Backend) -> None:
        """A suspect engine's probe, and more at growing intervals while it still answers
        (SUSPECT_RECHECKS_S): an engine being killed can still answer /health for a moment
        after a call on it broke (its API server outlives its engine core by a few scheduler
        ticks, more on a busy host)."""
        await self.probe(backend)
        for wait_s in SUSPECT_RECHECKS_S:
            if not backend.healthy or self._stopping:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), wait_s)
            if not self._stopping:
                await self.probe(backend)

    def record_success(self, backend: Backend) -> None:
        """A probe found the engine well. The run of failed calls stays counted: calls that
        keep failing on an engine whose /health answers must still take it out."""
        if not backend.healthy:
            backend.healthy = True
            log.info("backend %s healthy%s", backend.label, " again" if backend.last_error else "")

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self._probe_interval_s)
            await asyncio.gather(*(self.probe(b) for b in self.backends), return_exceptions=True)

    async def probe(self, backend: Backend, notify: bool = True) -> None:
        """Health, then capacity and live signals; a failed probe opens the circuit, a good
        one closes it. Capacity is re-read every time: a restarted engine may have changed.
        `notify=False`: the listeners are not told (a backend not yet listed)."""
        assert backend.engine is not None
        metrics: BackendMetrics | None = None
        started = time.monotonic()
        try:
            r = await backend.engine.get("/health", timeout_s=self._server.connect_timeout_s)
            if r.status != 200:
                raise UpstreamError(f"/health answered {r.status}")
        except UpstreamError as exc:
            if backend.healthy:
                log.warning("backend %s failed its health probe: %s", backend.label, exc)
            backend.healthy = False
            backend.last_error = f"health probe: {exc!r}"
            backend.discovered_capacity = None
            backend.max_model_len = None  # a restarted engine may serve another model
            backend.restricted_metrics = None  # ... or be another release
        else:
            # A probe sent before failed calls took the engine down is older evidence than
            # they are: only a later one brings it back.
            if started >= backend.down_since:
                self.record_success(backend)
            with contextlib.suppress(UpstreamError, ValueError, msgspec.DecodeError):
                metrics = await self._scrape(backend)
        if notify and self._by_label.get(backend.label) is backend:
            for listener in self.listeners:
                listener(backend, metrics)

    async def _read_page(self, backend: Backend) -> Exposition | None:
        """The samples a probe reads from the engine's Prometheus page (None: no page). Asked
        for by name first (`restricted_page_target`); where the engine answers that with no
        usage sample, the whole page, and the restricted read is not tried again until the
        engine is seen restarted. vLLM's page is ~600 lines of histograms: rendering it costs
        its API server ~4 ms a read (0.6 ms restricted), parsing it the gateway ~7.5 ms of
        the GIL its event loop needs (0.5 ms for the samples read), both off the loop here."""
        engine = backend.engine
        assert engine is not None
        timeout = self._server.connect_timeout_s
        flavor = _flavor_key(backend.flavor)
        names = SCRAPED_SAMPLES[flavor]
        if backend.restricted_metrics is not False:
            r = await engine.get(_RESTRICTED[flavor], timeout_s=timeout)
            if r.status == 200:
                with contextlib.suppress(ValueError):
                    page = await asyncio.to_thread(read_exposition, r.body, names)
                    if any(n in page.totals for n in _SIGNALS[flavor]["kv_usage"]):
                        backend.restricted_metrics = True
                        return page
            backend.restricted_metrics = False
        r = await engine.get("/metrics", timeout_s=timeout)
        if r.status != 200:
            return None
        return await asyncio.to_thread(read_exposition, r.body, names)

    async def _scrape(self, backend: Backend) -> BackendMetrics | None:
        engine = backend.engine
        assert engine is not None
        timeout = self._server.connect_timeout_s
        if backend.flavor == "sglang":
            r = await engine.get("/server_info", timeout_s=timeout)
            if r.status == 200:
                backend.discovered_capacity = server_info_capacity(r.body)
        if backend.max_model_len is None:
            models = await engine.get(
                "/v1/models", timeout_s=timeout, headers=backend.control_headers
            )
            if models.status == 200:
                backend.max_model_len = models_max_len(models.body)
        page = await self._read_page(backend)
        if page is None:
            return None
        if backend.flavor != "sglang":
            backend.discovered_capacity = exposition_capacity(page)
        return signals(backend.flavor, page)
