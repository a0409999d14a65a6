"""Forwarder: the standalone server's innermost app; moves requests to engines and answers back.

Streams SSE through event by event with no further buffering, captures `usage` for the
scheduler (asking the engine for it and hiding that chunk from clients that did not ask),
retries once elsewhere when an engine refuses the connection before any byte was sent,
and cancels the upstream request when the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec

from thunder_mw.engines.client import (
    STREAM_ERRORS,
    UpstreamError,
    UpstreamResponse,
    as_upstream_error,
)
from thunder_mw.engines.generate_usage import StreamUsage, usage_of_answer
from thunder_mw.engines.pool import Backend, BackendPool
from thunder_mw.middleware.agent_context import CONTEXT_PATHS
from thunder_mw.middleware.call_state import CallState, RequestBody, call_state
from thunder_mw.middleware.errors import send_error, send_json
from thunder_mw.middleware.request_body import BodyError, ClientLeft, decode_object, read_body
from thunder_mw.middleware.speculative_prefill import AnswerRecorder, SpeculativePrefiller
from thunder_mw.middleware.types import Receive, Scope, Send
from thunder_mw.policies.program_table import Usage
from thunder_mw.schemas.config import ServerSettings

__all__ = ["HOP_BY_HOP", "Forwarder", "sse_data"]

log = logging.getLogger("thunder_mw.forwarder")

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
_DROP_REQUEST = HOP_BY_HOP | {b"host", b"content-length", b"accept-encoding"}
_DROP_RESPONSE = HOP_BY_HOP | {b"content-length"}
_WATCH_AFTER_S = 0.05
# An SSE event whose payload is an OpenAI-style error object (a JSON string value cannot
# contain this unescaped, so generated text never matches it).
_ENGINE_ERROR_EVENT = b'data: {"error"'
# The end of the event that ends an OpenAI-style stream (`data: [DONE]`, with or without the
# space SSE allows).
_DONE_EVENT_END = b"[DONE]\n\n"


# The routes the gateway itself serves, by the one method each takes.
_OWN_ROUTES = {path: "POST" for path in CONTEXT_PATHS} | {"/v1/models": "GET"}


class _Details(msgspec.Struct):
    cached_tokens: int | None = None


class _UsageWire(msgspec.Struct):
    """Chat/completions usage and the Responses API's names for the same counts."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    prompt_tokens_details: _Details | None = None
    input_tokens_details: _Details | None = None

    def to_usage(self) -> Usage:
        details = self.prompt_tokens_details or self.input_tokens_details
        return Usage(
            prompt_tokens=self.prompt_tokens or self.input_tokens or 0,
            completion_tokens=self.completion_tokens or self.output_tokens or 0,
            cached_tokens=(details.cached_tokens or 0) if details else 0,
        )


class _Envelope(msgspec.Struct):
    usage: _UsageWire | None = None
    choices: list[Any] | None = None
    response: _Envelope | None = None  # Responses API: response.completed carries usage


_decode_envelope = msgspec.json.Decoder(_Envelope).decode
_decode_any = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def _usage_of(envelope: _Envelope) -> Usage | None:
    if envelope.usage is not None:
        return envelope.usage.to_usage()
    if envelope.response is not None and envelope.response.usage is not None:
        return envelope.response.usage.to_usage()
    return None


class Forwarder:
    def __init__(
        self,
        pool: BackendPool,
        server: ServerSettings,
        prefill: SpeculativePrefiller | None = None,
    ) -> None:
        self.pool = pool
        self.server = server
        # Remembers answers for the speculative_prefill stage, where it is on.
        self.prefill = prefill

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        allowed = _OWN_ROUTES.get(path)
        if allowed is not None and method not in (allowed, "OPTIONS"):
            # The gateway answers these routes itself, so it says which method they take
            # (CORS preflights still reach the engine, which may answer them).
            await send_error(
                send,
                405,
                f"{method} {path} is not supported; use {allowed}",
                None,
                "method_not_allowed",
                [(b"allow", allowed.encode())],
            )
        elif method == "POST" and path in CONTEXT_PATHS:
            await self._inference(scope, receive, send)
        elif path == "/v1/models" and method == "GET":
            await self._models(send)
        elif path.startswith("/v1/"):
            await self._plain(scope, receive, send)
        else:
            await send_error(send, 404, f"no route {method} {path}", "path", "route_not_found")

    # ------------------------------------------------------------------ inference
    async def _inference(self, scope: Scope, receive: Receive, send: Send) -> None:
        call = call_state(scope)
        call.path = scope["path"]
        body = call.body
        if body is None:  # mounted without AgentContextMiddleware: decode here
            body = await self._read_body(scope, receive, send, call)
            if body is None:
                return
        body.consumed = True
        stream = body.data.get("stream") is True
        # SGLang's native /generate reports its token counts in `meta_info` by itself.
        hide_usage = (
            stream and scope["path"] not in ("/v1/responses", "/generate") and _ask_usage(body)
        )
        payload = body.encoded()

        backend = self.pool.get(call.backend) if call.backend else self.pool.any_healthy()
        if backend is None:
            await send_error(send, 503, "no healthy backend is available", None, "no_backend")
            return

        # One loop lookup: on Python 3.11 each costs a getpid() syscall.
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        disconnected = False
        watcher: asyncio.Task[None] | None = None

        async def watch_disconnect() -> None:
            nonlocal disconnected
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected = True
                    if task is not None:
                        task.cancel()
                    return

        def arm() -> None:
            nonlocal watcher
            watcher = asyncio.ensure_future(watch_disconnect())

        # Most calls that finish fast never need a watcher task; slow ones get one soon enough
        # to cancel the engine's work when their client leaves.
        arming = loop.call_later(_WATCH_AFTER_S, arm)
        try:
            await self._send_upstream(scope, send, call, backend, payload, stream, hide_usage)
        except asyncio.CancelledError:
            if not disconnected or task is None:
                raise
            task.uncancel()
            call.outcome = "client_disconnected"
        finally:
            arming.cancel()
            if watcher is not None:
                watcher.cancel()

    async def _read_body(
        self, scope: Scope, receive: Receive, send: Send, call: CallState
    ) -> RequestBody | None:
        """The body, decoded here; None once the client has been answered or has left."""
        try:
            raw = await read_body(scope, receive, self.server.max_body_bytes)
        except BodyError as exc:
            await send_error(send, exc.status, exc.message, exc.param, exc.code)
            return None
        except ClientLeft:
            return None
        try:
            call.body = RequestBody(decode_object(raw, for_engine=True), raw)
        except BodyError as exc:
            await send_error(send, exc.status, exc.message, exc.param, exc.code)
            return None
        return call.body

    async def _send_upstream(
        self,
        scope: Scope,
        send: Send,
        call: CallState,
        backend: Backend,
        payload: bytes,
        stream: bool,
        hide_usage: bool,
    ) -> None:
        target = scope["path"]
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        response: UpstreamResponse | None = None
        for attempt in (0, 1):
            assert backend.engine is not None
            headers = self._request_headers(scope, backend, len(payload))
            try:
                response = await backend.engine.send("POST", target, headers, payload)
                break
            except UpstreamError as exc:
                self.pool.record_failure(backend, str(exc), refused=exc.before_any_byte)
                retry = exc.before_any_byte and attempt == 0
                alternative = call.reroute(backend.label) if retry else None
                if alternative is None:
                    call.outcome = "upstream_failed"
                    await _send_upstream_error(send, backend, exc)
                    return
                log.info(
                    "backend %s refused the connection; retrying on %s",
                    backend.label,
                    alternative.label,
                )
                backend = alternative
                call.backend = backend.label
        assert response is not None
        prefill = self.prefill
        recorder = (
            prefill.memory.recorder(scope["path"])
            if prefill is not None and response.status < 400 and prefill.wants(call.context)
            else None
        )
        try:
            if response.content_type == "text/event-stream":
                await self._relay_events(send, call, backend, response, hide_usage, recorder)
            else:
                # A JSON answer's headers come only once the engine is done: it answered.
                self.pool.record_answer(backend)
                await self._relay_whole(send, call, response, recorder)
        finally:
            response.close()
        if recorder is not None and prefill is not None and call.outcome in (None, "ok"):
            assert call.context is not None and call.body is not None
            prefill.memory.store(
                call.context.program_id, scope["path"], call.body.data, len(payload), recorder
            )

    def _request_headers(
        self, scope: Scope, backend: Backend, length: int
    ) -> list[tuple[bytes, bytes]]:
        forward_auth = self.server.forward_authorization and backend.auth_header is None
        headers = [
            (n, v)
            for n, v in scope["headers"]
            if n not in _DROP_REQUEST and (forward_auth or n != b"authorization")
        ]
        headers.append((b"content-length", str(length).encode()))
        # Uncompressed, so usage can be read from the stream; engines sit on a fast network.
        headers.append((b"accept-encoding", b"identity"))
        if backend.auth_header is not None:
            headers.append(backend.auth_header)
        return headers

    @staticmethod
    def _response_headers(response: UpstreamResponse) -> list[tuple[bytes, bytes]]:
        return [(n.lower(), v) for n, v in response.headers if n.lower() not in _DROP_RESPONSE]

    async def _relay_whole(
        self,
        send: Send,
        call: CallState,
        response: UpstreamResponse,
        recorder: AnswerRecorder | None = None,
    ) -> None:
        """A JSON answer is read whole before it is sent: if the engine dies halfway, the
        client gets a well-formed 502 instead of half a body."""
        try:
            content = await response.read()
        except UpstreamError as exc:
            call.outcome = "upstream_failed"
            status, code = (504, "upstream_timeout") if exc.timeout else (502, "upstream_error")
            await send_error(send, status, str(exc), None, code)
            return
        if response.status < 400 and call.native:
            call.usage = usage_of_answer(content)
        elif response.status < 400:
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                call.usage = _usage_of(_decode_envelope(content))
        if recorder is not None and response.status < 400:
            recorder.feed_json(content)
        headers = self._response_headers(response)
        headers.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def _relay_events(
        self,
        send: Send,
        call: CallState,
        backend: Backend,
        response: UpstreamResponse,
        hide_usage: bool,
        recorder: AnswerRecorder | None = None,
    ) -> None:
        # Headers go out with the first event: until then a slow or dead engine can still be
        # answered with a plain 504/502 rather than a stream that ends in an error event.
        try:
            chunk = await response.first_chunk()
        except UpstreamError as exc:
            self.pool.record_failure(backend, str(exc))
            call.outcome = "upstream_failed"
            await _send_upstream_error(send, backend, exc)
            return
        self.pool.record_answer(backend)
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": self._response_headers(response),
            }
        )
        pending = b""
        native = StreamUsage() if call.native else None
        next_chunk = response.chunks().__anext__
        try:
            while chunk:
                pending += chunk
                cut = pending.rfind(b"\n\n")
                if cut >= 0:
                    ready, pending = pending[: cut + 2], pending[cut + 2 :]
                    if native is not None:
                        call.usage = _follow_generate(native, ready) or call.usage
                    elif (usage_at := ready.rfind(b'"usage"')) >= 0:
                        ready = self._take_usage(ready, usage_at, call, hide_usage)
                    if _ENGINE_ERROR_EVENT in ready and call.outcome is None:
                        # The engine ended the stream itself with an error event (vLLM does
                        # when its engine core dies under a live API server): relayed as is,
                        # but the call failed and the engine is looked at now.
                        call.outcome = "upstream_failed"
                        self.pool.suspect(backend)
                    if ready:
                        # The engine's body has all arrived (a short answer comes in one
                        # read): these events end the stream, sent with the terminating
                        # chunk in one message, so one write to the client instead of two.
                        last = not pending and response.at_eof()
                        if not last and ready.endswith(_DONE_EVENT_END):
                            # The client stops reading at [DONE] and sends its next request
                            # at once; the engine's end of body may come later (under load,
                            # seconds later): the call is over now.
                            call.end(answered=True)
                        await send(
                            {"type": "http.response.body", "body": ready, "more_body": not last}
                        )
                        if recorder is not None:
                            recorder.feed_events(ready)
                        if last:
                            return
                try:
                    chunk = await next_chunk()
                except StopAsyncIteration:
                    break
        except STREAM_ERRORS as raw:
            failure = as_upstream_error(raw, "engine failed mid-stream")
            call.outcome = "upstream_failed"
            self.pool.suspect(backend)  # dead, or did only this call fail?
            error = _encode(
                {
                    "error": {
                        "message": str(failure),
                        "type": "upstream_error",
                        "param": None,
                        "code": "upstream_timeout" if failure.timeout else "upstream_error",
                    }
                }
            )
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + error + b"\n\n",
                    "more_body": False,
                }
            )
            return
        await send({"type": "http.response.body", "body": pending, "more_body": False})

    @staticmethod
    def _take_usage(ready: bytes, at: int, call: CallState, hide_usage: bool) -> bytes:
        """Capture usage from complete SSE events; drop the usage-only chunk we asked for.
        `at`: where the last `"usage"` in `ready` is.

        The usage chunk is one event of a batch of ~20, next to its end: the events that
        mention usage are found from `at` leftwards, each bounded by the blank lines around
        it, and the rest is never split (splitting and rejoining every event cost ~10 us
        per stream). Where three or more newlines run together, `_split_usage` reads the
        batch (how `split` pairs them decides where an event starts)."""
        if ready[-3:-2] == b"\n":
            return _split_usage(ready, call, hide_usage)
        found: Usage | None = None
        cuts: list[tuple[int, int]] = []  # events to drop, right to left: [start, stop)
        while at >= 0:
            before = ready.rfind(b"\n\n", 0, at)
            if before > 0 and ready[before - 1] == 10:  # b"\n"
                return _split_usage(ready, call, hide_usage)
            start = before + 2 if before >= 0 else 0
            end = ready.find(b"\n\n", at)  # found: `ready` ends with a blank line
            data = sse_data(ready[start:end])
            if data is not None:
                with contextlib.suppress(
                    msgspec.DecodeError, msgspec.ValidationError, RecursionError
                ):
                    envelope = _decode_envelope(data)
                    usage = _usage_of(envelope)
                    if usage is not None:
                        if found is None:  # the last event's, as read in order
                            found = usage
                        if hide_usage and envelope.response is None and not envelope.choices:
                            cuts.append((start, end + 2))
            at = ready.rfind(b'"usage"', 0, start)
        if found is not None:
            call.usage = found
        if not cuts:
            return ready
        kept: list[bytes] = []
        pos = 0
        for start, stop in reversed(cuts):
            kept.append(ready[pos:start])
            pos = stop
        kept.append(ready[pos:])
        return b"".join(kept)

    # ------------------------------------------------------------------ other routes
    async def _models(self, send: Send) -> None:
        engines = [b.engine for b in self.pool.backends if b.healthy and b.engine is not None]
        read_s, connect_s = self.server.read_timeout_s, self.server.connect_timeout_s
        results = await asyncio.gather(
            *(
                engine.get("/v1/models", timeout_s=read_s, connect_timeout_s=connect_s)
                for engine in engines
            ),
            return_exceptions=True,
        )
        merged: dict[str, Any] = {}
        for result in results:
            if isinstance(result, BaseException) or result.status != 200:
                continue
            with contextlib.suppress(
                msgspec.DecodeError, AttributeError, TypeError, RecursionError
            ):
                for model in _decode_any(result.body).get("data", []):
                    if isinstance(model, dict) and "id" in model:
                        merged.setdefault(model["id"], model)
        if not merged and not engines:
            await send_error(send, 503, "no healthy backend is available", None, "no_backend")
            return
        await send_json(send, 200, _encode({"object": "list", "data": list(merged.values())}))

    async def _plain(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Any other /v1/* route goes, untouched, to one healthy backend."""
        backend = self.pool.any_healthy()
        if backend is None or backend.engine is None:
            await send_error(send, 503, "no healthy backend is available", None, "no_backend")
            return
        try:
            raw = await read_body(scope, receive, self.server.max_body_bytes)
        except BodyError as exc:
            await send_error(send, exc.status, exc.message, exc.param, exc.code)
            return
        except ClientLeft:
            return
        target = scope["path"]
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        try:
            response = await backend.engine.send(
                scope["method"], target, self._request_headers(scope, backend, len(raw)), raw
            )
        except UpstreamError as exc:
            self.pool.record_failure(backend, str(exc), refused=exc.before_any_byte)
            await send_error(
                send, 502, f"backend {backend.label} failed: {exc}", None, "upstream_error"
            )
            return
        self.pool.record_answer(backend)
        try:
            await self._relay_whole(send, CallState(), response)
        finally:
            response.close()


def sse_data(event: bytes) -> bytes | None:
    """The `data:` payload of one SSE event. Chat streams send only that line; the Responses
    API (vLLM) puts an `event: response.completed` line before it."""
    if event.startswith(b"data:"):
        line = event[5:]
    else:
        start = event.find(b"\ndata:")
        if start < 0:
            return None
        line = event[start + 6 :]
    end = line.find(b"\n")
    line = line if end < 0 else line[:end]
    return line[1:] if line.startswith(b" ") else line


def _split_usage(ready: bytes, call: CallState, hide_usage: bool) -> bytes:
    """`Forwarder._take_usage` over every event of `ready`, split on blank lines."""
    kept: list[bytes] = []
    for event in ready.split(b"\n\n")[:-1]:
        data = sse_data(event) if b'"usage"' in event else None
        if data is not None:
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                envelope = _decode_envelope(data)
                usage = _usage_of(envelope)
                if usage is not None:
                    call.usage = usage
                    if hide_usage and envelope.response is None and not envelope.choices:
                        continue
        kept.append(event + b"\n\n")
    return b"".join(kept)


def _follow_generate(native: StreamUsage, ready: bytes) -> Usage | None:
    """SGLang `/generate` stream: each `data:` event's `meta_info` has cumulative counts."""
    for event in ready.split(b"\n\n"):
        if event.startswith(b"data: {") and b'"meta_info"' in event:
            native.feed(event[6:])
    return native.usage


async def _send_upstream_error(send: Send, backend: Backend, exc: UpstreamError) -> None:
    """The OpenAI-style error for an engine that gave no usable answer."""
    if exc.timeout:
        message, status, code = f"timed out: {exc}", 504, "upstream_timeout"
    elif exc.before_any_byte:
        message, status, code = "refused the connection", 502, "upstream_unreachable"
    else:
        message, status, code = f"failed: {exc}", 502, "upstream_error"
    await send_error(send, status, f"backend {backend.label} {message}", None, code)


def _ask_usage(body: RequestBody) -> bool:
    """Asks a stream for its usage chunk where the client did not; True if it was added (the
    scheduler needs the engine's token counts, and the extra chunk is hidden on the way back)."""
    data = body.data
    options = data.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    if isinstance(options, dict):
        options["include_usage"] = True
    else:
        data["stream_options"] = {"include_usage": True}
    body.changed()
    return True
