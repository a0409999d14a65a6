"""What one recompute of a program's context costs on a real engine, in decode steps.

The regime a program scheduler works in is set by this ratio: holding a program pays only when
recomputing its evicted context costs more than the decode steps the hold gives up. On GLM-4.6
on 8x H100 a 40 k-token recompute is ~50 decode steps; the tiny CPU model's is a few.

Measured from the engine's own histograms, not the client's clock (no HTTP or tokenisation
time in it): after a prefix-cache reset, a cold prompt of `context_tokens` distinct token ids
with one output token gives the prefill time (`vllm:request_prefill_time_seconds`); the same
prompt again, now cached, with `decode_tokens` + 1 output tokens gives the time of a decode
step at that context (`vllm:request_decode_time_seconds` over its decoded tokens). The ratio
is prefill / step, median over the repeats.
"""

from __future__ import annotations

import statistics
from typing import Any

import httpx

from thunder_mw.benchmarks.engine_counters import parse_metrics

__all__ = ["DECODE", "PREFILL", "measure"]

PREFILL = "vllm:request_prefill_time_seconds_sum"
DECODE = "vllm:request_decode_time_seconds_sum"


def _sample(url: str) -> dict[str, float]:
    response = httpx.get(f"{url}/metrics", timeout=30)
    response.raise_for_status()
    return parse_metrics(response.text)


def _complete(url: str, model: str, prompt: list[int], max_tokens: int) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    httpx.post(f"{url}/v1/completions", json=body, timeout=300).raise_for_status()


def _timed(url: str, model: str, prompt: list[int], max_tokens: int, key: str) -> float:
    before = _sample(url)[key]
    _complete(url, model, prompt, max_tokens)
    return _sample(url)[key] - before


def measure(
    url: str,
    model: str,
    context_tokens: int,
    *,
    vocab_size: int,
    decode_tokens: int = 64,
    repeats: int = 3,
) -> dict[str, Any]:
    """Prefill seconds, decode-step seconds and their ratio at `context_tokens` (one request
    alone on the engine at url, served as `model`)."""
    prefills, steps = [], []
    for repeat in range(repeats):
        httpx.post(f"{url}/reset_prefix_cache", timeout=30).raise_for_status()
        # Distinct ids per repeat (none cached), clear of the special tokens at the bottom.
        prompt = [8 + (repeat * 7919 + i * 31) % (vocab_size - 8) for i in range(context_tokens)]
        prefills.append(_timed(url, model, prompt, 1, PREFILL))
        decode = _timed(url, model, prompt, decode_tokens + 1, DECODE)
        steps.append(decode / decode_tokens)
    prefill_s, step_s = statistics.median(prefills), statistics.median(steps)
    return {
        "context_tokens": context_tokens,
        "prefill_s": round(prefill_s, 4),
        "decode_step_s": round(step_s, 5),
        "decode_steps_per_recompute": round(prefill_s / step_s, 1),
        "repeats": repeats,
        "prefill_s_runs": [round(p, 4) for p in prefills],
        "decode_step_s_runs": [round(s, 5) for s in steps],
    }
