"""The tests' one in-process OpenAI-compatible engine: records what it received, answers
deterministically, and misbehaves on request (errors, delays, dropped or silent calls).

Fault injectors that an ASGI app cannot be stay beside it: `closing_engine.py` closes
keep-alive connections at a chosen byte on a raw socket, `conformance_broken_servers.py` is a
flawed gateway (not an engine) and `passthrough_proxy.py` a proxy that reads nothing."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from thunder_mw.middleware.types import Receive, Scope, Send


@dataclass
class Received:
    path: str
    method: str
    headers: dict[str, str]
    raw: bytes

    @property
    def body(self) -> Any:
        return json.loads(self.raw) if self.raw else None


@dataclass
class FakeEngine:
    """Answers chat/completions deterministically; `chunks` SSE chunks when streaming."""

    model: str = "fake-model"
    chunks: int = 3
    num_blocks: int = 100
    block_size: int = 16
    delay_s: float = 0.0
    die_after_chunks: int | None = None  # close the stream abruptly after this many chunks
    # End the stream after this many chunks with vLLM's own error event and [DONE], as vLLM
    # does when its engine core dies under a live API server.
    error_after_chunks: int | None = None
    chunk_delay_s: float = 0.0
    # Hold the connection open this long after `data: [DONE]` (a loaded engine's last empty
    # write): a client stops reading at [DONE], before the body's end reaches the gateway.
    eof_delay_s: float = 0.0
    disconnects: int = 0  # streams whose client went away before the end
    status: int = 200
    report_capacity: bool = True
    health_status: int = 200  # what /health answers (503: an engine whose core died)
    # Accept every call and never answer it (its headers too, unless `headers_first`: then
    # an event stream starts and no event ever comes); `abandoned` is set once the client
    # gives up and closes the connection. The probe routes still answer.
    silent: bool = False
    headers_first: bool = False
    abandoned: threading.Event = field(default_factory=threading.Event)
    received: list[Received] = field(default_factory=list)
    pages: list[str] = field(default_factory=list)  # the /metrics reads, path and query
    url: str = ""  # where it listens, once served (conftest's `engine` fixture sets it)

    def last(self) -> Received:
        return self.received[-1]

    async def _metrics(self, scope: Scope, send: Send) -> None:
        """vLLM's page at /metrics and at prometheus_client's own mount, /metrics/ (the name
        filter ignored): its KV cache config, or nothing where `report_capacity` is off."""
        query = scope.get("query_string", b"").decode()
        self.pages.append(f"{scope['path']}?{query}" if query else scope["path"])
        if not self.report_capacity:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"# no cache_config_info\n"})
            return
        text = (
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{self.block_size}",'
            f'enable_prefix_caching="True",num_gpu_blocks="{self.num_blocks}"}} 1.0\n'
        )
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain; version=0.0.4")],
            }
        )
        await send({"type": "http.response.body", "body": text.encode()})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["path"]
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if path == "/health":
            await _json(send, self.health_status, {})
            return
        if path in ("/metrics", "/metrics/"):
            await self._metrics(scope, send)
            return
        if path == "/v1/models":
            await _json(
                send, 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
            )
            return
        self.received.append(Received(path, scope["method"], headers, raw))
        if self.silent:
            await self._say_nothing(receive, send)
            return
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.status != 200:
            await _json(send, self.status, {"error": {"message": "engine says no"}})
            return
        if path in ("/v1/chat/completions", "/v1/completions"):
            body = json.loads(raw)
            prompt_tokens = max(1, len(raw) // 4)
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": self.chunks,
                "total_tokens": prompt_tokens + self.chunks,
                "prompt_tokens_details": {"cached_tokens": 0},
            }
            chat = path == "/v1/chat/completions"
            if body.get("stream"):
                gone = asyncio.ensure_future(_wait_disconnect(receive))
                try:
                    await self._stream(send, body, usage, chat, gone)
                finally:
                    gone.cancel()
                return
            choice = (
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "tok " * self.chunks},
                    "finish_reason": "length",
                }
                if chat
                else {"index": 0, "text": "tok " * self.chunks, "finish_reason": "length"}
            )
            await _json(
                send,
                200,
                {
                    "id": "cmpl-1",
                    "object": "chat.completion" if chat else "text_completion",
                    "model": self.model,
                    "choices": [choice],
                    "usage": usage,
                },
            )
            return
        await _json(send, 200, {"echo": path, "method": scope["method"], "bytes": len(raw)})

    async def _say_nothing(self, receive: Any, send: Any) -> None:
        if self.headers_first:
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
        await _wait_disconnect(receive)
        self.abandoned.set()

    async def _stream(
        self,
        send: Send,
        body: dict[str, Any],
        usage: dict[str, Any],
        chat: bool,
        gone: asyncio.Future[None],
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for i in range(self.chunks):
            if self.chunk_delay_s:
                await asyncio.sleep(self.chunk_delay_s)
                if gone.done():
                    self.disconnects += 1
                    return
            if self.die_after_chunks is not None and i >= self.die_after_chunks:
                raise RuntimeError("engine died mid-stream")  # uvicorn drops the connection
            if self.error_after_chunks is not None and i >= self.error_after_chunks:
                error = {
                    "error": {
                        "message": "EngineCore encountered an issue.",
                        "type": "InternalServerError",
                        "param": None,
                        "code": 500,
                    }
                }
                await send(
                    {
                        "type": "http.response.body",
                        "body": b"data: " + json.dumps(error).encode() + b"\n\ndata: [DONE]\n\n",
                        "more_body": False,
                    }
                )
                return
            delta = (
                {"index": 0, "delta": {"content": f"t{i} "}}
                if chat
                else {"index": 0, "text": f"t{i} "}
            )
            chunk: dict[str, Any] = {
                "id": "c1",
                "object": "chat.completion.chunk",
                "model": self.model,
                "choices": [delta],
            }
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + json.dumps(chunk).encode() + b"\n\n",
                    "more_body": True,
                }
            )
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            chunk = {
                "id": "c1",
                "object": "chat.completion.chunk",
                "model": self.model,
                "choices": [],
                "usage": usage,
            }
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + json.dumps(chunk).encode() + b"\n\n",
                    "more_body": True,
                }
            )
        if self.eof_delay_s:
            await send(
                {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True}
            )
            await asyncio.sleep(self.eof_delay_s)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _json(send: Send, status: int, obj: Any) -> None:
    body = json.dumps(obj).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
