"""One request's state, typed: what each layer learned about a call as it moved inward.

The standalone app creates a `CallState` when a request arrives and keeps it in
`scope["state"]["thunder_mw"]` (Starlette's `request.state` reads the same dict); each layer
fills in what it owns — the context layer the body and the agent context, the scheduling
layer the backend and its `Admission`, the forwarder the usage and the outcome — and the
outer layers only read it. Nothing is a callback stored in the dict: the scheduler is told
how a call ended through `CallState.end()`, which the outermost send wrapper calls before
the last byte goes out and the scheduling layer calls again (a no-op then) when it unwinds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec

from thunder_mw.middleware.types import Receive, Scope
from thunder_mw.policies.program_table import Usage
from thunder_mw.schemas.agent_context import AgentContext

if TYPE_CHECKING:
    from thunder_mw.engines.pool import Backend

__all__ = [
    "STATE_KEY",
    "Admission",
    "CallState",
    "Outcome",
    "RequestBody",
    "call_state",
    "report_usage",
]

STATE_KEY = "thunder_mw"
Outcome = Literal["ok", "failed", "upstream_failed", "client_disconnected"]
_encode = msgspec.json.Encoder().encode


class RequestBody:
    """A JSON object body: `data` is the decoded dict; `raw` the bytes it came as.

    Layers that change `data` call `changed()`; `encoded()` then re-encodes once, keeping
    every other key's value and order. `consumed` is set once a layer took the body, so the
    replayed `receive` does not hand it out a second time.
    """

    __slots__ = ("_dirty", "consumed", "data", "raw")

    def __init__(self, data: dict[str, Any], raw: bytes) -> None:
        self.data = data
        self.raw = raw
        self._dirty = False
        self.consumed = False

    def changed(self) -> None:
        self._dirty = True

    def encoded(self) -> bytes:
        if self._dirty:
            self.raw = _encode(self.data)
            self._dirty = False
        return self.raw


class Admission(Protocol):
    """Who admitted a call (the live scheduler): asked for another engine when the chosen one
    refused the connection, and told once how the call ended (`CallState.end()`)."""

    def reroute(self, call: CallState, failed_backend: str) -> Backend | None: ...

    def finish(self, call: CallState, outcome: Outcome) -> None: ...


class CallState:
    """Everything thunder-mw knows about one request, filled in as it moves inward."""

    __slots__ = (
        "admission",
        "arrived_at",
        "backend",
        "backend_url",
        "body",
        "context",
        "first_body_at",
        "forwarded_at",
        "held_s",
        "outcome",
        "path",
        "planned",
        "receive",
        "status",
        "usage",
    )

    def __init__(self, arrived_at: float = 0.0) -> None:
        self.arrived_at = arrived_at  # perf_counter seconds
        self.body: RequestBody | None = None
        self.context: AgentContext | None = None
        # The server's own receive, to notice a client leaving while its call is held.
        self.receive: Receive | None = None
        self.backend: str | None = None  # the engine's label
        self.backend_url: str | None = None  # gateway mode: where the wrapped app forwards
        self.admission: Admission | None = None
        self.held_s: float | None = None  # set when the call waited for capacity
        self.forwarded_at: float | None = None
        self.first_body_at: float | None = None  # time to first token
        self.status = 0
        self.usage: Usage | None = None
        self.outcome: Outcome | None = None
        self.path = ""  # set by the forwarder: how to read the engine's usage
        # False: sent past every engine's limit by the scheduler's estimate (the engine
        # decides; policies/context_limit.py), so the scheduler does not count its end.
        self.planned = True

    @property
    def native(self) -> bool:
        """SGLang's native `/generate` (usage in `meta_info`), not an OpenAI route."""
        return self.path == "/generate"

    @property
    def stream(self) -> bool:
        return self.body is not None and self.body.data.get("stream") is True

    def reroute(self, failed_backend: str) -> Backend | None:
        """Another engine for a call whose engine refused the connection (None: none)."""
        admission = self.admission
        return admission.reroute(self, failed_backend) if admission is not None else None

    def end(self, *, answered: bool = False) -> None:
        """Reports the call's end to the scheduler, once. The send wrapper calls it with
        `answered` before the last byte goes out (the agent's next request, sent the moment
        it has the answer, must find the program ACTING); the scheduling layer calls it
        again as it unwinds, where a call that was never answered counts as failed."""
        admission = self.admission
        if admission is not None:
            self.admission = None
            if self.outcome is None:
                self.outcome = "ok" if answered and 0 < self.status < 400 else "failed"
            admission.finish(self, self.outcome)


def call_state(scope: Scope) -> CallState:
    """The request's CallState, created on first use (a layer mounted on its own)."""
    state = scope.get("state")
    if state is None:
        state = scope["state"] = {}
    call: CallState | None = state.get(STATE_KEY)
    if call is None:
        call = state[STATE_KEY] = CallState()
    return call


def report_usage(
    scope: Scope, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> None:
    """For apps mounted under ThunderMiddleware that do their own forwarding: tell the
    scheduler what the call used (else only the step, not its tokens, is accounted)."""
    call_state(scope).usage = Usage(prompt_tokens, completion_tokens, cached_tokens)
