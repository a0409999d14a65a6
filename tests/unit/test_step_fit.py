"""lab/step_fit.py: the fit of an engine's step time from what its scrapes carry."""

from __future__ import annotations

import itertools

import pytest

from thunder_mw.lab.step_fit import fit, intervals
from thunder_mw.policies.events import BackendMetrics

A, B, C, D = 0.015, 3e-5, 1.5e-5, 2e-8  # the step's fixed time and its per-unit costs
CAPACITY = 100_000


def _scrapes(with_context: bool) -> list[BackendMetrics]:
    """Cumulative counters of an engine whose every step costs A + B prefill + C batch
    (+ D context), over intervals of varied load."""
    steps = queries = hits = itl_s = itl_n = 0.0
    out = [BackendMetrics(steps_total=0.0, inter_tokens_total=0.0, inter_token_seconds_total=0.0)]
    for batch, prefill, usage in itertools.product((4, 12, 30), (0, 200, 900), (0.2, 0.5, 0.9)):
        n = 100  # steps in the interval
        step_s = A + B * prefill + C * batch + (D * usage * CAPACITY if with_context else 0.0)
        steps += n
        queries += prefill * n + 50 * n
        hits += 50 * n
        itl_n += batch * n
        itl_s += batch * n * step_s
        out.append(
            BackendMetrics(
                kv_usage=usage,
                steps_total=steps,
                prefix_queries_total=queries,
                prefix_hits_total=hits,
                inter_tokens_total=itl_n,
                inter_token_seconds_total=itl_s,
            )
        )
    return out


def test_the_fit_recovers_the_fixed_step_time_only_with_the_kv_in_use() -> None:
    rows = intervals(_scrapes(with_context=True), CAPACITY)
    assert len(rows) == 27
    a, b, c, d = fit(rows, with_kv=True)
    assert (a, b, c, d) == pytest.approx((A, B, C, D), rel=1e-6)
    # Without the KV term the context's cost (0.4-1.8 ms a step here) lands elsewhere.
    assert fit(rows, with_kv=False)[0] != pytest.approx(A, rel=0.01)
    # An engine whose steps cost nothing per context token: both fits agree.
    rows = intervals(_scrapes(with_context=False), CAPACITY)
    assert fit(rows, with_kv=False)[0] == pytest.approx(A, rel=1e-6)


def test_an_interval_of_too_few_steps_is_left_out() -> None:
    first, second = _scrapes(with_context=True)[:2]
    few = BackendMetrics(steps_total=5.0, inter_tokens_total=10.0, inter_token_seconds_total=0.1)
    assert intervals([first, few], CAPACITY) == []
    assert len(intervals([first, second], CAPACITY)) == 1
