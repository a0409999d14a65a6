"""Each pipeline stage's params: what a `- stage_name: {params}` entry may set, and its default.

A param left out of an entry takes the default here, and the default pipeline
(schemas/pipeline_presets.py) sets none, so `- admission: {}` is the admission stage the
default pipeline runs. The stages (policies/) read these; the `policies:` list is validated
against them when the config loads (schemas/stage_settings.py, whose entries are generated
from `STAGE_PARAMS`, the one list of built-in stages and their params).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

__all__ = [
    "STAGE_PARAMS",
    "AdmissionParams",
    "BatchGainParams",
    "ContinuumTtlParams",
    "GcParams",
    "KvAwareParams",
    "KvPlacementParams",
    "MigrationParams",
    "PauseParams",
    "ProgramBindingParams",
    "ProgramGateParams",
    "ProgressTtlParams",
    "SpeculativePrefillParams",
    "StageParams",
]


# ---------------------------------------------------------------------------- thunder-mw's stages
class StageParams(BaseModel):
    """A stage's params: unknown keys are errors; a built stage's params never change."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AdmissionParams(StageParams):
    high_watermark: float = Field(
        1.0, gt=0, le=1.5, description="Admit while reserved <= this x capacity."
    )
    low_watermark: float = Field(
        0.90, gt=0, le=1.5, description="Once over high, admit again only below this."
    )
    buffer_tokens_per_program: int = Field(
        128, ge=0, description="Tokens reserved per program on top of its context (growth)."
    )
    fill_idle_engine: bool = Field(
        True,
        description="An engine with no call in flight (every program placed there runs a "
        "tool) admits the queue's head past the watermark, if the head alone fits under "
        "it: held, the head would leave the engine idle until a tool returns; what admitting "
        "risks is the idle programs' cached KV, which the engine's LRU pushes out "
        '(docs/scheduling.md, "An idle engine").',
    )
    overflow: Literal["adaptive", "hold", "cost_aware"] = Field(
        "adaptive",
        description="How much a backend admits: `hold`: up to high_watermark, a program "
        "that does not fit waits; `cost_aware`: past it when the engine's learned cost of "
        "recomputing (or reloading from its host KV tier) what then no longer fits is below "
        "the batch width a hold loses; `adaptive`: `cost_aware` inside a working-set limit "
        "moved by feedback on the engine's measured goodput, within [low_watermark, "
        "max_limit] x capacity, starting at high_watermark (docs/scheduling.md).",
    )
    max_limit: float = Field(
        8.0,
        ge=1,
        le=64,
        description="adaptive: the most a backend admits, as a multiple of its KV capacity "
        "(the controller's ceiling: at it nothing is held).",
    )
    resident_floor: float | None = Field(
        None,
        ge=0.3,
        le=1,
        description="Correct the running programs' reservations by the engine's own KV gauge "
        "(vLLM kv_cache_usage_perc, SGLang token_usage), crediting back down to this share of "
        "them (null: trust the scheduler's own accounting; docs/scheduling.md).",
    )
    host_tier: bool = Field(
        True,
        description="cost_aware: count a backend's host (and disk) KV tier in its pool, at "
        "its reload cost (false: plan with the GPU cache alone).",
    )
    tier_reload: bool = Field(
        False,
        description="cost_aware: where the host KV tier holds the overflow, price it at its "
        "reload alone: admit past the GPU while a reload of the program's context, stalling "
        "the batch, costs less than the hold it spares, with no cap on the calls in flight "
        "(the engine queues and preempts to the tier; no effect on a backend without one; "
        "docs/scheduling.md).",
    )
    shared_prefix: bool = Field(
        False,
        description="Count a prefix (system prompt) that programs on one backend share once, "
        "as an engine with prefix caching holds it (false: every reservation counts its "
        "whole context; docs/scheduling.md).",
    )
    recompute_overflow: bool = Field(
        False,
        description="true: a backend without a host KV tier is filled past its limit with "
        "KV to recompute as `overflow` and `max_overflow` say, its controller probing past "
        "it; false: such a backend admits nothing past its limit (`max_overflow` 0 there) "
        "and runs no controller (its limit stays at high_watermark). A backend with a tier "
        "overflows as `overflow` says either way (docs/benchmarks.md, where recompute "
        "overflow loses to holding).",
    )
    max_overflow: float = Field(
        0.25,
        ge=0,
        le=1,
        description="cost_aware: the most a backend is filled past its limit with KV to "
        "recompute, as a share of its capacity (a host KV tier comes on top).",
    )

    @model_validator(mode="after")
    def _hysteresis(self) -> AdmissionParams:
        # Checked with the rest of the config, so check-config names it (not the first start).
        if self.low_watermark > self.high_watermark:
            raise PydanticCustomError(
                "watermarks",
                "low_watermark must not exceed high_watermark",
                {"field": "low_watermark"},
            )
        return self


class PauseParams(StageParams):
    victim: Literal["cost_benefit", "shortest_first", "fcfs", "new_first", "auto"] = Field(
        "auto",
        description="How victims are chosen among a backend's programs: `auto` pauses "
        "`shortest_first` (and yields nothing) while new programs keep arriving, and by "
        "`drain_victim` once they stop (a batch's drain); `fcfs`: programs in a tool as "
        "`cost_benefit`, of those in a call the one that arrived last is marked first, and "
        "paused programs resume in arrival order; `new_first`: `fcfs`, and once no more new "
        "programs are expected, those not yet begun resume before paused ones "
        "(docs/scheduling.md).",
    )
    drain_victim: Literal["cost_benefit", "fcfs", "new_first"] | None = Field(
        None,
        description="`auto`: the rule once new programs stop arriving (null: `fcfs` while "
        "the fleet has a host KV tier, else `cost_benefit`): `cost_benefit`, "
        "`fcfs` (one fixed order by arrival for marking calls to pause and for resuming: the "
        "programs furthest ahead in it run to completion and free their KV, instead of every "
        "program taking turns through the cache and the host tier) or `new_first` (the same "
        "order, and once no more new programs are expected those not yet begun first: a "
        "drain ends with its last program, and one that has not begun has all of its calls "
        "and tools still ahead; docs/scheduling.md).",
    )
    stream_patience: float = Field(
        4.0,
        gt=0,
        description="`auto`: new programs count as still arriving while the last came within "
        "this many of their usual gaps (an EMA of the gaps between first requests).",
    )
    acting_token_weight: float = Field(
        0.7,
        ge=0,
        le=1,
        description="Share of an ACTING program's context counted as resident (its KV is "
        "evictable cache while its tool runs); where `idle_fate`'s min-waste rule applies, "
        "only until the engine's prefill price is learned.",
    )
    idle_fate: Literal["weight", "min_waste", "tiered_min_waste"] = Field(
        "min_waste",
        description="What an ACTING program's reservation counts: `weight`: "
        "acting_token_weight x its context; `min_waste`: all of it or none, by InferCept's "
        "smallest waste when its call ends: keep its KV for the expected tool time, or let "
        "it go to be recomputed (or reloaded from the engine's host KV tier), stalling the "
        "batch; `tiered_min_waste`: `min_waste` on a backend with a host KV tier, `weight` "
        "elsewhere (docs/scheduling.md).",
    )
    high_watermark: float | None = Field(
        None, description="Overflow threshold (default: the admission stage's high watermark)."
    )
    check: Literal["event", "tick"] = Field(
        "event", description="Check for overflow on every event, or only on ticks."
    )
    yield_idle_after_s: float | None = Field(
        5.0,
        gt=0,
        description="When the queue's head fits nowhere, pause ACTING programs expected to "
        "stay in their tool at least this long more, to make room for it (null: never).",
    )
    reasoning_victim: Literal["largest", "smallest"] = Field(
        "largest",
        description="cost_benefit: which REASONING program is marked first: the `largest` "
        "(the fewest programs pay a pause) or the `smallest` (the least context to recompute "
        "when it returns; the programs furthest along run on: pays on very long contexts, "
        "costs batch width on moderate ones; docs/scheduling.md).",
    )
    reduce_projection: bool = Field(
        True,
        description="Count a REASONING program marked to pause as already freed (false "
        "reproduces the original's over-pausing, for the baseline only).",
    )
    pause_acting: bool = Field(
        True,
        description="On overflow pause ACTING programs first (false: REASONING ones only, "
        "the vLLM router's rule that acting programs are never reclaimed; baselines only).",
    )


class MigrationParams(StageParams):
    placement: Literal["best_fit_decreasing", "most_room", "mru"] = Field(
        "best_fit_decreasing",
        description="Queue order within a priority band: largest first (BFD), arrival, or "
        "the most recently queued first (the vLLM router's MRU resume, with `aging_s` "
        "raised past any wait; not a default: docs/benchmarks.md).",
    )
    prefer_home_backend: bool = Field(
        True, description="Resume on the previous backend when it has room (KV may be cached)."
    )
    resume_timeout_s: float = Field(
        1800.0, gt=0, description="A program queued this long is resumed regardless of room."
    )
    aging_s: float = Field(
        60.0, gt=0, description="Each this-many seconds queued raises a program one priority."
    )
    started_first: bool | None = Field(
        None,
        description="Queue programs under way (a call answered) ahead of programs not yet "
        "begun, as the original's resume order does: the set of programs started stays what "
        "the fleet runs (false: one order for both; null: started first while the fleet has "
        "a host KV tier, where a paused program's resume is a reload, not a recompute; "
        "docs/scheduling.md).",
    )
    tier_aware: bool = Field(
        True,
        description="Where a paused program's previous backend has a host KV tier (its "
        "context waits there, a reload away), resume it there, waiting for room, unless "
        "moving pays after a full recompute: the expected wait for that backend plus the "
        "reload exceed the recompute of the context on the backend with the most room, "
        "priced from the admission stage's learned costs (no effect on backends without a "
        "tier; false: the previous backend only when it has room now, else the most room; "
        "docs/scheduling.md).",
    )


class GcParams(StageParams):
    idle_ttl_s: float = Field(
        1800.0, gt=0, description="A program idle this long (no request in flight) is ended."
    )
    failed_ttl_s: float = Field(
        60.0,
        gt=0,
        description="A program none of whose calls has succeeded is ended this long after "
        "its last request or failed call (a client that gave up, or whose every request "
        "the engine refused), instead of staying listed until `idle_ttl_s`.",
    )
    reclaim: list[str] = Field(
        default_factory=lambda: ["stop", "remove"],
        description="What ending a program does to its containers, in order: stop, remove, "
        "remove_image, or a `module:function` hook.",
    )


# ---------------------------------------------------------------------------- baselines
class KvAwareParams(StageParams):
    overlap_weight: float = Field(
        1.0,
        ge=0,
        description="Weight of the tokens to prefill against the engine's active tokens "
        "(Dynamo's overlap_score_weight): cost = weight x new prefill + active tokens.",
    )
    index_fraction: float = Field(
        1.0,
        gt=0,
        description="The index forgets the least recently routed prefixes of an engine past "
        "this x its KV capacity (the engine would have evicted them).",
    )


class ContinuumTtlParams(StageParams):
    ttl_multiplier: float = Field(
        2.0,
        gt=0,
        description="TTL = this x the program's expected tool time (heavy tails: a margin "
        "over the mean keeps most returns within it).",
    )
    max_ttl_s: float = Field(
        30.0,
        gt=0,
        description="No pin when the expected tool time exceeds this (the KV would sit idle "
        "longer than a recompute costs); the TTL never exceeds it.",
    )


class ProgressTtlParams(StageParams):
    max_acting_ttl_s: float = Field(
        60.0, gt=0, description="An ACTING program keeps its reservation at most this long."
    )
    return_quantile: float = Field(
        0.9,
        gt=0,
        le=1,
        description="The armed TTL is this quantile of the session type's observed return "
        "times (tool gaps), capped by max_acting_ttl_s.",
    )
    min_samples: int = Field(
        8, ge=1, description="Before this many returns are observed the TTL is the cap."
    )
    window: int = Field(256, ge=1, description="Return times kept per session type.")
    max_segment_rounds: int | None = Field(
        32,
        ge=1,
        description="A program served this many calls since it was admitted yields its place "
        "when others are queued (null: never).",
    )
    immature_ttl_s: float | None = Field(
        None,
        ge=0,
        description="The TTL armed before `min_samples` returns are observed (null: the cap; "
        "the vLLM router documents 0 until its statistics window is full).",
    )


class BatchGainParams(StageParams):
    prefill_intercept_s: float = Field(
        0.02, ge=0, description="Prefill cost model: seconds per re-prefill (its intercept)."
    )
    prefill_s_per_1k_tokens: float = Field(
        0.03, ge=0, description="Prefill cost model: seconds per 1,000 context tokens."
    )


class ProgramGateParams(StageParams):
    max_active_programs_per_target: int | None = Field(
        64, ge=1, description="At most this many ACTIVE programs per engine (null: no cap)."
    )
    waiting_request_threshold: int = Field(
        1,
        ge=0,
        description="No admission or resume to an engine whose last scraped waiting-request "
        "count reached this (0: no gate).",
    )


class ProgramBindingParams(StageParams):
    cross_rank_headroom_ratio: float | None = Field(
        1.2,
        ge=0,
        description="global_queue: a program may resume on another engine when that engine's "
        "room is at least its bound engine's plus this x the program's footprint (null: never "
        "leave the bound engine, `global_queue: false`).",
    )


# ---------------------------------------------------------------------------- placement and warming
class KvPlacementParams(StageParams):
    overlap_weight: float = Field(
        1.0,
        ge=0,
        description="A cached prefix token is worth this many tokens of room: the engine "
        "chosen has the most `room + weight x cached prefix tokens` (0: most room only).",
    )
    index_fraction: float = Field(
        1.0,
        gt=0,
        description="The prefix index forgets an engine's least recently used prefixes past "
        "this x its KV capacity.",
    )


class SpeculativePrefillParams(StageParams):
    default: bool = Field(
        False,
        description="Warm programs that send no `nvext.agent_hints.speculative_prefill` hint "
        "(a hint of true or false decides for its program; false: only programs that ask, "
        "as warming every program did not pay in the benchmarks, docs/scheduling.md).",
    )
    min_context_tokens: int = Field(
        1024,
        ge=0,
        description="Contexts shorter than this are not warmed (their recompute is cheap).",
    )
    prefetch_elsewhere: bool = Field(
        False,
        description="Prefetch onto another engine when the program's own has no room (its "
        "KV may well still be cached at home, where its request would find it; false: "
        "elsewhere only when its own engine is gone or draining).",
    )
    prefetch_before_s: float | None = Field(
        2.0,
        ge=0,
        description="Resume a paused, idle program this long before its tool call is "
        "expected to end, when nobody is queued and an engine has room for its next request, "
        "and warm it there (null: warm only programs other rules resume).",
    )


# ---------------------------------------------------------------------------- the stage registry
# Every built-in stage's name and its params, in the order the config reference lists them:
# a `- <name>: {params}` entry of the `policies:` list (schemas/stage_settings.py) is made
# from each line, so a new stage is one line here (and its class in policies/).
STAGE_PARAMS: dict[str, type[StageParams]] = {
    "admission": AdmissionParams,
    "state_aware_pause": PauseParams,
    "migration": MigrationParams,
    "gc_hooks": GcParams,
    "speculative_prefill": SpeculativePrefillParams,
    "kv_placement": KvPlacementParams,
    "round_robin": StageParams,
    "sticky": StageParams,
    "kv_aware": KvAwareParams,
    "session_affinity": StageParams,
    "direct": StageParams,
    "continuum_ttl": ContinuumTtlParams,
    "progress_ttl": ProgressTtlParams,
    "batch_gain": BatchGainParams,
    "program_gate": ProgramGateParams,
    "program_binding": ProgramBindingParams,
}
