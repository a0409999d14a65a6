"""An embedded simulated engine shares the host's process: it leaves the host's loggers alone
and stops within its bound, whatever its open requests are doing."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from thunder_mw.schemas.config import SimEngineSettings
from thunder_mw.sim.embedded import STOP_GRACE_S, STOP_MARGIN_S, EmbeddedEngine

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_an_embedded_engine_leaves_the_shared_uvicorn_loggers_alone() -> None:
    error, access = logging.getLogger("uvicorn.error"), logging.getLogger("uvicorn.access")
    levels = error.level, access.level
    error.setLevel(logging.INFO)
    access.setLevel(logging.INFO)
    lines, kept = Lines(), logging.NullHandler()
    error.addHandler(lines)
    access.addHandler(kept)

    async def main() -> None:
        engine = EmbeddedEngine(SimEngineSettings(profile="instant", num_blocks=64))
        await engine.start()
        await engine.stop()

    try:
        asyncio.run(main())
        assert error.level == logging.INFO and access.level == logging.INFO
        assert kept in access.handlers
        # The host's own server's lines still show; the embedded server's are not repeated.
        error.info("Uvicorn running on the host")
        assert lines.lines == ["Uvicorn running on the host"]
    finally:
        error.removeHandler(lines)
        access.removeHandler(kept)
        error.setLevel(levels[0])
        access.setLevel(levels[1])


def test_stop_cuts_off_a_request_that_never_finishes() -> None:
    async def main() -> float:
        # One simulated second per 100,000 wall seconds: the request generates for good.
        engine = EmbeddedEngine(SimEngineSettings(time_scale=0.00001, num_blocks=64))
        url = await engine.start()
        async with httpx.AsyncClient(timeout=60) as client:
            call = asyncio.create_task(client.post(f"{url}/v1/chat/completions", json=BODY))
            await asyncio.sleep(0.5)
            assert not call.done()
            started = time.monotonic()
            await engine.stop()
            took = time.monotonic() - started
            call.cancel()
        return took

    took = asyncio.run(main())
    assert took < STOP_GRACE_S + STOP_MARGIN_S
