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
        "One live program (or one holding sandboxes before its first request).",
        (ProgramDetail, PendingProgram),
        errors=(404,),
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
    413: ("TooLarge", "The body is over 64 KiB."),
    503: ("EngineDown", "The Docker engine is down: the sandbox could not be started."),
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
