"""The pipeline's settings (schemas/stage_settings.py): one source of defaults, a tagged union
validated once at config load with each error at its YAML location, and renamed keys."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

import pytest

from thunder_mw.cli.config_loader import ConfigError, load_config
from thunder_mw.policies.pipeline import BUILTIN_STAGES, PipelineSettings, build_pipeline
from thunder_mw.schemas.config import ThunderConfig
from thunder_mw.schemas.pipeline_presets import DEFAULT_PIPELINE, PRESETS
from thunder_mw.schemas.stage_params import STAGE_PARAMS, AdmissionParams
from thunder_mw.schemas.stage_settings import (
    PIPELINE,
    STAGE_SETTINGS,
    CustomStageSetting,
    PresetReference,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def problems_of(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return info.value.problems


def params_of(pipeline: PipelineSettings | None) -> list[tuple[str, object]]:
    return [(stage.name, stage.params) for stage in build_pipeline(pipeline)]


# ---------------------------------------------------------------------- one source of defaults
def test_a_stage_written_without_params_is_the_stage_the_default_pipeline_runs() -> None:
    written: list[dict[str, Any]] = [
        {"admission": {}},
        {"state_aware_pause": {}},
        {"migration": {}},
        {"gc_hooks": None},  # `- gc_hooks:` with nothing after it
        {"speculative_prefill": {}},
    ]
    assert params_of(written) == params_of(None)
    admission = build_pipeline([{"admission": {}}])[0].params
    assert isinstance(admission, AdmissionParams) and admission.overflow == "adaptive"


def test_the_default_pipeline_overrides_no_stage_params() -> None:
    assert all(params == {} for entry in DEFAULT_PIPELINE for params in entry.values())
    assert PRESETS["thunder-mw"] is DEFAULT_PIPELINE


def test_every_built_in_stage_reads_the_params_its_setting_validates() -> None:
    assert set(STAGE_SETTINGS) == set(BUILTIN_STAGES)
    for name, setting in STAGE_SETTINGS.items():
        assert setting.model_fields[name].annotation is BUILTIN_STAGES[name].Params, name


def test_each_stage_of_the_registry_is_an_entry_named_after_it() -> None:
    # One line of STAGE_PARAMS makes the entry: its type, its one key, its default params.
    assert list(STAGE_SETTINGS) == list(STAGE_PARAMS)
    for name, params in STAGE_PARAMS.items():
        setting = STAGE_SETTINGS[name]
        assert setting.stage == name and list(setting.model_fields) == [name]
        assert setting.model_validate({name: None}).params == params()
    assert STAGE_SETTINGS["gc_hooks"].__name__ == "GcHooksSetting"


def test_a_built_in_entry_crosses_a_process_boundary() -> None:
    # `bench --jobs N` workers get their pipelines pickled; the entry types are made at import.
    entries: list[dict[str, Any]] = [{name: {}} for name in STAGE_PARAMS]
    written = PIPELINE.validate_python(entries)
    again = pickle.loads(pickle.dumps(written))
    assert again == written and [type(e) for e in again] == [type(e) for e in written]


def test_presets_that_meant_hold_still_say_hold() -> None:
    for preset in ("thunderagent", "vllm_router_program", "vllm_router_program/binary-reading"):
        admission = next(s for s in build_pipeline(PRESETS[preset]) if s.name == "admission")
        assert admission.params.overflow == "hold", preset  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- validated once, typed
def test_a_loaded_pipeline_is_typed_and_built_without_validating_again(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "policies:\n  - admission: {high_watermark: 0.9}\n"))
    assert config.policies is not None
    entry = config.policies[0]
    assert isinstance(entry, STAGE_SETTINGS["admission"])
    assert isinstance(entry.params, AdmissionParams) and entry.params.high_watermark == 0.9
    (stage,) = build_pipeline(config.policies)
    assert stage.params is entry.params  # the validated object itself


def test_a_preset_stays_as_written_in_the_config_and_expands_when_built(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "policies:\n  - thunderagent: {}\n  - gc_hooks: {}\n"))
    assert config.policies is not None
    assert isinstance(config.policies[0], PresetReference)
    dumped = config.model_dump(mode="json")["policies"]
    assert dumped[0] == {"thunderagent": {}}
    assert ThunderConfig.model_validate(config.model_dump()).policies == config.policies
    names = [stage.name for stage in build_pipeline(config.policies)]
    assert names == ["admission", "state_aware_pause", "migration", "gc_hooks"]


def test_a_third_party_stage_is_kept_as_written_and_built_from_its_import_path(
    tmp_path: Path,
) -> None:
    text = "policies:\n  - thunder_mw.policies.stages:Sticky:\n"
    config = load_config(write(tmp_path, text))
    assert config.policies == [CustomStageSetting({"thunder_mw.policies.stages:Sticky": {}})]
    assert [stage.name for stage in build_pipeline(config.policies)] == ["sticky"]


# ---------------------------------------------------------------------- errors at their place
def test_a_wrong_parameter_is_named_with_its_stage_and_line(tmp_path: Path) -> None:
    problems = problems_of(
        tmp_path,
        "policies:\n  - migration: {}\n  - admission:\n      high: 1\n      overflow: maybe\n",
    )
    assert sorted(problems) == [
        "policies[1].admission.high (line 4): unknown parameter",
        "policies[1].admission.overflow (line 5): "
        "Input should be 'adaptive', 'hold' or 'cost_aware'",
    ]


def test_an_unknown_stage_is_named_with_the_known_ones(tmp_path: Path) -> None:
    (problem,) = problems_of(tmp_path, "policies:\n  - nope: {}\n")
    assert problem.startswith("policies[0].nope (line 2): unknown stage (built in: admission,")
    assert "thunderagent" in problem and "or give `module:Class`" in problem


def test_an_entry_that_is_not_one_stage_mapping_is_refused(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, "policies:\n  - 3\n  - {admission: {}, migration: {}}\n")
    assert problems == [
        "policies[0] (line 2): each entry is one `stage_name: {params}` mapping",
        "policies[1] (line 3): each entry is one `stage_name: {params}` mapping",
    ]


def test_a_preset_with_params_and_params_that_are_not_a_mapping_are_refused(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, "policies:\n  - thunderagent: {x: 1}\n  - sticky: 5\n")
    assert problems[0] == (
        "policies[0].thunderagent (line 2): a preset names a whole pipeline and takes no parameters"
    )
    assert problems[1].startswith("policies[1].sticky (line 3): Input should be a valid dict")


def test_an_entry_after_a_preset_keeps_its_own_index(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, "policies:\n  - thunderagent: {}\n  - gc_hooks: {ttl: 1}\n")
    assert problems == ["policies[1].gc_hooks.ttl (line 3): unknown parameter"]


def test_a_third_party_stage_is_checked_by_its_own_params_at_load(tmp_path: Path) -> None:
    problems = problems_of(
        tmp_path,
        "policies:\n  - thunderagent: {}\n  - thunder_mw.policies.stages:Sticky: {bad: 1}\n"
        "  - no_such_module_here:Stage: {}\n",
    )
    assert problems == [
        "policies[1].thunder_mw.policies.stages:Sticky.bad (line 3): unknown parameter",
        "policies[2].no_such_module_here:Stage (line 4): No module named 'no_such_module_here'",
    ]


def test_watermarks_the_wrong_way_round_are_an_error_at_load(tmp_path: Path) -> None:
    problems = problems_of(
        tmp_path, "policies:\n  - admission: {high_watermark: 0.8, low_watermark: 0.9}\n"
    )
    assert problems == [
        "policies[0].admission.low_watermark (line 2): low_watermark must not exceed high_watermark"
    ]


# ---------------------------------------------------------------------- renamed keys
def test_the_old_keep_alive_names_are_read_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = "server:\n  keep_alive_s: 10\nbackends:\n  - url: http://a:1\n    keep_alive_s: 2\n"
    with caplog.at_level(logging.WARNING, logger="thunder_mw.config"):
        config = load_config(write(tmp_path, text))
    assert config.server.client_keep_alive_s == 10
    assert config.backends[0].pool_keep_alive_s == 2
    assert [r.getMessage() for r in caplog.records] == [
        "config: `server.keep_alive_s` is deprecated, write `server.client_keep_alive_s`",
        "config: `backends[].keep_alive_s` is deprecated, write `backends[].pool_keep_alive_s`",
    ]


def test_the_new_keep_alive_names_warn_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = (
        "server:\n  client_keep_alive_s: 10\n"
        "backends:\n  - url: http://a:1\n    pool_keep_alive_s: 2\n"
    )
    with caplog.at_level(logging.WARNING, logger="thunder_mw.config"):
        config = load_config(write(tmp_path, text))
    assert (config.server.client_keep_alive_s, config.backends[0].pool_keep_alive_s) == (10, 2)
    assert caplog.records == []


def test_an_old_and_a_new_name_together_are_an_error(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, "server:\n  keep_alive_s: 10\n  client_keep_alive_s: 3\n")
    assert problems == [
        "server.keep_alive_s (line 2): set `client_keep_alive_s` only (`keep_alive_s` is its "
        "deprecated name)"
    ]
