"""SchedulingMiddleware: asks the scheduler where (and when) a program's request may run.

The scheduler decides; this layer only waits for the decision, records it in
`scope["state"]["thunder_backend"]`, and reports how the call ended (usage, failure,
client gone) so a program can never stay REASONING or keep capacity it no longer uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from thunder_mw.engines.pool import Backend
from thunder_mw.middleware.errors import send_error
from thunder_mw.middleware.types import ASGIApp, Receive, Scope, Send
from thunder_mw.policies.program_owners import Claim
from thunder_mw.policies.program_table import Program, Usage
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.tools.refusal import ToolRefused

if TYPE_CHECKING:
    from thunder_mw.middleware.program_ownership import ProgramOwnership


class Rejected(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = headers


class ToolGate(Protocol):
    """Vets (and records) the containers a request attaches to its program, before it is
    scheduled. Must return without I/O when they are already the program's."""

    async def adopt(self, ctx: AgentContext) -> None:
        """Raises ToolRefused."""
        ...


class ClientGone(Exception):
    """The client went away while its request was held: nothing is left to answer."""


class Scheduler(Protocol):
    """What the middleware needs of a scheduler (live or pass-through)."""

    async def admit(self, ctx: AgentContext, state: dict[str, Any]) -> str:
        """Wait until the program may run; return the backend label. Raises Rejected."""
        ...

    def finish(
        self, ctx: AgentContext, backend: str, usage: Usage | None, outcome: str
    ) -> None: ...

    def reroute(self, ctx: AgentContext, failed_backend: str) -> Backend | None: ...

    def release(self, program_id: str) -> bool: ...

    def programs(self) -> list[Program]: ...

    def program(self, program_id: str) -> Program | None: ...


class SchedulingMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        scheduler: Scheduler,
        tools: ToolGate | None = None,
        owners: ProgramOwnership | None = None,
    ) -> None:
        self.app = app
        self.scheduler = scheduler
        self.tools = tools
        self.owners = owners

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.get("state")
        ctx: AgentContext | None = state.get("agent_context") if state else None
        if ctx is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        assert state is not None
        # Ownership first: another key must not attach containers to, or queue behind, a
        # program that is not its own.
        bound = False
        if self.owners is not None and not ctx.ephemeral:
            claim = self.owners.claim(ctx.program_id, scope["headers"])
            if not isinstance(claim, Claim):
                await send_error(send, claim.status, claim.message, claim.param, claim.code)
                return
            bound = claim is Claim.BOUND
        try:
            if self.tools is not None and ctx.docker_ids:
                await self.tools.adopt(ctx)
            backend = await self.scheduler.admit(ctx, state)
        except ToolRefused as exc:
            self._unbind_if_never_ran(ctx, bound)
            await send_error(send, exc.status, exc.message, exc.param, exc.code)
            return
        except Rejected as exc:
            self._unbind_if_never_ran(ctx, bound)
            await send_error(send, exc.status, exc.message, "program_id", exc.code, exc.headers)
            return
        except ClientGone:
            self._unbind_if_never_ran(ctx, bound)
            return
        state["thunder_backend"] = backend
        state["thunder_reroute"] = lambda failed: self.scheduler.reroute(ctx, failed)
        finished = False

        def finish(outcome: str) -> None:
            nonlocal finished
            if not finished:
                finished = True
                self.scheduler.finish(
                    ctx, state.get("thunder_backend", backend), state.get("thunder_usage"), outcome
                )

        def on_last_body(status: int) -> None:
            # Account the call BEFORE its last byte goes out: the agent's next request may
            # arrive the moment it has the answer, and must find the program ACTING.
            finish(state.get("thunder_outcome") or ("ok" if 0 < status < 400 else "failed"))

        state["thunder_on_last_body"] = on_last_body
        try:
            await self.app(scope, receive, send)
        finally:
            finish(state.get("thunder_outcome") or "failed")

    def _unbind_if_never_ran(self, ctx: AgentContext, bound: bool) -> None:
        # A first request that never got a program leaves no owner behind: no released
        # program would ever free the id again.
        if bound and self.owners is not None and self.scheduler.program(ctx.program_id) is None:
            self.owners.forget(ctx.program_id)


def report_usage(
    scope: Scope, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> None:
    """For apps mounted under ThunderMiddleware that do their own forwarding: tell the
    scheduler what the call used (else only the step, not its tokens, is accounted)."""
    scope.setdefault("state", {})["thunder_usage"] = Usage(
        prompt_tokens, completion_tokens, cached_tokens
    )
