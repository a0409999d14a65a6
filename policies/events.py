"""What the scheduler core is told: the payloads of its events besides ids and times."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["BackendMetrics", "ProgramHistory", "RequestInfo"]


class RequestInfo(msgspec.Struct, frozen=True):
    """What the middleware knows of a request before it runs."""

    prompt_chars: int = 0
    max_tokens: int | None = None
    # The request's leading shared part (a system prompt; for the DES its session type's),
    # by a key and its length in characters: KV-aware placement sends new programs where it
    # is already cached. None: the request has no recognisable shared prefix.
    prefix_key: str | None = None
    prefix_chars: int = 0
    # Characters of the prompt-bearing fields alone (policies/context_limit.py), for the
    # lower bound that refuses a request too long for every engine; None: counted from
    # `prompt_body` if given, else `prompt_chars`.
    prompt_text_chars: int | None = None
    # The decoded body, read (never changed) to count those characters only for a request
    # whose size could make it too long: walking every body costs each request time.
    prompt_body: dict[str, Any] | None = None


class BackendMetrics(msgspec.Struct, frozen=True):
    """Live signals scraped from an engine; counters are totals since the engine started."""

    kv_usage: float | None = None
    running: int | None = None
    waiting: int | None = None
    preemptions_total: float | None = None
    prefix_hits_total: float | None = None
    prefix_queries_total: float | None = None
    # What a prefill and a decode step cost (policies/overflow_cost.py): vLLM's per-request
    # prefill/decode time histograms' sums over their token counts.
    prefill_seconds_total: float | None = None
    prefill_tokens_total: float | None = None
    decode_seconds_total: float | None = None
    decode_tokens_total: float | None = None
    # The marginal price of a prefill token by regression (policies/overflow_cost.py): the
    # engine's steps (vLLM's `iteration_tokens_total` histogram's count) and its decode
    # tokens' inter-token latencies (`inter_token_latency_seconds` sum and count).
    steps_total: float | None = None
    inter_token_seconds_total: float | None = None
    inter_tokens_total: float | None = None
    # A host KV tier the engine reports (SGLang HiCache's host pool), tokens.
    host_kv_tokens: float | None = None


class ProgramHistory(msgspec.Struct, frozen=True):
    """What another replica recorded of a program (state/redis_store.py), carried into this
    replica's table when it takes the program's calls over."""

    source: str | None = None
    backend: str | None = None  # its home: placement prefers it
    steps: int = 0
    context_tokens: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    failures: int = 0
    pauses: int = 0
    migrations: int = 0
    tool_time_ema_s: float | None = None
    expected_output_tokens: int | None = None
