"""`thunder-mw replay`: programs driven through thunder-mw or a bare engine, the engines' own
counters read before and after, and a progress bar."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from support.asgi_servers import ServerThread, serving
from support.real_vllm import RealVllm

from thunder_mw.benchmarks.replay import Replayer
from thunder_mw.benchmarks.replay_cli import ProgressBar
from thunder_mw.benchmarks.workloads import generate, save_trace
from thunder_mw.cli.main import main
from thunder_mw.middleware.app import create_app
from thunder_mw.schemas.config import ThunderConfig

SIM = {"type": "sim", "sim": {"time_scale": 50.0, "profile": "instant"}}


@pytest.fixture(scope="module")
def gateway() -> Iterator[ServerThread]:
    config = ThunderConfig(backends=[{**SIM, "name": "s0"}, {**SIM, "name": "s1"}])
    with serving(create_app(config)) as server:
        yield server


def replay(tmp_path: Path, *argv: str) -> tuple[int, dict[str, Any]]:
    output = tmp_path / "replay.json"
    code = main(["replay", *argv, "--output", str(output)])
    return code, json.loads(output.read_text())


def test_a_replay_through_thunder_mw_reads_the_engines_behind_it(
    gateway: ServerThread, tmp_path: Path
) -> None:
    code, report = replay(
        tmp_path,
        "--url",
        gateway.url,
        "--workload",
        "chat",
        "--programs",
        "3",
        "--time-scale",
        "50",
    )
    assert code == 0
    backends = httpx.get(f"{gateway.url}/health").json()["backends"]
    assert report["engines"] == [b["url"] for b in backends]
    result, counted = report["result"], report["engine_counters"]
    assert result["programs_completed"] == 3 and result["programs_failed"] == 0
    assert counted["queries"] > 0 and 0 <= counted["hits"] <= counted["queries"]
    assert result["prefix_hit_rate"] == round(counted["hits"] / counted["queries"], 4)
    # Released at the end: nothing of the run is left on the gateway.
    assert httpx.get(f"{gateway.url}/programs").json()["count"] == 0


def test_a_trace_file_replays_its_programs(gateway: ServerThread, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    save_trace(generate("chat", 2, seed=7, prefix="t"), trace)
    code, report = replay(
        tmp_path, "--url", gateway.url, "--trace", str(trace), "--no-stream", "--time-scale", "50"
    )
    assert code == 0
    assert report["programs"] == 2 and report["result"]["programs_completed"] == 2


def test_the_progress_bar_ends_with_every_call_and_program_done() -> None:
    programs = generate("chat", 3, seed=1)
    calls = sum(len(p.calls) for p in programs)
    out = io.StringIO()
    bar = ProgressBar(programs, out)
    # Any: a stand-in for the Replayer, with only the counters the bar reads.
    done: Any = SimpleNamespace(calls_done=0, done=0, failed_calls=0)
    for step in range(1, calls + 1):
        done.calls_done = step
        bar(done)
    done.done = 3
    bar.close(done)
    lines = out.getvalue().splitlines()
    assert 2 <= len(lines) <= 12  # a line per tenth, not one per call
    assert f"{calls}/{calls} calls, 3/3 programs, 0 failed" in lines[-1]


def test_replayer_reports_progress_after_every_call(gateway: ServerThread) -> None:
    seen: list[int] = []
    replayer = Replayer(gateway.url, time_scale=50, progress=lambda r: seen.append(r.calls_done))
    programs = generate("chat", 2, seed=3)
    asyncio.run(replayer.run(programs))
    assert max(seen) == sum(len(p.calls) for p in programs)


@pytest.mark.real_vllm
def test_a_replay_straight_to_the_real_engine_reads_its_own_counters(
    vllm_engine: RealVllm, tmp_path: Path
) -> None:
    vocab = json.loads((vllm_engine.model_dir / "config.json").read_text())["vocab_size"]
    code, report = replay(
        tmp_path,
        "--url",
        vllm_engine.url,
        "--workload",
        "swe-agent",
        "--token-scale",
        "0.0625",
        "--max-model-len",
        "1024",
        "--programs",
        "2",
        "--time-scale",
        "50",
        "--model",
        vllm_engine.model,
        "--token-ids",
        str(vocab),
        "--no-release",
        "--no-progress",
    )
    assert code == 0, report
    assert report["engines"] == [vllm_engine.url]  # a bare engine: its own /metrics
    counted = report["engine_counters"]
    assert report["result"]["programs_completed"] == 2
    assert counted["generation_tokens"] > 0 and counted["prompt_tokens"] > 0
    assert counted["hits"] > 0  # each program's later calls reuse its earlier prefix
