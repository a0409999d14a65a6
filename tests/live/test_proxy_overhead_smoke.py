"""The proxy-overhead harness runs end to end against direct and the aiohttp pass-through."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from thunder_mw.benchmarks import proxy_overhead

pytestmark = pytest.mark.slow  # starts the benchmark's engine, proxy and gateway processes

ROW_KEYS = {
    "target",
    "stream",
    "concurrency",
    "req_per_s",
    "req_per_s_min",
    "req_per_s_max",
    "latency_p50_ms",
    "latency_p99_ms",
    "added_p50_ms",
    "added_p99_ms",
    "ratio_vs_aiohttp",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    proxy_overhead.add_arguments(parser)
    output = tmp_path_factory.mktemp("bench") / "proxy-overhead.json"
    args = parser.parse_args(
        [
            "--targets=direct,aiohttp-passthrough",
            "--duration=0.3",
            "--warmup=0.1",
            "--repeats=1",
            "--concurrency=1,4",
            f"--output={output}",
        ]
    )
    result = proxy_overhead.run(args)
    result["_output"] = output
    return result


def test_report_is_written_as_the_returned_json(report: dict[str, Any]) -> None:
    written = json.loads(Path(report["_output"]).read_text())
    assert written["scenario"] == "proxy-overhead"
    assert written["mode"] == "live"
    assert written["results"] == report["results"]


def test_every_target_mode_and_concurrency_has_one_row(report: dict[str, Any]) -> None:
    cells = {(r["target"], r["stream"], r["concurrency"]) for r in report["results"]}
    assert cells == {
        (t, s, c) for t in ("direct", "aiohttp-passthrough") for s in (False, True) for c in (1, 4)
    }
    assert len(report["results"]) == len(cells)


def test_rows_have_the_schema_and_nonzero_throughput(report: dict[str, Any]) -> None:
    for row in report["results"]:
        assert ROW_KEYS <= row.keys()
        assert row["req_per_s"] > 0
        assert row["errors"] == 0


def test_ratios_are_relative_to_the_aiohttp_passthrough(report: dict[str, Any]) -> None:
    for row in report["results"]:
        if row["target"] == "aiohttp-passthrough":
            assert row["ratio_vs_aiohttp"] == 1.0
        if row["target"] == "direct":
            assert row["added_p50_ms"] == 0.0


def test_both_targets_pass_the_correctness_probe(report: dict[str, Any]) -> None:
    assert report["probes"]["direct"]["ok"]
    assert report["probes"]["aiohttp-passthrough"]["ok"]
