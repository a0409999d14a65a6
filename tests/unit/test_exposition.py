"""Reading only the samples the gateway wants from an engine's Prometheus page
(engines/exposition.py `read_exposition(text, names)`): the same signals and capacity as the
whole page, on a page recorded from vLLM 0.32."""

from __future__ import annotations

from pathlib import Path

import pytest

from thunder_mw.engines.capacity import CAPACITY_SERIES, exposition_capacity
from thunder_mw.engines.exposition import read_exposition
from thunder_mw.engines.pool import parse_signals, signals

PAGE = (Path(__file__).parents[1] / "sim" / "vllm_0.32_metrics.txt").read_bytes()


def test_the_samples_read_give_what_the_whole_page_gives() -> None:
    whole = read_exposition(PAGE)
    read = parse_signals("vllm", PAGE)
    assert read == signals("vllm", whole)
    # A test that could fail: the recorded page carries these, so the filter must keep them.
    assert read.kv_usage is not None and read.prefill_seconds_total is not None
    names = CAPACITY_SERIES | {"vllm:num_requests_running"}
    assert exposition_capacity(read_exposition(PAGE, names)) == exposition_capacity(whole)
    assert exposition_capacity(whole) is not None


def test_only_the_named_samples_are_kept() -> None:
    page = read_exposition(PAGE, frozenset({"vllm:num_requests_running"}))
    assert set(page.totals) == {"vllm:num_requests_running"}
    # A page with none of the names is read whole (so one that is not Prometheus text
    # still raises, below).
    assert "vllm:num_requests_running" in read_exposition(PAGE, frozenset({"nope"})).totals


def test_a_page_that_is_not_prometheus_text_still_raises() -> None:
    with pytest.raises(ValueError):
        read_exposition(b"<html>not metrics {{</html>\n", frozenset({"vllm:kv_cache_usage_perc"}))
