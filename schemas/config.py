"""The configuration tree: field names are the YAML keys; descriptions feed the README."""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


class _Section(BaseModel):
    # A typo in a YAML key must be an error at start-up, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid")


class Convention(enum.StrEnum):
    """Agent-context conventions thunder-mw reads (reference/agent-context-protocols.md)."""

    THUNDERAGENT = "thunderagent"  # body program_id / docker_ids / tool_ids, nested extra_body
    DYNAMO_BODY = "dynamo_body"  # body nvext.agent_context (+ nvext.agent_hints)
    DYNAMO_HEADERS = "dynamo_headers"  # X-Dynamo-Session-ID / -Parent-Session-ID / -Session-Final
    VLLM_ROUTER = "vllm_router"  # body vllm_xargs.agentic_context
    LITELLM = "litellm"  # header x-litellm-session-id, body metadata.session_id
    CODING_AGENTS = "coding_agents"  # Claude Code / Codex / OpenCode session headers
    SESSION_HEADER = "session_header"  # one operator-named header (vLLM production-stack style)


DEFAULT_CONVENTIONS: tuple[Convention, ...] = (
    Convention.THUNDERAGENT,
    Convention.DYNAMO_BODY,
    Convention.DYNAMO_HEADERS,
    Convention.VLLM_ROUTER,
    Convention.LITELLM,
)


class ServerSettings(_Section):
    host: str = Field("127.0.0.1", description="Address to bind; loopback unless told otherwise.")
    port: int = Field(8300, ge=0, le=65535, description="Port to bind (0 picks a free one).")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="Log level of the gateway."
    )
    admin_token: str | None = Field(
        None,
        description="When set, admin routes need `Authorization: Bearer <token>`.",
    )
    max_body_bytes: int = Field(
        8 * 1024 * 1024, gt=0, description="Largest accepted request body; larger bodies get 413."
    )
    connect_timeout_s: float = Field(5.0, gt=0, description="Connect timeout to an engine.")
    read_timeout_s: float = Field(
        600.0, gt=0, description="Longest wait for the next bytes from an engine."
    )
    max_connections_per_backend: int = Field(
        512, gt=0, description="Pooled keep-alive connections per engine."
    )
    probe_interval_s: float = Field(
        5.0, gt=0, description="How often engines' health, capacity and metrics are read."
    )
    tick_interval_s: float = Field(
        1.0, gt=0, description="How often the scheduler runs its timers (expiry, timeouts)."
    )
    forward_authorization: bool = Field(
        False,
        description="Forward the client's Authorization header to engines (a backend's "
        "`api_key` wins when set).",
    )


class AgentContextSettings(_Section):
    conventions: list[Convention] = Field(
        default_factory=lambda: list(DEFAULT_CONVENTIONS),
        description="Conventions accepted (others are neither read nor stripped). "
        "`coding_agents` and `session_header` are off by default.",
    )
    on_missing: Literal["ephemeral", "passthrough", "reject"] = Field(
        "ephemeral",
        description="Requests with no agent context: `ephemeral` = a one-step program of its "
        "own; `passthrough` = forwarded unscheduled; `reject` = 400.",
    )
    session_header: str | None = Field(
        None,
        description="Header name read as the program id by the `session_header` convention.",
    )
    max_id_length: int = Field(256, gt=0, le=4096, description="Longest accepted id.")
    max_docker_ids: int = Field(64, gt=0, le=1024, description="Most docker/tool ids per request.")

    @model_validator(mode="after")
    def _session_header_named(self) -> AgentContextSettings:
        if Convention.SESSION_HEADER in self.conventions and not self.session_header:
            raise ValueError("the session_header convention needs `session_header` set")
        return self


class SimEngineSettings(_Section):
    """Parameters of an embedded simulated engine (benchmarks/sim)."""

    flavor: Literal["vllm", "sglang"] = Field("vllm", description="API and metrics to speak.")
    num_blocks: int = Field(2048, gt=0, description="KV blocks.")
    block_size: int = Field(16, gt=0, description="Tokens per KV block.")
    max_num_seqs: int = Field(256, gt=0, description="Most running sequences.")
    max_num_batched_tokens: int = Field(8192, gt=0, description="Token budget per step.")
    profile: str = Field("h100-8b", description="Named per-step cost profile.")
    time_scale: float = Field(
        1.0, gt=0, description="Simulated seconds per wall second (10 = ten times faster)."
    )
    model_name: str = Field("sim-model", description="Served model name.")
    seed: int = Field(0, description="Seed for anything random in the engine.")
    max_model_len: int = Field(32768, gt=0, description="Longest prompt + output, in tokens.")
    tokenizer_file: str | None = Field(
        None,
        description="A `tokenizers` tokenizer.json to count tokens like a real model "
        "(default: a fixed rule, about four characters per token).",
    )


class CapacityPlanSettings(_Section):
    """The `thunder-mw plan` inputs, for an engine that does not report its KV capacity."""

    model: str | None = Field(None, description="Model folder or its config.json.")
    layers: int | None = Field(None, gt=0, description="Layers (else from the model).")
    kv_heads: int | None = Field(None, gt=0, description="KV heads (else from the model).")
    head_dim: int | None = Field(None, gt=0, description="Head dimension (else from the model).")
    kv_dtype: str = Field("auto", description="fp8, bf16, fp16, fp32 or auto (the model's).")
    tp: int = Field(1, gt=0, description="Tensor-parallel ranks of the engine.")
    hbm_gib: float | None = Field(None, gt=0, description="GPU memory per rank, GiB.")
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Share of GPU memory the engine may use."
    )
    weights_gib: float | None = Field(
        None, ge=0, description="Weights, GiB (else from the model's safetensors)."
    )
    kv_space_gib: float | None = Field(
        None, gt=0, description="A fixed KV space per rank instead (vLLM's CPU build)."
    )
    block_size: int | None = Field(None, gt=0, description="Round down to whole KV blocks.")


class BackendSettings(_Section):
    name: str | None = Field(None, description="Name used in logs and labels (default: url).")
    type: Literal["vllm", "sglang", "sim"] = Field("vllm", description="Engine flavour.")
    url: str | None = Field(None, description="Base URL; required unless type is sim.")
    capacity_tokens: int | None = Field(
        None, gt=0, description="KV capacity override in tokens (wins over discovery)."
    )
    api_key: str | None = Field(None, description="Bearer token sent to this engine.")
    plan: CapacityPlanSettings | None = Field(
        None,
        description="Planned KV capacity, used while the engine reports none (the override "
        "wins over the engine, the engine over the plan).",
    )
    sim: SimEngineSettings = Field(
        default_factory=SimEngineSettings, description="Embedded engine parameters (type: sim)."
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _url_unless_sim(self) -> BackendSettings:
        if self.type != "sim" and not self.url:
            raise ValueError("url is required for a vllm or sglang backend")
        return self

    @property
    def label(self) -> str:
        return self.name or self.url or "sim"


class ThunderConfig(BaseSettings):
    """The whole configuration: YAML file first, `THUNDER_MW_*` environment variables override."""

    model_config = SettingsConfigDict(
        env_prefix="THUNDER_MW_",
        env_nested_delimiter="__",
        extra="forbid",
    )

    server: ServerSettings = Field(default_factory=ServerSettings, description="HTTP server.")
    agent_context: AgentContextSettings = Field(
        default_factory=AgentContextSettings, description="Reading agent context."
    )
    backends: list[BackendSettings] = Field(
        default_factory=list, description="Engines to schedule onto."
    )
    policies: list[dict[str, Any]] | None = Field(
        None,
        description="The scheduler pipeline, in order: one `{stage: params}` per entry "
        "(omitted: admission, state_aware_pause, migration, gc_hooks with their defaults; "
        "`[]`: sticky placement, no admission control).",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The YAML file arrives as init arguments; THUNDER_MW_* variables override it.
        return (env_settings, init_settings)

    @field_validator("backends")
    @classmethod
    def _unique_labels(cls, v: list[BackendSettings]) -> list[BackendSettings]:
        seen: set[str] = set()
        for b in v:
            if b.type != "sim" or b.name:
                if b.label in seen:
                    raise ValueError(f"duplicate backend {b.label!r}")
                seen.add(b.label)
        return v
