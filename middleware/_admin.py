"""The admin API (health, programs, release, sandboxes, profiles, dashboard, Prometheus
metrics, engine control) as a Starlette router of small endpoints, built from the routes of
middleware/openapi.py (the canonical ones and the alias table); errors keep the gateway's
OpenAI-style JSON shape."""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import msgspec
from msgspec import UNSET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Match, Route

from thunder_mw.engines.pool import BackendPool
from thunder_mw.middleware.errors import error_body, send_error
from thunder_mw.middleware.openapi import ROUTES, admin_openapi_json
from thunder_mw.middleware.request_body import BodyError, ClientLeft, decode_object, read_body
from thunder_mw.middleware.scheduling import Rejected, Scheduler
from thunder_mw.middleware.types import ASGIApp, Receive, Scope, Send
from thunder_mw.observability.metrics import GatewayMetrics
from thunder_mw.policies.program_table import ProgramSnapshot
from thunder_mw.schemas.context_parsing import ContextError, ContextParser
from thunder_mw.schemas.views import (
    HealthView,
    PendingProgram,
    ProfileList,
    ProfileView,
    ProgramDetail,
    ProgramList,
    ProgramView,
    Released,
    ToolsView,
    encode,
)
from thunder_mw.tools.docker_tools import DockerTools
from thunder_mw.tools.refusal import ToolRefused

if TYPE_CHECKING:
    from thunder_mw.middleware._rollout_routes import RolloutRoutes
    from thunder_mw.middleware.program_ownership import ProgramOwnership
    from thunder_mw.observability.service import Observability

__all__ = [
    "AdminAccess",
    "AdminRoutes",
    "AdminTokenGuard",
    "EngineServices",
    "ProgramServices",
    "Telemetry",
    "is_admin_path",
    "program_view",
]

_MAX_ADMIN_BODY = 64 * 1024
_JSON = "application/json"
_decode = msgspec.json.Decoder().decode
_HTML_HEADERS = {
    "cache-control": "no-store",
    # The page needs nothing from anywhere else; say so, so nothing else can be injected.
    "content-security-policy": "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
}


def _admin_paths() -> tuple[frozenset[str], tuple[str, ...]]:
    """The paths the admin API owns: each described path without an id, and the whole tree
    under a root that has routes below it (`/programs/...`), so an unknown subpath gets the
    admin API's 404 instead of being forwarded to an engine."""
    exact, trees = set(), set()
    for op in ROUTES:
        root = "/" + op.path.split("/")[1]
        if "{" not in op.path:
            exact.add(op.path)
        if op.path != root:
            trees.add(root + "/")
    return frozenset(exact), tuple(sorted(trees))


_EXACT, _TREES = _admin_paths()


def is_admin_path(path: str) -> bool:
    return path in _EXACT or path.startswith(_TREES)


def _json(view: Any, status: int = 200) -> Response:
    return Response(encode(view), status, media_type=_JSON)


def _error(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body = error_body(status, message, param, code)
    return Response(body, status, headers=headers, media_type=_JSON)


_VIEW_FIELDS = tuple(f for f in ProgramView.__struct_fields__ if f not in ("age_s", "idle_s"))


def _public_fields(program: ProgramSnapshot, now: float) -> dict[str, Any]:
    """The program's fields that ProgramView lists (and no others), with its age and idle
    time in seconds instead of the core's monotonic-clock stamps."""
    fields = {name: getattr(program, name) for name in _VIEW_FIELDS}
    fields["state"] = program.state.value
    fields["phase"] = program.phase.value
    fields["age_s"] = round(now - program.created_at, 3)
    fields["idle_s"] = round(now - program.last_active_at, 3)
    return fields


def program_view(program: ProgramSnapshot, now: float) -> ProgramView:
    return ProgramView(**_public_fields(program, now))


class _Route(Route):
    """A Route as the admin API describes it: an id is any decoded text (newlines included,
    up to the very end of the path), and GET does not imply HEAD (no HEAD operation is
    described, so HEAD is a 405 like any other undescribed method)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], method: str) -> None:
        super().__init__(path, endpoint, methods=[method])
        self.methods = {method}
        # Starlette internals (checked on 1.10.0, pinned by tests/test_framework_pins.py).
        self.path_regex = re.compile(self.path_regex.pattern.removesuffix("$") + r"\Z", re.S)


class AdminTokenGuard:
    """Answers 401 unless the request carries `server.admin_token`; runs before routing, so
    a client without the token learns nothing about which routes exist."""

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        public: frozenset[tuple[str, str]],
        query_token_paths: frozenset[str],
    ) -> None:
        self.app = app
        self._token = f"Bearer {token}".encode()
        self._public = public
        self._query_token_paths = query_token_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["method"], scope["path"]) in self._public or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        await send_error(
            send,
            401,
            "admin routes need `Authorization: Bearer <server.admin_token>`",
            "authorization",
            "unauthorized",
            [(b"www-authenticate", b"Bearer")],
        )

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, self._token)
        if scope["path"] in self._query_token_paths:
            # A browser's address bar cannot send a header: the page alone takes ?token=,
            # removes it from the address bar and sends it as a header on every poll.
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            for token in query.get("token", ())[:1]:
                return hmac.compare_digest(f"Bearer {token}".encode(), self._token)
        return False


@dataclass(frozen=True)
class ProgramServices:
    """What the program routes act on: the scheduler's programs, the id rules a release is
    checked against, and the programs' sandboxes (None: the tool manager is off)."""

    scheduler: Scheduler
    parser: ContextParser
    tools: DockerTools | None
    clock: Callable[[], float]


@dataclass(frozen=True)
class EngineServices:
    """The engines: the pool `/health` lists, and the run-time control of the RL-rollout
    routes (None where they are not mounted)."""

    pool: BackendPool
    rollout: RolloutRoutes | None = None


@dataclass(frozen=True)
class Telemetry:
    """What operators read: the Prometheus registry, profiles and the dashboard, the version."""

    metrics: GatewayMetrics
    observability: Observability
    version: str


@dataclass(frozen=True)
class AdminAccess:
    """Who may call: `server.admin_token` (None: no token), and program ownership by API key
    where `agent_context.program_owner: header`."""

    token: str | None = None
    owners: ProgramOwnership | None = None


class AdminRoutes:
    """The admin API as one ASGI app; app.py hands it every request `is_admin_path` claims."""

    def __init__(
        self,
        programs: ProgramServices,
        engines: EngineServices,
        telemetry: Telemetry,
        access: AdminAccess,
    ) -> None:
        self.scheduler = programs.scheduler
        self.parser = programs.parser
        self.tools = programs.tools
        self.clock = programs.clock
        self.pool = engines.pool
        self.rollout = engines.rollout
        self.metrics = telemetry.metrics
        self.observability = telemetry.observability
        self.version = telemetry.version
        self.owners = access.owners
        admin_token = access.token
        # With a token set, only token holders get past the guard, and they may act on any
        # program; without one, `program_owner: header` decides (see _not_owner).
        self._owners_decide = self.owners is not None and admin_token is None
        self._openapi = admin_openapi_json(self.version)
        middleware = []
        if admin_token:
            middleware.append(
                Middleware(
                    AdminTokenGuard,
                    token=admin_token,
                    public=frozenset((op.method, op.path) for op in ROUTES if op.public),
                    query_token_paths=frozenset(op.path for op in ROUTES if op.dashboard_token),
                )
            )
        self.routes = [_Route(op.path, self._endpoint(op.endpoint), op.method) for op in ROUTES]
        self.app = Starlette(
            routes=self.routes,
            middleware=middleware,
            exception_handlers={
                HTTPException: self._no_route,
                # A failing endpoint's 500 keeps the error shape too (Starlette still
                # re-raises it afterwards, so the server logs it).
                Exception: _server_error,
                # Starlette sends nothing when a handler returns None; its type says otherwise.
                ClientDisconnect: _client_gone,  # type: ignore[dict-item]
            },
        )
        # `/dashboard/` is a route of its own; no other path is redirected to a slashed twin.
        self.app.router.redirect_slashes = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    def _endpoint(self, name: str) -> Callable[..., Any]:
        """`rollout.x` names a method of the RL-rollout routes (middleware/_rollout_routes.py)."""
        owner, _, method = name.rpartition(".")
        if owner == "rollout":
            if self.rollout is None:
                return _rollout_off
            return getattr(self.rollout, method)  # type: ignore[no-any-return]
        return getattr(self, name)  # type: ignore[no-any-return]

    async def _no_route(self, request: Request, exc: Exception) -> Response:
        """Starlette's 404 and 405, in the gateway's error shape. A 405's `Allow` lists what
        every route matching the path takes (Starlette's names only the first such route's:
        PUT /programs/release would say POST, though GET answers there too)."""
        scope = request.scope
        message = f"no route {scope['method']} {scope['path']}"
        if isinstance(exc, HTTPException) and exc.status_code == 405:
            allowed = {
                method
                for route in self.routes
                if route.matches(scope)[0] is not Match.NONE
                for method in route.methods or ()
            }
            headers = {"allow": ", ".join(sorted(allowed))}
            return _error(405, message, None, "method_not_allowed", headers)
        return _error(404, message, None, "route_not_found")

    # ------------------------------------------------------------------ endpoints
    async def health(self, request: Request) -> Response:
        backends = [b.describe() for b in self.pool.backends]
        return _json(
            HealthView(
                status="ok" if any(b.healthy for b in backends) else "degraded",
                version=self.version,
                backends=backends,
                programs=len(self.scheduler.programs()),
                tools=UNSET if self.tools is None else ToolsView(docker=self.tools.status()),
            )
        )

    async def prometheus(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def openapi(self, request: Request) -> Response:
        return Response(self._openapi, media_type=_JSON)

    async def programs(self, request: Request) -> Response:
        now = self.clock()
        views = [program_view(p, now) for p in self.scheduler.programs()]
        return _json(ProgramList(programs=views, count=len(views)))

    async def program(self, request: Request) -> Response:
        program_id = request.path_params["program_id"]
        program = self.scheduler.program(program_id)
        holder = self.scheduler.replica_id
        if program is None:
            # With replicas: another one may hold it; its shared record answers here too.
            try:
                shared = await self.scheduler.shared_program(program_id)
            except Rejected as exc:
                return _error(exc.status, exc.message, None, exc.code, dict(_text(exc.headers)))
            if shared is not None:
                program, holder = shared
        containers = self.tools.containers_of(program_id) if self.tools else []
        if program is None and not containers:
            return _error(404, f"no live program {program_id!r}", "program_id", "program_not_found")
        if program is None:
            # Handed sandboxes before its first request: its containers are all there is.
            return _json(PendingProgram(program_id=program_id, containers=containers))
        fields = _public_fields(program, self.clock())
        return _json(
            ProgramDetail(
                **fields,
                containers=UNSET if self.tools is None else containers,
                holder=UNSET if holder is None else holder,
            )
        )

    async def release(self, request: Request) -> Response:
        data = await _json_object(request)
        if isinstance(data, Response):
            return data
        if data.get("program_id") is None:
            # null is the same as leaving the field out, here as on inference calls
            # (docs/usage.md); a release must name what it ends.
            return _error(
                400,
                "program_id is required: name the program to release (null is the same as "
                "leaving it out)",
                "program_id",
                "invalid_agent_context",
            )
        try:
            program_id = self.parser.check_id(data["program_id"], "program_id")
        except ContextError as exc:
            return _error(400, exc.message, exc.param, exc.code)
        refused = self._not_owner(program_id, request)
        if refused is not None:
            return refused
        released = self.scheduler.release(program_id)
        if not released and self.tools is not None:
            # Not scheduled yet, but it was handed sandboxes: those go.
            released = self.tools.release_unknown(program_id) > 0
            if released:
                # (A scheduled program's release is counted from its Released decision.)
                self.metrics.programs_released.labels("release").inc()
        return _json(Released(program_id=program_id, released=released))

    async def sandbox(self, request: Request) -> Response:
        data = await _json_object(request)
        if isinstance(data, Response):
            return data
        try:
            program_id = self.parser.check_id(request.path_params["program_id"], "program_id")
        except ContextError as exc:
            return _error(400, exc.message, exc.param, exc.code)
        refused = self._not_owner(program_id, request)
        if refused is not None:
            return refused
        template = data.get("template")
        if not isinstance(template, str):
            return _error(
                400, "`template` must name a sandbox template", "template", "invalid_template"
            )
        if self.tools is None:
            # Off by configuration, not failing: a 4xx like `profiles_disabled`, so clients
            # do not retry and monitors do not page.
            return _error(404, "the Docker tool manager is off", "template", "tools_disabled")
        try:
            answer = await self.tools.hand_out(program_id, template)
        except ToolRefused as exc:
            return _error(exc.status, exc.message, exc.param, exc.code)
        return _json(answer, 201)

    async def profiles(self, request: Request) -> Response:
        store = self.observability.profiles
        if store is None:
            return _profiles_off()
        summaries = store.summaries()
        return _json(msgspec.convert({"profiles": summaries, "count": len(summaries)}, ProfileList))

    async def profile(self, request: Request) -> Response:
        store = self.observability.profiles
        if store is None:
            return _profiles_off()
        program_id = request.path_params["program_id"]
        view = store.get(program_id)
        if view is None:
            return _error(404, f"no profile of {program_id!r}", "program_id", "profile_not_found")
        return _json(msgspec.convert(view, ProfileView))

    async def dashboard(self, request: Request) -> Response:
        page = self.observability.dashboard.html
        return Response(page, headers=_HTML_HEADERS, media_type="text/html; charset=utf-8")

    async def dashboard_state(self, request: Request) -> Response:
        return _json(self.observability.dashboard.snapshot())

    # ------------------------------------------------------------------ helpers
    def _not_owner(self, program_id: str, request: Request) -> Response | None:
        """`program_owner: header` without an admin token: only a program's owner may act on
        it (with a token set, only token holders get here, and they may act on any)."""
        if not self._owners_decide:
            return None
        assert self.owners is not None
        refusal = self.owners.check(program_id, request.scope["headers"])
        if refusal is None:
            return None
        return _error(refusal.status, refusal.message, refusal.param, refusal.code)


async def _json_object(request: Request) -> dict[str, Any] | Response:
    """The request's JSON object, or the error answer saying why there is none."""
    try:
        return decode_object(await read_body(request.scope, request.receive, _MAX_ADMIN_BODY))
    except BodyError as exc:
        return _error(exc.status, exc.message, exc.param, exc.code)
    except ClientLeft:
        raise ClientDisconnect() from None


def _text(headers: list[tuple[bytes, bytes]] | None) -> list[tuple[str, str]]:
    return [(n.decode("latin-1"), v.decode("latin-1")) for n, v in headers or ()]


def _profiles_off() -> Response:
    return _error(
        404, "profiles are off (observability.profiles.enabled)", None, "profiles_disabled"
    )


async def _rollout_off(request: Request) -> Response:
    return _error(404, "run-time engine control is not mounted here", None, "route_not_found")


async def _server_error(request: Request, exc: Exception) -> Response:
    message = "the admin route failed (the gateway's log has the error)"
    return _error(500, message, None, "internal_error")


async def _client_gone(request: Request, exc: Exception) -> None:
    """The client left before its body arrived: nobody is there to answer."""
    return None
