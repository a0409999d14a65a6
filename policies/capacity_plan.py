"""KV capacity arithmetic: how many programs' contexts an engine replica can keep resident.

Admission must be sized from this number, not from throughput: admitting past the programs
whose contexts fit does not fail loudly, it thrashes (evict, recompute, preempt). The same
pure functions serve `thunder-mw plan` and the admission stage's fallback when an engine does
not report its capacity. Everything here is integer bytes and tokens; no I/O.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DTYPE_ALIASES",
    "KV_DTYPE_BYTES",
    "MISMATCH_TOLERANCE",
    "CapacityPlan",
    "GiB",
    "KvShape",
    "PlanError",
    "ReplicaMemory",
    "Workload",
    "capacity_tokens",
    "check_grouping",
    "derive_head_dim",
    "differs",
    "kv_budget_bytes",
    "kv_bytes_per_token",
    "normalise_dtype",
    "plan_capacity",
    "programs_fit",
    "relative_difference",
    "resident_tokens",
    "stored_kv_heads",
]

GiB = 1024**3
# Bytes per element of the KV cache, by the names `--kv-dtype` accepts.
KV_DTYPE_BYTES: dict[str, int] = {"fp8": 1, "bf16": 2, "fp16": 2, "fp32": 4}
# Hugging Face `torch_dtype` / `dtype` names and vLLM `--kv-cache-dtype` names for the same.
DTYPE_ALIASES: dict[str, str] = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
}
# vLLM's default: 10 % of each GPU's memory is kept back for activations and the runtime.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# A live engine whose capacity differs more than this from the plan is flagged.
MISMATCH_TOLERANCE = 0.10


class PlanError(ValueError):
    """A missing or inconsistent input; the message names the field and what to pass."""


class KvShape(msgspec.Struct, frozen=True, kw_only=True):
    """What one token of context costs in every layer's K and V."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: str = "bf16"


class ReplicaMemory(msgspec.Struct, frozen=True, kw_only=True):
    """One engine replica's memory for KV: HBM x TP less a reserve and the weights, or a fixed
    KV space per rank (engines like vLLM's CPU build are given one instead)."""

    tp: int = 1
    hbm_bytes_per_gpu: int | None = None
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    weights_bytes: int = 0
    kv_space_bytes_per_rank: int | None = None
    # Engines allocate whole blocks: capacity rounds down to a multiple of this.
    block_size: int | None = None
    # Host-memory or disk KV tier (KV offloading), in tokens: pooled with HBM by the engine.
    offload_tokens: int = 0


class Workload(msgspec.Struct, frozen=True, kw_only=True):
    """The programs expected: context length at the mean and p95, and how many arrive."""

    context_mean: int | None = None
    context_p95: int | None = None
    programs: int | None = None


class CapacityPlan(msgspec.Struct, frozen=True, kw_only=True):
    """The plan for one replica (and, for arrivals, the fleet of `replicas`)."""

    bytes_per_token: int
    kv_budget_bytes: int
    resident_tokens: int
    offload_tokens: int
    combined_tokens: int
    context_mean: int | None
    context_p95: int | None
    programs_fit_mean: int | None
    programs_fit_p95: int | None
    programs_fit_mean_combined: int | None
    programs_fit_p95_combined: int | None
    replicas: int
    programs: int | None
    programs_running: int | None
    programs_waiting: int | None


def normalise_dtype(name: str) -> str:
    """`bf16`, `bfloat16`, `torch.bfloat16`, ... to a key of KV_DTYPE_BYTES."""
    key = name.strip().lower().removeprefix("torch.")
    key = DTYPE_ALIASES.get(key, key)
    if key not in KV_DTYPE_BYTES:
        raise PlanError(f"unknown KV dtype {name!r}: use one of {', '.join(KV_DTYPE_BYTES)}")
    return key


def derive_head_dim(hidden_size: int, num_attention_heads: int) -> int:
    """hidden_size / num_attention_heads, for configs that do not state head_dim."""
    _positive("hidden_size", hidden_size)
    _positive("num_attention_heads", num_attention_heads)
    if hidden_size % num_attention_heads:
        raise PlanError(
            f"num_attention_heads ({num_attention_heads}) does not divide hidden_size "
            f"({hidden_size}): pass --head-dim"
        )
    return hidden_size // num_attention_heads


def check_grouping(num_attention_heads: int, num_kv_heads: int) -> None:
    """Grouped-query attention shares each KV head among a whole number of query heads."""
    _positive("num_attention_heads", num_attention_heads)
    _positive("num_key_value_heads", num_kv_heads)
    if num_kv_heads > num_attention_heads or num_attention_heads % num_kv_heads:
        raise PlanError(
            f"num_key_value_heads ({num_kv_heads}) must divide num_attention_heads "
            f"({num_attention_heads})"
        )


def stored_kv_heads(num_kv_heads: int, tp: int) -> int:
    """KV heads held across the replica's ranks: each rank holds at least one, so with more
    ranks than KV heads the heads are replicated (as vLLM and SGLang do)."""
    _positive("num_key_value_heads", num_kv_heads)
    _positive("tp", tp)
    if num_kv_heads >= tp:
        if num_kv_heads % tp:
            raise PlanError(f"tp ({tp}) must divide num_key_value_heads ({num_kv_heads})")
        return num_kv_heads
    if tp % num_kv_heads:
        raise PlanError(
            f"num_key_value_heads ({num_kv_heads}) must divide tp ({tp}) to be replicated"
        )
    return tp


def kv_bytes_per_token(shape: KvShape, tp: int = 1) -> int:
    """2 (K and V) x layers x KV heads x head dim x dtype bytes, over the whole replica."""
    _positive("num_hidden_layers", shape.num_layers)
    _positive("head_dim", shape.head_dim)
    heads = stored_kv_heads(shape.num_kv_heads, tp)
    return (
        2
        * shape.num_layers
        * heads
        * shape.head_dim
        * KV_DTYPE_BYTES[normalise_dtype(shape.kv_dtype)]
    )


def kv_budget_bytes(memory: ReplicaMemory) -> int:
    """Bytes the replica can give its KV cache; 0 (never negative) when weights fill HBM."""
    _positive("tp", memory.tp)
    if memory.kv_space_bytes_per_rank is not None:
        if memory.kv_space_bytes_per_rank < 0:
            raise PlanError("the KV space must not be negative")
        return memory.kv_space_bytes_per_rank * memory.tp
    if memory.hbm_bytes_per_gpu is None:
        raise PlanError("HBM per GPU is unknown: pass --hbm-gib (or a fixed --kv-space-gib)")
    _positive("HBM per GPU", memory.hbm_bytes_per_gpu)
    if not 0 < memory.gpu_memory_utilization <= 1:
        raise PlanError(
            f"gpu_memory_utilization must be in (0, 1], not {memory.gpu_memory_utilization}"
        )
    if memory.weights_bytes < 0:
        raise PlanError("the weights size must not be negative")
    # Rounded to the byte: 80 GiB x 0.9 is 72 GiB, not one byte less from float error.
    usable = round(memory.hbm_bytes_per_gpu * memory.tp * memory.gpu_memory_utilization)
    return max(0, usable - memory.weights_bytes)


def resident_tokens(budget_bytes: int, bytes_per_token: int, block_size: int | None = None) -> int:
    """Tokens of context the budget holds, in whole blocks when the block size is known."""
    _positive("bytes per token", bytes_per_token)
    if block_size is None:
        return budget_bytes // bytes_per_token
    _positive("block_size", block_size)
    return budget_bytes // (bytes_per_token * block_size) * block_size


def programs_fit(tokens: int, context_tokens: int) -> int:
    """Whole programs of `context_tokens` each that `tokens` keeps resident."""
    _positive("context length", context_tokens)
    return tokens // context_tokens


def capacity_tokens(shape: KvShape, memory: ReplicaMemory) -> int:
    """The replica's planned HBM KV capacity in tokens: what admission assumes when an engine
    does not report its own."""
    bytes_per_token = kv_bytes_per_token(shape, memory.tp)
    return resident_tokens(kv_budget_bytes(memory), bytes_per_token, memory.block_size)


def plan_capacity(
    shape: KvShape, memory: ReplicaMemory, workload: Workload, replicas: int = 1
) -> CapacityPlan:
    """Bytes per token, budget, resident tokens and the programs that fit and run."""
    _positive("replicas", replicas)
    if memory.offload_tokens < 0:
        raise PlanError("the offload tier must not be negative")
    bytes_per_token = kv_bytes_per_token(shape, memory.tp)
    budget = kv_budget_bytes(memory)
    tokens = resident_tokens(budget, bytes_per_token, memory.block_size)
    combined = tokens + memory.offload_tokens
    mean = workload.context_mean
    p95 = workload.context_p95 if workload.context_p95 is not None else mean
    if mean is not None and p95 is not None and p95 < mean:
        raise PlanError(f"the p95 context ({p95}) is below the mean ({mean})")
    if mean is None and p95 is not None:
        raise PlanError("a p95 context length needs a mean context length too")
    fit_mean = programs_fit(tokens, mean) if mean is not None else None
    fit_p95 = programs_fit(tokens, p95) if p95 is not None else None
    running = waiting = None
    if workload.programs is not None:
        if workload.programs < 0:
            raise PlanError("the number of arriving programs must not be negative")
        if fit_p95 is None:
            raise PlanError("how many programs run needs a context length (--context-mean)")
        # Sized at the p95 context: a program that grows to p95 must still fit, or it thrashes.
        running = min(workload.programs, fit_p95 * replicas)
        waiting = workload.programs - running
    return CapacityPlan(
        bytes_per_token=bytes_per_token,
        kv_budget_bytes=budget,
        resident_tokens=tokens,
        offload_tokens=memory.offload_tokens,
        combined_tokens=combined,
        context_mean=mean,
        context_p95=p95,
        programs_fit_mean=fit_mean,
        programs_fit_p95=fit_p95,
        programs_fit_mean_combined=programs_fit(combined, mean) if mean is not None else None,
        programs_fit_p95_combined=programs_fit(combined, p95) if p95 is not None else None,
        replicas=replicas,
        programs=workload.programs,
        programs_running=running,
        programs_waiting=waiting,
    )


def relative_difference(planned: int, reported: int) -> float:
    """(reported - planned) / planned; infinite when nothing was planned but some reported."""
    if planned == 0:
        return 0.0 if reported == 0 else float("inf")
    return (reported - planned) / planned


def differs(planned: int, reported: int, tolerance: float = MISMATCH_TOLERANCE) -> bool:
    """True when an engine's reported capacity is off the plan by more than `tolerance`: a
    wrong plan or a misconfigured engine."""
    return abs(relative_difference(planned, reported)) > tolerance


def _positive(name: str, value: int | float) -> None:
    if value <= 0:
        raise PlanError(f"{name} must be positive, not {value}")
