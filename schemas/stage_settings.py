"""The `policies:` list: a tagged union of stage settings, keyed by the stage's name.

Each YAML entry is a one-key mapping, `- stage_name: {params}`; its key picks the entry's
type, so the whole list is validated once, when the config loads, with every error at its
location (`policies[i].stage.param`). A preset (`- thunderagent: {}`, schemas/pipeline_presets.py)
stands for its stages; a third-party stage (`- my_pkg.mod:MyStage: {...}`) is kept as written
and checked by its class's own `Params` (policies/pipeline.py, which imports it). Each built-in
entry holds its stage's params (schemas/stage_params.py), which the stages read as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar

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
from thunder_mw.schemas.stage_params import (
    AdmissionParams,
    BatchGainParams,
    ContinuumTtlParams,
    GcParams,
    KvAwareParams,
    KvPlacementParams,
    MigrationParams,
    PauseParams,
    ProgramBindingParams,
    ProgramGateParams,
    ProgressTtlParams,
    SpeculativePrefillParams,
    StageParams,
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
