"""The admin API as one table of operations, from which both its Starlette router
(middleware/admin.py) and its OpenAPI 3.1 description (GET /openapi.json) are built, so
operators' clients and fuzzers (schemathesis in the tests) see exactly the routes served.

Schemas come from the msgspec structs the routes encode (schemas/views.py), through
`msgspec.json.schema_components`; this module only says which route answers which struct.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

from thunder_mw.schemas.rollout_views import (
    BackendChange,
    BackendList,
    BackendRequest,
    GenerationState,
    IsPaused,
    IsSleeping,
    PauseRequest,
    WeightUpdateRequest,
    WorkerAccepted,
    WorkerChanged,
    WorkerList,
    WorkerRequest,
    WorkerUrls,
)
from thunder_mw.schemas.views import (
    ID_RULES,
    DashboardState,
    ErrorBody,
    HealthView,
    PendingProgram,
    ProfileList,
    ProfileView,
    ProgramDetail,
    ProgramList,
    Released,
    ReleaseRequest,
    SandboxRequest,
    SandboxView,
)

OPENAPI_PATH = "/openapi.json"
_JSON = "application/json"
_REF = "#/components/schemas/{name}"
_HTML = "text/html; charset=utf-8"


@dataclass(frozen=True)
class Param:
    """A path or query parameter besides `program_id`."""

    name: str
    where: str  # "path" | "query"
    description: str
    schema: tuple[tuple[str, Any], ...] = (("type", "string"), ("minLength", 1))
    required: bool = True

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "in": self.where,
            "required": self.required,
            "description": self.description,
            "schema": dict(self.schema),
        }


@dataclass(frozen=True)
class Operation:
    """One admin route: where it is, which AdminApi method answers it, what it answers."""

    path: str  # a Starlette path; `{program_id:path}`: an id may hold slashes
    method: str
    endpoint: str  # the name of the AdminApi method that answers it
    operation_id: str
    summary: str
    answers: tuple[Any, ...]  # the types its success body may be (several: any of them)
    status: int = 200
    media: str = _JSON
    body: type | None = None  # the JSON body it accepts
    errors: tuple[int, ...] = ()  # besides 401, which every guarded route may answer
    public: bool = False  # needs no admin token
    dashboard_token: bool = False  # `?token=` stands in for the header
    params: tuple[Param, ...] = ()

    @property
    def openapi_path(self) -> str:
        return re.sub(r"\{(\w+):\w+\}", r"{\1}", self.path)


_DASHBOARD_PAGE = (
    "The live dashboard page (`?token=` stands in for the header here, since a browser's "
    "address bar cannot send one)."
)

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "/health",
        "GET",
        "health",
        "health",
        "Gateway and backend health (never needs the admin token).",
        (HealthView,),
        public=True,
    ),
    Operation(
        "/metrics",
        "GET",
        "prometheus",
        "metrics",
        "Prometheus metrics.",
        (str,),
        media="text/plain; version=0.0.4",
    ),
    Operation(OPENAPI_PATH, "GET", "openapi", "openapi", "This description.", (dict[str, Any],)),
    Operation("/programs", "GET", "programs", "listPrograms", "Live programs.", (ProgramList,)),
    # Before /programs/{program_id}: the router tries routes in this order.
    Operation(
        "/programs/release",
        "POST",
        "release",
        "releaseProgram",
        "End a program: held requests answered, containers reclaimed.",
        (Released,),
        body=ReleaseRequest,
        errors=(400, 403, 413),
    ),
    Operation(
        "/programs/{program_id:path}/sandboxes",
        "POST",
        "sandbox",
        "handOutSandbox",
        "Hand the program a started sandbox from a template (warm pool first).",
        (SandboxView,),
        status=201,
        body=SandboxRequest,
        errors=(400, 403, 404, 413, 503),
    ),
    Operation(
        "/programs/{program_id:path}",
        "GET",
        "program",
        "getProgram",
        "One live program (or one holding sandboxes before its first request); with "
        "replicas, also one another replica holds (`holder` names it).",
        (ProgramDetail, PendingProgram),
        errors=(404, 503),
    ),
    Operation(
        "/profiles",
        "GET",
        "profiles",
        "listProfiles",
        "Per-program profile summaries (404 when profiles are off).",
        (ProfileList,),
        errors=(404,),
    ),
    Operation(
        "/profiles/{program_id:path}",
        "GET",
        "profile",
        "getProfile",
        "One program's profile, step by step.",
        (ProfileView,),
        errors=(404,),
    ),
    Operation(
        "/dashboard",
        "GET",
        "dashboard",
        "dashboard",
        _DASHBOARD_PAGE,
        (str,),
        media=_HTML,
        dashboard_token=True,
    ),
    Operation(
        "/dashboard/",
        "GET",
        "dashboard",
        "dashboardSlash",
        _DASHBOARD_PAGE,
        (str,),
        media=_HTML,
        dashboard_token=True,
    ),
    Operation(
        "/dashboard/state",
        "GET",
        "dashboard_state",
        "dashboardState",
        "What the dashboard polls: backends, programs by state, queue, decisions.",
        (DashboardState,),
    ),
)

_URL = Param("url", "query", "The engine's base URL (http:// or https://).", (("type", "string"),))
_MODE_DOC = "Held calls are never failed: new calls wait at the gateway until generation continues."
_ROLLOUT = "RL rollout (docs/rl-rollout.md): "


def _rollout(
    path: str, method: str, endpoint: str, op_id: str, summary: str, answer: Any, **kw: Any
) -> Operation:
    return Operation(
        path, method, "rollout." + endpoint, op_id, _ROLLOUT + summary, (answer,), **kw
    )


ROLLOUT_OPERATIONS: tuple[Operation, ...] = (
    _rollout(
        "/backends", "GET", "list_backends", "listBackends", "The engines in the pool.", BackendList
    ),
    _rollout(
        "/backends",
        "POST",
        "add_backend",
        "addBackend",
        "Add an engine (the fields of a YAML `backends[]` entry); probed for health and "
        "KV capacity, then programs may be placed on it.",
        BackendChange,
        status=201,
        body=BackendRequest,
        errors=(400, 409, 413),
    ),
    _rollout(
        "/backends/{name:path}",
        "DELETE",
        "drain_backend",
        "drainBackend",
        "Drain an engine: no new programs, paused ones resume elsewhere, in-flight calls "
        "finish, then it leaves the pool.",
        BackendChange,
        status=202,
        errors=(404,),
        params=(Param("name", "path", "The backend's name (its label in /health)."),),
    ),
    _rollout(
        "/add_worker",
        "POST",
        "add_worker",
        "addWorker",
        "SGLang router's spelling of adding an (SGLang) engine.",
        WorkerChanged,
        errors=(400, 409),
        params=(_URL,),
    ),
    _rollout(
        "/remove_worker",
        "POST",
        "remove_worker",
        "removeWorker",
        "SGLang router's spelling of removing an engine (it drains).",
        WorkerChanged,
        errors=(400, 404),
        params=(_URL,),
    ),
    _rollout(
        "/list_workers",
        "GET",
        "list_workers",
        "listWorkers",
        "SGLang router's worker list: the URLs of engines taking calls.",
        WorkerUrls,
    ),
    _rollout(
        "/workers",
        "GET",
        "workers",
        "listWorkersV2",
        "SGLang model gateway's worker list.",
        WorkerList,
    ),
    _rollout(
        "/workers",
        "POST",
        "create_worker",
        "createWorker",
        "SGLang model gateway's spelling of adding an engine.",
        WorkerAccepted,
        status=202,
        body=WorkerRequest,
        errors=(400, 409, 413),
    ),
    _rollout(
        "/workers/{worker_id:path}",
        "DELETE",
        "delete_worker",
        "deleteWorker",
        "SGLang model gateway's spelling of removing an engine (it drains).",
        WorkerAccepted,
        status=202,
        errors=(404,),
        params=(Param("worker_id", "path", "The worker's id (its name) or URL."),),
    ),
    _rollout(
        "/generation",
        "GET",
        "generation",
        "generationState",
        "Whether generation is paused, and the calls held and in flight.",
        GenerationState,
    ),
    _rollout(
        "/generation/pause",
        "POST",
        "pause",
        "pauseGeneration",
        "Pause generation (`wait`, `abort` or `keep`). " + _MODE_DOC,
        GenerationState,
        body=PauseRequest,
        errors=(400, 413, 504),
    ),
    _rollout(
        "/generation/resume",
        "POST",
        "resume",
        "resumeGeneration",
        "Continue generation: the engines resume, held calls are scheduled.",
        GenerationState,
    ),
    _rollout(
        "/weights/update",
        "POST",
        "update_weights",
        "updateWeights",
        "A whole weight-update cycle: pause, update every engine, mark every cache cold, "
        "resume. " + _MODE_DOC,
        GenerationState,
        body=WeightUpdateRequest,
        errors=(400, 413, 504),
    ),
    _rollout(
        "/pause_generation",
        "POST",
        "sglang_pause",
        "sglangPauseGeneration",
        "SGLang's spelling (`mode`: abort, retract, in_place).",
        GenerationState,
        errors=(400, 413, 504),
    ),
    _rollout(
        "/continue_generation",
        "POST",
        "resume",
        "sglangContinueGeneration",
        "SGLang's spelling of resuming generation.",
        GenerationState,
    ),
    _rollout(
        "/update_weights_from_disk",
        "POST",
        "sglang_update",
        "sglangUpdateWeights",
        "SGLang's weight update, forwarded to every SGLang engine inside a pause "
        "(`abort_all_requests: true` aborts in-flight calls).",
        GenerationState,
        errors=(400, 413, 504),
    ),
    _rollout(
        "/flush_cache",
        "POST",
        "flush_cache",
        "sglangFlushCache",
        "Flush every engine's prefix cache; the scheduler counts caches cold.",
        GenerationState,
    ),
    _rollout(
        "/reset_prefix_cache",
        "POST",
        "flush_cache",
        "vllmResetPrefixCache",
        "vLLM's spelling of flushing every engine's prefix cache.",
        GenerationState,
    ),
    _rollout(
        "/pause",
        "POST",
        "vllm_pause",
        "vllmPause",
        "vLLM's spelling of pausing (`?mode=abort|wait|keep`).",
        GenerationState,
        errors=(400, 504),
        params=(
            Param(
                "mode",
                "query",
                "abort (default), wait or keep.",
                (("enum", ["abort", "wait", "keep"]),),
                required=False,
            ),
        ),
    ),
    _rollout(
        "/resume", "POST", "resume", "vllmResume", "vLLM's spelling of resuming.", GenerationState
    ),
    _rollout("/is_paused", "GET", "is_paused", "vllmIsPaused", "vLLM's pause state.", IsPaused),
    _rollout(
        "/sleep",
        "POST",
        "sleep",
        "vllmSleep",
        "vLLM's sleep: generation paused (calls held), engines asleep, caches cold.",
        GenerationState,
        errors=(400, 504),
        params=(
            Param("level", "query", "1 (default) or 2.", (("enum", ["1", "2"]),), required=False),
        ),
    ),
    _rollout(
        "/wake_up",
        "POST",
        "wake_up",
        "vllmWakeUp",
        "vLLM's wake-up: engines awake, held calls released.",
        GenerationState,
    ),
    _rollout(
        "/is_sleeping", "GET", "is_sleeping", "vllmIsSleeping", "vLLM's sleep state.", IsSleeping
    ),
)
OPERATIONS = OPERATIONS + ROLLOUT_OPERATIONS

# Shared error answers, by status: (component name, description).
_ERRORS: dict[int, tuple[str, str]] = {
    400: ("BadRequest", "The body or an id is invalid; `param` names which."),
    401: ("Unauthorized", "`server.admin_token` is set and the request did not carry it."),
    403: (
        "OwnedElsewhere",
        "`agent_context.program_owner: header`: the program belongs to another client.",
    ),
    404: (
        "NotFound",
        "No such program, profile, template or route, or the feature is off (`code` says: "
        "`profiles_disabled`, `tools_disabled`).",
    ),
    409: ("Conflict", "A backend with that name or URL is already in the pool."),
    413: ("TooLarge", "The body is over 64 KiB."),
    503: (
        "EngineDown",
        "A store or engine the answer needs is down: the Docker engine (the sandbox could not "
        "be started), or with replicas Redis (`state_unavailable`; retry after `Retry-After`).",
    ),
    504: (
        "PauseTimeout",
        "Calls were still in flight after `timeout_s`: generation continues as before.",
    ),
}


def _components() -> tuple[dict[str, Any], dict[tuple[int, int], dict[str, Any]]]:
    """The schema components, and each operation's answer/body schema by (table row, slot)."""
    wanted: list[tuple[tuple[int, int], Any]] = [((-1, 0), ErrorBody)]
    for row, op in enumerate(OPERATIONS):
        wanted.extend(((row, slot), answer) for slot, answer in enumerate(op.answers))
        if op.body is not None:
            wanted.append(((row, -1), op.body))
    schemas, components = msgspec.json.schema_components([t for _, t in wanted], ref_template=_REF)
    return components, {key: schema for (key, _), schema in zip(wanted, schemas, strict=True)}


def _content(media: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {media: {"schema": schema}}


def _error_ref(status: int) -> dict[str, str]:
    return {"$ref": f"#/components/responses/{_ERRORS[status][0]}"}


def _operation(row: int, op: Operation, schemas: dict[tuple[int, int], Any]) -> dict[str, Any]:
    answers = [schemas[row, slot] for slot in range(len(op.answers))]
    ok = answers[0] if len(answers) == 1 else {"anyOf": answers}
    responses: dict[str, Any] = {
        str(op.status): {"description": op.summary, "content": _content(op.media, ok)}
    }
    for status in () if op.public else (401, *op.errors):
        responses[str(status)] = _error_ref(status)
    described: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary}
    if op.public:
        described["security"] = []
    elif op.dashboard_token:
        described["security"] = [{"adminToken": []}, {"dashboardToken": []}]
    if "{program_id" in op.path:
        described["parameters"] = [
            {
                "name": "program_id",
                "in": "path",
                "required": True,
                "description": ID_RULES,
                "schema": {"type": "string", "minLength": 1},
            }
        ]
    if op.params:
        described.setdefault("parameters", []).extend(p.describe() for p in op.params)
    if op.body is not None:
        described["requestBody"] = {"required": True, "content": _content(_JSON, schemas[row, -1])}
    described["responses"] = responses
    return described


def admin_openapi(version: str) -> dict[str, Any]:
    """The admin API's OpenAPI 3.1 document for gateway `version`."""
    components, schemas = _components()
    paths: dict[str, dict[str, Any]] = {}
    for row, op in enumerate(OPERATIONS):
        paths.setdefault(op.openapi_path, {})[op.method.lower()] = _operation(row, op, schemas)
    error = schemas[-1, 0]
    responses = {
        name: {"description": description, "content": _content(_JSON, error)}
        for name, description in _ERRORS.values()
    }
    responses["Unauthorized"]["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "thunder-mw admin API",
            "version": version,
            "description": "Health, programs, release, sandboxes, profiles, dashboard and "
            "metrics of a thunder-mw gateway. Every route but /health needs "
            "`Authorization: Bearer <server.admin_token>` when that token is set. Errors are "
            "OpenAI-style JSON naming the offending field; an unknown method on an admin path "
            "is a 405 of the same shape, with an `Allow` header.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "responses": responses,
            "securitySchemes": {
                "adminToken": {"type": "http", "scheme": "bearer"},
                "dashboardToken": {"type": "apiKey", "in": "query", "name": "token"},
            },
        },
        "security": [{"adminToken": []}],
    }


def admin_openapi_json(version: str) -> bytes:
    return msgspec.json.encode(admin_openapi(version))
