"""Prometheus series of speculative prefill: warming requests and the prompts remembered for them.

Warming requests are the gateway's own, never a client's: they are counted here and in the
programs' profiles (`speculative_prefills`), and appear in no client's usage.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["PrefillMetrics"]


class PrefillMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.prefills = Counter(
            "thunder_mw_speculative_prefills",
            "Warming requests the scheduler asked for, by backend and outcome (ok, no_prompt: "
            "nothing remembered for the program, unsupported: an API route it cannot warm, "
            "no_backend, http_error, failed, timeout)",
            ["backend", "outcome"],
            registry=registry,
        )
        self.tokens = Counter(
            "thunder_mw_speculative_prefill_tokens",
            "Prompt tokens of answered warming requests, by backend and kind (prompt: sent, "
            "cached: already in the engine's cache)",
            ["backend", "kind"],
            registry=registry,
        )
        self.memory_bytes = Gauge(
            "thunder_mw_speculative_prefill_memory_bytes",
            "Bytes of remembered prompts and answers held for warming",
            registry=registry,
        )
        self.memory_programs = Gauge(
            "thunder_mw_speculative_prefill_memory_programs",
            "Programs whose last prompt and answer are remembered",
            registry=registry,
        )
        self.evictions = Counter(
            "thunder_mw_speculative_prefill_memory_evictions",
            "Remembered prompts dropped to stay within speculative_prefill.memory_bytes",
            registry=registry,
        )

    def watch(self, held_bytes: Callable[[], int], held_programs: Callable[[], int]) -> None:
        """Read the memory's size at scrape time (nothing kept twice)."""
        self.memory_bytes.set_function(held_bytes)
        self.memory_programs.set_function(held_programs)
