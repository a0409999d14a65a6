"""The admin API described in OpenAPI 3 (served at GET /openapi.json), so operators' clients
and fuzzers (schemathesis in the tests) know every admin route, parameter, body and error."""

from __future__ import annotations

from typing import Any

import msgspec

from thunder_mw.middleware.errors import send_error
from thunder_mw.middleware.types import Send

OPENAPI_PATH = "/openapi.json"

_JSON = "application/json"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "nullable": True}


_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_NSTR = _nullable(_STR)
_NINT = _nullable(_INT)
_NNUM = _nullable(_NUM)

_ID_RULES = (
    "Non-empty, not only whitespace, no control characters, at most "
    "`agent_context.max_id_length` characters (256 by default)."
)

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "description": "OpenAI-style error: `param` names the offending field where there is one.",
        **_obj(
            ["error"],
            error=_obj(
                ["message", "type", "param", "code"],
                message=_STR,
                type=_STR,
                param=_NSTR,
                code=_NSTR,
            ),
        ),
    },
    "Backend": _obj(
        ["name", "url", "type", "healthy", "capacity_tokens", "capacity_source", "last_error"],
        name=_STR,
        url=_NSTR,
        type=_STR,
        healthy=_BOOL,
        capacity_tokens=_NINT,
        capacity_source=_nullable({"type": "string", "enum": ["config", "engine", "plan"]}),
        last_error=_NSTR,
    ),
    "Health": _obj(
        ["status", "version", "backends", "programs"],
        status={"type": "string", "enum": ["ok", "degraded"]},
        version=_STR,
        backends={"type": "array", "items": _ref("Backend")},
        programs=_INT,
        tools={
            "type": "object",
            "description": "Present when the Docker tool manager is configured.",
            "properties": {"docker": {"type": "object"}},
        },
    ),
    "Program": {
        "description": "A program as the scheduler holds it, with its age and idle time.",
        **_obj(
            ["program_id", "state", "phase", "steps", "in_flight", "age_s", "idle_s"],
            program_id=_STR,
            source=_NSTR,
            parent_program_id=_NSTR,
            session_id=_NSTR,
            session_type=_NSTR,
            ephemeral=_BOOL,
            priority=_INT,
            state={"type": "string", "enum": ["active", "paused", "terminated"]},
            phase={"type": "string", "enum": ["reasoning", "acting"]},
            backend=_NSTR,
            context_tokens=_INT,
            reserved_tokens=_INT,
            steps=_INT,
            in_flight=_INT,
            waiting=_INT,
            pauses=_INT,
            migrations=_INT,
            prompt_tokens=_INT,
            completion_tokens=_INT,
            cached_tokens=_INT,
            docker_ids={"type": "array", "items": _STR},
            age_s=_NUM,
            idle_s=_NUM,
        ),
    },
    "ProgramList": _obj(
        ["programs", "count"],
        programs={"type": "array", "items": _ref("Program")},
        count=_INT,
    ),
    "Container": _obj(["id", "name", "state"], id=_STR, name=_STR, state=_STR, template=_STR),
    "ProgramDetail": {
        "description": "A live program; or, for one handed sandboxes before its first "
        "request, only its id, `state: null` and its containers. `containers` is present "
        "when the Docker tool manager is configured.",
        **_obj(
            ["program_id", "state"],
            program_id=_STR,
            state=_nullable({"type": "string", "enum": ["active", "paused", "terminated"]}),
            containers={"type": "array", "items": _ref("Container")},
        ),
    },
    "ReleaseRequest": {
        "description": "ThunderAgent-compatible: ends the program and reclaims its containers.",
        **_obj(["program_id"], program_id={**_STR, "minLength": 1, "description": _ID_RULES}),
    },
    "Released": _obj(["program_id", "released"], program_id=_STR, released=_BOOL),
    "SandboxRequest": _obj(
        ["template"],
        template={**_STR, "description": "A name under `tools.docker.templates`."},
    ),
    "Sandbox": _obj(
        ["program_id", "container_id", "name", "template", "warm", "ready_s"],
        program_id=_STR,
        container_id=_STR,
        name=_STR,
        template=_STR,
        warm=_BOOL,
        ready_s=_NUM,
    ),
    "ProfileSummary": _obj(
        ["program_id", "steps_total", "steps_kept", "queue_s", "tool_s"],
        program_id=_STR,
        session_type=_NSTR,
        parent_program_id=_NSTR,
        created_at=_NUM,
        released_at=_NNUM,
        release_reason=_NSTR,
        steps_total=_INT,
        steps_kept=_INT,
        queue_s=_NUM,
        tool_s=_NUM,
        prompt_tokens=_INT,
        cached_tokens=_INT,
        completion_tokens=_INT,
    ),
    "Step": _obj(
        ["step", "started_at", "backend", "stream", "status", "queue_s", "total_s"],
        step=_INT,
        started_at=_NUM,
        backend=_NSTR,
        stream=_BOOL,
        status=_INT,
        queue_s=_NUM,
        total_s=_NUM,
        ttft_s=_NNUM,
        decode_s=_NNUM,
        tool_s=_NNUM,
        prompt_tokens=_NINT,
        cached_tokens=_NINT,
        completion_tokens=_NINT,
    ),
    "Profile": {
        "allOf": [
            _ref("ProfileSummary"),
            _obj(["steps"], steps={"type": "array", "items": _ref("Step")}),
        ]
    },
    "ProfileList": _obj(
        ["profiles", "count"],
        profiles={"type": "array", "items": _ref("ProfileSummary")},
        count=_INT,
    ),
    "DashboardState": _obj(
        ["now", "backends", "counts", "counters", "history", "queue", "top", "decisions"],
        now=_NUM,
        backends={"type": "array", "items": {"type": "object"}},
        counts={"type": "object", "additionalProperties": _INT},
        counters={"type": "object", "additionalProperties": _INT},
        history={"type": "array", "items": {"type": "array", "items": _NUM}},
        queue={"type": "array", "items": {"type": "object"}},
        top={"type": "array", "items": {"type": "object"}},
        decisions={
            "type": "array",
            "items": _obj(
                ["at", "decision", "program_id", "backend", "reason"],
                at=_NUM,
                decision=_STR,
                program_id=_STR,
                backend=_NSTR,
                reason=_STR,
            ),
        },
    ),
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": _ref("Error")}}}


_RESPONSES: dict[str, Any] = {
    "BadRequest": _error("The body or an id is invalid; `param` names which."),
    "Unauthorized": {
        **_error("`server.admin_token` is set and the request did not carry it."),
        "headers": {"WWW-Authenticate": {"schema": _STR}},
    },
    "NotFound": _error(
        "No such program, profile, template or route, or the feature is off (`code` says: "
        "`profiles_disabled`, `tools_disabled`)."
    ),
    "TooLarge": _error("The body is over 64 KiB."),
}


def _ok(description: str, schema: dict[str, Any], media: str = _JSON) -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": schema}}}


def _answers(ok: dict[str, Any], *errors: str, status: str = "200") -> dict[str, Any]:
    """`ok` under `status`, 401 (admin token) and the named shared error responses."""
    named = {"400": "BadRequest", "401": "Unauthorized", "404": "NotFound", "413": "TooLarge"}
    answers = {status: ok, "401": {"$ref": "#/components/responses/Unauthorized"}}
    for code in errors:
        answers[code] = {"$ref": f"#/components/responses/{named[code]}"}
    return answers


_OWNED_ELSEWHERE = _error(
    "`agent_context.program_owner: header`: the program belongs to another client."
)

_PROGRAM_ID = {
    "name": "program_id",
    "in": "path",
    "required": True,
    "description": _ID_RULES,
    "schema": {**_STR, "minLength": 1},
}

_DASHBOARD = {
    "operationId": "dashboard",
    "summary": "The live dashboard page (`?token=` stands in for the header here, since a "
    "browser's address bar cannot send one).",
    "security": [{"adminToken": []}, {"dashboardToken": []}],
    "responses": _answers(_ok("The page.", _STR, "text/html; charset=utf-8")),
}

_PATHS: dict[str, Any] = {
    "/health": {
        "get": {
            "operationId": "health",
            "summary": "Gateway and backend health (never needs the admin token).",
            "security": [],
            "responses": {"200": _ok("Health.", _ref("Health"))},
        }
    },
    "/metrics": {
        "get": {
            "operationId": "metrics",
            "summary": "Prometheus metrics.",
            "responses": _answers(
                _ok("Prometheus text exposition.", _STR, "text/plain; version=0.0.4")
            ),
        }
    },
    OPENAPI_PATH: {
        "get": {
            "operationId": "openapi",
            "summary": "This description.",
            "responses": _answers(_ok("OpenAPI 3 document.", {"type": "object"})),
        }
    },
    "/programs": {
        "get": {
            "operationId": "listPrograms",
            "summary": "Live programs.",
            "responses": _answers(_ok("Programs.", _ref("ProgramList"))),
        }
    },
    "/programs/{program_id}": {
        "get": {
            "operationId": "getProgram",
            "summary": "One live program (or one holding sandboxes before its first request).",
            "parameters": [_PROGRAM_ID],
            "responses": _answers(_ok("The program.", _ref("ProgramDetail")), "404"),
        }
    },
    "/programs/release": {
        "post": {
            "operationId": "releaseProgram",
            "summary": "End a program: held requests answered, containers reclaimed.",
            "requestBody": {
                "required": True,
                "content": {_JSON: {"schema": _ref("ReleaseRequest")}},
            },
            "responses": {
                **_answers(
                    _ok("Whether a live program was released.", _ref("Released")), "400", "413"
                ),
                "403": _OWNED_ELSEWHERE,
            },
        }
    },
    "/programs/{program_id}/sandboxes": {
        "post": {
            "operationId": "handOutSandbox",
            "summary": "Hand the program a started sandbox from a template (warm pool first).",
            "parameters": [_PROGRAM_ID],
            "requestBody": {
                "required": True,
                "content": {_JSON: {"schema": _ref("SandboxRequest")}},
            },
            "responses": {
                **_answers(_ok("The sandbox.", _ref("Sandbox")), "400", "404", "413", status="201"),
                "403": _OWNED_ELSEWHERE,
                "503": _error("The Docker engine is down: the sandbox could not be started."),
            },
        }
    },
    "/profiles": {
        "get": {
            "operationId": "listProfiles",
            "summary": "Per-program profile summaries (404 when profiles are off).",
            "responses": _answers(_ok("Profiles.", _ref("ProfileList")), "404"),
        }
    },
    "/profiles/{program_id}": {
        "get": {
            "operationId": "getProfile",
            "summary": "One program's profile, step by step.",
            "parameters": [{**_PROGRAM_ID, "description": "A program id."}],
            "responses": _answers(_ok("The profile.", _ref("Profile")), "404"),
        }
    },
    "/dashboard": {"get": _DASHBOARD},
    "/dashboard/": {"get": {**_DASHBOARD, "operationId": "dashboardSlash"}},
    "/dashboard/state": {
        "get": {
            "operationId": "dashboardState",
            "summary": "What the dashboard polls: backends, programs by state, queue, decisions.",
            "responses": _answers(_ok("Snapshot.", _ref("DashboardState"))),
        }
    },
}


def allowed_methods(path: str) -> bytes:
    """The `Allow` header of a 405 on admin `path`: the methods its described routes take.
    Templates match as the router does: an id is everything after its prefix."""
    methods: set[str] = set()
    for template, operations in _PATHS.items():
        head, _, tail = template.partition("{program_id}")
        if path == template or (
            "{" in template
            and path.startswith(head)
            and path.endswith(tail)
            and len(path) >= len(head) + len(tail)
        ):
            methods.update(m.upper() for m in operations)
    return ", ".join(sorted(methods)).encode()


async def send_method_not_allowed(send: Send, method: str, path: str) -> None:
    await send_error(
        send,
        405,
        f"no route {method} {path}",
        None,
        "method_not_allowed",
        [(b"allow", allowed_methods(path))],
    )


def admin_openapi(version: str) -> dict[str, Any]:
    """The admin API's OpenAPI 3.0 document for gateway `version`."""
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "thunder-mw admin API",
            "version": version,
            "description": "Health, programs, release, sandboxes, profiles, dashboard and "
            "metrics of a thunder-mw gateway. Every route but /health needs "
            "`Authorization: Bearer <server.admin_token>` when that token is set. Errors are "
            "OpenAI-style JSON naming the offending field; an unknown method on an admin path "
            "is a 405 of the same shape.",
        },
        "paths": _PATHS,
        "components": {
            "schemas": _SCHEMAS,
            "responses": _RESPONSES,
            "securitySchemes": {
                "adminToken": {"type": "http", "scheme": "bearer"},
                "dashboardToken": {"type": "apiKey", "in": "query", "name": "token"},
            },
        },
        "security": [{"adminToken": []}],
    }


def admin_openapi_json(version: str) -> bytes:
    return msgspec.json.encode(admin_openapi(version))
