"""The admin API as one table of operations, from which both its Starlette router
(middleware/_admin.py) and its OpenAPI 3.1 description (GET /openapi.json) are built, so
operators' clients and fuzzers (schemathesis in the tests) see exactly the routes served.

Schemas come from the msgspec structs the routes encode (schemas/views.py), through
`msgspec.json.schema_components`; this module only says which route answers which struct.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
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

__all__ = [
    "ALIASES",
    "FAMILIES",
    "OPENAPI_PATH",
    "OPERATIONS",
    "ROUTES",
    "Alias",
    "Operation",
    "Param",
    "admin_openapi",
    "admin_openapi_json",
]

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
    family: str = ""  # the canonical routes' group (the OpenAPI tag)
    alias_of: str = ""  # an alias: the canonical route it stands for, "METHOD /path"

    @property
    def openapi_path(self) -> str:
        return re.sub(r"\{(\w+):\w+\}", r"{\1}", self.path)

    @property
    def key(self) -> str:
        """ "METHOD /path" as the OpenAPI document spells the path: what an alias names."""
        return f"{self.method} {self.openapi_path}"


def _family(name: str, *operations: Operation) -> tuple[Operation, ...]:
    return tuple(replace(op, family=name) for op in operations)


_DASHBOARD_PAGE = (
    "The live dashboard page (`?token=` stands in for the header here, since a browser's "
    "address bar cannot send one)."
)
_MODE_DOC = "Held calls are never failed: new calls wait at the gateway until generation continues."
_ROLLOUT = "RL rollout (docs/rl-rollout.md): "


def _rollout(
    path: str, method: str, endpoint: str, op_id: str, summary: str, answer: Any, **kw: Any
) -> Operation:
    return Operation(
        path, method, "rollout." + endpoint, op_id, _ROLLOUT + summary, (answer,), **kw
    )


_SLEEP_LEVEL = Param("level", "query", "1 (default) or 2.", (("enum", ["1", "2"]),), required=False)

FAMILIES: dict[str, str] = {
    "gateway": "The gateway itself: health, Prometheus metrics, this description.",
    "programs": "Live programs: list, inspect, release, hand out sandboxes.",
    "profiles": "Per-program step profiles.",
    "dashboard": "The live dashboard page and the snapshot it polls.",
    "backends": "The engines in the pool, added and drained at run time.",
    "generation": "The generation gate: pause, resume, sleep, weight updates, cache flushes.",
}

# The canonical routes: thunder-mw's own spelling, by family. Other servers' spellings of the
# same operations are ALIASES below, not routes of their own.
OPERATIONS: tuple[Operation, ...] = (
    *_family(
        "gateway",
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
        Operation(
            OPENAPI_PATH, "GET", "openapi", "openapi", "This description.", (dict[str, Any],)
        ),
    ),
    *_family(
        "programs",
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
    ),
    *_family(
        "profiles",
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
    ),
    *_family(
        "dashboard",
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
            "/dashboard/state",
            "GET",
            "dashboard_state",
            "dashboardState",
            "What the dashboard polls: backends, programs by state, queue, decisions.",
            (DashboardState,),
        ),
    ),
    *_family(
        "backends",
        _rollout(
            "/backends",
            "GET",
            "list_backends",
            "listBackends",
            "The engines in the pool.",
            BackendList,
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
    ),
    *_family(
        "generation",
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
            "/generation/flush_cache",
            "POST",
            "flush_cache",
            "flushCache",
            "Flush every engine's prefix cache; the scheduler counts caches cold.",
            GenerationState,
        ),
        _rollout(
            "/generation/sleep",
            "POST",
            "sleep",
            "sleep",
            "Sleep: generation paused (calls held), engines asleep, caches cold.",
            GenerationState,
            errors=(400, 504),
            params=(_SLEEP_LEVEL,),
        ),
        _rollout(
            "/generation/wake_up",
            "POST",
            "wake_up",
            "wakeUp",
            "Wake up: engines awake, held calls released.",
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
    ),
)


@dataclass(frozen=True)
class Alias:
    """Another server's spelling of a canonical route. `shape` None: the canonical route
    answers it as it is; else the operation (its own endpoint, in the table's `rollout.x`
    form) that reads that server's request and writes its answer shape, over the same
    operation of the fleet."""

    path: str
    method: str
    canonical: str  # the canonical route's `key`: "METHOD /path"
    spelling: str  # whose: "SGLang's", "vLLM's", ...
    operation_id: str
    shape: Operation | None = None


def _shape(endpoint: str, summary: str, answer: Any, **kw: Any) -> Operation:
    """The vendor-shaped operation of an alias (its path and method come from the alias)."""
    return Operation("", "", "rollout." + endpoint, "", _ROLLOUT + summary, (answer,), **kw)


_URL = Param("url", "query", "The engine's base URL (http:// or https://).", (("type", "string"),))
_ROUTER = "SGLang router's"
_GATEWAY = "SGLang model gateway's"
_SGLANG = "SGLang's"
_VLLM = "vLLM's"

# The one alias table: (alias path, method) -> the canonical route it stands for.
ALIASES: tuple[Alias, ...] = (
    Alias("/dashboard/", "GET", "GET /dashboard", "The trailing-slash", "dashboardSlash"),
    # SGLang router's and model gateway's worker API (what slime registers engines with).
    Alias(
        "/add_worker",
        "POST",
        "POST /backends",
        _ROUTER,
        "addWorker",
        _shape(
            "add_worker",
            "SGLang router's spelling of adding an (SGLang) engine.",
            WorkerChanged,
            errors=(400, 409),
            params=(_URL,),
        ),
    ),
    Alias(
        "/remove_worker",
        "POST",
        "DELETE /backends/{name}",
        _ROUTER,
        "removeWorker",
        _shape(
            "remove_worker",
            "SGLang router's spelling of removing an engine (it drains).",
            WorkerChanged,
            errors=(400, 404),
            params=(_URL,),
        ),
    ),
    Alias(
        "/list_workers",
        "GET",
        "GET /backends",
        _ROUTER,
        "listWorkers",
        _shape(
            "list_workers",
            "SGLang router's worker list: the URLs of engines taking calls.",
            WorkerUrls,
        ),
    ),
    Alias(
        "/workers",
        "GET",
        "GET /backends",
        _GATEWAY,
        "listWorkersV2",
        _shape("workers", "SGLang model gateway's worker list.", WorkerList),
    ),
    Alias(
        "/workers",
        "POST",
        "POST /backends",
        _GATEWAY,
        "createWorker",
        _shape(
            "create_worker",
            "SGLang model gateway's spelling of adding an engine.",
            WorkerAccepted,
            status=202,
            body=WorkerRequest,
            errors=(400, 409, 413),
        ),
    ),
    Alias(
        "/workers/{worker_id:path}",
        "DELETE",
        "DELETE /backends/{name}",
        _GATEWAY,
        "deleteWorker",
        _shape(
            "delete_worker",
            "SGLang model gateway's spelling of removing an engine (it drains).",
            WorkerAccepted,
            status=202,
            errors=(404,),
            params=(Param("worker_id", "path", "The worker's id (its name) or URL."),),
        ),
    ),
    # The engines' own spellings of the generation gate (what rollout frameworks call).
    Alias(
        "/pause_generation",
        "POST",
        "POST /generation/pause",
        _SGLANG,
        "sglangPauseGeneration",
        _shape(
            "sglang_pause",
            "SGLang's spelling (`mode`: abort, retract, in_place).",
            GenerationState,
            errors=(400, 413, 504),
        ),
    ),
    Alias(
        "/continue_generation",
        "POST",
        "POST /generation/resume",
        _SGLANG,
        "sglangContinueGeneration",
    ),
    Alias(
        "/update_weights_from_disk",
        "POST",
        "POST /weights/update",
        _SGLANG,
        "sglangUpdateWeights",
        _shape(
            "sglang_update",
            "SGLang's weight update, forwarded to every SGLang engine inside a pause "
            "(`abort_all_requests: true` aborts in-flight calls).",
            GenerationState,
            errors=(400, 413, 504),
        ),
    ),
    Alias("/flush_cache", "POST", "POST /generation/flush_cache", _SGLANG, "sglangFlushCache"),
    Alias(
        "/reset_prefix_cache",
        "POST",
        "POST /generation/flush_cache",
        _VLLM,
        "vllmResetPrefixCache",
    ),
    Alias(
        "/pause",
        "POST",
        "POST /generation/pause",
        _VLLM,
        "vllmPause",
        _shape(
            "vllm_pause",
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
    ),
    Alias("/resume", "POST", "POST /generation/resume", _VLLM, "vllmResume"),
    Alias(
        "/is_paused",
        "GET",
        "GET /generation",
        _VLLM,
        "vllmIsPaused",
        _shape("is_paused", "vLLM's pause state.", IsPaused),
    ),
    Alias("/sleep", "POST", "POST /generation/sleep", _VLLM, "vllmSleep"),
    Alias("/wake_up", "POST", "POST /generation/wake_up", _VLLM, "vllmWakeUp"),
    Alias(
        "/is_sleeping",
        "GET",
        "GET /generation",
        _VLLM,
        "vllmIsSleeping",
        _shape("is_sleeping", "vLLM's sleep state.", IsSleeping),
    ),
)


def _resolved(alias: Alias, canonical: Operation) -> Operation:
    """The route an alias is served as: the canonical route at the alias's path, or the
    alias's own shape; either way it keeps the canonical route's family and access rules."""
    base = canonical if alias.shape is None else alias.shape
    summary = base.summary
    if alias.shape is None:
        summary = f"{alias.spelling} spelling of `{canonical.key}`, answered as it is."
    return replace(
        base,
        path=alias.path,
        method=alias.method,
        operation_id=alias.operation_id,
        summary=summary,
        family=canonical.family,
        public=canonical.public,
        dashboard_token=canonical.dashboard_token,
        alias_of=canonical.key,
    )


def _routes() -> tuple[Operation, ...]:
    """Every route served: the canonical ones, then each alias resolved. The one place the
    alias table is applied: the router, the admin paths and the OpenAPI document read this."""
    by_key = {op.key: op for op in OPERATIONS}
    return OPERATIONS + tuple(_resolved(alias, by_key[alias.canonical]) for alias in ALIASES)


ROUTES = _routes()

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
    for row, op in enumerate(ROUTES):
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
    described: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": [op.family],
    }
    if op.alias_of:
        # Served for clients written against another server; the canonical route is the
        # one to call. Not deprecated: aliases stay as long as those clients exist.
        described["description"] = f"An alias of `{op.alias_of}` (see that route)."
        described["x-alias-of"] = op.alias_of
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
    for row, op in enumerate(ROUTES):
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
            "description": "Health, programs, release, sandboxes, profiles, dashboard, "
            "metrics and run-time engine control of a thunder-mw gateway. Every route but "
            "/health needs `Authorization: Bearer <server.admin_token>` when that token is set. "
            "Errors are OpenAI-style JSON naming the offending field; an unknown method on an "
            "admin path is a 405 of the same shape, with an `Allow` header. Operations with "
            "`x-alias-of` are other servers' spellings (SGLang's, its router's, vLLM's) of the "
            "canonical route named there.",
        },
        "tags": [{"name": name, "description": text} for name, text in FAMILIES.items()],
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
