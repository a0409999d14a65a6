"""The admin API: health, programs, release (ThunderAgent-compatible) and Prometheus metrics."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from thunder_mw.engines.pool import BackendPool
from thunder_mw.middleware.errors import send_error, send_json
from thunder_mw.middleware.openapi import OPENAPI_PATH, admin_openapi_json, send_method_not_allowed
from thunder_mw.middleware.scheduling import Scheduler
from thunder_mw.middleware.types import Receive, Scope, Send
from thunder_mw.observability.metrics import GatewayMetrics
from thunder_mw.observability.service import is_observability_path
from thunder_mw.policies.program_table import Program
from thunder_mw.schemas.context_parsing import ContextError, ContextParser
from thunder_mw.tools.docker_tools import DockerTools
from thunder_mw.tools.refusal import ToolRefused

if TYPE_CHECKING:
    from thunder_mw.middleware.program_ownership import ProgramOwnership
    from thunder_mw.observability.service import Observability

ADMIN_PREFIXES = ("/programs", "/metrics", "/health")
_MAX_ADMIN_BODY = 64 * 1024
_SANDBOXES = "/sandboxes"
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def is_admin_path(path: str) -> bool:
    return (
        path in ("/health", "/metrics", "/programs", OPENAPI_PATH)
        or path.startswith("/programs/")
        or is_observability_path(path)
    )


def program_view(program: Program, now: float) -> dict[str, Any]:
    view = msgspec.to_builtins(program)
    view["age_s"] = round(now - program.created_at, 3)
    view["idle_s"] = round(now - program.last_active_at, 3)
    return view


class AdminRoutes:
    def __init__(
        self,
        scheduler: Scheduler,
        pool: BackendPool,
        metrics: GatewayMetrics,
        parser: ContextParser,
        admin_token: str | None,
        clock: Any,
        version: str,
        tools: DockerTools | None = None,
        observability: Observability | None = None,
        owners: ProgramOwnership | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.pool = pool
        self.metrics = metrics
        self.parser = parser
        self._token = f"Bearer {admin_token}".encode() if admin_token else None
        self.clock = clock
        self.version = version
        self.tools = tools
        self.observability = observability
        self.owners = owners
        self._openapi = admin_openapi_json(version)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/health" and method == "GET":
            await self._health(send)
            return
        if self._token is not None and not self._authorized(scope):
            await send_error(
                send,
                401,
                "admin routes need `Authorization: Bearer <server.admin_token>`",
                "authorization",
                "unauthorized",
                [(b"www-authenticate", b"Bearer")],
            )
            return
        if self.observability is not None and is_observability_path(path):
            await self.observability.route(scope, receive, send)
            return
        if path == "/metrics" and method == "GET":
            body = generate_latest(self.metrics.registry)
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", CONTENT_TYPE_LATEST.encode()),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
        elif path == OPENAPI_PATH and method == "GET":
            await send_json(send, 200, self._openapi)
        elif path == "/programs" and method == "GET":
            now = self.clock()
            views = [program_view(p, now) for p in self.scheduler.programs()]
            await send_json(send, 200, _encode({"programs": views, "count": len(views)}))
        elif path == "/programs/release" and method == "POST":
            await self._release(scope, receive, send)
        elif path.startswith("/programs/") and path.endswith(_SANDBOXES) and method == "POST":
            await self._sandbox(path[len("/programs/") : -len(_SANDBOXES)], scope, receive, send)
        elif path.startswith("/programs/") and method == "GET":
            program_id = path[len("/programs/") :]
            program = self.scheduler.program(program_id)
            containers = self.tools.containers_of(program_id) if self.tools else []
            if program is None and not containers:
                await send_error(
                    send, 404, f"no live program {program_id!r}", "program_id", "program_not_found"
                )
                return
            if program is None:
                # Handed sandboxes before its first request: its containers are all there is.
                view: dict[str, Any] = {"program_id": program_id, "state": None}
            else:
                view = program_view(program, self.clock())
            if self.tools is not None:
                view["containers"] = containers
            await send_json(send, 200, _encode(view))
        else:
            await send_method_not_allowed(send, method, path)

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                assert self._token is not None
                return hmac.compare_digest(value, self._token)
        if scope["path"] in ("/dashboard", "/dashboard/") and self._token is not None:
            # A browser's address bar cannot send a header: the page alone takes ?token=,
            # removes it from the address bar and sends it as a header on every poll.
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            for token in query.get("token", ())[:1]:
                return hmac.compare_digest(f"Bearer {token}".encode(), self._token)
        return False

    async def _health(self, send: Send) -> None:
        backends = [b.describe() for b in self.pool.backends]
        healthy = sum(1 for b in backends if b.healthy)
        body = {
            "status": "ok" if healthy else "degraded",
            "version": self.version,
            "backends": backends,
            "programs": len(self.scheduler.programs()),
        }
        if self.tools is not None:
            body["tools"] = {"docker": self.tools.status()}
        await send_json(send, 200, _encode(body))

    async def _json_body(self, receive: Receive, send: Send) -> dict[str, Any] | None:
        """The request's JSON object, or None after answering why there is none."""
        raw = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            raw += message.get("body", b"")
            if len(raw) > _MAX_ADMIN_BODY:
                await send_error(send, 413, "body too large", "body", "body_too_large")
                return None
            if not message.get("more_body", False):
                break
        try:
            data = _decode(raw)
        except (msgspec.DecodeError, RecursionError):
            # RecursionError: nested deeper than the decoder goes, still under the size limit.
            await send_error(send, 400, "body is not valid JSON", "body", "invalid_json")
            return None
        if not isinstance(data, dict):
            await send_error(send, 400, "body must be a JSON object", "body", "invalid_body")
            return None
        return data

    async def _sandbox(self, raw_id: str, scope: Scope, receive: Receive, send: Send) -> None:
        data = await self._json_body(receive, send)
        if data is None:
            return
        try:
            program_id = self.parser.check_id(raw_id, "program_id")
        except ContextError as exc:
            await send_error(send, 400, exc.message, exc.param, exc.code)
            return
        if await self._not_owner(program_id, scope, send):
            return
        template = data.get("template")
        if not isinstance(template, str):
            await send_error(
                send, 400, "`template` must name a sandbox template", "template", "invalid_template"
            )
            return
        if self.tools is None:
            # Off by configuration, not failing: a 4xx like `profiles_disabled`, so clients
            # do not retry and monitors do not page.
            await send_error(
                send, 404, "the Docker tool manager is off", "template", "tools_disabled"
            )
            return
        try:
            answer = await self.tools.hand_out(program_id, template)
        except ToolRefused as exc:
            await send_error(send, exc.status, exc.message, exc.param, exc.code)
            return
        await send_json(send, 201, _encode(answer))

    async def _not_owner(self, program_id: str, scope: Scope, send: Send) -> bool:
        """`program_owner: header` without an admin token: only a program's owner may act on
        it (with a token set, only token holders get here, and they may act on any)."""
        if self.owners is None or self._token is not None:
            return False
        refusal = self.owners.check(program_id, scope["headers"])
        if refusal is None:
            return False
        await send_error(send, refusal.status, refusal.message, refusal.param, refusal.code)
        return True

    async def _release(self, scope: Scope, receive: Receive, send: Send) -> None:
        data = await self._json_body(receive, send)
        if data is None:
            return
        try:
            program_id = self.parser.check_id(data.get("program_id"), "program_id")
        except ContextError as exc:
            await send_error(send, 400, exc.message, exc.param, exc.code)
            return
        if await self._not_owner(program_id, scope, send):
            return
        released = self.scheduler.release(program_id)
        if not released and self.tools is not None:
            # Not scheduled yet, but it was handed sandboxes: those go.
            released = self.tools.release_unknown(program_id) > 0
            if released:
                # (A scheduled program's release is counted from its Released decision.)
                self.metrics.programs_released.labels("release").inc()
        await send_json(send, 200, _encode({"program_id": program_id, "released": released}))
