"""The workload presets of the published regimes: reasoning models run longer than the 8B ones."""

from __future__ import annotations

import argparse

import pytest

from thunder_mw.benchmarks.workloads import PRESETS, generate, summarise

REGIME_PRESETS = (
    "mini-swe-agent-glm46",
    "openhands-glm46",
    "swe-agent-qwen3-235b",
    "swe-agent-minimax-m2",
)


@pytest.mark.parametrize("name", REGIME_PRESETS)
def test_reasoning_model_presets_run_longer_contexts_and_outputs_than_the_8b_one(
    name: str,
) -> None:
    base = summarise(generate("swe-agent", 200, seed=3))
    s = summarise(generate(name, 200, seed=3))
    assert s.turns_mean > 2 * base.turns_mean
    assert s.output_tokens_mean > base.output_tokens_mean
    assert s.final_context_mean > 3 * base.final_context_mean
    # Still within the 128-200 k contexts these models serve.
    assert s.final_context_p90 < 131_072


def test_the_toolorchestra_preset_reasons_longer_than_the_plain_orchestrator() -> None:
    plain = summarise(generate("tool-orchestra", 300, seed=3))
    s = summarise(generate("toolorchestra-qwen3-8b", 300, seed=3))
    assert s.output_tokens_mean > 2 * plain.output_tokens_mean
    assert s.tool_s_mean > 5.0  # expert-model and API calls, not bash


def test_the_bench_command_offers_the_new_presets() -> None:
    from thunder_mw.benchmarks.bench_cli import add_bench_arguments

    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    scenario = next(a for a in parser._actions if a.dest == "scenario").choices[0]  # type: ignore[index]
    args = parser.parse_args(["--scenario", scenario, "--workload", "openhands-glm46"])
    assert args.workload == "openhands-glm46"
    assert set(REGIME_PRESETS) | {"toolorchestra-qwen3-8b"} <= set(PRESETS)
