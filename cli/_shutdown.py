"""The standalone gateway's bounded shutdown: what a call cut off at shutdown is answered,
and how the process ends when its shutdown does not finish in time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable

from thunder_mw.middleware.call_state import STATE_KEY, CallState
from thunder_mw.middleware.errors import send_error
from thunder_mw.middleware.types import ASGIApp, Receive, Scope, Send

__all__ = ["AnswerCutOffCalls", "exit_now"]

log = logging.getLogger("thunder_mw")


class AnswerCutOffCalls:
    """Past its graceful-shutdown deadline uvicorn cancels the calls still running and
    answers those that had not started their response with a plain-text 500. Those get
    OpenAI's error object instead, 503 `shutting_down`, as held calls do at the signal; a
    response already started (a stream) is cut off as uvicorn does."""

    def __init__(self, app: ASGIApp, stopping: Callable[[], bool]) -> None:
        self.app = app
        self.stopping = stopping

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            # The gateway sets the call's status as the response starts (0 until then);
            # admin routes keep no call state, and are left to uvicorn.
            call: CallState | None = (scope.get("state") or {}).get(STATE_KEY)
            if call is None or call.status or not self.stopping():
                raise
            await send_error(
                send,
                503,
                "the gateway shut down before this call finished (server.shutdown_timeout_s)",
                None,
                "shutting_down",
            )


def exit_now(status: int, message: str, *args: object) -> None:
    """Ends the process at once (as SIGKILL would: the tool journal is written ahead of every
    action, so the next start reclaims what this one leaves), its log flushed first."""
    with contextlib.suppress(Exception):
        log.error(message, *args)
        for handler in logging.getLogger().handlers + logging.getLogger("uvicorn").handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)
