"""Named pipelines a `policies:` list may name as one entry (`- thunderagent: {}`), as YAML data.

thunder-mw's default, the original ThunderAgent's rules and the baselines users run
(policies/stages.py, policies/baselines.py). An entry that leaves a param out gets the
default of its stage's params (schemas/stage_settings.py).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BASELINE_PRESETS",
    "CORE_PRESETS",
    "DEFAULT_PIPELINE",
    "PRESETS",
    "THUNDERAGENT_PIPELINE",
    "VLLM_ROUTER_PROGRAM_BINARY_READING",
    "VLLM_ROUTER_PROGRAM_PIPELINE",
]

# The original ThunderAgent scheduler's documented rules, as a pipeline (a baseline):
# capacity check only every 5 s tick, shortest-first victims, marking without lowering the
# projection, 100 tokens per program, no home preference, 1,800 s force-resume. Like the
# vLLM router's below, it pins off the host-tier rules the default pipeline runs
# (`tier_reload`, `idle_fate`, `tier_aware`) and the idle-engine admission
# (`fill_idle_engine`): neither system has them.
THUNDERAGENT_PIPELINE: list[dict[str, Any]] = [
    {
        "admission": {
            "high_watermark": 1.0,
            "low_watermark": 1.0,
            "buffer_tokens_per_program": 100,
            "overflow": "hold",
            "tier_reload": False,
            "fill_idle_engine": False,
        }
    },
    {
        "state_aware_pause": {
            "victim": "shortest_first",
            "acting_token_weight": 1.0,
            "idle_fate": "weight",
            "yield_idle_after_s": None,
            "check": "tick",
            "reduce_projection": False,
            "high_watermark": 1.0,
        }
    },
    {
        "migration": {
            "placement": "best_fit_decreasing",
            "prefer_home_backend": False,
            "resume_timeout_s": 1800,
            "started_first": False,  # as measured since 0.1.0 (benchmarks/reuse.py)
            "tier_aware": False,
        }
    },
]

# Every stage at its params' defaults (schemas/stage_settings.py), so `- admission: {}`
# written in YAML means what the default pipeline runs.
DEFAULT_PIPELINE: list[dict[str, Any]] = [
    {"admission": {}},
    {"state_aware_pause": {}},
    {"migration": {}},
    {"gc_hooks": {}},
    {"speculative_prefill": {}},
]

CORE_PRESETS: dict[str, list[dict[str, Any]]] = {
    "thunder-mw": DEFAULT_PIPELINE,
    "thunderagent": THUNDERAGENT_PIPELINE,
    "sticky": [{"sticky": {}}],
    "round_robin": [{"round_robin": {}}],
}


# The vLLM router's program scheduler at the defaults of vllm-project/router's
# docs/program_scheduling.md (configuration reference): watermarks 1.0 / 1.0, decode buffer
# 100 tokens, `max_acting_ttl_seconds` 10 (0 until `stats_window_size` 100 returns are
# seen), `max_segment_rounds` 14, `max_active_programs_per_target` 64,
# `admission_waiting_request_threshold` 1, MRU resume, `force_resume_timeout_seconds` 300,
# consistent-hash binding and the recommended `global_queue: true` (cross-rank headroom 1.2).
# Capacity repair pauses REASONING programs only: "Acting Programs are not reclaimed by
# admission or resume; their TTL and terminal lifecycle move them out of ACTIVE state".
# Batch-gain admission "bypasses only the continuous-growth reserve", which is not modelled
# (no growth reserve here), so it has no stage. What the docs leave open is ours: the TTL is
# a quantile (0.9) of the session type's return times, capacity repair's victim order the
# fewest tokens first. benchmarks/README.md lists what is and is not modelled.
VLLM_ROUTER_PROGRAM_PIPELINE: list[dict[str, Any]] = [
    {
        "admission": {
            "high_watermark": 1.0,
            "low_watermark": 1.0,
            "buffer_tokens_per_program": 100,
            "overflow": "hold",
            "tier_reload": False,
            "fill_idle_engine": False,
        }
    },
    {"program_gate": {"max_active_programs_per_target": 64, "waiting_request_threshold": 1}},
    {
        "progress_ttl": {
            "max_acting_ttl_s": 10.0,
            "max_segment_rounds": 14,
            "min_samples": 100,
            "window": 100,
            "immature_ttl_s": 0.0,
        }
    },
    {
        "state_aware_pause": {
            "victim": "shortest_first",
            "acting_token_weight": 1.0,
            "idle_fate": "weight",
            "yield_idle_after_s": None,
            "pause_acting": False,
        }
    },
    {"program_binding": {"cross_rank_headroom_ratio": 1.2}},
    {
        "migration": {
            "placement": "mru",
            "prefer_home_backend": True,
            "resume_timeout_s": 300,
            "aging_s": 1e9,
            "started_first": False,  # MRU over every held program
            "tier_aware": False,
        }
    },
]

# The reading of the router used before its documentation was found (the package's binary
# only): kept as an ablation of the stand-in (`vllm_router_program/binary-reading`).
VLLM_ROUTER_PROGRAM_BINARY_READING: list[dict[str, Any]] = [
    {
        "admission": {
            "high_watermark": 0.9,
            "low_watermark": 0.8,
            "buffer_tokens_per_program": 256,
            "overflow": "hold",
            "tier_reload": False,
            "fill_idle_engine": False,
        }
    },
    {"progress_ttl": {}},
    {"batch_gain": {}},
    {
        "state_aware_pause": {
            "victim": "shortest_first",
            "acting_token_weight": 1.0,
            "idle_fate": "weight",
            "yield_idle_after_s": None,
        }
    },
    {
        "migration": {
            "placement": "most_room",
            "prefer_home_backend": True,
            "resume_timeout_s": 600,
            "started_first": False,
            "tier_aware": False,
        }
    },
]

BASELINE_PRESETS: dict[str, list[dict[str, Any]]] = {
    "kv_aware": [{"kv_aware": {}}],
    "session_affinity": [{"session_affinity": {}}],
    "vllm": [{"direct": {}}],
    "continuum": [{"session_affinity": {}}, {"continuum_ttl": {}}],
    "vllm_router_program": VLLM_ROUTER_PROGRAM_PIPELINE,
    "vllm_router_program/binary-reading": VLLM_ROUTER_PROGRAM_BINARY_READING,
}

# Every preset a `policies:` list may name; a name that is also a stage's is that stage.
PRESETS: dict[str, list[dict[str, Any]]] = {**CORE_PRESETS, **BASELINE_PRESETS}
