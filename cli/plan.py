"""`thunder-mw plan`: the KV capacity plan for a model on an engine replica, before launching.

The I/O around policies/capacity_plan.py: reads a model folder's config.json and safetensors
sizes, asks live engines what capacity they report (vLLM `vllm:cache_config_info`, SGLang
`max_total_num_tokens`), and prints the plan as text, JSON, or YAML to paste into a config.
Exit status: 0 the plan (and every engine) agree; 1 an engine differs over 10 % or could not
be read; 2 missing or inconsistent inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

import msgspec
import yaml
from pydantic import ValidationError

from thunder_mw.engines.capacity import (
    EngineCapacity,
    ModelFacts,
    model_facts,
    plan_inputs,
    read_engine_capacity,
)
from thunder_mw.policies.capacity_plan import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    KV_DTYPE_BYTES,
    MISMATCH_TOLERANCE,
    CapacityPlan,
    GiB,
    KvShape,
    PlanError,
    ReplicaMemory,
    Workload,
    differs,
    plan_capacity,
    relative_difference,
)
from thunder_mw.schemas.config import CapacityPlanSettings

__all__ = [
    "DEFAULT_BUFFER_TOKENS",
    "DEFAULT_HIGH_WATERMARK",
    "DEFAULT_LOW_WATERMARK",
    "EXIT_INPUT",
    "EXIT_MISMATCH",
    "EXIT_OK",
    "add_plan_arguments",
    "plan_settings",
    "run_plan",
]

EXIT_OK, EXIT_MISMATCH, EXIT_INPUT = 0, 1, 2
# Emitted admission watermarks unless told otherwise (the admission stage's own defaults).
DEFAULT_HIGH_WATERMARK = 0.95
DEFAULT_LOW_WATERMARK = 0.80
DEFAULT_BUFFER_TOKENS = 128


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """The `plan` subcommand's flags."""
    model = parser.add_argument_group("model (flags win over --model)")
    model.add_argument("--model", help="a local model folder, or its config.json")
    model.add_argument("--layers", type=int, help="num_hidden_layers")
    model.add_argument("--kv-heads", type=int, help="num_key_value_heads")
    model.add_argument("--head-dim", type=int, help="head_dim")
    model.add_argument("--hidden-size", type=int, help="hidden_size (head dim = this / heads)")
    model.add_argument("--attention-heads", type=int, help="num_attention_heads")
    model.add_argument(
        "--kv-dtype",
        default="auto",
        help=f"KV-cache dtype: {'|'.join(KV_DTYPE_BYTES)}, or auto = the model's dtype",
    )
    replica = parser.add_argument_group("engine replica")
    replica.add_argument("--hbm-gib", type=float, help="HBM per GPU, GiB")
    replica.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per replica")
    replica.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=DEFAULT_GPU_MEMORY_UTILIZATION,
        help="share of HBM the engine may use (reserve = 1 - this; default %(default)s)",
    )
    replica.add_argument(
        "--weights-gib", type=float, help="weights per replica, GiB (default: safetensors size)"
    )
    replica.add_argument(
        "--kv-space-gib",
        type=float,
        help="a fixed KV space per rank instead of HBM - weights (vLLM CPU's "
        "VLLM_CPU_KVCACHE_SPACE, --kv-cache-memory-bytes)",
    )
    replica.add_argument(
        "--block-size", type=int, help="KV block size: round capacity down to whole blocks"
    )
    replica.add_argument(
        "--offload-tokens", type=int, default=0, help="host-memory/disk KV tier, in tokens"
    )
    replica.add_argument("--offload-gib", type=float, help="host-memory/disk KV tier, in GiB")
    replica.add_argument(
        "--replicas", type=int, help="engine replicas (default: the number of --engine, or 1)"
    )
    work = parser.add_argument_group("workload")
    work.add_argument("--context-mean", type=int, help="mean context length per program, tokens")
    work.add_argument("--context-p95", type=int, help="p95 context length (default: the mean)")
    work.add_argument("--programs", type=int, help="programs arriving: how many run, how many wait")
    out = parser.add_argument_group("engines and output")
    out.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="URL",
        help="a live engine to compare with the plan (repeatable)",
    )
    out.add_argument("--timeout", type=float, default=10.0, help="engine query timeout, s")
    out.add_argument("--high-watermark", type=float, default=DEFAULT_HIGH_WATERMARK)
    out.add_argument("--low-watermark", type=float, default=DEFAULT_LOW_WATERMARK)
    out.add_argument("--buffer-tokens-per-program", type=int, default=DEFAULT_BUFFER_TOKENS)
    fmt = out.add_mutually_exclusive_group()
    fmt.add_argument(
        "--emit-config", action="store_true", help="print backends + admission YAML to paste"
    )
    fmt.add_argument("--json", action="store_true", help="print the plan as JSON")


def run_plan(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Computes and prints the plan; compares it with each --engine. Returns the exit status."""
    out = out or sys.stdout
    try:
        settings = plan_settings(args)
        facts = model_facts(settings)
        shape, memory, notes = plan_inputs(settings, facts)
        workload = Workload(
            context_mean=args.context_mean, context_p95=args.context_p95, programs=args.programs
        )
        replicas = args.replicas or max(1, len(args.engine))
        plan = plan_capacity(shape, memory, workload, replicas)
        if not 0 < args.low_watermark <= args.high_watermark <= 1:
            raise PlanError("watermarks must satisfy 0 < --low-watermark <= --high-watermark <= 1")
    except PlanError as exc:
        print(f"thunder-mw plan: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    engines = [read_engine_capacity(url, args.timeout) for url in args.engine]
    mismatch = any(e.tokens is None or differs(plan.resident_tokens, e.tokens) for e in engines)
    if args.json:
        out.write(_json_report(plan, shape, memory, engines, facts) + "\n")
    elif args.emit_config:
        out.write(_config_yaml(plan, engines, args))
    else:
        out.write(_text_report(plan, shape, memory, facts, notes, engines))
    return EXIT_MISMATCH if mismatch else EXIT_OK


def plan_settings(args: argparse.Namespace) -> CapacityPlanSettings:
    """The flags as the YAML `plan:` section, so the command and the config share one planner."""
    given = {
        name: getattr(args, name)
        for name in CapacityPlanSettings.model_fields
        if getattr(args, name, None) is not None
    }
    try:
        return CapacityPlanSettings.model_validate(given)
    except ValidationError as exc:
        problems = [
            f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}" for err in exc.errors()
        ]
        raise PlanError("; ".join(problems)) from None


# ---------------------------------------------------------------------- output
def _text_report(
    plan: CapacityPlan,
    shape: KvShape,
    memory: ReplicaMemory,
    facts: ModelFacts,
    notes: list[str],
    engines: list[EngineCapacity],
) -> str:
    dtype_bytes = KV_DTYPE_BYTES[shape.kv_dtype]
    heads = plan.bytes_per_token // (2 * shape.num_layers * shape.head_dim * dtype_bytes)
    lines = [f"KV capacity plan per engine replica (model: {facts.source})"]
    lines.append(
        f"  bytes per token   {plan.bytes_per_token:,} ({_size(plan.bytes_per_token)}) = 2 x "
        f"{shape.num_layers} layers x {heads} KV heads x head dim {shape.head_dim} x "
        f"{dtype_bytes} ({shape.kv_dtype})"
    )
    if memory.kv_space_bytes_per_rank is not None:
        how = f"fixed KV space {_gib_text(memory.kv_space_bytes_per_rank)} x {memory.tp} rank(s)"
    else:
        assert memory.hbm_bytes_per_gpu is not None
        how = (
            f"{_gib_text(memory.hbm_bytes_per_gpu)} HBM x TP {memory.tp} x "
            f"{memory.gpu_memory_utilization:g} - {_gib_text(memory.weights_bytes)} weights"
        )
    lines.append(f"  KV budget         {_gib_text(plan.kv_budget_bytes)} = {how}")
    blocks = f" ({memory.block_size}-token blocks)" if memory.block_size else ""
    lines.append(f"  resident tokens   {plan.resident_tokens:,}{blocks}")
    if plan.offload_tokens:
        lines.append(f"  offload tier      {plan.offload_tokens:,} tokens")
        lines.append(f"  combined          {plan.combined_tokens:,} tokens")
    if plan.programs_fit_mean is not None:
        lines.append(
            f"  programs that fit {plan.programs_fit_mean:,} at the mean context "
            f"({plan.context_mean:,} tokens), {plan.programs_fit_p95:,} at p95 "
            f"({plan.context_p95:,})"
        )
        if plan.offload_tokens:
            lines.append(
                f"  with offload      {plan.programs_fit_mean_combined:,} at the mean, "
                f"{plan.programs_fit_p95_combined:,} at p95 (offloaded KV reloads, no recompute)"
            )
    if plan.programs is not None:
        fleet = f" on {plan.replicas} replicas" if plan.replicas > 1 else ""
        lines.append(
            f"  {plan.programs:,} programs arriving{fleet}: {plan.programs_running:,} run, "
            f"{plan.programs_waiting:,} wait (sized at the p95 context)"
        )
    lines.extend(f"  note: {note}" for note in notes)
    for engine in engines:
        lines.append(_engine_line(plan, engine))
    return "\n".join(lines) + "\n"


def _engine_line(plan: CapacityPlan, engine: EngineCapacity) -> str:
    if engine.tokens is None:
        return f"  engine {engine.url}: capacity unknown ({engine.error}) - CHECK"
    detail = f" = {engine.num_blocks:,} blocks x {engine.block_size}" if engine.num_blocks else ""
    diff = relative_difference(plan.resident_tokens, engine.tokens)
    verdict = (
        f"DIFFERS over {MISMATCH_TOLERANCE:.0%}: a wrong plan or a misconfigured engine"
        if differs(plan.resident_tokens, engine.tokens)
        else "matches"
    )
    return (
        f"  engine {engine.url} ({engine.flavor}): reports {engine.tokens:,} tokens{detail}, "
        f"planned {plan.resident_tokens:,} ({diff:+.1%}) - {verdict}"
    )


def _json_report(
    plan: CapacityPlan,
    shape: KvShape,
    memory: ReplicaMemory,
    engines: list[EngineCapacity],
    facts: ModelFacts,
) -> str:
    report: dict[str, Any] = msgspec.to_builtins(plan)
    report["inputs"] = {
        "model": facts.source,
        "shape": msgspec.to_builtins(shape),
        "memory": msgspec.to_builtins(memory),
    }
    report["engines"] = [
        {
            "url": e.url,
            "flavor": e.flavor,
            "reported_tokens": e.tokens,
            "num_blocks": e.num_blocks,
            "block_size": e.block_size,
            "relative_difference": relative_difference(plan.resident_tokens, e.tokens)
            if e.tokens is not None
            else None,
            "differs": e.tokens is None or differs(plan.resident_tokens, e.tokens),
            "error": e.error,
        }
        for e in engines
    ]
    return json.dumps(report, indent=2)


def _config_yaml(
    plan: CapacityPlan, engines: list[EngineCapacity], args: argparse.Namespace
) -> str:
    backends: list[dict[str, Any]] = []
    if engines:
        for i, engine in enumerate(engines):
            # An override above what the engine really holds would admit into thrashing.
            tokens = plan.resident_tokens
            if engine.tokens is not None:
                tokens = min(tokens, engine.tokens)
            backends.append(
                {
                    "name": f"{engine.flavor or 'vllm'}-{i}",
                    "type": engine.flavor or "vllm",
                    "url": engine.url,
                    "capacity_tokens": tokens,
                }
            )
    else:
        for i in range(plan.replicas):
            backends.append(
                {
                    "name": f"vllm-{i}",
                    "type": "vllm",
                    "url": f"http://127.0.0.1:{8000 + i}",
                    "capacity_tokens": plan.resident_tokens,
                }
            )
    admission = {
        "high_watermark": args.high_watermark,
        "low_watermark": args.low_watermark,
        "buffer_tokens_per_program": args.buffer_tokens_per_program,
    }
    header = [
        f"# thunder-mw plan: {plan.resident_tokens:,} KV tokens per replica "
        f"({plan.bytes_per_token:,} bytes per token, {_gib_text(plan.kv_budget_bytes)} budget)."
    ]
    if plan.programs_fit_mean is not None and plan.context_mean:
        admitted = int(plan.resident_tokens * args.high_watermark) // plan.context_mean
        header.append(
            f"# {plan.programs_fit_mean} programs fit at the mean context "
            f"({plan.context_mean:,}), {plan.programs_fit_p95} at p95; the high watermark "
            f"admits about {admitted} at the mean."
        )
    if not engines:
        header.append("# Replace each url with your engine's.")
    body = yaml.safe_dump(
        {"backends": backends, "policies": [{"admission": admission}]}, sort_keys=False
    )
    return "\n".join(header) + "\n" + body


def _gib_text(n: int) -> str:
    return f"{n / GiB:,.1f} GiB"


def _size(n: int) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"
