"""The `vllm-cpu-real` scenario: policies compared on ONE real vLLM CPU engine, by its own counters.

Every other scenario runs simulated engines; this one starts the real `vllm serve` of the tiny
model (benchmarks/vllm_cpu.py) with a KV cache small enough that the scenario's concurrency
overflows it, puts `thunder-mw serve` in front of it (benchmarks/live.py's Gateway, a `vllm`
backend), and replays a scaled-down swe-agent workload through it. The prefix hit rate and the
preemptions are the deltas of the engine's own `/metrics` counters over each run
(`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`,
`vllm:num_preemptions_total`), and the prefix cache is reset before each run, so runs are
independent. Policies alternate run by run, so load from other processes on the machine falls
on both alike; the spread (min/median/max) is reported beside the median run.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from thunder_mw.benchmarks.engine_counters import delta, parse_metrics, read_counters
from thunder_mw.benchmarks.live import Gateway, live_metrics
from thunder_mw.benchmarks.replay import Replayer, ReplayResult
from thunder_mw.benchmarks.scenarios import POLICIES, Scenario
from thunder_mw.benchmarks.vllm_cpu import SERVED_MODEL_NAME, start_vllm
from thunder_mw.benchmarks.workloads import (
    PRESETS,
    LogNormal,
    ProgramSpec,
    WorkloadPreset,
    generate,
)
from thunder_mw.sim.ports import free_port

# The engine's counters read before and after each run (summed over label sets).
SPREAD_KEYS = (
    "steps_per_min",
    "output_tokens_per_s",
    "jct_mean_s",
    "jct_p95_s",
    "prefix_hit_rate",
    "preemptions",
    "recomputed_prefill_tokens",
    "paused_time_s",
)
BLOCK_SIZE = 128  # vLLM's CPU block size; the KV cache is sized in whole blocks


def _scaled(dist: LogNormal, factor: float) -> LogNormal:
    return LogNormal(dist.median * factor, dist.sigma, dist.low * factor, dist.high * factor)


def scaled_preset(
    name: str, token_scale: float, time_scale: float, max_tool_s: float | None = None
) -> WorkloadPreset:
    """Preset `name` with every token count x `token_scale` and every time x `time_scale`.

    Turns, the share of instant tools and the spread of every distribution are unchanged, so the
    scaled programs keep the reference programs' shape (growing prompts, a shared system prompt,
    heavy-tailed tool time) at the size of a tiny model. `max_tool_s` clips the scaled tool time.
    """
    base = PRESETS[name]
    tool = _scaled(base.tool_s, time_scale)
    if max_tool_s is not None:
        tool = replace(tool, high=min(tool.high, max_tool_s))
    return replace(
        base,
        name=f"{name}-x{token_scale:g}",
        system_tokens=round(base.system_tokens * token_scale),
        task_tokens=_scaled(base.task_tokens, token_scale),
        tool_result_tokens=_scaled(base.tool_result_tokens, token_scale),
        output_tokens=_scaled(base.output_tokens, token_scale),
        tool_s=tool,
        start_s=_scaled(base.start_s, time_scale) if base.start_s else None,
        compact_at_tokens=round(base.compact_at_tokens * token_scale)
        if base.compact_at_tokens
        else None,
        compact_to_tokens=round(base.compact_to_tokens * token_scale),
    )


def scenario_programs(scenario: Scenario, seed: int, count: int | None = None) -> list[ProgramSpec]:
    """The scenario's programs: its preset scaled to the tiny model, one wave at t=0."""
    preset = scaled_preset(
        scenario.workload, scenario.token_scale, scenario.tool_time_scale, scenario.max_tool_s
    )
    return generate(
        preset, count or scenario.concurrency, seed=seed, max_context_tokens=scenario.max_model_len
    )


def reset_prefix_cache(url: str, attempts: int = 20) -> None:
    """Empties the engine's prefix cache (dev-mode endpoint) so a run starts cold."""
    for _ in range(attempts):
        response = httpx.post(f"{url}/reset_prefix_cache", timeout=30)
        response.raise_for_status()
        # vLLM refuses while blocks are still held by finishing requests: wait them out.
        if response.json().get("success", True):
            return
        time.sleep(0.25)
    raise RuntimeError(f"{url} would not reset its prefix cache")


def gateway_config(engine_url: str, pipeline: list[dict[str, Any]], port: int) -> dict[str, Any]:
    """`thunder-mw serve` with the one real engine as a `vllm` backend."""
    return {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "log_level": "warning",
            # Runs last seconds: read the engine's KV usage often enough to act on it.
            "tick_interval_s": 0.25,
            "probe_interval_s": 0.5,
        },
        "backends": [{"name": "vllm-cpu", "type": "vllm", "url": engine_url}],
        "policies": pipeline,
    }


def ideal_prefill_tokens(programs: list[ProgramSpec], block_size: int = BLOCK_SIZE) -> int:
    """Prefill a perfect prefix cache would still compute: each call's tokens past the whole
    blocks of what the engine already saw (the shared system prompt, the program's last call).

    `recomputed_prefill_tokens` is the engine's missed prompt tokens (queries - hits) minus
    this. vLLM counts a request's prefix query once, so the recompute of a preempted request
    is not in it: the preemption counter stands for that.
    """
    total = 0
    seen_system: set[tuple[str, int]] = set()
    for program in programs:
        previous = 0  # tokens of this program's context the engine holds (prompt + answer)
        for call, prompt in zip(program.calls, program.context_tokens(), strict=True):
            key = (program.session_type, program.system_tokens)
            if call.reset or previous == 0:
                previous = program.system_tokens if key in seen_system else 0
                seen_system.add(key)
            # vLLM always computes the prompt's last token, so a full hit stops a block short.
            cached = min(previous, prompt - 1) // block_size * block_size
            total += prompt - cached
            previous = prompt + call.output_tokens
    return total


def held_seconds(gateway_url: str) -> float:
    """Seconds requests spent held by the gateway (its queue-wait histogram's sum)."""
    samples = parse_metrics(httpx.get(f"{gateway_url}/metrics", timeout=10).text)
    return samples.get("thunder_mw_queue_wait_seconds_sum", 0.0)


def run_once(
    programs: list[ProgramSpec],
    engine_url: str,
    policy: str,
    *,
    vocab_size: int,
    tool_time_scale: float,
    stream: bool = False,
) -> dict[str, Any]:
    """One run of `programs` through a fresh gateway running `policy`: the result record."""
    reset_prefix_cache(engine_url)
    config = gateway_config(engine_url, POLICIES[policy], free_port())
    with Gateway(config) as gateway:
        before = read_counters([engine_url])
        # Tool times in the programs are already scaled to wall seconds.
        replayer = Replayer(
            gateway.url,
            model=SERVED_MODEL_NAME,
            time_scale=1.0,
            stream=stream,
            vocab_size=vocab_size,
        )
        result: ReplayResult = asyncio.run(replayer.run(programs))
        after = read_counters([engine_url])
        held = held_seconds(gateway.url)
    counted = delta(before, after)
    record = {"policy": policy, **live_metrics(result, 1.0, before, after)}
    if not stream:  # a whole answer's arrival is no first token: leave TTFT unmeasured
        record.update(ttft_p99_s=None, ttft_max_s=None)
    computed = counted["queries"] - counted["hits"]
    record.update(
        recomputed_prefill_tokens=max(0, int(computed - ideal_prefill_tokens(programs))),
        paused_time_s=round(held, 2),
        kv_imbalance=0.0,  # one engine: nothing to balance
        engine_counters={key: int(value) for key, value in counted.items()},
        # What the engine's answers said, to check its counters against.
        client_prompt_tokens=sum(c.prompt_tokens for p in result.programs for c in p.calls),
        tool_time_scale=tool_time_scale,
    )
    return record


@contextmanager
def _engine(scenario: Scenario, engine_url: str | None) -> Iterator[tuple[str, float]]:
    """(url, start seconds): the engine given, else a fresh one for the scenario."""
    if engine_url is not None:
        yield engine_url, 0.0
        return
    assert scenario.kv_tokens is not None, "the real-engine scenario sizes its KV cache"
    started = time.perf_counter()
    with start_vllm(
        num_blocks=scenario.kv_tokens // BLOCK_SIZE, max_model_len=scenario.max_model_len
    ) as engine:
        yield engine.url, round(time.perf_counter() - started, 1)


def _vocab_size(engine_url: str) -> int:
    """The served model's vocabulary size, from its config.json (the engine names its folder)."""
    root = httpx.get(f"{engine_url}/v1/models", timeout=10).json()["data"][0]["root"]
    return int(json.loads((Path(root) / "config.json").read_text())["vocab_size"])


def run_vllm_real_scenario(
    scenario: Scenario,
    policies: list[str],
    *,
    seed: int = 0,
    repeats: int = 3,
    programs: int | None = None,
    engine_url: str | None = None,
    stream: bool = False,
) -> dict[str, Any]:
    """Each policy `repeats` times on one real engine (started here unless `engine_url` names
    one): the result document, median run per policy plus min/median/max of each metric."""
    started = time.perf_counter()
    workload = scenario_programs(scenario, seed, programs)
    runs: dict[str, list[dict[str, Any]]] = {policy: [] for policy in policies}
    with _engine(scenario, engine_url) as (url, engine_start_s):
        kv_tokens = _engine_kv_tokens(url)
        vocab = _vocab_size(url)
        for _ in range(repeats):
            for policy in policies:  # alternating: background load falls on every policy
                runs[policy].append(
                    run_once(
                        workload,
                        url,
                        policy,
                        vocab_size=vocab,
                        tool_time_scale=scenario.tool_time_scale,
                        stream=stream,
                    )
                )
    results, spread = [], {}
    for policy in policies:
        ordered = sorted(runs[policy], key=lambda r: r["steps_per_min"])
        results.append(ordered[len(ordered) // 2])
        spread[policy] = {key: _spread([r.get(key) for r in ordered]) for key in SPREAD_KEYS}
    return {
        "scenario": scenario.name,
        "mode": "real",
        "seed": seed,
        "config": {
            "engine": "vllm-cpu (tiny model), one engine",
            "workload": scenario.workload,
            "token_scale": scenario.token_scale,
            "tool_time_scale": scenario.tool_time_scale,
            "max_tool_s": scenario.max_tool_s,
            "programs": len(workload),
            "calls": sum(len(p.calls) for p in workload),
            "kv_tokens": kv_tokens,
            "peak_context_tokens_sum": sum(_peak_context(p) for p in workload),
            # The best any scheduler could reach: 1 - what a perfect cache still computes.
            "prefix_hit_rate_ideal": round(
                1 - ideal_prefill_tokens(workload) / sum(sum(p.context_tokens()) for p in workload),
                4,
            ),
            "max_model_len": scenario.max_model_len,
            "repeats": repeats,
            "stream": stream,
            "policies": {p: POLICIES[p] for p in policies},
            "description": scenario.description,
        },
        "results": results,
        "spread": spread,
        "runs": runs,
        "engine_start_s": engine_start_s,
        "wall_s": round(time.perf_counter() - started, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
    }


def _peak_context(program: ProgramSpec) -> int:
    """The most KV tokens the program's context needs at once (prompt + answer)."""
    pairs = zip(program.context_tokens(), program.calls, strict=True)
    return max(prompt + call.output_tokens for prompt, call in pairs)


def _engine_kv_tokens(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:cache_config_info"):
                return int(sample.labels["block_size"]) * int(sample.labels["num_gpu_blocks"])
    return 0


def _spread(values: list[Any]) -> dict[str, Any] | None:
    present = sorted(v for v in values if v is not None)
    if not present:
        return None
    return {"min": present[0], "median": present[len(present) // 2], "max": present[-1]}


def format_spread(report: dict[str, Any]) -> str:
    """min / median / max over the runs of each policy, one line per metric."""
    lines = [f"spread over {report['config']['repeats']} runs (min / median / max):"]
    for policy, metrics in report["spread"].items():
        for key, spread in metrics.items():
            if spread is not None:
                values = " / ".join(f"{spread[k]:.4g}" for k in ("min", "median", "max"))
                lines.append(f"  {policy:12s} {key:26s} {values}")
    return "\n".join(lines)


def write_plots(report: dict[str, Any], stem: Path) -> list[Path]:
    """One PNG: each run's preemptions and prefix hit rate, per policy (engine counters)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    metrics = (
        ("preemptions", "preemptions (engine)"),
        ("prefix_hit_rate", "prefix hit rate (engine)"),
        ("jct_mean_s", "mean JCT (s)"),
    )
    policies = list(report["runs"])
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.4))
    for ax, (key, label) in zip(axes, metrics, strict=True):
        for i, policy in enumerate(policies):
            values = [run[key] for run in report["runs"][policy]]
            xs = [i + (j - (len(values) - 1) / 2) * 0.25 for j in range(len(values))]
            ax.bar(xs, values, width=0.22, label=policy, color=f"C{i}")
        ax.set_xticks(range(len(policies)), policies)
        ax.set_title(label, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{report['scenario']}: each bar one run", fontsize=10)
    fig.tight_layout()
    path = stem.parent / f"{stem.name}-runs.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]
