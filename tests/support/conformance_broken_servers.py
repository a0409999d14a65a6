"""A minimal agent-context gateway with switchable flaws: each conformance check can be failed.

With no flaws it behaves as thunder-mw promises on the routes the suite touches; each flaw
breaks one promise. `THUNDERAGENT_LIKE` reproduces the original ThunderAgent's documented
behaviour (only program_id stripped, forced usage chunk, no validation, 500 on bad JSON, one
shared `default` program), so the `thunderagent` profile can be shown to expect exactly that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import httpx

from thunder_mw.middleware.types import Receive, Scope, Send


@dataclass(frozen=True)
class Flaws:
    forwards_program_id: bool = False
    drops_extra_body_siblings: bool = False
    sorts_keys: bool = False
    forces_usage_chunk: bool = False
    errors_500_on_bad_input: bool = False
    validates_ids: bool = True
    strips_tool_ids: bool = True
    shared_default_program: bool = False


CORRECT = Flaws()
THUNDERAGENT_LIKE = Flaws(
    forces_usage_chunk=True,
    errors_500_on_bad_input=True,
    validates_ids=False,
    strips_tool_ids=False,
    shared_default_program=True,
)
FORWARDS_PROGRAM_ID = replace(CORRECT, forwards_program_id=True)
DROPS_EXTRA_BODY_SIBLINGS = replace(CORRECT, drops_extra_body_siblings=True)
SORTS_KEYS = replace(CORRECT, sorts_keys=True)
ADDS_USAGE_CHUNK = replace(CORRECT, forces_usage_chunk=True)
ERRORS_500_ON_BAD_INPUT = replace(CORRECT, errors_500_on_bad_input=True)


class BadInput(Exception):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


class MiniGateway:
    """Forwards /v1/chat/completions to one engine; keeps a step count per program."""

    def __init__(self, engine_url: str, flaws: Flaws = CORRECT) -> None:
        self.engine_url = engine_url
        self.flaws = flaws
        self.steps: dict[str, int] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = await _read(receive)
        path, method = scope["path"], scope["method"]
        if path == "/v1/models":
            async with httpx.AsyncClient() as client:
                response = await client.get(self.engine_url + path)
            await _send(send, response.status_code, response.content)
        elif path == "/programs" and method == "GET":
            views = [{"program_id": p, "steps": n} for p, n in self.steps.items()]
            await _json(send, 200, {"programs": views, "count": len(views)})
        elif path == "/programs/release" and method == "POST":
            program = json.loads(raw).get("program_id")
            if not isinstance(program, str) or not program.strip():
                await _json(
                    send, 400, _error("program_id must be a non-blank string", "program_id")
                )
                return
            released = self.steps.pop(program, None) is not None
            await _json(send, 200, {"program_id": program, "released": released})
        elif path == "/v1/chat/completions" and method == "POST":
            await self._chat(raw, send)
        else:
            await _json(send, 404, _error(f"no route {path}", "path"))

    async def _chat(self, raw: bytes, send: Send) -> None:
        try:
            body, program = self._context(raw)
        except BadInput as exc:
            status = 500 if self.flaws.errors_500_on_bad_input else 400
            await _json(send, status, _error(exc.message, exc.param))
            return
        if program is not None:
            self.steps[program] = self.steps.get(program, 0) + 1
        if body.get("stream") is True and self.flaws.forces_usage_chunk:
            body["stream_options"] = {"include_usage": True}
        payload = json.dumps(body, sort_keys=self.flaws.sorts_keys).encode()
        async with (
            httpx.AsyncClient(timeout=30) as client,
            client.stream(
                "POST",
                self.engine_url + "/v1/chat/completions",
                content=payload,
                headers={"content-type": "application/json"},
            ) as response,
        ):
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [(b"content-type", response.headers["content-type"].encode())],
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    def _context(self, raw: bytes) -> tuple[dict[str, Any], str | None]:
        try:
            body = json.loads(raw)
        except ValueError:
            raise BadInput("body is not JSON", "body") from None
        if not isinstance(body, dict):
            raise BadInput("body must be an object", "body")
        flaws = self.flaws
        program = (
            body.get("program_id") if flaws.forwards_program_id else body.pop("program_id", None)
        )
        nested = body.get("extra_body")
        if isinstance(nested, dict) and "program_id" in nested:
            program = program or nested.pop("program_id")
            if flaws.drops_extra_body_siblings or not nested:
                del body["extra_body"]
        if flaws.validates_ids and program is not None:
            if not isinstance(program, str) or not program.strip() or len(program) > 256:
                raise BadInput("program_id must be a non-blank string of at most 256", "program_id")
        if flaws.strips_tool_ids:
            for key in ("docker_ids", "tool_ids"):
                value = body.pop(key, None)
                if flaws.validates_ids and value is not None and not isinstance(value, list):
                    raise BadInput(f"{key} must be a list", key)
        if program is None and flaws.shared_default_program:
            program = "default"
        return body, program if isinstance(program, str) else None


def _error(message: str, param: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param}}


async def _read(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _json(send: Send, status: int, obj: Any) -> None:
    await _send(send, status, json.dumps(obj).encode())


async def _send(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
