"""The KV capacity arithmetic, pinned on the published worked example and its variations."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thunder_mw.policies.capacity_plan import (
    GiB,
    KvShape,
    PlanError,
    ReplicaMemory,
    Workload,
    capacity_tokens,
    derive_head_dim,
    differs,
    kv_budget_bytes,
    kv_bytes_per_token,
    plan_capacity,
    programs_fit,
)

# The worked example: 64 layers, 8 KV heads, head dim 128, bf16 on an 80 GiB GPU with 32 GiB
# of weights and vLLM's default 10 % reserve, programs of 8,000 tokens.
EXAMPLE_SHAPE = KvShape(num_layers=64, num_kv_heads=8, head_dim=128, kv_dtype="bf16")
EXAMPLE_MEMORY = ReplicaMemory(hbm_bytes_per_gpu=80 * GiB, weights_bytes=32 * GiB)
EXAMPLE_WORKLOAD = Workload(context_mean=8000)


def test_worked_example_costs_256_kib_per_token() -> None:
    assert kv_bytes_per_token(EXAMPLE_SHAPE) == 262_144 == 256 * 1024


def test_worked_example_budget_is_40_gib() -> None:
    assert kv_budget_bytes(EXAMPLE_MEMORY) == 40 * GiB


def test_worked_example_holds_163840_tokens() -> None:
    plan = plan_capacity(EXAMPLE_SHAPE, EXAMPLE_MEMORY, EXAMPLE_WORKLOAD)
    assert plan.resident_tokens == 163_840


def test_worked_example_fits_20_programs_of_8000_tokens() -> None:
    plan = plan_capacity(EXAMPLE_SHAPE, EXAMPLE_MEMORY, EXAMPLE_WORKLOAD)
    assert (plan.programs_fit_mean, plan.programs_fit_p95) == (20, 20)


def test_of_50_arriving_programs_20_run_and_30_wait() -> None:
    plan = plan_capacity(EXAMPLE_SHAPE, EXAMPLE_MEMORY, Workload(context_mean=8000, programs=50))
    assert (plan.programs_running, plan.programs_waiting) == (20, 30)


def test_fewer_arrivals_than_fit_all_run() -> None:
    plan = plan_capacity(EXAMPLE_SHAPE, EXAMPLE_MEMORY, Workload(context_mean=8000, programs=7))
    assert (plan.programs_running, plan.programs_waiting) == (7, 0)


def test_fp32_doubles_bytes_per_token() -> None:
    fp32 = KvShape(num_layers=64, num_kv_heads=8, head_dim=128, kv_dtype="fp32")
    assert kv_bytes_per_token(fp32) == 2 * kv_bytes_per_token(EXAMPLE_SHAPE)


def test_fp8_halves_bytes_per_token() -> None:
    fp8 = KvShape(num_layers=64, num_kv_heads=8, head_dim=128, kv_dtype="fp8")
    assert kv_bytes_per_token(fp8) == kv_bytes_per_token(EXAMPLE_SHAPE) // 2


def test_hugging_face_dtype_names_are_accepted() -> None:
    named = KvShape(num_layers=64, num_kv_heads=8, head_dim=128, kv_dtype="torch.bfloat16")
    assert kv_bytes_per_token(named) == 262_144


def test_weights_that_fill_hbm_give_zero_programs_without_error() -> None:
    full = ReplicaMemory(hbm_bytes_per_gpu=80 * GiB, weights_bytes=72 * GiB)
    plan = plan_capacity(EXAMPLE_SHAPE, full, Workload(context_mean=8000, programs=50))
    assert (plan.kv_budget_bytes, plan.resident_tokens, plan.programs_fit_mean) == (0, 0, 0)
    assert (plan.programs_running, plan.programs_waiting) == (0, 50)


def test_weights_larger_than_hbm_give_an_empty_not_negative_budget() -> None:
    too_big = ReplicaMemory(hbm_bytes_per_gpu=80 * GiB, weights_bytes=140 * GiB)
    assert kv_budget_bytes(too_big) == 0


def test_doubling_the_context_halves_the_programs_in_the_example() -> None:
    plan = plan_capacity(EXAMPLE_SHAPE, EXAMPLE_MEMORY, Workload(context_mean=16_000))
    assert plan.programs_fit_mean == 10


@given(tokens=st.integers(0, 10**9), context=st.integers(1, 10**6))
def test_doubling_the_context_halves_the_programs_rounded_down(tokens: int, context: int) -> None:
    assert programs_fit(tokens, 2 * context) == programs_fit(tokens, context) // 2


def test_programs_run_are_sized_at_the_p95_context() -> None:
    plan = plan_capacity(
        EXAMPLE_SHAPE, EXAMPLE_MEMORY, Workload(context_mean=8000, context_p95=16_000, programs=50)
    )
    assert (plan.programs_fit_mean, plan.programs_fit_p95) == (20, 10)
    assert (plan.programs_running, plan.programs_waiting) == (10, 40)


def test_replicas_multiply_the_programs_that_run() -> None:
    plan = plan_capacity(
        EXAMPLE_SHAPE, EXAMPLE_MEMORY, Workload(context_mean=8000, programs=50), replicas=2
    )
    assert (plan.programs_fit_mean, plan.programs_running, plan.programs_waiting) == (20, 40, 10)


def test_tensor_parallel_pools_the_hbm_of_every_gpu() -> None:
    tp2 = ReplicaMemory(tp=2, hbm_bytes_per_gpu=80 * GiB, weights_bytes=32 * GiB)
    assert kv_budget_bytes(tp2) == (144 - 32) * GiB


def test_kv_heads_are_replicated_when_tp_exceeds_them() -> None:
    # 8 KV heads on 16 ranks: every rank still holds one head, so the replica stores 16.
    assert kv_bytes_per_token(EXAMPLE_SHAPE, tp=16) == 2 * kv_bytes_per_token(EXAMPLE_SHAPE)


def test_kv_heads_not_divisible_by_tp_are_an_error() -> None:
    with pytest.raises(PlanError, match="tp"):
        kv_bytes_per_token(EXAMPLE_SHAPE, tp=3)


def test_a_fixed_kv_space_replaces_hbm_and_weights() -> None:
    # The tiny test model on vLLM's CPU build: 2 layers x 4 KV heads x 32 x bf16 = 1 KiB/token.
    tiny = KvShape(num_layers=2, num_kv_heads=4, head_dim=32, kv_dtype="bf16")
    memory = ReplicaMemory(kv_space_bytes_per_rank=1 * GiB, weights_bytes=999 * GiB)
    assert kv_budget_bytes(memory) == GiB
    assert capacity_tokens(tiny, memory) == 1_048_576


def test_capacity_rounds_down_to_whole_blocks() -> None:
    tiny = KvShape(num_layers=2, num_kv_heads=4, head_dim=32, kv_dtype="bf16")
    memory = ReplicaMemory(kv_space_bytes_per_rank=GiB + 1000 * 1024, block_size=128)
    # 1,049,576 tokens' worth of bytes; 8,199 whole blocks of 128 hold 1,049,472 of them.
    assert capacity_tokens(tiny, memory) == 8199 * 128


def test_offload_tier_is_reported_separately_and_combined() -> None:
    memory = ReplicaMemory(
        hbm_bytes_per_gpu=80 * GiB, weights_bytes=32 * GiB, offload_tokens=163_840
    )
    plan = plan_capacity(EXAMPLE_SHAPE, memory, Workload(context_mean=8000, programs=50))
    assert (plan.resident_tokens, plan.offload_tokens, plan.combined_tokens) == (
        163_840,
        163_840,
        327_680,
    )
    assert (plan.programs_fit_mean, plan.programs_fit_mean_combined) == (20, 40)
    # Only what fits in HBM runs; offloaded contexts wait without being recomputed.
    assert plan.programs_running == 20


def test_admission_fallback_capacity_equals_the_plans_resident_tokens() -> None:
    plan = plan_capacity(EXAMPLE_SHAPE, EXAMPLE_MEMORY, EXAMPLE_WORKLOAD)
    assert capacity_tokens(EXAMPLE_SHAPE, EXAMPLE_MEMORY) == plan.resident_tokens


def test_heads_not_dividing_hidden_size_is_an_error() -> None:
    with pytest.raises(PlanError, match=r"num_attention_heads \(48\) does not divide hidden_size"):
        derive_head_dim(4000, 48)


def test_head_dim_is_hidden_size_over_heads() -> None:
    assert derive_head_dim(8192, 64) == 128


def test_p95_below_the_mean_is_an_error() -> None:
    with pytest.raises(PlanError, match="p95"):
        plan_capacity(EXAMPLE_SHAPE, EXAMPLE_MEMORY, Workload(context_mean=8000, context_p95=4000))


def test_unknown_kv_dtype_is_an_error() -> None:
    with pytest.raises(PlanError, match="unknown KV dtype 'int3'"):
        kv_bytes_per_token(KvShape(num_layers=1, num_kv_heads=1, head_dim=1, kv_dtype="int3"))


def test_gpu_memory_utilization_above_one_is_an_error() -> None:
    memory = ReplicaMemory(hbm_bytes_per_gpu=80 * GiB, gpu_memory_utilization=1.5)
    with pytest.raises(PlanError, match="gpu_memory_utilization"):
        kv_budget_bytes(memory)


def test_missing_hbm_is_an_error_naming_the_flag() -> None:
    with pytest.raises(PlanError, match="--hbm-gib"):
        kv_budget_bytes(ReplicaMemory(weights_bytes=GiB))


def test_arrivals_without_a_context_length_are_an_error() -> None:
    with pytest.raises(PlanError, match="--context-mean"):
        plan_capacity(EXAMPLE_SHAPE, EXAMPLE_MEMORY, Workload(programs=50))


def test_an_engine_within_10_percent_of_the_plan_matches() -> None:
    assert not differs(163_840, 150_000)


def test_an_engine_over_10_percent_off_the_plan_differs() -> None:
    assert differs(163_840, 3_072)
    assert differs(163_840, 200_000)
