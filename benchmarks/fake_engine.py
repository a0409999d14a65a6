"""A fake OpenAI engine that answers in microseconds, so a benchmark measures the proxy, not it.

A raw asyncio Protocol speaking just enough HTTP/1.1 keep-alive for the proxy-overhead
benchmark: `POST /v1/chat/completions` (a fixed completion with `usage`, or 20 SSE chunks
with `"stream": true`, plus a usage chunk when `stream_options.include_usage` is set) and
the probes a gateway makes: `GET /health`, `GET /metrics` (vLLM names) and `GET /v1/models`.
Run it in its own process: `python -m thunder_mw.benchmarks.fake_engine --port 0` prints
`PORT <n>` once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, cast

import msgspec

__all__ = ["MODEL", "STREAM_CHUNKS", "main", "new_event_loop", "serve"]

STREAM_CHUNKS = 20
MODEL = "fake-model"

_COMPLETION = msgspec.json.encode(
    {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok " * 20},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 256, "completion_tokens": 20, "total_tokens": 276},
    }
)


def _sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def _chunk(body: bytes) -> bytes:
    # One HTTP/1.1 chunk per SSE event, as a real engine flushes them.
    return b"%x\r\n%b\r\n" % (len(body), body)


def _stream_body(include_usage: bool) -> bytes:
    events = [
        _sse_event(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": "ok "},
                        "finish_reason": "stop" if i == STREAM_CHUNKS - 1 else None,
                    }
                ],
            }
        )
        for i in range(STREAM_CHUNKS)
    ]
    if include_usage:
        events.append(
            _sse_event(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": 1700000000,
                    "model": MODEL,
                    "choices": [],
                    "usage": {"prompt_tokens": 256, "completion_tokens": 20, "total_tokens": 276},
                }
            )
        )
    events.append(b"data: [DONE]\n\n")
    return b"".join(_chunk(e) for e in events) + b"0\r\n\r\n"


def _response(status: str, content_type: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %b\r\ncontent-type: %b\r\ncontent-length: %d\r\n\r\n%b" % (
        status.encode(),
        content_type,
        len(body),
        body,
    )


_JSON = b"application/json"
_COMPLETION_RESPONSE = _response("200 OK", _JSON, _COMPLETION)
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
_STREAM_RESPONSE = {
    False: _STREAM_HEAD + _stream_body(include_usage=False),
    True: _STREAM_HEAD + _stream_body(include_usage=True),
}
_METRICS = (
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",'
    'engine="0",num_gpu_blocks="100000"} 1.0\n'
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    f'vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.0\n'
    "# TYPE vllm:num_requests_running gauge\n"
    f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 0.0\n'
).encode()
_GET_RESPONSES = {
    b"/health": _response("200 OK", b"text/plain", b""),
    b"/metrics": _response("200 OK", b"text/plain; version=0.0.4", _METRICS),
    b"/v1/models": _response(
        "200 OK",
        _JSON,
        msgspec.json.encode(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 32768}]}
        ),
    ),
}
_NOT_FOUND = _response("404 Not Found", _JSON, b'{"detail":"Not Found"}')


class _Request(msgspec.Struct):
    stream: bool = False
    stream_options: dict[str, Any] | None = None


_decode_request = msgspec.json.Decoder(_Request).decode


def _answer(method: bytes, path: bytes, body: bytes) -> bytes:
    if method == b"POST" and path == b"/v1/chat/completions":
        try:
            req = _decode_request(body)
        except msgspec.DecodeError:
            return _response("400 Bad Request", _JSON, b'{"error":{"message":"bad json"}}')
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.get("include_usage"))
            return _STREAM_RESPONSE[usage]
        return _COMPLETION_RESPONSE
    if method == b"GET":
        return _GET_RESPONSES.get(path.split(b"?", 1)[0], _NOT_FOUND)
    return _NOT_FOUND


class _Http11(asyncio.Protocol):
    """Parses pipelined keep-alive requests (Content-Length or chunked bodies) and answers each."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while True:
            request = self._take_request()
            if request is None:
                return
            assert self._transport is not None
            self._transport.write(_answer(*request))

    def _take_request(self) -> tuple[bytes, bytes, bytes] | None:
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(buf[:end])
        lines = head.split(b"\r\n")
        method, path, _ = lines[0].split(b" ", 2)
        length = 0
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        start = end + 4
        if not chunked:
            if len(buf) < start + length:
                return None
            body = bytes(buf[start : start + length])
            del buf[: start + length]
            return method, path, body
        parts: list[bytes] = []
        pos = start
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return None
            size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
            if size == 0:
                # The last-chunk line's CRLF, any trailers, then the blank line.
                trailer_end = buf.find(b"\r\n\r\n", eol)
                if trailer_end < 0:
                    return None
                del buf[: trailer_end + 4]
                return method, path, b"".join(parts)
            if len(buf) < eol + 2 + size + 2:
                return None
            parts.append(bytes(buf[eol + 2 : eol + 2 + size]))
            pos = eol + 2 + size + 2


async def serve(host: str = "127.0.0.1", port: int = 0) -> None:
    """Listen until cancelled, printing `PORT <n>` on stdout once bound."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Http11, host, port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    print(f"PORT {bound}", flush=True)
    async with server:
        await server.serve_forever()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (uvicorn[standard] brings it), else the stdlib loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        try:
            runner.run(serve(args.host, args.port))
        except KeyboardInterrupt:
            sys.exit(0)


if __name__ == "__main__":
    main()
