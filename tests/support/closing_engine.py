"""An engine stand-in that closes keep-alive connections at a chosen moment, on a raw socket.

uvicorn (under vLLM and SGLang, and under thunder-mw itself) closes a connection idle for 5 s;
a client that picks that connection from its pool as the close is under way loses its
request before any status line. On a real server that is a race of microseconds; here it is
made certain: the stand-in answers a request, keeps the connection, and then closes it
exactly when the next request arrives on it (`close_reused`), or when one arrives after the
connection sat idle longer than `idle_limit_s` (as if its idle timer had fired while the
request was on the wire). `close_with` picks a clean close after reading the request (the
client sees ServerDisconnectedError) or a reset on its first bytes (ConnectionResetError,
"Can not write request body"). It speaks just enough HTTP/1.1 for the gateway, the replay
client and the conformance client: POST /v1/chat/completions and /v1/completions (JSON, or
SSE when `stream` is true), POST /programs/release, GET /health.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from typing import Any, Literal


class ClosingEngine:
    def __init__(
        self,
        *,
        close_reused: bool = False,
        idle_limit_s: float | None = None,
        close_with: Literal["fin", "reset"] = "fin",
        drop_fresh: int = 0,
        drop_paths: tuple[str, ...] = (),
        keep_alive_header: str | None = None,
        health_delay_s: float = 0.0,
        die_on_stale: bool = False,
    ) -> None:
        self.close_reused = close_reused
        self.idle_limit_s = idle_limit_s
        self.close_with = close_with
        self.drop_fresh = drop_fresh  # this many POSTs on new connections get no answer
        self.drop_paths = drop_paths  # POSTs to these paths never get an answer
        self.keep_alive_header = keep_alive_header
        self.health_delay_s = health_delay_s
        self.die_on_stale = (
            die_on_stale  # a stale request finds the engine dying: it stops listening
        )
        self.connections = 0  # connections accepted
        self.answered: list[str] = []  # "METHOD /path" of every request answered
        self.dropped: list[str] = []  # requests received and closed on without an answer
        self.port = 0
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> ClosingEngine:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._connection, "127.0.0.1", 0)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            self.url = f"http://127.0.0.1:{self.port}"
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        assert ready.wait(5), "the stand-in engine did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        loop, server = self._loop, self._server
        assert loop is not None and server is not None and self._thread is not None

        async def shutdown() -> None:
            server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=5)
        loop.close()

    # ------------------------------------------------------------------ one connection
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        idle_since = time.monotonic()
        try:
            while True:
                first = await reader.readline()
                if not first:
                    return
                method, path = first.decode("latin-1").split(" ")[:2]
                stale = (self.close_reused and served > 0) or (
                    self.idle_limit_s is not None
                    and served > 0
                    and time.monotonic() - idle_since > self.idle_limit_s
                )
                if method == "POST" and stale and self.close_with == "reset":
                    self.dropped.append(f"{method} {path}")
                    _reset(writer)  # the rest of the request is still unread
                    return
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                drop = method == "POST" and (
                    stale
                    or path in self.drop_paths
                    or (served == 0 and len(self.dropped) < self.drop_fresh)
                )
                if drop:
                    self.dropped.append(f"{method} {path}")
                    if stale and self.die_on_stale and self._server is not None:
                        self._server.close()  # new connections are refused from now on
                    writer.close()
                    return
                if path == "/health" and self.health_delay_s:
                    await asyncio.sleep(self.health_delay_s)
                writer.write(self._answer(method, path, body))
                await writer.drain()
                self.answered.append(f"{method} {path}")
                served += 1
                idle_since = time.monotonic()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            return  # the stand-in is shutting down (a cancelled handler would be logged)
        finally:
            if not writer.is_closing():
                writer.close()

    def _answer(self, method: str, path: str, body: bytes) -> bytes:
        status, content_type, payload = "200 OK", "application/json", b"{}"
        data: dict[str, Any] = json.loads(body) if body else {}
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
            if path == "/v1/completions":
                choice: dict[str, Any] = {"index": 0, "text": " ok", "finish_reason": "length"}
            else:
                message = {"role": "assistant", "content": "ok"}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
            if data.get("stream"):
                content_type = "text/event-stream"
                chunk = {"id": "c", "object": "chunk", "choices": [choice]}
                tail = {"id": "c", "object": "chunk", "choices": [], "usage": usage}
                payload = b"".join(
                    b"data: " + json.dumps(event).encode() + b"\n\n" for event in (chunk, tail)
                )
                payload += b"data: [DONE]\n\n"
            else:
                payload = json.dumps({"id": "c", "choices": [choice], "usage": usage}).encode()
        elif path == "/programs/release":
            payload = json.dumps({"program_id": data.get("program_id"), "released": True}).encode()
        elif path != "/health":
            status, payload = "404 Not Found", b'{"error": "no route"}'
        head = [
            f"HTTP/1.1 {status}",
            f"content-type: {content_type}",
            f"content-length: {len(payload)}",
        ]
        if self.keep_alive_header is not None:
            head.append(f"keep-alive: {self.keep_alive_header}")
        return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a server does that drops unread input."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
