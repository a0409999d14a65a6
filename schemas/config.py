"""The configuration tree: field names are the YAML keys; descriptions feed the config docs."""

from __future__ import annotations

import enum
import ipaddress
import logging
import os
import tempfile
from typing import Any, ClassVar, Literal
from urllib.parse import unquote, urlsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from thunder_mw.schemas.stage_settings import Pipeline

__all__ = [
    "DEFAULT_CONVENTIONS",
    "DEFAULT_JOURNAL_PATH",
    "EXPOSED_WITHOUT_ADMIN_TOKEN",
    "KNOWN_AGENT_HINTS",
    "AgentContextSettings",
    "BackendSettings",
    "CapacityPlanSettings",
    "Convention",
    "DockerToolSettings",
    "ObservabilitySettings",
    "ProfileSettings",
    "SandboxTemplate",
    "ServerSettings",
    "SimEngineSettings",
    "SpeculativePrefillSettings",
    "StateSettings",
    "ThunderConfig",
    "ToolSettings",
    "is_loopback",
    "masked_url",
    "per_user_state_path",
]

log = logging.getLogger("thunder_mw.config")


class _Section(BaseModel):
    # A typo in a YAML key must be an error at start-up, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid")
    # Old key -> its new name: still read (each field's validation_alias), with a warning
    # that names the key by its place in the YAML (`section`).
    renamed: ClassVar[dict[str, str]] = {}
    section: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for old, new in cls.renamed.items():
                if old not in data:
                    continue
                if new in data:
                    raise PydanticCustomError(
                        "renamed_twice",
                        "set `{new}` only (`{old}` is its deprecated name)",
                        {"field": old, "old": old, "new": new},
                    )
                log.warning(
                    "config: `%s%s` is deprecated, write `%s%s`", cls.section, old, cls.section, new
                )
        return data


class Convention(enum.StrEnum):
    """Agent-context conventions thunder-mw reads (reference/agent-context-protocols.md)."""

    THUNDERAGENT = "thunderagent"  # body program_id / docker_ids / tool_ids, nested extra_body
    DYNAMO_BODY = "dynamo_body"  # body nvext.agent_context (+ nvext.agent_hints)
    # X-Dynamo-Session-ID / -Parent-Session-ID / -Session-Final, and the older
    # x-dynamo-trajectory-id / -parent-trajectory-id / -trajectory-final
    DYNAMO_HEADERS = "dynamo_headers"
    VLLM_ROUTER = "vllm_router"  # body vllm_xargs.agentic_context
    LITELLM = "litellm"  # header x-litellm-session-id, body metadata.session_id
    CODING_AGENTS = "coding_agents"  # Claude Code / Codex / OpenCode session headers
    SESSION_HEADER = "session_header"  # one operator-named header (vLLM production-stack style)


# The hints Dynamo's agent-hints page documents (read into typed AgentContext fields).
KNOWN_AGENT_HINTS = frozenset({"priority", "strict_priority", "osl", "speculative_prefill"})

DEFAULT_CONVENTIONS: tuple[Convention, ...] = (
    Convention.THUNDERAGENT,
    Convention.DYNAMO_BODY,
    Convention.DYNAMO_HEADERS,
    Convention.VLLM_ROUTER,
    Convention.LITELLM,
)


class ServerSettings(_Section):
    renamed = {"keep_alive_s": "client_keep_alive_s"}
    section = "server."

    host: str = Field(
        "127.0.0.1",
        description="Address to bind; loopback unless told otherwise. Any other address "
        "(`0.0.0.0` and `::` among them) needs `admin_token`, or `allow_unauthenticated_admin`.",
    )
    port: int = Field(8300, ge=0, le=65535, description="Port to bind (0 picks a free one).")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="Log level of the gateway."
    )
    admin_token: SecretStr | None = Field(
        None,
        description="When set, admin routes need `Authorization: Bearer <token>` (never "
        "printed: check-config and the logs mask it). Required to bind a `host` other than "
        "loopback.",
    )
    allow_unauthenticated_admin: bool = Field(
        False,
        description="Let the gateway bind a non-loopback `host` without `admin_token`. "
        "Dangerous: anyone who can reach the port can then list every program, release any "
        "program, add and drain engines, pause generation and read the dashboard and metrics. "
        "Only for a network where every client is trusted, or behind a proxy that "
        "authenticates the admin routes itself.",
    )
    max_body_bytes: int = Field(
        8 * 1024 * 1024, gt=0, description="Largest accepted request body; larger bodies get 413."
    )
    max_header_bytes: int = Field(
        32 * 1024,
        gt=0,
        description="Largest accepted request head (target URL plus every header name and "
        "value); larger ones get 431.",
    )
    max_headers: int = Field(100, gt=0, description="Most request headers accepted; more get 431.")
    connect_timeout_s: float = Field(5.0, gt=0, description="Connect timeout to an engine.")
    read_timeout_s: float = Field(
        600.0, gt=0, description="Longest wait for the next bytes from an engine."
    )
    first_byte_timeout_s: float = Field(
        300.0,
        gt=0,
        description="Longest wait, once a request is sent, for the engine's response to "
        "start (its headers, and for a stream its first event); past it the call gets 504 "
        "`upstream_timeout` and its reservation is freed. An engine answers a non-streaming "
        "call only when it is complete, so this also bounds those calls.",
    )
    max_connections_per_backend: int = Field(
        512, gt=0, description="Pooled keep-alive connections per engine."
    )
    probe_interval_s: float = Field(
        5.0,
        gt=0,
        description="How often engines' health, capacity and metrics are read. A read asks "
        "the engine's Prometheus page for the samples the gateway uses (`/metrics/?name[]=...`, "
        "prometheus_client's own filter, which vLLM and SGLang serve there); an engine that "
        "answers that without them is read whole at `/metrics` from then on.",
    )
    failures_to_open: int = Field(
        3,
        gt=0,
        description="Failed calls in a row (no call answered between them, all within "
        "`failure_window_s`) that mark an engine down. Fewer make it suspect: it is probed at "
        "once and keeps getting calls unless the probe fails. A refused connection marks it "
        "down at once (it is what a probe would find).",
    )
    failure_window_s: float = Field(
        10.0,
        gt=0,
        description="Window of `failures_to_open`: a failure longer than this after the first "
        "of a run of failures starts a new run.",
    )
    client_keep_alive_s: float = Field(
        75.0,
        gt=0,
        validation_alias=AliasChoices("client_keep_alive_s", "keep_alive_s"),
        description="Seconds an idle connection from a client is kept open (uvicorn's "
        "`timeout_keep_alive`). Longer than clients' own pools keep theirs (httpx and the "
        "OpenAI client 5 s, aiohttp 15 s), as nginx's 75 s is, so the client closes first and "
        "never sends a request on a connection the gateway is closing. Formerly "
        "`keep_alive_s` (still read, with a warning).",
    )
    tick_interval_s: float = Field(
        1.0, gt=0, description="How often the scheduler runs its timers (expiry, timeouts)."
    )
    max_held_requests: int = Field(
        10_000,
        gt=0,
        description="Requests held at once (their program paused or not yet admitted); past "
        "it a new one gets 429 with Retry-After instead of unbounded memory.",
    )
    max_held_bytes: int = Field(
        256 * 1024 * 1024,
        gt=0,
        description="Body bytes of the requests held at once (each keeps its body until it "
        "runs); past it a new one gets 503 `held_bytes_full` with Retry-After.",
    )
    max_hold_s: float = Field(
        600.0,
        gt=0,
        description="Longest a request is held for capacity; then 503 `hold_timeout` with "
        "Retry-After (the OpenAI client gives up after 600 s by default).",
    )
    alone_hold_s: float = Field(
        10.0,
        gt=0,
        description="Longest a request is held when it is larger than every engine's KV cache "
        "as planned, so it could only run on an empty engine; then it is placed on the engine "
        "with the most room, which serves it as its own scheduler can.",
    )
    forward_authorization: bool = Field(
        False,
        description="Forward the client's Authorization header to engines (a backend's "
        "`api_key` wins when set).",
    )
    shutdown_timeout_s: float = Field(
        30.0,
        gt=0,
        description="On SIGTERM or Ctrl-C the process exits within this many seconds, whatever "
        "its calls or embedded engines are doing. Calls still running get all of it but the "
        "last 5 s (half of it under 10 s) to finish, then are answered 503 `shutting_down` (a "
        "stream already started is cut off); the gateway's own stop (tools, engine clients, "
        "embedded engines) gets the rest. A second signal exits at once.",
    )

    @model_validator(mode="after")
    def _exposed_admin_needs_a_token(self) -> ServerSettings:
        # As Redis's protected mode: open admin routes are acceptable on loopback only.
        token = self.admin_token.get_secret_value() if self.admin_token else ""
        if token or self.allow_unauthenticated_admin or is_loopback(self.host):
            return self
        raise PydanticCustomError(
            "exposed_without_admin_token",
            EXPOSED_WITHOUT_ADMIN_TOKEN,
            {"field": "host", "host": self.host},
        )


EXPOSED_WITHOUT_ADMIN_TOKEN = (
    "refusing to bind {host}, which is not a loopback address, without `server.admin_token`: "
    "the admin routes (list and release every program, add and drain engines, pause "
    "generation) would be open to anyone who can reach the port. Set `server.admin_token` "
    "(or THUNDER_MW_SERVER__ADMIN_TOKEN), bind a loopback address (127.0.0.1, ::1, "
    "localhost), or, if every client that can reach it is trusted, set "
    "`server.allow_unauthenticated_admin: true`"
)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`; every other address or name (0.0.0.0, :: among
    them) may be reachable from other hosts."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    extra_agent_hints: list[str] = Field(
        default_factory=list,
        description="Names accepted in `nvext.agent_hints` besides Dynamo's documented "
        "`priority`, `strict_priority`, `osl` and `speculative_prefill` (e.g. a hint a newer "
        "Dynamo adds): read onto the context's `extra_hints` and stripped. Any other unknown "
        "hint is a 400.",
    )
    max_id_length: int = Field(256, gt=0, le=4096, description="Longest accepted id.")
    max_docker_ids: int = Field(64, gt=0, le=1024, description="Most docker/tool ids per request.")
    program_owner: Literal["none", "header"] = Field(
        "none",
        description="`header`: a program's first request binds it to (a keyed digest of) the "
        "`program_owner_header` value (a first request without it gets 401); requests, "
        "releases and sandbox requests for it with another value or none get 403 "
        "`program_owned_by_another_key` until it is released or expires (admin-token holders "
        "may release any). `none`: any client may use any program id.",
    )
    program_owner_header: str = Field(
        "authorization",
        description="Header whose value owns a program under `program_owner: header` (the "
        "client's API key).",
    )

    @field_validator("extra_agent_hints")
    @classmethod
    def _hint_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not name.isidentifier():
                raise ValueError(f"{name!r} is not a hint name (letters, digits, underscores)")
            if name in KNOWN_AGENT_HINTS:
                raise ValueError(f"{name!r} is one of Dynamo's documented hints already")
        if len(set(v)) != len(v):
            raise ValueError("a hint is named twice")
        return v

    @field_validator("program_owner_header")
    @classmethod
    def _lower_header(cls, v: str) -> str:
        if not v or not v.isascii() or any(c in v for c in " :\t\r\n"):
            raise ValueError("must be an HTTP header name")
        return v.lower()

    @model_validator(mode="after")
    def _session_header_named(self) -> AgentContextSettings:
        if Convention.SESSION_HEADER in self.conventions and not self.session_header:
            raise ValueError("the session_header convention needs `session_header` set")
        return self


class SimEngineSettings(_Section):
    """Parameters of an embedded simulated engine (sim/)."""

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
    host_kv_tokens: int = Field(
        0,
        ge=0,
        description="Host-memory KV tier, in tokens (0: none). Full blocks evicted from the "
        "GPU are kept there (LRU) and loaded back on a prefix hit instead of recomputed, as "
        "vLLM's offloading connector, LMCache and SGLang HiCache do.",
    )
    host_kv_load_tokens_per_s: float | None = Field(
        None,
        gt=0,
        description="Host-to-GPU load speed of the host tier, tokens/s (default: the "
        "profile's PCIe bandwidth over its KV bytes per token).",
    )
    disk_kv_tokens: int = Field(
        0, ge=0, description="Disk KV tier below the host tier, in tokens (0: none)."
    )
    disk_kv_load_tokens_per_s: float | None = Field(
        None, gt=0, description="Load speed of the disk tier, tokens/s (required with it)."
    )
    scripted_agent: bool = Field(
        False,
        description="Answer chat completions with the `bash` tool calls of a small script "
        "per task (a few shell steps, then mini-SWE-agent's submit command; chosen by the "
        "task text and `seed`), so an agent framework runs end to end on the simulator.",
    )


class CapacityPlanSettings(_Section):
    """The `thunder-mw plan` inputs, for an engine that does not report its KV capacity."""

    model: str | None = Field(None, description="Model folder or its config.json.")
    layers: int | None = Field(None, gt=0, description="Layers (else from the model).")
    kv_heads: int | None = Field(None, gt=0, description="KV heads (else from the model).")
    head_dim: int | None = Field(None, gt=0, description="Head dimension (else from the model).")
    attention_heads: int | None = Field(
        None, gt=0, description="Attention heads, with hidden_size for the head dimension."
    )
    hidden_size: int | None = Field(
        None, gt=0, description="Hidden size (head dimension = this / attention heads)."
    )
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
    offload_tokens: int = Field(0, ge=0, description="Host-memory/disk KV tier, tokens.")
    offload_gib: float | None = Field(None, ge=0, description="Host-memory/disk KV tier, GiB.")


class BackendSettings(_Section):
    renamed = {"keep_alive_s": "pool_keep_alive_s"}
    section = "backends[]."

    name: str | None = Field(None, description="Name used in logs and labels (default: url).")
    type: Literal["vllm", "sglang", "sim"] = Field("vllm", description="Engine flavour.")
    url: str | None = Field(None, description="Base URL; required unless type is sim.")
    capacity_tokens: int | None = Field(
        None, gt=0, description="KV capacity override in tokens (wins over discovery)."
    )
    host_kv_tokens: int | None = Field(
        None,
        ge=0,
        description="Host-memory (and disk) KV tier of this engine, tokens: vLLM's offloading "
        "connector, LMCache, SGLang HiCache (default: the sim engine's own, else the plan's "
        "`offload_tokens`; SGLang's report wins). The scheduler counts it in the engine's pool.",
    )
    host_kv_load_tokens_per_s: float | None = Field(
        None,
        gt=0,
        description="Speed at which that tier reloads KV to the GPU, tokens/s (its PCIe "
        "bandwidth over the KV bytes per token); without it the tier is not planned with.",
    )
    pool_keep_alive_s: float = Field(
        4.0,
        gt=0,
        validation_alias=AliasChoices("pool_keep_alive_s", "keep_alive_s"),
        description="Seconds a pooled connection to this engine may sit idle before it is "
        "retired. Keep it below the engine's own idle timeout (uvicorn, under vLLM and SGLang: "
        "5 s) so the gateway never sends a call on a connection the engine is closing; a "
        "shorter `Keep-Alive: timeout=N` from the engine wins. A call lost that way anyway is "
        "resent once on a fresh connection. Formerly `keep_alive_s` (still read, with a "
        "warning).",
    )
    api_key: SecretStr | None = Field(
        None,
        description="Bearer token sent to this engine (never printed: masked like "
        "`server.admin_token`).",
    )
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
        if "@" in v.split("://", 1)[1].split("/", 1)[0]:
            # The URL is shown in /health, logs and metric labels; a key belongs in api_key.
            raise ValueError("must not carry credentials (user:password@); use api_key")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _url_unless_sim(self) -> BackendSettings:
        if self.type != "sim" and not self.url:
            raise ValueError("url is required for a vllm or sglang backend")
        return self

    @property
    def label(self) -> str:
        return self.name or self.url or "sim"


class SandboxTemplate(_Section):
    """A sandbox container the gateway prepares ahead and hands to programs on request."""

    name: str = Field(
        ...,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Template name clients ask for.",
    )
    image: str = Field(..., description="Image to run (must exist locally; nothing is pulled).")
    command: list[str] | str | None = Field(
        None, description="Command the container runs (default: the image's)."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra labels; the selector's label is always added, so the gateway may "
        "manage what it starts.",
    )
    environment: dict[str, str] = Field(default_factory=dict, description="Environment variables.")
    mem_limit: str | None = Field(None, description="Memory limit, Docker syntax (`256m`).")
    cpus: float | None = Field(None, gt=0, description="CPU limit in cores.")
    pids_limit: int | None = Field(None, gt=0, description="Most processes in the container.")
    network: str = Field(
        "none", description="Docker network to attach (`none`: no network, the safe default)."
    )
    pool_size: int = Field(
        0, ge=0, le=256, description="Started containers kept ready to hand out (0: cold start)."
    )


DEFAULT_JOURNAL_PATH = "~/.local/state/thunder-mw/tool-journal.sqlite3"


def per_user_state_path(path: str) -> str:
    """`path` with `~` expanded; the default journal goes under `$XDG_STATE_HOME` when that is
    set (an absolute path, as the XDG spec asks), and under the temporary directory when there
    is no home to expand `~` to: runtime state never lands in the working directory."""
    if path != DEFAULT_JOURNAL_PATH:
        return os.path.expanduser(path)
    state = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):
        state = os.path.expanduser("~/.local/state")
    if not os.path.isabs(state):  # no home directory
        state = os.path.join(tempfile.gettempdir(), f"thunder-mw-{os.getuid()}")
    return os.path.join(state, "thunder-mw", "tool-journal.sqlite3")


class DockerToolSettings(_Section):
    """The Docker tool manager: adopts programs' containers and reclaims them when they end."""

    enabled: bool | Literal["auto"] = Field(
        False,
        description="`auto`: manage containers when a Docker engine answers at start-up, else "
        "say in the log and /health that the manager is off; `true`: always (an engine that is "
        "down is retried); `false`: never.",
    )
    engine_url: str | None = Field(
        None,
        description="Docker engine address (`unix:///var/run/docker.sock`, `tcp://...`; "
        "default: DOCKER_HOST or the local socket).",
    )
    selector_label: str | None = Field(
        "thunder-mw.managed=true",
        description="`key=value` label a container must carry to be adopted (null: no label "
        "needed, then `selector_name_prefix` must be set).",
    )
    selector_name_prefix: str | None = Field(
        None, description="When set, an adopted container's name must also start with this."
    )
    reclaim: list[str] | None = Field(
        None,
        description="What ending a program does to its containers, in order: stop, remove, "
        "remove_image, or a `module:function` hook (called in a worker thread with the "
        "container, program id and reason). Null: the `gc_hooks` stage's `reclaim` list.",
    )
    remove_images: bool = Field(
        False, description="Also remove a reclaimed container's image once no container uses it."
    )
    stop_timeout_s: float = Field(
        5.0, ge=0, description="Seconds a container has to stop before it is killed."
    )
    grace_period_s: float = Field(
        60.0,
        ge=0,
        description="Containers whose program is not live (after a restart, or handed out "
        "before the program's first request) are reclaimed after this long.",
    )
    journal_path: str = Field(
        DEFAULT_JOURNAL_PATH,
        validate_default=True,
        description="SQLite (WAL) journal of ownership and pending reclaims; survives restarts. "
        "The default is per user, under `$XDG_STATE_HOME` when it is set (else "
        "`~/.local/state`), never the working directory; two gateways on one host need "
        "different paths.",
    )
    max_concurrent_calls: int = Field(
        8, gt=0, le=64, description="Docker API calls running at once (worker threads)."
    )
    call_timeout_s: float = Field(30.0, gt=0, description="Timeout of one Docker API call.")
    retry_max_interval_s: float = Field(
        30.0, gt=0, description="Longest wait between retries of a failing reclaim."
    )
    sweep_interval_s: float = Field(
        2.0, gt=0, description="How often orphans, retries and disk use are checked."
    )
    templates: list[SandboxTemplate] = Field(
        default_factory=list, description="Sandbox templates for `POST /programs/{id}/sandboxes`."
    )

    @field_validator("journal_path")
    @classmethod
    def _per_user_state(cls, v: str) -> str:
        return per_user_state_path(v)

    @field_validator("selector_label")
    @classmethod
    def _key_value(cls, v: str | None) -> str | None:
        if v is not None and (v.count("=") != 1 or v.startswith("=")):
            raise ValueError("must be `key=value`")
        return v

    @model_validator(mode="after")
    def _some_selector(self) -> DockerToolSettings:
        if self.selector_label is None and not self.selector_name_prefix:
            raise ValueError("a selector is required: selector_label or selector_name_prefix")
        names = [t.name for t in self.templates]
        if len(set(names)) != len(names):
            raise ValueError("template names must be unique")
        for hook in self.reclaim or ():
            if hook not in ("stop", "remove", "remove_image") and ":" not in hook:
                raise ValueError(
                    f"unknown reclaim hook {hook!r} (stop, remove, remove_image, "
                    "or module:function)"
                )
        return self


class ToolSettings(_Section):
    docker: DockerToolSettings = Field(
        default_factory=DockerToolSettings, description="Docker containers programs own."
    )


class ProfileSettings(_Section):
    """Per-program, per-step timing and token profiles (`GET /profiles`)."""

    enabled: bool = Field(True, description="Record a profile of every program's steps.")
    ring_size: int = Field(
        256, gt=0, le=100_000, description="Steps kept per program (older ones drop off)."
    )
    retention_s: float = Field(
        600.0, ge=0, description="How long a released program's profile stays readable."
    )
    max_programs: int = Field(
        10_000,
        gt=0,
        description="Most profiles held; past it the longest-released (then the oldest live) "
        "program's profile is dropped.",
    )
    export_path: str | None = Field(
        None,
        description="Append each released program's profile to this JSONL file, in the "
        "benchmarks' replay trace format (written by a background thread).",
    )


class ObservabilitySettings(_Section):
    profiles: ProfileSettings = Field(
        default_factory=ProfileSettings, description="Per-program step profiles."
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="`json`: one JSON object per log line, decision logs carrying "
        "`program_id`, `backend`, `reason` as fields.",
    )
    decision_log: bool = Field(
        True, description="Log every pause, resume, migration, release and reclaim (INFO)."
    )
    access_log: bool = Field(
        False, description="uvicorn's per-request access log (off: it costs on the hot path)."
    )
    dashboard_history_s: int = Field(
        600,
        gt=0,
        le=86_400,
        description="Seconds of programs-by-state history the dashboard keeps.",
    )


class SpeculativePrefillSettings(_Section):
    """The live side of the `speculative_prefill` stage: what the gateway remembers of each
    program to warm an engine with, and how it sends the warming request. The decision to
    warm is the stage's (`policies:`); without that stage nothing is remembered or sent."""

    memory_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="Byte budget for remembered prompts (each program's last request body and "
        "answer); past it the least recently used program's is dropped (0: remember nothing).",
    )
    timeout_s: float = Field(
        120.0, gt=0, description="A warming request not answered in this time is given up."
    )


class StateSettings(_Section):
    """Where the scheduler's state lives: this process's memory, or a Redis several gateways
    share (docs/replicas.md)."""

    # A rejected url must not be echoed in an error (pydantic quotes the input otherwise).
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    backend: Literal["memory", "redis"] = Field(
        "memory",
        description="`memory`: programs, reservations and the queue live in this process (one "
        "gateway; a restart forgets them). `redis`: program placement, per-engine reservations "
        "and the queue of waiting programs live in the Redis at `url`, shared by every "
        "gateway replica over the same fleet (docs/replicas.md).",
    )
    url: SecretStr | None = Field(
        None,
        description="Redis URL of the `redis` backend, `redis://` or `rediss://` (TLS), e.g. "
        "`rediss://:PASSWORD@host:6380/0`; its password is a secret (check-config prints it "
        "masked, the logs mask it; better set from THUNDER_MW_STATE__URL).",
    )
    key_prefix: str = Field(
        "thunder-mw:",
        description="Prefix of every key the `redis` backend writes, so several fleets can "
        "share one Redis.",
    )

    on_unavailable: Literal["fail_open", "fail_closed"] = Field(
        "fail_open",
        description="What a replica does while Redis does not answer. `fail_open` (default): "
        "requests keep flowing, placed by this replica's own view (program affinity, its own "
        "reservations) without the shared admission gate, so the fleet stays up and at worst "
        "over-commits an engine, which then queues or preempts. `fail_closed`: requests that "
        "need the gate are answered 503 (`state_unavailable`, Retry-After) until Redis is back.",
    )
    lease_ttl_s: float = Field(
        5.0,
        ge=1.0,
        le=300.0,
        description="Lifetime of a replica's lease, renewed every `server.tick_interval_s`. "
        "The reservations of a replica that died (SIGKILL, host lost) stop counting against "
        "the engines at most this long after its last renewal.",
    )
    timeout_s: float = Field(
        0.5,
        gt=0,
        le=30.0,
        description="Connect and reply timeout of each Redis call; past it the store counts as "
        "unavailable (see `on_unavailable`) and is retried a second later.",
    )

    @field_validator("url")
    @classmethod
    def _redis_url(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None:
            return v
        parts = urlsplit(v.get_secret_value())
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError("must start with redis:// or rediss://")
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            raise ValueError("has a port that is not a number") from None
        return v

    @model_validator(mode="after")
    def _url_for_redis_only(self) -> StateSettings:
        if self.backend == "redis" and self.url is None:
            raise PydanticCustomError(
                "missing_redis_url", "the redis backend needs a url", {"field": "url"}
            )
        if self.backend == "memory" and self.url is not None:
            raise PydanticCustomError(
                "unused_redis_url",
                "the memory backend takes no url (set `backend: redis` to use it)",
                {"field": "url"},
            )
        return self

    @field_serializer("url", when_used="json")
    def _masked_url(self, v: SecretStr | None) -> str | None:
        # check-config shows where the store is, never its password.
        return None if v is None else masked_url(v.get_secret_value())

    def secrets(self) -> list[str]:
        """The url's password, as written and percent-decoded (for the log filter)."""
        password = urlsplit(self.url.get_secret_value()).password if self.url else None
        return list(dict.fromkeys((password, unquote(password)))) if password else []


def masked_url(url: str) -> str:
    """`url` with the password of its `user:password@` replaced by `***`."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:***@{hostport}").geturl()


class ThunderConfig(BaseSettings):
    """The whole configuration: YAML file first, `THUNDER_MW_*` environment variables override."""

    model_config = SettingsConfigDict(
        env_prefix="THUNDER_MW_",
        env_nested_delimiter="__",
        extra="forbid",
        # Errors quote no input: it may be a secret (an admin token, a Redis URL's password).
        hide_input_in_errors=True,
    )

    server: ServerSettings = Field(default_factory=ServerSettings, description="HTTP server.")
    agent_context: AgentContextSettings = Field(
        default_factory=AgentContextSettings, description="Reading agent context."
    )
    backends: list[BackendSettings] = Field(
        default_factory=list, description="Engines to schedule onto."
    )
    policies: Pipeline | None = Field(
        None,
        description="The scheduler pipeline, in order: one `{stage: params}` per entry, a "
        "param left out taking its stage's default, or a preset's name (`thunderagent: {}`) "
        "for its stages (omitted: admission, state_aware_pause, migration, gc_hooks and "
        "speculative_prefill, each at its defaults: the `thunder-mw` preset; `[]`: sticky "
        "placement, no admission control; docs/scheduling.md).",
    )
    tools: ToolSettings = Field(
        default_factory=ToolSettings, description="Tools programs own (sandbox containers)."
    )
    observability: ObservabilitySettings = Field(
        default_factory=ObservabilitySettings,
        description="Profiles, logs and the dashboard.",
    )
    speculative_prefill: SpeculativePrefillSettings = Field(
        default_factory=SpeculativePrefillSettings,
        description="Remembered prompts and warming requests of the `speculative_prefill` "
        "stage (standalone gateway only: in gateway mode the answers pass through your app).",
    )
    state: StateSettings = Field(
        default_factory=StateSettings,
        description="Where programs, reservations and the queue live (one gateway or several).",
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
