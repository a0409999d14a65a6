"""A stand-in OpenAI-compatible engine that records every request it receives, for conformance runs.

The server under test forwards to it as it would to vLLM or SGLang; the suite then reads what
actually arrived (body bytes and headers) and what was sent back (every SSE event), so a check
can compare the client's view with the engine's. Answers are deterministic: the same request
always gets the same answer. It speaks either flavour's probe routes (vLLM's /metrics with
`vllm:cache_config_info`, SGLang's /server_info) so servers that discover capacity start, and
it has an inspection API under /_recorder/ for people driving it by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs

import uvicorn

from thunder_mw.middleware.types import Receive, Scope, Send
from thunder_mw.sim import responses_api

__all__ = [
    "BLOCK_SIZE",
    "INFERENCE_PATHS",
    "KV_BLOCKS",
    "MODEL",
    "STREAM_PIECES",
    "BackendServer",
    "Flavor",
    "Recorded",
    "RecordingBackend",
    "recording_backend",
]

Flavor = Literal["vllm", "sglang"]
INFERENCE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})
MODEL = "conformance-model"
# A request whose text contains this marker is answered only after that many milliseconds,
# so tests can hold requests in flight at the same time without sleeping on the client side.
_DELAY = re.compile(rb"recorder-delay-ms=(\d{1,5})")
# The answer's text: multi-byte characters on purpose, so a proxy that re-encodes shows up.
STREAM_PIECES = ("Hello", " from", " the", " recorder", " — ünïcödé ✓ 漢字")
# Large enough that admission control never holds a conformance request for capacity.
KV_BLOCKS = 1_000_000
BLOCK_SIZE = 16


@dataclass
class Recorded:
    """One request as the engine received it, and what the engine answered."""

    seq: int
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes
    received_at: float
    status: int = 0
    sent_events: list[bytes] = field(default_factory=list)  # SSE `data:` payloads, in order
    sent_event_names: list[str] = field(default_factory=list)  # their `event:` names, if any
    answer: bytes = b""  # a non-streamed /v1/responses answer, as sent

    def json(self) -> Any:
        """The body decoded, keeping key order; None when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for n, v in self.headers if n == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": [list(h) for h in self.headers],
            "body": self.body.decode("utf-8", "replace"),
            "received_at": self.received_at,
            "status": self.status,
            "sent_events": [e.decode("utf-8", "replace") for e in self.sent_events],
        }


class RecordingBackend:
    """The ASGI app. `requests` holds every request received, probes included, in order."""

    def __init__(self, flavor: Flavor = "vllm", model: str = MODEL) -> None:
        self.flavor = flavor
        self.model = model
        self.requests: list[Recorded] = []
        self._seq = 0
        self._arrival: asyncio.Event | None = None

    # ------------------------------------------------------------------ queries
    def inference_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path in INFERENCE_PATHS]

    def containing(self, marker: str) -> list[Recorded]:
        """Inference requests whose body contains `marker` (the suite tags each request)."""
        needle = marker.encode()
        return [r for r in self.inference_requests() if needle in r.body]

    def clear(self) -> None:
        self.requests.clear()

    async def wait_for(self, markers: list[str], timeout_s: float = 10.0) -> None:
        """Returns once a request containing each marker has arrived (same event loop only)."""
        async with asyncio.timeout(timeout_s):
            while not all(self.containing(m) for m in markers):
                self._arrival = self._arrival or asyncio.Event()
                await self._arrival.wait()

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        body = await _read_body(receive)
        path, method = scope["path"], scope["method"]
        if path.startswith("/_recorder/"):
            await self._inspect(path, method, scope.get("query_string", b""), send)
            return
        self._seq += 1
        record = Recorded(
            seq=self._seq,
            method=method,
            path=path,
            query=scope.get("query_string", b"").decode("latin-1"),
            headers=[(n.decode("latin-1"), v.decode("latin-1")) for n, v in scope["headers"]],
            body=body,
            received_at=time.time(),
        )
        self.requests.append(record)
        if self._arrival is not None:
            self._arrival.set()
            self._arrival = None
        if method == "POST" and path in INFERENCE_PATHS:
            await self._inference(record, send)
        else:
            status, content_type, payload = self._probe(path, method)
            record.status = status
            await _respond(send, status, payload, content_type)

    # ------------------------------------------------------------------ inference
    async def _inference(self, record: Recorded, send: Send) -> None:
        data = record.json()
        if not isinstance(data, dict):
            record.status = 400
            await _respond_json(
                send,
                400,
                _error("request body must be a JSON object", "body", "BadRequestError"),
            )
            return
        delay = _DELAY.search(record.body)
        if delay:
            await asyncio.sleep(int(delay.group(1)) / 1000)
        answer_id = hashlib.sha256(record.body).hexdigest()[:24]
        prompt_tokens = max(1, len(record.body) // 4)
        completion_tokens = len(STREAM_PIECES)
        usage = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        if record.path == "/v1/responses":
            await self._responses(record, send, answer_id, usage)
            return
        chat = record.path == "/v1/chat/completions"
        if data.get("stream") is True:
            options = data.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            record.status = 200
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
                }
            )
            for event in self._events(answer_id, chat, usage if include_usage else None):
                record.sent_events.append(event)
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + event + b"\n\n",
                        "more_body": True,
                    }
                )
            record.sent_events.append(b"[DONE]")
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            return
        text = "".join(STREAM_PIECES)
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            if chat
            else {"index": 0, "text": text, "finish_reason": "stop"}
        )
        record.status = 200
        await _respond_json(
            send,
            200,
            {
                "id": f"{'chatcmpl' if chat else 'cmpl'}-{answer_id}",
                "object": "chat.completion" if chat else "text_completion",
                "created": 1700000000,
                "model": self.model,
                "choices": [choice],
                "usage": usage,
            },
        )

    def _events(self, answer_id: str, chat: bool, usage: dict[str, Any] | None) -> list[bytes]:
        base = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{answer_id}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 1700000000,
            "model": self.model,
        }
        events = []
        last = len(STREAM_PIECES) - 1
        for i, piece in enumerate(STREAM_PIECES):
            delta: dict[str, Any] = {"content": piece}
            if chat and i == 0:
                delta = {"role": "assistant", "content": piece}
            choice: dict[str, Any] = (
                {"index": 0, "delta": delta} if chat else {"index": 0, "text": piece}
            )
            choice["finish_reason"] = "stop" if i == last else None
            events.append({**base, "choices": [choice]})
        if usage is not None:
            events.append({**base, "choices": [], "usage": usage})  # type: ignore[dict-item]
        return [json.dumps(e, ensure_ascii=False, separators=(",", ":")).encode() for e in events]

    async def _responses(
        self, record: Recorded, send: Send, answer_id: str, usage: dict[str, Any]
    ) -> None:
        """vLLM's Responses API: the response object, or its stream of `event:`/`data:` frames
        ending in `response.completed` with usage (cached tokens in `input_tokens_details`)."""
        data = record.json()
        record.status = 200
        text = "".join(STREAM_PIECES)
        tokens = responses_api.usage(usage["prompt_tokens"], usage["completion_tokens"], 0)
        item_id = f"msg_{answer_id}"

        def answer(output: list[dict[str, Any]], status: str, used: Any) -> dict[str, Any]:
            return responses_api.response_object(
                data,
                f"resp_{answer_id}",
                1700000000,
                self.model,
                output=output,
                status=status,
                max_output_tokens=16,
                usage=used,
            )

        if data.get("stream") is not True:
            item = responses_api.message_item(item_id, text, "completed")
            record.answer = json.dumps(answer([item], "completed", tokens)).encode()
            await _respond(send, 200, record.answer, b"application/json")
            return
        events = responses_api.ResponseEvents(item_id)
        frames = events.start(answer([], "in_progress", None))
        frames += [events.delta(piece) for piece in STREAM_PIECES]
        item = responses_api.message_item(item_id, text, "completed")
        frames += events.finish(answer([item], "completed", tokens))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
            }
        )
        for frame in frames:
            name, _, payload = frame.partition(b"\ndata: ")
            record.sent_events.append(payload.rstrip(b"\n"))
            record.sent_event_names.append(name.removeprefix(b"event: ").decode())
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    # ------------------------------------------------------------------ probes
    def _probe(self, path: str, method: str) -> tuple[int, bytes, Any]:
        """Status, content type and body of the engine's non-inference routes."""
        if path in ("/health", "/ping", "/health_generate"):
            return 200, b"application/json", {}
        if path == "/v1/models":
            owner = self.flavor
            models = [
                {"id": self.model, "object": "model", "created": 1700000000, "owned_by": owner}
            ]
            return 200, b"application/json", {"object": "list", "data": models}
        if path == "/metrics":
            return 200, b"text/plain; version=0.0.4; charset=utf-8", self._metrics_text()
        if path == "/version":
            return 200, b"application/json", {"version": "conformance-recorder"}
        if self.flavor == "sglang" and path in ("/server_info", "/get_server_info"):
            return (
                200,
                b"application/json",
                {
                    "max_total_num_tokens": KV_BLOCKS * BLOCK_SIZE,
                    "page_size": 1,
                    "model_path": self.model,
                },
            )
        if self.flavor == "sglang" and path == "/get_model_info":
            return 200, b"application/json", {"model_path": self.model, "is_generation": True}
        return 404, b"application/json", _error(f"no route {method} {path}", "path", "NotFound")

    def _metrics_text(self) -> bytes:
        if self.flavor == "sglang":
            lines = [
                "# TYPE sglang:num_running_reqs gauge",
                f'sglang:num_running_reqs{{model_name="{self.model}"}} 0.0',
                "# TYPE sglang:num_queue_reqs gauge",
                f'sglang:num_queue_reqs{{model_name="{self.model}"}} 0.0',
                "# TYPE sglang:token_usage gauge",
                f'sglang:token_usage{{model_name="{self.model}"}} 0.0',
                "# TYPE sglang:max_total_num_tokens gauge",
                f'sglang:max_total_num_tokens{{model_name="{self.model}"}} '
                f"{float(KV_BLOCKS * BLOCK_SIZE)}",
                "# TYPE sglang:cache_hit_rate gauge",
                f'sglang:cache_hit_rate{{model_name="{self.model}"}} 0.0',
            ]
        else:
            lines = [
                "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                "# TYPE vllm:cache_config_info gauge",
                f'vllm:cache_config_info{{block_size="{BLOCK_SIZE}",enable_prefix_caching="True",'
                f'num_gpu_blocks="{KV_BLOCKS}"}} 1.0',
                "# TYPE vllm:num_requests_running gauge",
                f'vllm:num_requests_running{{model_name="{self.model}"}} 0.0',
                "# TYPE vllm:num_requests_waiting gauge",
                f'vllm:num_requests_waiting{{model_name="{self.model}"}} 0.0',
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f'vllm:kv_cache_usage_perc{{model_name="{self.model}"}} 0.0',
                "# TYPE vllm:prefix_cache_queries_total counter",
                f'vllm:prefix_cache_queries_total{{model_name="{self.model}"}} 0.0',
                "# TYPE vllm:prefix_cache_hits_total counter",
                f'vllm:prefix_cache_hits_total{{model_name="{self.model}"}} 0.0',
            ]
        return ("\n".join(lines) + "\n").encode()

    # ------------------------------------------------------------------ inspection API
    async def _inspect(self, path: str, method: str, query: bytes, send: Send) -> None:
        """GET /_recorder/requests[?contains=TEXT], /_recorder/last; DELETE /_recorder/requests."""
        if path == "/_recorder/requests" and method == "DELETE":
            self.clear()
            await _respond_json(send, 200, {"cleared": True})
            return
        if path == "/_recorder/requests" and method == "GET":
            contains = parse_qs(query.decode("latin-1")).get("contains", [""])[0]
            chosen = self.containing(contains) if contains else self.requests
            views = [r.to_dict() for r in chosen]
            await _respond_json(send, 200, {"requests": views, "count": len(views)})
            return
        if path == "/_recorder/last" and method == "GET" and self.requests:
            await _respond_json(send, 200, self.requests[-1].to_dict())
            return
        await _respond_json(send, 404, _error(f"no route {method} {path}", "path", "NotFound"))


class BackendServer:
    """Serves a RecordingBackend on 127.0.0.1:port inside the caller's event loop."""

    def __init__(self, backend: RecordingBackend, port: int, host: str = "127.0.0.1") -> None:
        self.backend = backend
        self.url = f"http://{host}:{port}"
        self._server = uvicorn.Server(
            uvicorn.Config(
                backend,
                host=host,
                port=port,
                log_level="warning",
                lifespan="on",
                loop="asyncio",
                access_log=False,
            )
        )
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._server.config.setup_event_loop = lambda: None  # type: ignore[method-assign]
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                # uvicorn exits (SystemExit) when it cannot bind: most often the port is taken.
                raise OSError(f"recording backend could not listen on {self.url}")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task

    async def wait(self) -> None:
        """Serve until cancelled or interrupted (the `--serve-backend` mode)."""
        assert self._task is not None
        await self._task


@contextlib.asynccontextmanager
async def recording_backend(port: int, flavor: Flavor = "vllm") -> AsyncIterator[BackendServer]:
    server = BackendServer(RecordingBackend(flavor), port)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _error(message: str, param: str | None, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": 400}}


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _respond(send: Send, status: int, payload: Any, content_type: bytes) -> None:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _respond_json(send: Send, status: int, payload: Any) -> None:
    await _respond(send, status, payload, b"application/json")
