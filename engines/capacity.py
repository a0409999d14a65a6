"""How much KV an engine holds: read from the engine itself, or planned from its model.

One reader serves the backend pool's probes and `thunder-mw plan --engine`: vLLM reports
`vllm:cache_config_info{num_gpu_blocks, block_size}` on /metrics, SGLang
`max_total_num_tokens` on /server_info (and `sglang:max_total_num_tokens` on /metrics).
For an engine that reports nothing, `planned_capacity` computes it from the model folder's
config.json and the replica's memory (the pure arithmetic is policies/capacity_plan.py).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from thunder_mw.engines.client import UpstreamError, control_request
from thunder_mw.engines.exposition import Exposition, read_exposition
from thunder_mw.policies.capacity_plan import (
    GiB,
    KvShape,
    PlanError,
    ReplicaMemory,
    capacity_tokens,
    check_grouping,
    derive_head_dim,
    kv_bytes_per_token,
    normalise_dtype,
)
from thunder_mw.schemas.config import CapacityPlanSettings

__all__ = [
    "CAPACITY_SERIES",
    "EngineCapacity",
    "ModelFacts",
    "capacity_from_exposition",
    "capacity_from_metrics",
    "capacity_from_server_info",
    "exposition_capacity",
    "model_facts",
    "models_max_len",
    "plan_inputs",
    "planned_capacity",
    "read_engine_capacity",
    "read_model",
    "server_info_capacity",
]

_SAFETENSORS_INDEX = "model.safetensors.index.json"


@dataclass
class EngineCapacity:
    """The capacity one live engine reports, or why it could not be read."""

    url: str = ""
    flavor: str | None = None
    tokens: int | None = None
    num_blocks: int | None = None
    block_size: int | None = None
    error: str | None = None


# ---------------------------------------------------------------------- from the engine
def capacity_from_metrics(text: bytes, result: EngineCapacity) -> bool:
    """Fills `result` from a Prometheus page (vLLM's cache_config_info, SGLang's gauge)."""
    try:
        page = read_exposition(text)
    except ValueError:
        return False
    return capacity_from_exposition(page, result)


# The samples capacity_from_exposition reads.
CAPACITY_SERIES = frozenset({"vllm:cache_config_info", "sglang:max_total_num_tokens"})


def capacity_from_exposition(page: Exposition, result: EngineCapacity) -> bool:
    for labels in page.info.get("vllm:cache_config_info", ()):
        blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
        if blocks.isdigit() and size.isdigit():
            result.flavor = "vllm"
            result.num_blocks, result.block_size = int(blocks), int(size)
            result.tokens = int(blocks) * int(size)
            return True
    tokens = page.totals.get("sglang:max_total_num_tokens")
    if tokens is not None and tokens > 0:
        result.flavor, result.tokens = "sglang", int(tokens)
        return True
    return False


def capacity_from_server_info(info: Any, result: EngineCapacity) -> bool:
    """Fills `result` from SGLang's /server_info answer."""
    tokens = info.get("max_total_num_tokens") if isinstance(info, dict) else None
    if not isinstance(tokens, int | float) or isinstance(tokens, bool) or tokens <= 0:
        return False
    result.flavor, result.tokens = "sglang", int(tokens)
    page = info.get("page_size")
    result.block_size = int(page) if isinstance(page, int) and page > 0 else None
    return True


def server_info_capacity(content: bytes) -> int | None:
    """SGLang's capacity from a /server_info body (None where it reports none)."""
    result = EngineCapacity()
    try:
        found = capacity_from_server_info(msgspec.json.decode(content), result)
    except (msgspec.DecodeError, RecursionError):
        return None
    return result.tokens if found else None


def models_max_len(content: bytes) -> int | None:
    """The longest `max_model_len` a `/v1/models` body reports (vLLM and SGLang list it per
    served model); None where it reports none."""
    try:
        body = msgspec.json.decode(content)
    except (msgspec.DecodeError, RecursionError):
        return None
    models = body.get("data") if isinstance(body, dict) else None
    lengths = [
        m["max_model_len"]
        for m in models or ()
        if isinstance(m, dict)
        and isinstance(m.get("max_model_len"), int)
        and not isinstance(m["max_model_len"], bool)
        and m["max_model_len"] > 0
    ]
    return max(lengths) if lengths else None


def exposition_capacity(page: Exposition) -> int | None:
    """The same, from a page already read."""
    result = EngineCapacity()
    return result.tokens if capacity_from_exposition(page, result) else None


def read_engine_capacity(url: str, timeout_s: float = 10.0) -> EngineCapacity:
    """The KV capacity an engine reports (blocking; for the `plan` command): /metrics first,
    then /server_info (or /get_server_info, its name in SGLang releases before it)."""
    return asyncio.run(_read_engine_capacity(url.rstrip("/"), timeout_s))


async def _read_engine_capacity(url: str, timeout_s: float) -> EngineCapacity:
    result = EngineCapacity(url=url)
    try:
        # The gateway's own engine client stack (engines/client.py), for one command.
        async with aiohttp.ClientSession() as session:
            metrics = await control_request(session, "GET", url + "/metrics", timeout_s=timeout_s)
            if metrics.status == 200 and capacity_from_metrics(metrics.body, result):
                return result
            for path in ("/server_info", "/get_server_info"):
                info = await control_request(session, "GET", url + path, timeout_s=timeout_s)
                if info.status == 200 and capacity_from_server_info(json.loads(info.body), result):
                    return result
    except (UpstreamError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.error = "reports no KV capacity (no vllm:cache_config_info, no max_total_num_tokens)"
    return result


# ---------------------------------------------------------------------- from the model
@dataclass
class ModelFacts:
    """What a model folder says about KV size; None where it is silent."""

    source: str
    num_layers: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    hidden_size: int | None = None
    dtype: str | None = None
    weights_bytes: int | None = None
    notes: list[str] = field(default_factory=list)


def planned_capacity(plan: CapacityPlanSettings) -> int:
    """Capacity in tokens for a backend's YAML `plan:` section (reads the model folder)."""
    shape, memory, _ = plan_inputs(plan, model_facts(plan))
    return capacity_tokens(shape, memory)


def model_facts(plan: CapacityPlanSettings) -> ModelFacts:
    return read_model(Path(plan.model)) if plan.model else ModelFacts(source="flags")


def read_model(path: Path) -> ModelFacts:
    """KV-relevant fields of a Hugging Face config.json, and the weights' size beside it."""
    config_path = path / "config.json" if path.is_dir() else path
    folder = config_path.parent
    if not config_path.is_file():
        raise PlanError(f"no config.json at {config_path}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise PlanError(f"{config_path} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise PlanError(f"{config_path} is not a JSON object")
    facts = ModelFacts(source=str(config_path))
    text = config
    # Multimodal configs (Llama 4, Gemma 3, ...) keep the language model's fields apart.
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
        text = {**config, **config["text_config"]}
        facts.notes.append("fields read from text_config")
    if "kv_lora_rank" in text:
        raise PlanError(
            f"{config_path} uses multi-head latent attention (kv_lora_rank): its KV is not "
            "2 x KV heads x head dim per layer, so this plan does not apply"
        )
    facts.num_layers = _int_field(text, config_path, "num_hidden_layers", "n_layer")
    facts.num_attention_heads = _int_field(text, config_path, "num_attention_heads", "n_head")
    facts.num_kv_heads = _int_field(text, config_path, "num_key_value_heads")
    if facts.num_kv_heads is None and facts.num_attention_heads is not None:
        facts.num_kv_heads = facts.num_attention_heads
        facts.notes.append("no num_key_value_heads: multi-head attention assumed")
    facts.head_dim = _int_field(text, config_path, "head_dim")
    facts.hidden_size = _int_field(text, config_path, "hidden_size", "n_embd")
    dtype = text.get("torch_dtype") or text.get("dtype")
    facts.dtype = str(dtype) if dtype else None
    facts.weights_bytes = _weights_bytes(folder)
    return facts


def plan_inputs(
    plan: CapacityPlanSettings, facts: ModelFacts
) -> tuple[KvShape, ReplicaMemory, list[str]]:
    """The planner's inputs: settings win over what the model folder says."""
    notes = list(facts.notes)
    layers = plan.layers if plan.layers is not None else facts.num_layers
    heads = plan.attention_heads if plan.attention_heads is not None else facts.num_attention_heads
    kv_heads = plan.kv_heads if plan.kv_heads is not None else facts.num_kv_heads
    if layers is None:
        raise PlanError("num_hidden_layers is unknown: pass --layers or --model")
    if kv_heads is None:
        raise PlanError("num_key_value_heads is unknown: pass --kv-heads or --model")
    if heads is not None:
        check_grouping(heads, kv_heads)
    head_dim = _head_dim(plan, facts, heads)
    kv_dtype = _kv_dtype(plan.kv_dtype, facts.dtype, notes)
    shape = KvShape(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, kv_dtype=kv_dtype)

    kv_space = _gib(plan.kv_space_gib)
    weights = _gib(plan.weights_gib)
    if weights is None:
        weights = facts.weights_bytes
    if kv_space is None and weights is None:
        raise PlanError(
            "the weights' size is unknown: pass --weights-gib or a --model folder "
            "holding safetensors files"
        )
    offload = plan.offload_tokens
    if plan.offload_gib is not None:
        offload += (_gib(plan.offload_gib) or 0) // kv_bytes_per_token(shape, plan.tp)
    memory = ReplicaMemory(
        tp=plan.tp,
        hbm_bytes_per_gpu=_gib(plan.hbm_gib),
        gpu_memory_utilization=plan.gpu_memory_utilization,
        weights_bytes=weights or 0,
        kv_space_bytes_per_rank=kv_space,
        block_size=plan.block_size,
        offload_tokens=offload,
    )
    return shape, memory, notes


def _int_field(config: dict[str, Any], path: Path, *names: str) -> int | None:
    for name in names:
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise PlanError(f"{path}: {name} must be an integer, not {value!r}")
        return value
    return None


def _weights_bytes(folder: Path) -> int | None:
    """The safetensors index's total_size (exact tensor bytes), else the shards' file sizes."""
    index = folder / _SAFETENSORS_INDEX
    if index.is_file():
        try:
            total = json.loads(index.read_text())["metadata"]["total_size"]
            return int(total)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    shards = sorted(folder.glob("*.safetensors"))
    return sum(s.stat().st_size for s in shards) if shards else None


def _head_dim(plan: CapacityPlanSettings, facts: ModelFacts, heads: int | None) -> int:
    if plan.head_dim is not None:
        return int(plan.head_dim)
    hidden = plan.hidden_size
    if hidden is None and plan.attention_heads is None and facts.head_dim is not None:
        return facts.head_dim
    hidden = hidden if hidden is not None else facts.hidden_size
    if hidden is None or heads is None:
        raise PlanError(
            "head_dim is unknown: pass --head-dim, or --hidden-size and --attention-heads"
        )
    return derive_head_dim(hidden, heads)


def _kv_dtype(setting: str, model_dtype: str | None, notes: list[str]) -> str:
    if setting != "auto":
        return normalise_dtype(setting)
    if model_dtype is None:
        notes.append("KV dtype unknown: bf16 assumed (pass --kv-dtype)")
        return "bf16"
    return normalise_dtype(model_dtype)


def _gib(value: float | None) -> int | None:
    return None if value is None else round(value * GiB)
