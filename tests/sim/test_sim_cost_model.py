"""The cost profiles of the published regimes: derived from their roofline, and checked against
the published single-request figures found (docs/simulator.md lists them)."""

from __future__ import annotations

import pytest

from thunder_mw.sim.cost_model import (
    ATTENTION_EFFICIENCY,
    GLM46_FP8,
    LLAMA3_8B,
    PROFILES,
    QWEN3_235B_FP8,
    REGIMES,
    HardwareFacts,
    ModelFacts,
    get_profile,
    prefill_positions,
    roofline,
    touched_expert_share,
)


def test_every_published_regime_has_a_profile() -> None:
    for name in (
        "h100-8b",
        "h100x8-glm46-fp8",
        "h100x8-qwen3-235b-fp8",
        "h100x4-minimax-m2-fp8",
        "rtx5090-qwen3-8b",
        "cpu-tiny",
        "cpu-dear",
    ):
        assert get_profile(name).a > 0


def test_h100_8b_rederived_keeps_the_illustrative_numbers_within_3_percent() -> None:
    # The profile's earlier hand-written values: 6 ms, 30 us, 30 us, 50 ns.
    p = get_profile("h100-8b")
    assert p.a == pytest.approx(6.0e-3, rel=0.03)
    assert p.b == pytest.approx(3.0e-5, rel=0.03)
    assert p.c == pytest.approx(3.0e-5, rel=0.03)
    assert p.d == pytest.approx(5.0e-8, rel=0.03)


def test_glm46_single_request_decode_is_near_the_published_70_tokens_per_s() -> None:
    # zai-org/GLM-4.5 issue 113: GLM-4.6-FP8 on 8xH100, SGLang 0.5.6, one request ~70 tok/s.
    speed = get_profile("h100x8-glm46-fp8").decode_tokens_per_s(8192)
    assert 70 * 0.75 <= speed <= 70 * 1.25


def test_minimax_m2_tp4_time_per_output_token_at_10_sequences_is_near_16_ms() -> None:
    # vllm-project/recipes PR 112: MiniMax-M2 on H100, vLLM, 10 concurrent requests,
    # mean TPOT 16.39 ms (DeepGEMM off). ~3k tokens of context per sequence assumed.
    p = get_profile("h100x4-minimax-m2-fp8")
    tpot = p.step_seconds(0, 10, 10 * 3000)
    assert 16.39e-3 * 0.75 <= tpot <= 16.39e-3 * 1.25


def test_rtx5090_qwen3_8b_decode_stays_under_its_bandwidth_bound() -> None:
    # No published single-request figure found: bound it by reading 16.4 GB per token at
    # the full 1,792 GB/s, and from below by the same at half that bandwidth.
    speed = get_profile("rtx5090-qwen3-8b").decode_tokens_per_s(8192)
    assert 1.792e12 / 16.4e9 / 2 < speed < 1.792e12 / 16.4e9


def test_kv_bytes_per_token_come_from_the_config_facts() -> None:
    # 2 (K, V) x 92 layers x 8 KV heads x 128 dims x 2 bytes (bf16 KV).
    assert get_profile("h100x8-glm46-fp8").kv_bytes_per_token == 2 * 92 * 8 * 128 * 2
    # Qwen3-235B has 4 KV heads: TP8 stores each twice (8 heads over the replica).
    assert get_profile("h100x8-qwen3-235b-fp8").kv_bytes_per_token == 2 * 94 * 8 * 128 * 2


def test_capacity_is_hbm_times_utilisation_less_weights_over_kv_bytes() -> None:
    # GLM-4.6-FP8 on 8 x 80 GiB at 0.9: 618.5 GB less 355 GB of weights, / 376,832 B.
    budget = 8 * 80 * 1024**3 * 0.9 - 355e9
    expected = int(budget // (376_832 * 16) * 16)
    assert get_profile("h100x8-glm46-fp8").capacity_tokens == expected
    assert 650_000 < expected < 750_000
    # Qwen3-8B bf16 fills a third of an RTX 5090: ~100 k tokens are left.
    cap = get_profile("rtx5090-qwen3-8b").capacity_tokens
    assert cap is not None and 90_000 < cap < 110_000


def test_moe_flops_follow_the_active_parameters() -> None:
    glm, qwen = get_profile("h100x8-glm46-fp8"), get_profile("h100x8-qwen3-235b-fp8")
    # Same hardware: the compute part of b scales with 32 B vs 22 B active parameters.
    dense = roofline(
        ModelFacts(
            name="dense 355B",
            total_params=GLM46_FP8.total_params,
            active_params=GLM46_FP8.total_params,
            num_layers=GLM46_FP8.num_layers,
            hidden_size=GLM46_FP8.hidden_size,
            num_heads=GLM46_FP8.num_heads,
            num_kv_heads=8,
            head_dim=128,
            weight_bytes=1,
        ),
        REGIMES["h100x8-glm46-fp8"][1],
    )
    assert dense.b > 5 * glm.b
    assert glm.b > qwen.b


def test_moe_weight_reads_follow_the_experts_a_batch_touches() -> None:
    assert touched_expert_share(GLM46_FP8, 1) == pytest.approx(8 / 160)
    assert touched_expert_share(GLM46_FP8, 32) == pytest.approx(1 - (1 - 8 / 160) ** 32)
    assert touched_expert_share(QWEN3_235B_FP8, 1000) == pytest.approx(1.0)
    # So a GLM-4.6 step reads less than its 355 GB but far more than its 32 GB active.
    glm = get_profile("h100x8-glm46-fp8")
    read_s = glm.a - 2 * 92 * 10e-6
    assert 32e9 / (8 * 3.35e12) < read_s < 355e9 / (8 * 3.35e12 * 0.8)


def test_fitted_and_derived_profiles_are_told_apart() -> None:
    assert PROFILES["cpu-tiny"].capacity_tokens is None
    assert all(PROFILES[name].capacity_tokens for name in REGIMES)


def test_a_64k_token_glm46_recompute_costs_its_matmuls_plus_its_attention_by_hand() -> None:
    p = get_profile("h100x8-glm46-fp8")
    n = 65_536
    # Attention: 4 FLOPs x 92 layers x 96 query heads x 128 dims per key; token i attends to
    # i + 1 keys, 2,147,516,416 in all; 8 GPUs x 989 TFLOP/s (bf16, the KV's dtype) x 0.6.
    keys = n * (n + 1) // 2
    assert prefill_positions(0, n) == keys == 2_147_516_416
    attention_s = 4 * 92 * 96 * 128 * keys / (8 * 989e12 * ATTENTION_EFFICIENCY)
    assert attention_s == pytest.approx(2.0456, rel=1e-3)
    expected = p.a + p.b * n + attention_s
    assert p.step_seconds(n, 0, 0, keys) == pytest.approx(expected, rel=1e-12)
    # At this length attention costs twice the matmuls: recompute is ~3x what b alone says.
    assert 2.9 < (p.b * n + attention_s) / (p.b * n) < 3.3


def test_prefill_attention_grows_with_the_position_of_the_chunk() -> None:
    p = get_profile("h100x8-glm46-fp8")
    early = p.step_seconds(4096, 0, 0, prefill_positions(0, 4096))
    late = p.step_seconds(4096, 0, 0, prefill_positions(60_000, 4096))
    assert late > 3 * early
    # Chunking a prompt does not change the attention it pays, only when it pays it.
    chunks = sum(prefill_positions(k, 4096) for k in range(0, 65_536, 4096))
    assert chunks == prefill_positions(0, 65_536)


def test_decode_attention_stays_in_the_kv_read_term() -> None:
    # A decode step's duration has no attention-FLOPs term: its cost is the KV it reads.
    p = get_profile("h100x8-glm46-fp8")
    assert p.step_seconds(0, 10, 400_000) == p.a + p.c * 10 + p.d * 400_000


def test_the_fitted_cpu_profiles_price_attention_and_a_cost_per_request() -> None:
    # benchmarks/fit_cpu_profile.py fits e (prefill attention) and f (per request taken in):
    # the CPU engine shows both; the GPU rooflines price no fixed per-request work.
    for name in ("cpu-tiny", "cpu-dear"):
        assert get_profile(name).e > 0.0 and get_profile(name).f > 0.0
    assert get_profile("h100-8b").f == 0.0


def test_a_recompute_is_dear_on_the_dear_profile_and_cheap_on_the_tiny_one() -> None:
    # One 1,500-token context prefilled alone, in decode steps at that context: the regimes of
    # the real-engine benchmark (measured there as decode_steps_per_recompute).
    def steps(name: str) -> float:
        p = get_profile(name)
        return p.step_seconds(1500, 0, 0, prefill_positions(0, 1500)) / p.step_seconds(0, 1, 1500)

    assert steps("cpu-dear") >= 40
    assert steps("cpu-tiny") < 40


def test_a_1m_token_prefill_of_an_8b_model_on_one_a100_takes_about_30_minutes() -> None:
    # MInference (arXiv 2407.02490, abstract): "it takes 30 minutes for an 8B LLM to process
    # a prompt of 1M tokens (i.e., the pre-filling stage) on a single A100 GPU" (a
    # LLaMA-3-8B long-context variant: same layers and heads). A100 SXM 80 GB datasheet:
    # 312 TFLOP/s dense BF16, 2,039 GB/s HBM2e, PCIe Gen4 x16 (32 GB/s each way).
    a100 = HardwareFacts(
        name="1x A100 SXM 80GB",
        tp=1,
        hbm_bytes=80 * 1024**3,
        hbm_bytes_per_s=2.039e12,
        dense_flops_per_s=312e12,
        attention_flops_per_s=312e12,
        interconnect_bytes_per_s=0.0,
        host_link_bytes_per_s=32e9,
    )
    p = roofline(LLAMA3_8B, a100)
    n = 1_000_000
    seconds = p.step_seconds(n, 0, 0, prefill_positions(0, n))
    assert 30 * 60 * 0.75 <= seconds <= 30 * 60 * 1.25
    # Without the attention term the roofline said 1.6 minutes.
    assert p.step_seconds(n, 0, 0) < 2 * 60
