"""Gateway mode's innermost layer: names the chosen engine's URL on the call state, so the
wrapped app knows where to forward (`call_state(scope).backend_url`)."""

from __future__ import annotations

from thunder_mw.engines.pool import BackendPool
from thunder_mw.middleware.call_state import STATE_KEY, CallState
from thunder_mw.middleware.types import ASGIApp, Receive, Scope, Send

__all__ = ["WithBackendUrl"]


class WithBackendUrl:
    def __init__(self, app: ASGIApp, pool: BackendPool) -> None:
        self.app = app
        self.pool = pool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.get("state")
        call: CallState | None = state.get(STATE_KEY) if state is not None else None
        if call is not None and call.backend is not None:
            backend = self.pool.get(call.backend)
            call.backend_url = backend.url if backend else None
        await self.app(scope, receive, send)
