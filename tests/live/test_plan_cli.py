"""`thunder-mw plan`: model folders in, plan out; checked against the simulator and real vLLM."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.asgi_servers import ServerThread, serving
from support.real_vllm import MODEL_DIR, RealVllm, missing_prerequisites, start_vllm

from thunder_mw.cli import main as cli
from thunder_mw.cli.config_loader import load_config
from thunder_mw.cli.plan import add_plan_arguments, run_plan
from thunder_mw.schemas.config import SimEngineSettings
from thunder_mw.sim.ports import free_port
from thunder_mw.sim.server import create_sim_app

WORKED_EXAMPLE = (
    "--layers", "64", "--kv-heads", "8", "--head-dim", "128", "--kv-dtype", "bf16",
    "--hbm-gib", "80", "--weights-gib", "32", "--context-mean", "8000",
)  # fmt: skip
# The tiny model as the real engine runs it: 1 GiB of KV space (VLLM_CPU_KVCACHE_SPACE=1),
# 128-token blocks. 2 layers x 4 KV heads x head dim 32 x bf16 = 1 KiB per token.
TINY_ON_VLLM_CPU = ("--model", str(MODEL_DIR), "--kv-space-gib", "1", "--block-size", "128")
TINY_PLANNED_TOKENS = 8192 * 128


def plan(*argv: str) -> tuple[int, str]:
    """Runs the planner as `thunder-mw plan ARGV` would; returns (exit status, stdout)."""
    parser = argparse.ArgumentParser(prog="thunder-mw plan")
    add_plan_arguments(parser)
    out = io.StringIO()
    status = run_plan(parser.parse_args(list(argv)), out)
    return status, out.getvalue()


def plan_json(*argv: str) -> tuple[int, dict[str, Any]]:
    status, text = plan(*argv, "--json")
    return status, json.loads(text)


def write_model(folder: Path, config: dict[str, Any], shards: dict[str, int] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    for name, size in (shards or {}).items():
        (folder / name).write_bytes(b"\0" * size)
    return folder


LLAMA_70B_LIKE = {
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "torch_dtype": "bfloat16",
}


# ---------------------------------------------------------------------- arithmetic via the CLI
def test_worked_example_prints_20_run_30_wait() -> None:
    status, text = plan(*WORKED_EXAMPLE, "--programs", "50")
    assert status == 0
    assert "262,144 (256 KiB)" in text
    assert "40.0 GiB" in text
    assert "163,840" in text
    assert "50 programs arriving: 20 run, 30 wait" in text


def test_json_carries_the_documented_keys() -> None:
    status, report = plan_json(*WORKED_EXAMPLE, "--programs", "50")
    assert status == 0
    assert {
        key: report[key]
        for key in (
            "bytes_per_token",
            "kv_budget_bytes",
            "resident_tokens",
            "programs_fit_mean",
            "programs_fit_p95",
            "programs_running",
            "programs_waiting",
        )
    } == {
        "bytes_per_token": 262_144,
        "kv_budget_bytes": 40 * 1024**3,
        "resident_tokens": 163_840,
        "programs_fit_mean": 20,
        "programs_fit_p95": 20,
        "programs_running": 20,
        "programs_waiting": 30,
    }


def test_reserve_follows_gpu_memory_utilization() -> None:
    _, report = plan_json(*WORKED_EXAMPLE, "--gpu-memory-utilization", "0.8")
    assert report["kv_budget_bytes"] == 32 * 1024**3


def test_offload_gib_converts_to_tokens_at_the_kv_dtype() -> None:
    _, report = plan_json(*WORKED_EXAMPLE, "--offload-gib", "40")
    assert (report["offload_tokens"], report["combined_tokens"]) == (163_840, 327_680)


# ---------------------------------------------------------------------- model folders
def test_model_folder_gives_shape_dtype_and_weights(tmp_path: Path) -> None:
    folder = write_model(
        tmp_path / "m", LLAMA_70B_LIKE, {"a.safetensors": 3000, "b.safetensors": 1}
    )
    _, report = plan_json("--model", str(folder), "--hbm-gib", "80")
    assert report["inputs"]["shape"] == {
        "num_layers": 64,
        "num_kv_heads": 8,
        "head_dim": 128,
        "kv_dtype": "bf16",
    }
    assert report["inputs"]["memory"]["weights_bytes"] == 3001


def test_model_config_json_path_is_accepted(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", LLAMA_70B_LIKE)
    _, report = plan_json(
        "--model", str(folder / "config.json"), "--hbm-gib", "80", "--weights-gib", "32"
    )
    assert report["bytes_per_token"] == 262_144


def test_safetensors_index_gives_the_weights_size(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", LLAMA_70B_LIKE)
    index = {"metadata": {"total_size": 32 * 1024**3}, "weight_map": {}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    _, report = plan_json("--model", str(folder), "--hbm-gib", "80", "--context-mean", "8000")
    assert (report["kv_budget_bytes"], report["programs_fit_mean"]) == (40 * 1024**3, 20)


def test_fp32_model_dtype_sets_the_kv_dtype_unless_overridden(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", {**LLAMA_70B_LIKE, "torch_dtype": "float32"})
    common = ("--model", str(folder), "--hbm-gib", "80", "--weights-gib", "32")
    _, auto = plan_json(*common)
    _, fp8 = plan_json(*common, "--kv-dtype", "fp8")
    assert (auto["bytes_per_token"], fp8["bytes_per_token"]) == (524_288, 131_072)


def test_flags_win_over_the_model_config(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", LLAMA_70B_LIKE)
    _, report = plan_json(
        "--model", str(folder), "--layers", "32", "--hbm-gib", "80", "--weights-gib", "32"
    )
    assert report["bytes_per_token"] == 131_072


def test_text_config_of_a_multimodal_model_is_read(tmp_path: Path) -> None:
    folder = write_model(tmp_path / "m", {"text_config": LLAMA_70B_LIKE, "torch_dtype": "bfloat16"})
    _, report = plan_json("--model", str(folder), "--hbm-gib", "80", "--weights-gib", "32")
    assert report["bytes_per_token"] == 262_144


def test_missing_kv_heads_means_multi_head_attention(tmp_path: Path) -> None:
    config = {k: v for k, v in LLAMA_70B_LIKE.items() if k != "num_key_value_heads"}
    folder = write_model(tmp_path / "m", config)
    _, report = plan_json("--model", str(folder), "--hbm-gib", "80", "--weights-gib", "32")
    assert report["inputs"]["shape"]["num_kv_heads"] == 64


# ---------------------------------------------------------------------- input errors
def test_heads_not_dividing_hidden_size_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_model(tmp_path / "m", {**LLAMA_70B_LIKE, "num_attention_heads": 48})
    status, _ = plan(
        "--model", str(folder), "--kv-heads", "8", "--hbm-gib", "80", "--weights-gib", "1"
    )
    assert status == 2
    assert "num_attention_heads (48) does not divide hidden_size (8192)" in capsys.readouterr().err


def test_kv_heads_not_dividing_attention_heads_is_a_clear_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, _ = plan(*WORKED_EXAMPLE, "--attention-heads", "60")
    assert status == 2
    assert "num_key_value_heads (8) must divide num_attention_heads (60)" in capsys.readouterr().err


def test_missing_layers_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    status, _ = plan(
        "--kv-heads", "8", "--head-dim", "128", "--hbm-gib", "80", "--weights-gib", "1"
    )
    assert status == 2
    assert "pass --layers" in capsys.readouterr().err


def test_unknown_weights_size_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_model(tmp_path / "m", LLAMA_70B_LIKE)
    status, _ = plan("--model", str(folder), "--hbm-gib", "80")
    assert status == 2
    assert "--weights-gib" in capsys.readouterr().err


def test_missing_config_json_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _ = plan("--model", str(tmp_path), "--hbm-gib", "80")
    assert status == 2
    assert f"no config.json at {tmp_path / 'config.json'}" in capsys.readouterr().err


def test_multi_head_latent_attention_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_model(tmp_path / "m", {**LLAMA_70B_LIKE, "kv_lora_rank": 512})
    status, _ = plan("--model", str(folder), "--hbm-gib", "80", "--weights-gib", "1")
    assert status == 2
    assert "kv_lora_rank" in capsys.readouterr().err


# ---------------------------------------------------------------------- --emit-config
def test_emitted_config_loads_with_the_planned_capacity_and_watermarks(tmp_path: Path) -> None:
    status, text = plan(
        *WORKED_EXAMPLE, "--replicas", "2", "--emit-config", "--high-watermark", "0.9"
    )
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    config = load_config(path)
    assert status == 0
    assert [b.capacity_tokens for b in config.backends] == [163_840, 163_840]
    assert config.policies is not None
    assert [entry.model_dump(exclude_unset=True) for entry in config.policies] == [
        {
            "admission": {
                "high_watermark": 0.9,
                "low_watermark": 0.8,
                "buffer_tokens_per_program": 128,
            }
        }
    ]


def test_emitted_config_is_plain_yaml_with_explanatory_comments() -> None:
    _, text = plan(*WORKED_EXAMPLE, "--emit-config")
    assert text.startswith("# thunder-mw plan: 163,840 KV tokens per replica")
    assert yaml.safe_load(text)["backends"][0]["capacity_tokens"] == 163_840


# ---------------------------------------------------------------------- --engine: simulator
def sim(flavor: str, num_blocks: int, block_size: int = 16) -> AbstractContextManager[ServerThread]:
    return serving(
        create_sim_app(
            SimEngineSettings(flavor=flavor, num_blocks=num_blocks, block_size=block_size)
        )
    )


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_plan_matches_a_simulator_sized_like_the_worked_example(flavor: str) -> None:
    # 163,840 planned tokens = 10,240 blocks of 16.
    with sim(flavor, 10_240) as engine:
        status, report = plan_json(*WORKED_EXAMPLE, "--block-size", "16", "--engine", engine.url)
    (seen,) = report["engines"]
    assert status == 0
    assert seen["flavor"] == flavor
    assert abs(seen["reported_tokens"] - 163_840) <= 16  # SGLang's figure leaves out block 0
    assert seen["differs"] is False


def test_a_simulator_with_half_the_planned_blocks_is_flagged() -> None:
    with sim("vllm", 5_120) as engine:
        status, text = plan(*WORKED_EXAMPLE, "--engine", engine.url)
    assert status == 1
    assert "reports 81,920 tokens" in text
    assert "DIFFERS over 10%" in text


def test_emitted_override_never_exceeds_what_the_engine_reports() -> None:
    with sim("vllm", 5_120) as engine:
        _, text = plan(*WORKED_EXAMPLE, "--engine", engine.url, "--emit-config")
    (backend,) = yaml.safe_load(text)["backends"]
    assert (backend["url"], backend["capacity_tokens"]) == (engine.url, 81_920)


def test_an_unreachable_engine_is_reported_not_raised() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    status, text = plan(*WORKED_EXAMPLE, "--engine", url, "--timeout", "2")
    assert status == 1
    assert f"engine {url}: capacity unknown" in text


# ---------------------------------------------------------------------- --engine: real vLLM
def test_real_engine_block_override_shows_as_a_difference(vllm_engine: RealVllm) -> None:
    # The shared engine runs with --num-gpu-blocks-override 24: 3,072 tokens, not what its
    # 1 GiB KV space holds. The planner must notice.
    status, report = plan_json(*TINY_ON_VLLM_CPU, "--engine", vllm_engine.url)
    (seen,) = report["engines"]
    assert status == 1
    assert (seen["reported_tokens"], seen["differs"]) == (3_072, True)


def test_plan_equals_vllms_own_sizing_of_the_kv_space(vllm_engine: RealVllm) -> None:
    # vLLM logs the block count the KV space gives before the override replaces it.
    log = vllm_engine.log_path.read_text(errors="replace")
    (natural_blocks,) = set(re.findall(r"Overriding num_gpu_blocks=(\d+)", log))
    _, report = plan_json(*TINY_ON_VLLM_CPU)
    assert report["resident_tokens"] == int(natural_blocks) * 128 == TINY_PLANNED_TOKENS


@pytest.fixture(scope="module")
def vllm_without_override(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    """A second real engine, sized by its KV space alone (one more start: ~30-100 s)."""
    reason = missing_prerequisites()
    if reason:
        if os.environ.get("THUNDER_MW_REQUIRE_REAL") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    with start_vllm(
        num_blocks=None, log_dir=tmp_path_factory.mktemp("vllm-plan"), startup_timeout_s=240
    ) as engine:
        yield engine


@pytest.mark.real_vllm
def test_plan_matches_a_real_engine_sized_by_its_kv_space(vllm_without_override: RealVllm) -> None:
    status, report = plan_json(*TINY_ON_VLLM_CPU, "--engine", vllm_without_override.url)
    (seen,) = report["engines"]
    assert status == 0
    assert seen["reported_tokens"] == report["resident_tokens"] == TINY_PLANNED_TOKENS


# ---------------------------------------------------------------------- the subcommand
@pytest.mark.skipif("plan" not in cli.SUBCOMMANDS, reason="`plan` not wired into the CLI yet")
def test_thunder_mw_plan_subcommand_runs_the_planner(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", *WORKED_EXAMPLE, "--programs", "50"]) == 0
    assert "20 run, 30 wait" in capsys.readouterr().out
