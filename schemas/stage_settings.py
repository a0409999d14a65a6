"""The `policies:` list: a tagged union of stage settings, keyed by the stage's name.

Each YAML entry is a one-key mapping, `- stage_name: {params}`; its key picks the entry's
type, so the whole list is validated once, when the config loads, with every error at its
location (`policies[i].stage.param`). A preset (`- thunderagent: {}`, schemas/pipeline_presets.py)
stands for its stages; a third-party stage (`- my_pkg.mod:MyStage: {...}`) is kept as written
and checked by its class's own `Params` (policies/pipeline.py, which imports it). Each built-in
entry holds its stage's params, which the stages read as they are; its type is made from the
stage registry (`STAGE_PARAMS`, schemas/stage_params.py), one line per stage.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Union

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
from thunder_mw.schemas.stage_params import STAGE_PARAMS, StageParams

__all__ = [
    "DEFAULT_STAGES",
    "PIPELINE",
    "STAGE_SETTINGS",
    "CustomStageSetting",
    "Pipeline",
    "PipelineEntry",
    "PresetReference",
    "StageEntry",
    "StageSetting",
    "entry_error",
    "expand_presets",
]


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

    def __reduce__(self) -> tuple[Any, tuple[str, StageParams]]:
        # Its class is made at import, not named in the module: pickled by its stage's name.
        return (_setting_of, (self.stage, self.params))


def _setting_class(stage: str, params: type[StageParams]) -> type[StageSetting]:
    """`- <stage>: {params}` as a model of one field named after the stage, defaulting to
    the params' defaults; its class is named after it (`gc_hooks`: `GcHooksSetting`)."""

    def body(namespace: dict[str, Any]) -> None:
        namespace["__module__"] = __name__
        namespace["__annotations__"] = {stage: params}
        namespace["stage"] = stage
        namespace[stage] = Field(default_factory=params)

    name = "".join(word.capitalize() for word in stage.split("_")) + "Setting"
    return types.new_class(name, (StageSetting,), exec_body=body)


def _setting_of(stage: str, params: StageParams) -> StageSetting:
    """A built-in entry rebuilt from its stage's name (how one crosses back pickled)."""
    return STAGE_SETTINGS[stage].model_validate({stage: params})


# Each built-in stage's entry type, made from the one list of stages (schemas/stage_params.py).
STAGE_SETTINGS: dict[str, type[StageSetting]] = {
    stage: _setting_class(stage, params) for stage, params in STAGE_PARAMS.items()
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


# The entry types of the union: each built-in stage's, tagged with its name, then the
# others; the last two always refuse (their errors name the entry). To the type checker an
# entry is one of the base classes (the built-in ones are made at import).
if TYPE_CHECKING:
    PipelineEntry = StageSetting | CustomStageSetting | PresetReference
else:
    PipelineEntry = Annotated[
        Union[  # a union of a run-time tuple: `|` takes two at a time
            (
                *(Annotated[cls, Tag(stage)] for stage, cls in STAGE_SETTINGS.items()),
                Annotated[CustomStageSetting, Tag("custom")],
                Annotated[PresetReference, Tag("preset")],
                Annotated[
                    CustomStageSetting, BeforeValidator(_unknown_stage), Tag("unknown_stage")
                ],
                Annotated[
                    CustomStageSetting, BeforeValidator(_not_one_stage), Tag("not_one_stage")
                ],
            )
        ],
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
