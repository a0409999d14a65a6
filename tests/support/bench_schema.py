"""The result record every `thunder-mw bench` scenario writes, as the benchmarks issue names it."""

RECORD_KEYS = frozenset(
    {
        "policy",
        "steps_per_min",
        "output_tokens_per_s",
        "jct_mean_s",
        "jct_p95_s",
        "jct_p99_s",
        "ttft_p99_s",
        "ttft_max_s",
        "prefix_hit_rate",
        "recomputed_prefill_tokens",
        "preemptions",
        "paused_time_s",
        "kv_imbalance",
        "programs_completed",
        "programs_failed",
    }
)
