"""`thunder-mw replay`: drive agent programs through any OpenAI-compatible URL and measure.

    thunder-mw replay --url http://127.0.0.1:8300 --workload swe-agent --programs 32
    thunder-mw replay --url http://127.0.0.1:8000 --trace my-runs.jsonl --no-release

The target may be thunder-mw, a bare engine, or another gateway (the original ThunderAgent):
the program id rides in the body as `extra_body` puts it. Before and after the run the
engines' own /metrics counters are read — the engines behind thunder-mw (from its /health),
the URL itself when it is an engine, or the `--engine` URLs given — so prefix hits and
preemptions are the engines' figures, comparable across targets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TextIO

import httpx

from thunder_mw.benchmarks.engine_counters import delta, hit_rate, read_counters
from thunder_mw.benchmarks.live import live_metrics
from thunder_mw.benchmarks.replay import Replayer
from thunder_mw.benchmarks.workloads import (
    PRESETS,
    ProgramSpec,
    generate,
    load_trace,
    scaled_preset,
)

__all__ = ["ProgressBar", "add_replay_arguments", "discover_engines", "run_replay"]


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `thunder-mw replay`."""
    parser.add_argument("--url", required=True, help="Base URL of the target (no /v1).")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--workload", choices=sorted(PRESETS), help="Generate from a preset.")
    source.add_argument("--trace", type=Path, help="Replay a JSONL trace (one program a line).")
    parser.add_argument("--programs", type=int, default=16, help="Programs to generate.")
    parser.add_argument("--seed", type=int, default=0, help="Workload seed.")
    parser.add_argument(
        "--arrival-rate",
        type=float,
        help="Programs per second (Poisson); default: all start at once.",
    )
    parser.add_argument(
        "--token-scale",
        type=float,
        default=1.0,
        help="Multiply every token count of the preset (0.125 fits a tiny model).",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        help="The engine's max_model_len: contexts past it are compacted, as agents do.",
    )
    parser.add_argument("--model", default="sim-model", help="Model name sent in requests.")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="Workload seconds per wall second (tool delays sleep 1/time-scale as long).",
    )
    parser.add_argument(
        "--token-ids",
        type=int,
        metavar="VOCAB",
        help="Send prompts as token ids modulo VOCAB (a real engine: exact prefix reuse).",
    )
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="URL",
        help="An engine whose /metrics to read (repeatable; default: discovered).",
    )
    parser.add_argument(
        "--no-release", action="store_true", help="Do not POST /programs/release at the end."
    )
    parser.add_argument(
        "--no-stream", action="store_true", help="Non-streaming calls (no TTFT measured)."
    )
    parser.add_argument("--output", type=Path, help="Write the result JSON here.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")


def run_replay(args: argparse.Namespace, err: TextIO | None = None) -> int:
    err = err or sys.stderr
    url = args.url.rstrip("/")
    programs = _programs(args)
    engines = args.engine or discover_engines(url)
    before = _counters(engines, err)
    bar = None if args.no_progress else ProgressBar(programs, err)
    replayer = Replayer(
        url,
        model=args.model,
        time_scale=args.time_scale,
        release=not args.no_release,
        stream=not args.no_stream,
        vocab_size=args.token_ids,
        progress=bar,
    )
    error: str | None = None
    try:
        result = asyncio.run(replayer.run(programs))
    except Exception as exc:  # whatever went wrong, the calls already made are reported
        result = replayer.partial_result()
        error = f"the run stopped early: {exc!r}"
        print(error, file=err)
    if bar is not None:
        bar.close(replayer)
    after = _counters(engines, err)
    counted = delta(before, after) if before is not None and after is not None else None
    zeros = {"hits": 0.0, "queries": 0.0, "preemptions": 0.0}
    metrics = live_metrics(result, args.time_scale, before or zeros, after or zeros)
    metrics["prefix_hit_rate"] = hit_rate(counted) if counted else None
    metrics["preemptions"] = int(counted["preemptions"]) if counted else None
    metrics["stale_connection_retries"] = result.stale_retries
    release_errors = {p.program_id: p.release_error for p in result.programs if p.release_error}
    for program_id, problem in release_errors.items():
        print(f"release of {program_id} failed: {problem}", file=err)
    report = {
        "command": "replay",
        "url": url,
        "workload": args.workload or str(args.trace),
        "programs": len(programs),
        "seed": args.seed,
        "time_scale": args.time_scale,
        "engines": engines,
        "engine_counters": {k: int(v) for k, v in counted.items()} if counted else None,
        "result": metrics,
        "release_errors": release_errors,
        "error": error,
    }
    print(json.dumps(report, indent=1))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if metrics["programs_failed"] == 0 and not release_errors and not error else 1


def _programs(args: argparse.Namespace) -> list[ProgramSpec]:
    if args.trace is not None:
        return load_trace(args.trace)
    preset = PRESETS[args.workload]
    if args.token_scale != 1.0:
        preset = replace(scaled_preset(args.workload, args.token_scale, 1.0), name=preset.name)
    return generate(
        preset,
        args.programs,
        seed=args.seed,
        arrival_rate=args.arrival_rate,
        max_context_tokens=args.max_model_len,
    )


def discover_engines(url: str) -> list[str]:
    """The engines behind a thunder-mw (its /health lists them), else the URL itself when it
    serves engine metrics; [] when neither (the counters are then left out)."""
    try:
        health = httpx.get(f"{url}/health", timeout=10)
        backends = health.json().get("backends") if health.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        backends = None
    if backends:
        return [b["url"] for b in backends if isinstance(b, dict) and b.get("url")]
    try:
        metrics = httpx.get(f"{url}/metrics", timeout=10)
    except httpx.HTTPError:
        return []
    engine_metrics = metrics.status_code == 200 and (
        "vllm:" in metrics.text or "sglang:" in metrics.text
    )
    return [url] if engine_metrics else []


def _counters(engines: list[str], err: TextIO) -> dict[str, float] | None:
    if not engines:
        print("no engine /metrics found: prefix hits and preemptions left out", file=err)
        return None
    try:
        return read_counters(engines)
    except httpx.HTTPError as exc:
        print(f"engine /metrics unreadable ({exc}): counters left out", file=err)
        return None


def _count(programs: list[ProgramSpec] | tuple[ProgramSpec, ...]) -> tuple[int, int]:
    """(programs, calls), sub-agents included."""
    programs_n = calls_n = 0
    for program in programs:
        programs_n += 1
        calls_n += len(program.calls)
        for call in program.calls:
            sub_programs, sub_calls = _count(call.subagents)
            programs_n += sub_programs
            calls_n += sub_calls
    return programs_n, calls_n


class ProgressBar:
    """Calls and programs done: redrawn in place on a terminal, a line per tenth otherwise."""

    WIDTH = 30

    def __init__(self, programs: list[ProgramSpec], out: TextIO) -> None:
        self.programs, self.calls = _count(programs)
        self.out = out
        self.tty = out.isatty()
        self.started = time.monotonic()
        self._tenth = -1
        self._last = ""

    def __call__(self, replayer: Replayer) -> None:
        share = replayer.calls_done / self.calls if self.calls else 1.0
        if self.tty:
            self.out.write("\r" + self._line(replayer, share))
            self.out.flush()
        elif int(share * 10) > self._tenth:
            self._tenth = int(share * 10)
            self._write(self._line(replayer, share))

    def close(self, replayer: Replayer) -> None:
        line = self._line(replayer, 1.0)
        if self.tty:
            self.out.write("\r" + line + "\n")
        elif line != self._last:
            self._write(line)

    def _write(self, line: str) -> None:
        self._last = line
        self.out.write(line + "\n")

    def _line(self, replayer: Replayer, share: float) -> str:
        filled = round(share * self.WIDTH)
        return (
            f"replay [{'#' * filled}{'-' * (self.WIDTH - filled)}] "
            f"{replayer.calls_done}/{self.calls} calls, "
            f"{replayer.done}/{self.programs} programs, {replayer.failed_calls} failed, "
            f"{time.monotonic() - self.started:.1f} s"
        )
