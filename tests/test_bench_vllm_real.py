"""`thunder-mw bench --scenario vllm-cpu-real` end to end on the real vLLM CPU engine (a tiny run:
one repeat of three programs), its result document, and counters that came from the engine."""

from __future__ import annotations

import argparse
import json

import pytest
from bench_schema import RECORD_KEYS

from thunder_mw.benchmarks.bench_cli import add_bench_arguments, run_bench
from thunder_mw.benchmarks.vllm_real import ideal_prefill_tokens
from thunder_mw.benchmarks.workloads import Call, ProgramSpec


@pytest.fixture(scope="module")
def report(vllm_engine, tmp_path_factory):
    output = tmp_path_factory.mktemp("bench") / "vllm-cpu-real.json"
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    args = parser.parse_args(
        [
            "--scenario",
            "vllm-cpu-real",
            "--repeats",
            "1",
            "--programs",
            "3",
            "--engine-url",
            vllm_engine.url,
            "--output",
            str(output),
            "--no-plots",
        ]
    )
    assert run_bench(args) == 0
    return json.loads(output.read_text())


def test_result_document_has_the_scenario_schema(report):
    assert {"scenario", "mode", "seed", "config", "results"} <= report.keys()
    assert report["scenario"] == "vllm-cpu-real" and report["mode"] == "real"
    assert [r["policy"] for r in report["results"]] == ["round_robin", "thunder-mw"]
    for record in report["results"]:
        assert RECORD_KEYS <= record.keys()


def test_every_program_completes_under_each_policy(report):
    for record in report["results"]:
        assert record["programs_completed"] == 3 and record["programs_failed"] == 0


def test_prefix_counters_come_from_the_engine(report):
    for record in report["results"]:
        counters = record["engine_counters"]
        assert counters["queries"] > 0
        # The engine counted exactly the prompt tokens its answers reported to the client.
        assert counters["queries"] == record["client_prompt_tokens"]
        assert record["prefix_hit_rate"] == round(counters["hits"] / counters["queries"], 4)
        assert record["preemptions"] == counters["preemptions"]


def test_ideal_prefill_counts_whole_blocks_a_perfect_cache_would_serve():
    program = ProgramSpec(
        "p", "t", system_tokens=200, calls=(Call(100, 50), Call(150, 10))
    )  # prompts 300 then 500 tokens; the second extends the first's 350-token context
    # Call 0: nothing cached yet (300). Call 1: 2 whole blocks (256) of 350 served: 244.
    assert ideal_prefill_tokens([program], block_size=128) == 300 + 244


def test_a_second_program_of_the_same_type_finds_the_system_prompt_cached():
    programs = [ProgramSpec(f"p{i}", "t", system_tokens=260, calls=(Call(40, 8),)) for i in (0, 1)]
    # The second skips the system prompt's 2 whole blocks.
    assert ideal_prefill_tokens(programs, block_size=128) == 300 + (300 - 256)


def test_spread_reports_min_median_max_per_policy(report):
    spread = report["spread"]["thunder-mw"]["prefix_hit_rate"]
    assert spread["min"] <= spread["median"] <= spread["max"]
