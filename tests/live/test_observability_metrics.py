"""/metrics as Prometheus parses it: every series operators watch, with its labels and units."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.asgi_servers import ServerThread, serving, serving_gateway
from support.fake_engine import FakeEngine
from support.held_requests import SMALL, start_hog

from thunder_mw.engines.pool import BackendPool
from thunder_mw.middleware.app import create_app
from thunder_mw.observability.decisions import DecisionLog
from thunder_mw.observability.log_format import JsonFormatter
from thunder_mw.observability.metrics import GatewayMetrics
from thunder_mw.policies import BackendChanged
from thunder_mw.policies.core import (
    Action,
    BackendMetrics,
    Paused,
    ReclaimTools,
    Reject,
    Released,
    Resumed,
    SchedulerCore,
)
from thunder_mw.schemas.config import ServerSettings, ThunderConfig

TIGHT_POLICIES = [  # whole-context accounting, no yielding: the pause these tests expect
    {"admission": {"buffer_tokens_per_program": 0, "overflow": "hold"}},
    {"state_aware_pause": {"acting_token_weight": 1.0, "yield_idle_after_s": None}},
    {"migration": {}},
    {"gc_hooks": {}},
]


def scrape(gw: ServerThread) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{gw.url}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def names(samples: Iterable[tuple[str, Any]]) -> set[str]:
    return {name for name, _ in samples}


@pytest.fixture
def gw(engine: FakeEngine) -> Iterator[ServerThread]:
    config = ThunderConfig(backends=[{"name": "e0", "url": engine.url}])
    with serving(create_app(config)) as server:
        yield server


def test_backend_series_carry_the_backend_label_and_units(gw: ServerThread) -> None:
    httpx.post(f"{gw.url}/v1/chat/completions", json={**SMALL, "program_id": "p"})
    samples = scrape(gw)
    e0 = (("backend", "e0"),)
    assert samples[("thunder_mw_backend_capacity_tokens", e0)] == 1600
    assert samples[("thunder_mw_backend_effective_capacity_tokens", e0)] == 1600
    assert samples[("thunder_mw_backend_reserved_tokens", e0)] > 0  # p is ACTIVE, ACTING
    assert samples[("thunder_mw_backend_programs", e0)] == 1


def test_imbalance_and_queue_gauges_are_exported(gw: ServerThread) -> None:
    samples = scrape(gw)
    assert samples[("thunder_mw_backend_imbalance_ratio", (("source", "reserved"),))] == 0
    assert samples[("thunder_mw_queue_programs", ())] == 0


def test_engine_signals_are_re_exported_from_the_probe(engine: FakeEngine) -> None:
    config = ThunderConfig(backends=[{"name": "e0", "url": engine.url}])
    app = create_app(config)
    with serving(app) as gw:
        # What a probe of a real engine brings back, fed as the probe loop would.
        core = app.core.scheduler.core
        gw.call(_feed(core, BackendMetrics(0.42, 3, 1, 7.0, 30.0, 120.0)))
        samples = scrape(gw)
    e0 = (("backend", "e0"),)
    assert samples[("thunder_mw_backend_engine_kv_usage_ratio", e0)] == pytest.approx(0.42)
    assert samples[("thunder_mw_backend_engine_prefix_hit_ratio", e0)] == pytest.approx(0.25)
    assert samples[("thunder_mw_backend_engine_preemptions_total", e0)] == 7
    assert samples[("thunder_mw_backend_engine_running_requests", e0)] == 3
    assert samples[("thunder_mw_backend_engine_waiting_requests", e0)] == 1
    assert samples[("thunder_mw_backend_imbalance_ratio", (("source", "engine"),))] == 0


async def _feed(core: SchedulerCore, metrics: BackendMetrics) -> None:
    core.handle(BackendChanged("e0", metrics=metrics, now=time.monotonic()))


def test_requests_are_counted_by_route_and_status_and_without_context(gw: ServerThread) -> None:
    httpx.post(f"{gw.url}/v1/chat/completions", json=SMALL)
    samples = scrape(gw)
    route = (("route", "/v1/chat/completions"), ("status", "200"))
    assert samples[("thunder_mw_requests_total", route)] == 1
    assert samples[("thunder_mw_requests_without_context_total", ())] == 1


def test_programs_are_gauged_by_state_and_phase(gw: ServerThread) -> None:
    httpx.post(f"{gw.url}/v1/chat/completions", json={**SMALL, "program_id": "p"})
    samples = scrape(gw)
    assert samples[("thunder_mw_programs", (("phase", "acting"), ("state", "active")))] == 1


def test_admissions_and_releases_are_counted_with_backend_and_reason(gw: ServerThread) -> None:
    httpx.post(f"{gw.url}/v1/chat/completions", json={**SMALL, "program_id": "p"})
    httpx.post(f"{gw.url}/programs/release", json={"program_id": "p"})
    samples = scrape(gw)
    assert samples[("thunder_mw_admissions_total", (("backend", "e0"),))] == 1
    assert samples[("thunder_mw_programs_released_total", (("reason", "release"),))] == 1


def test_final_and_ephemeral_programs_are_counted_as_released(gw: ServerThread) -> None:
    httpx.post(f"{gw.url}/v1/chat/completions", json=SMALL)  # no context: ephemeral
    samples = scrape(gw)
    assert samples[("thunder_mw_programs_released_total", (("reason", "ephemeral"),))] == 1


def test_latency_histograms_count_every_scheduled_request(gw: ServerThread) -> None:
    for _ in range(3):
        httpx.post(f"{gw.url}/v1/chat/completions", json={**SMALL, "program_id": "p"})
    samples = scrape(gw)
    assert samples[("thunder_mw_proxy_overhead_seconds_count", ())] == 3
    assert samples[("thunder_mw_proxy_overhead_seconds_bucket", (("le", "+Inf"),))] == 3
    assert ("thunder_mw_queue_wait_seconds_count", ()) in samples


def test_no_series_is_labelled_per_program(gw: ServerThread) -> None:
    for i in range(5):
        httpx.post(f"{gw.url}/v1/chat/completions", json={**SMALL, "program_id": f"prog-{i}"})
    samples = scrape(gw)
    labels = {value for _, pairs in samples for _, value in pairs}
    assert not any(v.startswith("prog-") for v in labels)


# ------------------------------------------------------------------ pauses under pressure
@pytest.fixture
def tight() -> Iterator[ServerThread]:
    """One engine whose KV holds 1,000 tokens; a slow first program fills it."""
    engine = FakeEngine(chunks=20, chunk_delay_s=0.1)
    with serving_gateway(engine, {"capacity_tokens": 1000}, policies=TIGHT_POLICIES) as gw:
        yield gw


@pytest.mark.slow  # ~2 s: holds behind a 2 s stream
def test_a_held_request_is_counted_in_the_queue_histogram_and_as_a_pause(
    tight: ServerThread,
) -> None:
    # Both run a small call and go ACTING; then `grows` asks for nearly the whole engine,
    # so `small` (ACTING: its GPU idle) is paused and its next request waits for the room.
    for program_id in ("small", "grows"):
        httpx.post(f"{tight.url}/v1/chat/completions", json={**SMALL, "program_id": program_id})
    hog = start_hog(tight.url, "grows")
    r = httpx.post(
        f"{tight.url}/v1/chat/completions", json={**SMALL, "program_id": "small"}, timeout=30
    )
    hog.join()
    samples = scrape(tight)
    assert r.status_code == 200
    pauses = sum(v for (n, _), v in samples.items() if n == "thunder_mw_pauses_total")
    assert pauses >= 1
    assert samples[("thunder_mw_pauses_total", (("backend", "e"), ("reason", "acting")))] >= 1
    assert samples[("thunder_mw_queue_wait_seconds_count", ())] >= 1
    assert samples[("thunder_mw_queue_wait_seconds_sum", ())] > 0.5  # it waited for the hog
    resumed = samples.get(("thunder_mw_resumes_total", (("backend", "e"),)), 0)
    assert resumed >= 1


def _decision_samples(*actions: Action) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    # A gateway with no engines and no programs: only the decision counters have samples.
    metrics = GatewayMetrics(dict, BackendPool([], ServerSettings()))
    decisions = DecisionLog(metrics.registry, metrics.programs_released, log_decisions=False)
    for action in actions:
        decisions.on_action(action)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in family.samples
    }


def test_a_migration_is_counted_with_both_backends_and_as_a_resume() -> None:
    samples = _decision_samples(Resumed("p", "b1", "b0", forced=False, admitted=False))
    assert (
        samples[("thunder_mw_migrations_total", (("backend", "b1"), ("from_backend", "b0")))] == 1
    )
    assert samples[("thunder_mw_resumes_total", (("backend", "b1"),))] == 1


def test_a_forced_resume_is_counted_apart_from_resumes() -> None:
    samples = _decision_samples(Resumed("p", "b0", "b0", forced=True, admitted=False))
    assert samples[("thunder_mw_forced_resumes_total", (("backend", "b0"),))] == 1
    assert ("thunder_mw_resumes_total", (("backend", "b0"),)) not in samples


def test_an_expiry_is_a_release_with_reason_expired() -> None:
    samples = _decision_samples(Released("p", "expired", ()))
    assert samples[("thunder_mw_programs_released_total", (("reason", "expired"),))] == 1


def test_a_pause_marked_during_a_call_is_not_yet_a_pause() -> None:
    samples = _decision_samples(Paused("p", "b0", "after_reasoning", pending=True))
    assert samples[("thunder_mw_pauses_marked_total", (("backend", "b0"),))] == 1
    assert not any(name == "thunder_mw_pauses_total" for name, _ in samples)


def test_reclaims_and_rejections_of_held_requests_are_counted() -> None:
    samples = _decision_samples(
        ReclaimTools("p", ("c1",), "expired", ("stop",)),
        Reject("p", 409, "program_released", "released"),
    )
    assert samples[("thunder_mw_reclaim_decisions_total", (("reason", "expired"),))] == 1
    assert samples[("thunder_mw_held_rejections_total", (("code", "program_released"),))] == 1


# ------------------------------------------------------------------ decision logs
def test_decisions_are_logged_with_program_backend_and_reason(
    gw: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="thunder_mw.decisions"):
        httpx.post(f"{gw.url}/v1/chat/completions", json={**SMALL, "program_id": "p"})
    admit = [r for r in caplog.records if r.name == "thunder_mw.decisions"]
    assert admit and admit[0].thunder == {  # type: ignore[attr-defined]  # the logger's `extra`
        "decision": "admit",
        "program_id": "p",
        "backend": "e0",
        "reason": "fits",
    }


def test_json_log_lines_carry_the_decision_fields() -> None:
    record = logging.LogRecord("thunder_mw.decisions", logging.INFO, "x", 1, "pause", (), None)
    record.thunder = {"decision": "pause", "program_id": "p", "backend": "b", "reason": "acting"}
    line = json.loads(JsonFormatter().format(record))
    assert line["program_id"] == "p" and line["backend"] == "b" and line["reason"] == "acting"
    assert line["level"] == "info" and line["logger"] == "thunder_mw.decisions"
