"""Builds the scheduler pipeline from the YAML `policies:` list, naming any error's location."""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import ValidationError

from thunder_mw.policies.baselines import BASELINE_PRESETS, BASELINE_STAGES
from thunder_mw.policies.kv_placement import KvPlacement
from thunder_mw.policies.speculative_prefill import SpeculativePrefill
from thunder_mw.policies.stage_contract import Stage
from thunder_mw.policies.stages import BUILTIN_STAGES as CORE_STAGES
from thunder_mw.policies.stages import DEFAULT_PIPELINE
from thunder_mw.policies.stages import PRESETS as CORE_PRESETS

# Every stage and preset a `policies:` list may name: thunder-mw's, the original's rules and
# the baselines users run (policies/baselines.py).
BUILTIN_STAGES: dict[str, type[Stage]] = {
    **CORE_STAGES,
    **BASELINE_STAGES,
    KvPlacement.name: KvPlacement,
    SpeculativePrefill.name: SpeculativePrefill,
}
PRESETS: dict[str, list[dict[str, Any]]] = {**CORE_PRESETS, **BASELINE_PRESETS}


class PipelineError(ValueError):
    """Every problem in the `policies:` list, each as `policies[i].stage.param: message`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems

    def __reduce__(self) -> tuple[type[PipelineError], tuple[list[str]]]:
        # Raised in a `bench --jobs N` worker process, it crosses back pickled: rebuilt from
        # the problems, not from the joined message (which would be split into letters).
        return (PipelineError, (self.problems,))


def expand(entries: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """`None` means the default pipeline; a preset name used as a stage expands in place."""
    if entries is None:
        return DEFAULT_PIPELINE
    out: list[dict[str, Any]] = []
    for entry in entries:
        if isinstance(entry, dict) and len(entry) == 1:
            name, params = next(iter(entry.items()))
            if name in PRESETS and name not in BUILTIN_STAGES and not params:
                out.extend(PRESETS[name])
                continue
        out.append(entry)
    return out


def build_pipeline(entries: list[dict[str, Any]] | None) -> list[Stage]:
    stages: list[Stage] = []
    problems: list[str] = []
    for i, entry in enumerate(expand(entries)):
        where = f"policies[{i}]"
        if not isinstance(entry, dict) or len(entry) != 1:
            problems.append(f"{where}: each entry is one `stage_name: {{params}}` mapping")
            continue
        name, params = next(iter(entry.items()))
        try:
            cls = _stage_class(str(name))
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            problems.append(f"{where}.{name}: {exc}")
            continue
        try:
            stages.append(cls(cls.Params.model_validate(params or {})))
        except ValidationError as exc:
            for err in exc.errors():
                loc = ".".join(str(p) for p in err["loc"])
                message = "unknown parameter" if err["type"] == "extra_forbidden" else err["msg"]
                problems.append(f"{where}.{name}.{loc}: {message}")
    if problems:
        raise PipelineError(problems)
    return stages


def _stage_class(name: str) -> type[Stage]:
    if name in BUILTIN_STAGES:
        return BUILTIN_STAGES[name]
    if ":" not in name:
        known = ", ".join(sorted({*BUILTIN_STAGES, *PRESETS}))
        raise ValueError(f"unknown stage (built in: {known}; or give `module:Class`)")
    module_name, _, attr = name.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Stage)):
        raise TypeError(f"{name} is not a thunder_mw.policies.Stage subclass")
    return cls
