"""AgentContextMiddleware: reads the body once, normalises the agent context, strips it.

Pure ASGI so the hot path pays for nothing it does not use. Downstream layers find the
context, the decoded body and the server's own `receive` on the request's CallState.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import msgspec

from thunder_mw.middleware.call_state import RequestBody, call_state
from thunder_mw.middleware.errors import send_error
from thunder_mw.middleware.request_body import BodyError, ClientLeft, decode_object, read_body
from thunder_mw.middleware.types import ASGIApp, Message, Receive, Scope, Send
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.schemas.config import AgentContextSettings, Convention
from thunder_mw.schemas.context_parsing import ContextError, ContextParser
from thunder_mw.schemas.generate_context import RidError, program_from_rid

__all__ = ["CONTEXT_PATHS", "AgentContextMiddleware", "new_ephemeral_id"]

# The inference routes whose bodies carry agent context (`/generate`: SGLang's native API).
CONTEXT_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate"})

_decode = msgspec.json.Decoder().decode


def new_ephemeral_id() -> str:
    return f"ephemeral-{uuid.uuid4().hex}"


class AgentContextMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        settings: AgentContextSettings,
        max_body_bytes: int,
        *,
        encode_eagerly: bool = True,
        on_missing_context: Callable[[], None] | None = None,
        new_program_id: Callable[[], str] = new_ephemeral_id,
    ) -> None:
        """`encode_eagerly=False` is for the standalone server, whose Forwarder reads the body
        from scope state and encodes it once after its own changes; a wrapped third-party app
        reads it through `receive` and needs bytes and Content-Length up front."""
        self.app = app
        self.settings = settings
        self.parser = ContextParser(settings)
        self.max_body_bytes = max_body_bytes
        self.encode_eagerly = encode_eagerly
        self.on_missing_context = on_missing_context
        self.new_program_id = new_program_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] not in CONTEXT_PATHS
        ):
            await self.app(scope, receive, send)
            return
        try:
            raw = await read_body(scope, receive, self.max_body_bytes)
            data = decode_object(raw, for_engine=True)
            ctx, changed = self.parser.parse(data, scope["headers"])
            if ctx is None and scope["path"] == "/generate":
                ctx = self._from_rid(data)
        except (BodyError, ContextError) as exc:
            await send_error(send, exc.status, exc.message, exc.param, exc.code)
            return
        except ClientLeft:
            return
        body = RequestBody(data, raw)
        if changed:
            body.changed()
        if ctx is None:
            if self.on_missing_context is not None:
                self.on_missing_context()
            mode = self.settings.on_missing
            if mode == "reject":
                await send_error(
                    send,
                    400,
                    "this gateway requires agent context: send program_id (or another "
                    "supported convention) with every request",
                    "program_id",
                    "missing_agent_context",
                )
                return
            if mode == "ephemeral":
                ctx = AgentContext(program_id=self.new_program_id(), source=None, ephemeral=True)
        await self._call_downstream(scope, receive, send, ctx, body)

    def _from_rid(self, data: dict[str, object]) -> AgentContext | None:
        """SGLang `/generate`: a `rid` of `<program_id>::<rest>` names the program when
        nothing else does (schemas/generate_context.py); the rid stays in the body."""
        if Convention.THUNDERAGENT not in self.settings.conventions:
            return None
        try:
            found = program_from_rid(data)
        except RidError as exc:
            raise ContextError(exc.message, exc.param, code="conflicting_program_ids") from None
        if found is None:
            return None
        program_id, param = found
        program_id = self.parser.check_id(program_id, param)
        return AgentContext(program_id=program_id, source=Convention.THUNDERAGENT)

    async def _call_downstream(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        ctx: AgentContext | None,
        body: RequestBody,
    ) -> None:
        strip = self.parser.context_headers
        if self.encode_eagerly:
            payload = body.encoded()
            headers = [
                (n, v) for n, v in scope["headers"] if n not in strip and n != b"content-length"
            ]
            headers.append((b"content-length", str(len(payload)).encode()))
        else:
            headers = [(n, v) for n, v in scope["headers"] if n not in strip]
        call = call_state(scope)
        call.context = ctx
        call.body = body
        call.receive = receive  # the server's own, to notice a client leaving
        # A copy of the scope shares the state dict, so outer layers see the same CallState.
        scope = dict(scope)
        scope["headers"] = headers

        async def replay() -> Message:
            if not body.consumed:
                body.consumed = True
                return {"type": "http.request", "body": body.encoded(), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
