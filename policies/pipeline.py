"""Builds the scheduler's stages from the validated `policies:` list (schemas/stage_settings.py)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from thunder_mw.policies.baselines import BASELINE_STAGES
from thunder_mw.policies.kv_placement import KvPlacement
from thunder_mw.policies.speculative_prefill import SpeculativePrefill
from thunder_mw.policies.stage_contract import Stage
from thunder_mw.policies.stages import BUILTIN_STAGES as CORE_STAGES
from thunder_mw.schemas.pipeline_presets import DEFAULT_PIPELINE, PRESETS
from thunder_mw.schemas.stage_params import StageParams
from thunder_mw.schemas.stage_settings import (
    DEFAULT_STAGES,
    PIPELINE,
    CustomStageSetting,
    PipelineEntry,
    PresetReference,
    StageEntry,
    entry_error,
    expand_presets,
)

__all__ = [
    "BUILTIN_STAGES",
    "DEFAULT_PIPELINE",
    "PRESETS",
    "PipelineError",
    "PipelineSettings",
    "build_pipeline",
    "custom_stage_problems",
]

# What a pipeline is built from: a loaded config's validated `policies:`, or the same list
# in YAML form (the benchmarks' variants, tests).
PipelineSettings = Sequence[PipelineEntry | Mapping[str, Any]]

# Every stage a `policies:` list may name: thunder-mw's, the original's rules and the
# baselines users run (policies/baselines.py). Each one's params are validated by the
# config (schemas/stage_settings.py).
BUILTIN_STAGES: dict[str, type[Stage]] = {
    **CORE_STAGES,
    **BASELINE_STAGES,
    KvPlacement.name: KvPlacement,
    SpeculativePrefill.name: SpeculativePrefill,
}


class PipelineError(ValueError):
    """Every problem in the `policies:` list, each as `policies[i].stage.param: message`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems

    def __reduce__(self) -> tuple[type[PipelineError], tuple[list[str]]]:
        # Raised in a `bench --jobs N` worker process, it crosses back pickled: rebuilt from
        # the problems, not from the joined message (which would be split into letters).
        return (PipelineError, (self.problems,))


def build_pipeline(entries: PipelineSettings | None) -> list[Stage]:
    """The stages of a pipeline: `None` is the default one. Settings from a loaded config
    are built as they are; a list in YAML form (benchmarks, tests) is validated first."""
    stages: list[Stage] = []
    problems: list[str] = []
    for i, written in enumerate(_settings(entries)):
        for entry in expand_presets([written]):
            if isinstance(entry, CustomStageSetting):
                stage = _custom_stage(f"policies[{i}]", entry, problems)
                if stage is not None:
                    stages.append(stage)
            else:
                stages.append(BUILTIN_STAGES[entry.stage](entry.params))
    if problems:
        raise PipelineError(problems)
    return stages


def custom_stage_problems(entries: Sequence[PipelineEntry] | None) -> list[str]:
    """What is wrong with the third-party stages of validated settings (their module, their
    class, their params), each as `policies[i].module:Class...: message`."""
    problems: list[str] = []
    for i, entry in enumerate(entries or ()):
        if isinstance(entry, CustomStageSetting):
            _custom_stage(f"policies[{i}]", entry, problems)
    return problems


def _custom_stage(where: str, entry: CustomStageSetting, problems: list[str]) -> Stage | None:
    """A third-party stage, its params checked by its class's own `Params`; None (and the
    reasons added to `problems`) when it cannot be built."""
    where = f"{where}.{entry.stage}"
    try:
        cls = _stage_class(entry.stage)
        return cls(cls.Params.model_validate(entry.params))
    except ValidationError as exc:
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            message = "unknown parameter" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{where}.{loc}: {message}")
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        problems.append(f"{where}: {exc}")
    return None


def _settings(entries: PipelineSettings | None) -> Sequence[StageEntry | PresetReference]:
    """The entries as written (presets not expanded), validated unless they already are."""
    if entries is None:
        return DEFAULT_STAGES
    if all(not isinstance(e, Mapping) for e in entries):
        return entries  # type: ignore[return-value]
    try:
        return PIPELINE.validate_python(list(entries))
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc, message = entry_error(err)
            where = f"policies[{loc[0]}]" + "".join(f".{part}" for part in loc[1:])
            problems.append(f"{where}: {message}")
        raise PipelineError(problems) from None


def _stage_class(name: str) -> type[Stage]:
    module_name, _, attr = name.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise TypeError(f"{name} is not a thunder_mw.policies.Stage subclass")
    if not issubclass(cls.Params, StageParams):
        raise TypeError(f"{name}.Params is not a thunder_mw.policies.StageParams subclass")
    return cls
