"""What a conformance check works with: the server under test, the recording backend, and the
verdict vocabulary (a check passes by returning, fails by raising `Fail`, or is `NotApplicable`).

Every request a check sends carries a unique tag in its text, so the check can find exactly
the requests the backend received on its behalf, whatever else the server forwarded. A request
that went out on a pooled connection the server had just closed (idle keep-alive) is sent
once more on a fresh connection: the server saw nothing of it, and a check must not fail on it.
"""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from thunder_mw.conformance._views import read_program_views
from thunder_mw.conformance.recording_backend import MODEL, Recorded, RecordingBackend

__all__ = [
    "Fail",
    "NotApplicable",
    "Reply",
    "Session",
    "WithoutContext",
    "clip",
    "parse_sse",
    "tag_of",
]

WithoutContext = Literal["forward", "reject"]
_PAYLOAD_LIMIT = 600
# What a request meets on a pooled connection the server closed while it went out.
_LOST_ON_A_CLOSED_CONNECTION = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class Fail(Exception):
    """The server broke the statement; `payload` is what shows it (a body, events, headers)."""

    def __init__(self, reason: str, payload: Any = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.payload = payload

    def detail(self) -> str:
        if self.payload is None:
            return self.reason
        return f"{self.reason} | payload: {clip(self.payload)}"


class NotApplicable(Exception):
    """The statement cannot be tested on this server (e.g. it has no /programs route)."""


def clip(value: Any, limit: int = _PAYLOAD_LIMIT) -> str:
    if isinstance(value, bytes):
        text = value.decode("utf-8", "replace")
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


@dataclass
class Reply:
    """The server's answer as the client saw it."""

    status: int
    headers: httpx.Headers
    body: bytes
    events: list[bytes] | None = None  # SSE `data:` payloads, for streamed answers

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class Session:
    """One conformance run against one target."""

    def __init__(
        self,
        target: str,
        backend: RecordingBackend,
        client: httpx.AsyncClient,
        without_context: WithoutContext = "forward",
    ) -> None:
        self.target = target.rstrip("/")
        self.backend = backend
        self.client = client
        self.without_context = without_context
        self.run_id = uuid.uuid4().hex[:8]
        self._counter = itertools.count(1)
        self.check_id = ""  # set by the runner before each check

    # ------------------------------------------------------------------ naming
    def tag(self) -> str:
        """A marker unique to one request of the current check (it names the check)."""
        return f"[conformance {self.check_id} #{next(self._counter)} {self.run_id}]"

    def program_id(self, name: str = "p") -> str:
        return f"conformance-{self.run_id}-{self.check_id}-{name}-{next(self._counter)}"

    def chat(self, text: str = "", **fields: Any) -> dict[str, Any]:
        """A small chat request tagged for this check; `fields` follow in their given order."""
        tag = self.tag()
        return {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"{tag} {text}".rstrip()}],
            **fields,
        }

    def responses(self, text: str = "", **fields: Any) -> dict[str, Any]:
        """A small /v1/responses request tagged for this check."""
        return {"model": MODEL, "input": f"{self.tag()} {text}".rstrip(), **fields}

    # ------------------------------------------------------------------ traffic
    async def post(
        self,
        body: dict[str, Any] | bytes,
        *,
        path: str = "/v1/chat/completions",
        headers: dict[str, str] | None = None,
    ) -> Reply:
        content = body if isinstance(body, bytes) else _encode(body)
        sent_headers = {"content-type": "application/json", **(headers or {})}
        streaming = isinstance(body, dict) and body.get("stream") is True
        attempt = _Attempt()
        try:
            response, raw = await attempt.post(
                self.client, self.target + path, content, sent_headers
            )
        except _LOST_ON_A_CLOSED_CONNECTION:
            if attempt.answered or attempt.connected:
                raise  # not a stale pooled connection: the server may have seen the request
            async with httpx.AsyncClient(timeout=self.client.timeout, trust_env=False) as fresh:
                response, raw = await _Attempt().post(
                    fresh, self.target + path, content, sent_headers
                )
        events = None
        if streaming and response.headers.get("content-type", "").startswith("text/event-stream"):
            events = parse_sse(raw)
        return Reply(response.status_code, response.headers, raw, events)

    async def post_ok(self, body: dict[str, Any] | bytes, **kwargs: Any) -> Reply:
        """POST that must succeed (2xx); anything else fails the check with the answer."""
        reply = await self.post(body, **kwargs)
        if not 200 <= reply.status < 300:
            raise Fail(f"server answered {reply.status} to a valid request", reply.body)
        return reply

    def received(self, body: dict[str, Any]) -> list[Recorded]:
        """What the backend received for the request built from `body` (by its tag)."""
        return self.backend.containing(tag_of(body))

    def received_once(self, body: dict[str, Any]) -> Recorded:
        got = self.received(body)
        if len(got) != 1:
            raise Fail(f"the backend received this request {len(got)} times, expected once")
        return got[0]

    def forwarded_json(self, body: dict[str, Any]) -> dict[str, Any]:
        record = self.received_once(body)
        data = record.json()
        if not isinstance(data, dict):
            raise Fail("the backend received a body that is not a JSON object", record.body)
        return data

    # ------------------------------------------------------------------ admin routes
    async def programs(self) -> dict[str, dict[str, Any]] | None:
        """Live programs by id, or None when the server publishes none (shapes: _views.py)."""
        return await read_program_views(self.client, self.target)

    async def programs_or_na(self) -> dict[str, dict[str, Any]]:
        views = await self.programs()
        if views is None:
            raise NotApplicable(
                "the server publishes no program views (no GET /programs or "
                "/scheduling/diagnostics answering JSON)"
            )
        return views

    async def release(self, program_id: Any) -> Reply:
        return await self.post({"program_id": program_id}, path="/programs/release")


class _Attempt:
    """One POST, noting whether it opened a connection of its own and got a status line."""

    def __init__(self) -> None:
        self.connected = False
        self.answered = False

    async def _trace(self, event: str, info: dict[str, Any]) -> None:
        if "connect_tcp" in event:
            self.connected = True

    async def post(
        self, client: httpx.AsyncClient, url: str, content: bytes, headers: dict[str, str]
    ) -> tuple[httpx.Response, bytes]:
        async with client.stream(
            "POST", url, content=content, headers=headers, extensions={"trace": self._trace}
        ) as response:
            self.answered = True
            return response, await response.aread()


def tag_of(body: dict[str, Any]) -> str:
    if "messages" in body:
        text = body["messages"][0]["content"]
    else:
        text = body.get("prompt", body.get("input", ""))
    return str(text[: text.index("]") + 1])


def parse_sse(raw: bytes) -> list[bytes]:
    """The `data:` payloads of an SSE stream, one per event, in order."""
    events = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        lines = [line for line in block.split(b"\n") if line.startswith(b"data:")]
        if lines:
            events.append(b"\n".join(_strip_prefix(line) for line in lines))
    return events


def _strip_prefix(line: bytes) -> bytes:
    value = line[5:]
    return value[1:] if value.startswith(b" ") else value


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
