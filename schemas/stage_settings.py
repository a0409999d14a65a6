"""The pipeline's settings: each stage's params and the `policies:` list as a tagged union of them.

Each YAML entry is a one-key mapping, `- stage_name: {params}`; its key picks the entry's
type, so the whole list is validated once, when the config loads, with every error at its
location (`policies[i].stage.param`). A preset (`- thunderagent: {}`, schemas/pipeline_presets.py)
expands in place; a third-party stage (`- my_pkg.mod:MyStage: {...}`) is kept as written and
checked by its class's own `Params` when the pipeline is built (policies/pipeline.py). The
stages themselves (policies/stages.py and its neighbours) read these params and never
validate them again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    RootModel,
    Tag,
    TypeAdapter,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from thunder_mw.schemas.pipeline_presets import PRESETS


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
    overflow: Literal["hold", "cost_aware"] = Field(
        "cost_aware",
        description="A program that does not fit: `hold` it until room appears, or "
        "`cost_aware`: admit it past capacity when the engine's learned cost of recomputing "
        "(or reloading from its host KV tier) what then no longer fits is below the batch "
        "width a hold loses (docs/scheduling.md).",
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
    shared_prefix: bool = Field(
        False,
        description="Count a prefix (system prompt) that programs on one backend share once, "
        "as an engine with prefix caching holds it (false: every reservation counts its "
        "whole context; docs/scheduling.md).",
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
    victim: Literal["cost_benefit", "shortest_first"] = Field(
        "cost_benefit", description="How victims are chosen among a backend's programs."
    )
    acting_token_weight: float = Field(
        0.7,
        ge=0,
        le=1,
        description="Share of an ACTING program's context counted as resident (its KV is "
        "evictable cache while its tool runs).",
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
        "the most recently queued first (the vLLM router's MRU resume; baselines only).",
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


# ---------------------------------------------------------------------------- pipeline entries
class StageSetting(BaseModel):
    """A built-in stage in the pipeline, `- <stage>: {params}`: one field, named after it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    stage: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        # `- gc_hooks:` with nothing after it is that stage at its defaults.
        if isinstance(data, dict) and cls.stage in data and data[cls.stage] is None:
            return {**data, cls.stage: {}}
        return data

    @property
    def params(self) -> StageParams:
        params: StageParams = getattr(self, self.stage)
        return params


class AdmissionSetting(StageSetting):
    stage = "admission"
    admission: AdmissionParams = Field(default_factory=AdmissionParams)


class StateAwarePauseSetting(StageSetting):
    stage = "state_aware_pause"
    state_aware_pause: PauseParams = Field(default_factory=PauseParams)


class MigrationSetting(StageSetting):
    stage = "migration"
    migration: MigrationParams = Field(default_factory=MigrationParams)


class GcHooksSetting(StageSetting):
    stage = "gc_hooks"
    gc_hooks: GcParams = Field(default_factory=GcParams)


class SpeculativePrefillSetting(StageSetting):
    stage = "speculative_prefill"
    speculative_prefill: SpeculativePrefillParams = Field(default_factory=SpeculativePrefillParams)


class KvPlacementSetting(StageSetting):
    stage = "kv_placement"
    kv_placement: KvPlacementParams = Field(default_factory=KvPlacementParams)


class RoundRobinSetting(StageSetting):
    stage = "round_robin"
    round_robin: StageParams = Field(default_factory=StageParams)


class StickySetting(StageSetting):
    stage = "sticky"
    sticky: StageParams = Field(default_factory=StageParams)


class KvAwareSetting(StageSetting):
    stage = "kv_aware"
    kv_aware: KvAwareParams = Field(default_factory=KvAwareParams)


class SessionAffinitySetting(StageSetting):
    stage = "session_affinity"
    session_affinity: StageParams = Field(default_factory=StageParams)


class DirectSetting(StageSetting):
    stage = "direct"
    direct: StageParams = Field(default_factory=StageParams)


class ContinuumTtlSetting(StageSetting):
    stage = "continuum_ttl"
    continuum_ttl: ContinuumTtlParams = Field(default_factory=ContinuumTtlParams)


class ProgressTtlSetting(StageSetting):
    stage = "progress_ttl"
    progress_ttl: ProgressTtlParams = Field(default_factory=ProgressTtlParams)


class BatchGainSetting(StageSetting):
    stage = "batch_gain"
    batch_gain: BatchGainParams = Field(default_factory=BatchGainParams)


class ProgramGateSetting(StageSetting):
    stage = "program_gate"
    program_gate: ProgramGateParams = Field(default_factory=ProgramGateParams)


class ProgramBindingSetting(StageSetting):
    stage = "program_binding"
    program_binding: ProgramBindingParams = Field(default_factory=ProgramBindingParams)


STAGE_SETTINGS: dict[str, type[StageSetting]] = {
    cls.stage: cls
    for cls in (
        AdmissionSetting,
        StateAwarePauseSetting,
        MigrationSetting,
        GcHooksSetting,
        SpeculativePrefillSetting,
        KvPlacementSetting,
        RoundRobinSetting,
        StickySetting,
        KvAwareSetting,
        SessionAffinitySetting,
        DirectSetting,
        ContinuumTtlSetting,
        ProgressTtlSetting,
        BatchGainSetting,
        ProgramGateSetting,
        ProgramBindingSetting,
    )
}


def _params_of_one_name(data: Any) -> Any:
    if isinstance(data, dict) and len(data) == 1:
        name, params = next(iter(data.items()))
        if params is None:
            return {name: {}}
        if not isinstance(params, dict):
            raise PydanticCustomError(
                "stage_params", "params must be a mapping", {"field": str(name)}
            )
    return data


class CustomStageSetting(RootModel[dict[str, dict[str, Any]]]):
    """A third-party stage, `- my_pkg.mod:MyStage: {params}`: its params are checked by
    `MyStage.Params` when the pipeline is built (importing it is the builder's business)."""

    model_config = ConfigDict(frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _one_stage(cls, data: Any) -> Any:
        return _params_of_one_name(data)

    @property
    def stage(self) -> str:
        return next(iter(self.root))

    @property
    def params(self) -> dict[str, Any]:
        return self.root[self.stage]


class PresetReference(RootModel[str]):
    """A named pipeline as one entry, `- thunderagent: {}`; its stages replace it when the
    pipeline is built (`expand_presets`). Written back as it was read."""

    model_config = ConfigDict(frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _named(cls, data: Any) -> Any:
        if isinstance(data, dict) and len(data) == 1:
            name, params = next(iter(data.items()))
            if params:
                raise PydanticCustomError(
                    "preset_params",
                    "a preset names a whole pipeline and takes no parameters",
                    {"field": str(name)},
                )
            return name
        return data

    @model_serializer
    def _as_written(self) -> dict[str, dict[str, Any]]:
        return {self.root: {}}


def _unknown_stage(data: Any) -> Any:
    name = str(next(iter(data)))
    known = ", ".join(sorted({*STAGE_SETTINGS, *PRESETS}))
    raise PydanticCustomError(
        "unknown_stage",
        "unknown stage (built in: {known}; or give `module:Class`)",
        {"field": name, "known": known},
    )


def _not_one_stage(data: Any) -> Any:
    raise PydanticCustomError("stage_entry", "each entry is one `stage_name: {params}` mapping")


def _entry_tag(value: Any) -> str:
    """The union's tag: the entry's stage name, or what else the entry is."""
    if isinstance(value, StageSetting):
        return value.stage
    if isinstance(value, CustomStageSetting):
        return "custom"
    if isinstance(value, PresetReference):
        return "preset"
    if not (isinstance(value, dict) and len(value) == 1):
        return "not_one_stage"
    name = next(iter(value))
    if name in STAGE_SETTINGS:
        return str(name)
    if name in PRESETS:
        return "preset"
    return "custom" if isinstance(name, str) and ":" in name else "unknown_stage"


# The entry types of the union; the last two always refuse (their errors name the entry).
PipelineEntry = Annotated[
    Annotated[AdmissionSetting, Tag("admission")]
    | Annotated[StateAwarePauseSetting, Tag("state_aware_pause")]
    | Annotated[MigrationSetting, Tag("migration")]
    | Annotated[GcHooksSetting, Tag("gc_hooks")]
    | Annotated[SpeculativePrefillSetting, Tag("speculative_prefill")]
    | Annotated[KvPlacementSetting, Tag("kv_placement")]
    | Annotated[RoundRobinSetting, Tag("round_robin")]
    | Annotated[StickySetting, Tag("sticky")]
    | Annotated[KvAwareSetting, Tag("kv_aware")]
    | Annotated[SessionAffinitySetting, Tag("session_affinity")]
    | Annotated[DirectSetting, Tag("direct")]
    | Annotated[ContinuumTtlSetting, Tag("continuum_ttl")]
    | Annotated[ProgressTtlSetting, Tag("progress_ttl")]
    | Annotated[BatchGainSetting, Tag("batch_gain")]
    | Annotated[ProgramGateSetting, Tag("program_gate")]
    | Annotated[ProgramBindingSetting, Tag("program_binding")]
    | Annotated[CustomStageSetting, Tag("custom")]
    | Annotated[PresetReference, Tag("preset")]
    | Annotated[CustomStageSetting, BeforeValidator(_unknown_stage), Tag("unknown_stage")]
    | Annotated[CustomStageSetting, BeforeValidator(_not_one_stage), Tag("not_one_stage")],
    Discriminator(_entry_tag),
]

# A stage the builder makes: a built-in one's validated params, or a third-party one's own.
StageEntry = StageSetting | CustomStageSetting


def expand_presets(entries: Sequence[StageEntry | PresetReference]) -> list[StageEntry]:
    """The pipeline with each preset replaced by its stages."""
    out: list[StageEntry] = []
    for entry in entries:
        if isinstance(entry, PresetReference):
            out.extend(_PRESET_STAGES[entry.root])
        else:
            out.append(entry)
    return out


# The `policies:` list as written: validated entry by entry; the builder expands presets.
Pipeline = list[PipelineEntry]
PIPELINE: TypeAdapter[Pipeline] = TypeAdapter(Pipeline)
# Each preset's stages, validated once (a preset never names a preset).
_PRESET_STAGES: dict[str, list[StageEntry]] = {
    name: expand_presets(PIPELINE.validate_python(entries)) for name, entries in PRESETS.items()
}
DEFAULT_STAGES: list[StageEntry] = _PRESET_STAGES["thunder-mw"]


def entry_error(err: Mapping[str, Any]) -> tuple[tuple[int | str, ...], str]:
    """A pipeline error's location from its entry's index on (`(i, stage, param...)`,
    without the union's tag) and its message, as `policies[i].stage.param: message` says it."""
    loc = err["loc"]
    where: tuple[int | str, ...] = (loc[0], *loc[2:]) if len(loc) > 1 else tuple(loc)
    field = (err.get("ctx") or {}).get("field")
    if isinstance(field, str):
        where += (field,)
    message = "unknown parameter" if err["type"] == "extra_forbidden" else err["msg"]
    return where, message
