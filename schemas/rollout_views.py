"""What the RL-rollout admin routes accept and answer: engines added and drained at run time
(thunder-mw's own `/backends` and SGLang router's worker API) and weight-update cycles, as
msgspec structs that the routes encode and GET /openapi.json describes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from thunder_mw.schemas.views import BackendView

__all__ = [
    "BackendChange",
    "BackendList",
    "BackendRequest",
    "BackendType",
    "EngineAnswer",
    "GenerationState",
    "IsPaused",
    "IsSleeping",
    "PauseMode",
    "PauseRequest",
    "TimeoutS",
    "WeightUpdateRequest",
    "WorkerAccepted",
    "WorkerChanged",
    "WorkerInfo",
    "WorkerList",
    "WorkerRequest",
    "WorkerStats",
    "WorkerUrls",
]

BackendType = Literal["vllm", "sglang", "sim"]


class BackendRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """An engine to add: the fields of a YAML `backends[]` entry (docs/configuration.md)."""

    name: str | None = None
    type: BackendType = "vllm"
    url: str | None = None
    capacity_tokens: int | None = None
    pool_keep_alive_s: float = 4.0  # `keep_alive_s`, its deprecated name, is still read
    api_key: str | None = None
    plan: dict[str, Any] | None = None
    sim: dict[str, Any] | None = None


class BackendList(Struct, kw_only=True):
    backends: list[BackendView]
    count: int


class BackendChange(Struct, kw_only=True):
    """The backend as it is now: added (probed once), or draining until it has left."""

    backend: BackendView
    message: str


# ---------------------------------------------------------------- SGLang router's worker API
class WorkerRequest(Struct, kw_only=True):
    """SGLang router's `POST /workers` body (other fields it accepts are ignored here)."""

    url: str
    worker_type: Literal["regular", "prefill", "decode"] = "regular"
    api_key: str | None = None


class WorkerUrls(Struct, kw_only=True):
    """SGLang router's `GET /list_workers` answer."""

    urls: list[str]


class WorkerChanged(Struct, kw_only=True):
    """`POST /add_worker` / `POST /remove_worker`: the old router answered text; slime's router
    answers this JSON (`status`, `worker_urls`); clients check the status code."""

    status: Literal["success"]
    message: str
    worker_urls: list[str]


class WorkerInfo(Struct, kw_only=True):
    """One worker in SGLang router's `GET /workers` shape."""

    id: str
    url: str
    model_id: str | None
    worker_type: Literal["regular"]
    is_healthy: bool
    load: int
    connection_mode: Literal["Http"]
    draining: bool


class WorkerStats(Struct, kw_only=True):
    prefill_count: int
    decode_count: int
    regular_count: int


class WorkerList(Struct, kw_only=True):
    workers: list[WorkerInfo]
    total: int
    stats: WorkerStats


class WorkerAccepted(Struct, kw_only=True):
    """`POST /workers` / `DELETE /workers/{worker_id}`: 202, as SGLang's gateway answers."""

    status: Literal["accepted"]
    worker_id: str
    url: str
    location: str
    message: str


# ---------------------------------------------------------------- weight-update cycles
PauseMode = Literal["wait", "abort", "keep"]
TimeoutS = Annotated[float, Meta(ge=0.1, le=86400)]


class PauseRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """How to pause generation. `wait`: new calls are held and in-flight calls finish;
    `abort`: the engines abort in-flight calls (they answer with what they have); `keep`:
    the engines keep in-flight calls paused inside them until generation continues."""

    mode: PauseMode = "wait"
    timeout_s: TimeoutS = 300.0


class WeightUpdateRequest(Struct, kw_only=True):
    """A whole cycle: pause (as `mode` says), update every engine, mark caches cold, resume.
    `model_path`, `load_format`, `weight_version` and any other field go to SGLang engines'
    `/update_weights_from_disk` as they are; vLLM engines, whose weights the trainer pushes
    itself, get their prefix cache reset."""

    mode: PauseMode = "wait"
    timeout_s: TimeoutS = 300.0
    model_path: str | None = None
    load_format: str | None = None
    weight_version: str | None = None


class EngineAnswer(Struct, kw_only=True):
    """What one engine answered to a forwarded control call."""

    backend: str
    path: str
    status: int | None  # None: no answer (unreachable)
    ok: bool
    detail: str | None = None


class GenerationState(Struct, kw_only=True):
    """The gateway's generation gate after a pause / update / resume (SGLang-style `success`
    and `message` included, so its clients read it as an engine's answer)."""

    success: bool
    message: str
    paused: bool
    mode: PauseMode | None
    held_calls: int
    in_flight_calls: int
    released_calls: int
    num_paused_requests: int
    cache_flushes: int
    engines: list[EngineAnswer]


class IsPaused(Struct, kw_only=True):
    """vLLM's `GET /is_paused` answer."""

    is_paused: bool


class IsSleeping(Struct, kw_only=True):
    """vLLM's `GET /is_sleeping` answer."""

    is_sleeping: bool
