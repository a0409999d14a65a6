"""An in-memory asyncio transport for driving the gateway's HTTP protocol class without a
socket: it records what the protocol writes, and whether it closed the connection."""

from __future__ import annotations

import asyncio


class MemoryTransport(asyncio.Transport):
    """What a connection's protocol writes, in order; `strict`: a write after `close` fails
    the test (a response must not outlive its connection)."""

    def __init__(self, strict: bool = False) -> None:
        super().__init__()
        self.strict = strict
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not (self.strict and self.closed), "a write after close"
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...
