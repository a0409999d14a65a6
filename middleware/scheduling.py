"""SchedulingMiddleware: asks the scheduler where (and when) a program's request may run.

The scheduler decides; this layer only waits for the decision, records it on the request's
CallState (the backend, and the scheduler as the call's `Admission`), and makes sure the
scheduler hears how the call ended (usage, failure, client gone) so a program can never
stay REASONING or keep capacity it no longer uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from thunder_mw.engines.pool import Backend
from thunder_mw.middleware.call_state import STATE_KEY, CallState, Outcome
from thunder_mw.middleware.errors import send_error
from thunder_mw.middleware.types import ASGIApp, Receive, Scope, Send
from thunder_mw.policies.program_owners import Claim
from thunder_mw.policies.program_table import ProgramSnapshot
from thunder_mw.schemas.agent_context import AgentContext
from thunder_mw.tools.refusal import ToolRefused

if TYPE_CHECKING:
    from thunder_mw.middleware.program_ownership import ProgramOwnership

__all__ = [
    "ClientGone",
    "Rejected",
    "Scheduler",
    "SchedulingMiddleware",
    "ToolGate",
    "until_disconnect",
]


class Rejected(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        headers: list[tuple[bytes, bytes]] | None = None,
        param: str | None = "program_id",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers, self.param = headers, param


class ToolGate(Protocol):
    """Vets (and records) the containers a request attaches to its program, before it is
    scheduled. Must return without I/O when they are already the program's."""

    async def adopt(self, ctx: AgentContext) -> None:
        """Raises ToolRefused."""
        ...


async def until_disconnect(receive: Receive) -> None:
    """Returns when the client of a held request goes away."""
    while (await receive())["type"] != "http.disconnect":
        pass


class ClientGone(Exception):
    """The client went away while its request was held: nothing is left to answer."""


class Scheduler(Protocol):
    """What the middleware needs of a scheduler (live or pass-through); it is also the
    `Admission` of every call it admits."""

    async def admit(self, call: CallState) -> str:
        """Wait until the call's program may run; return the backend label. Raises Rejected."""
        ...

    def finish(self, call: CallState, outcome: Outcome) -> None: ...

    def reroute(self, call: CallState, failed_backend: str) -> Backend | None: ...

    def release(self, program_id: str) -> bool: ...

    def programs(self) -> list[ProgramSnapshot]: ...

    def program(self, program_id: str) -> ProgramSnapshot | None: ...

    # With replicas sharing a Redis: this replica's id, and a program another one holds,
    # read from its shared record with that replica's id (None: no such record).
    @property
    def replica_id(self) -> str | None: ...

    async def shared_program(self, program_id: str) -> tuple[ProgramSnapshot, str] | None: ...


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
        call: CallState | None = state.get(STATE_KEY) if state else None
        ctx = call.context if call is not None else None
        if ctx is None or call is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
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
            call.backend = await self.scheduler.admit(call)
        except ToolRefused as exc:
            self._unbind_if_never_ran(ctx, bound)
            await send_error(send, exc.status, exc.message, exc.param, exc.code)
            return
        except Rejected as exc:
            self._unbind_if_never_ran(ctx, bound)
            await send_error(send, exc.status, exc.message, exc.param, exc.code, exc.headers)
            return
        except ClientGone:
            self._unbind_if_never_ran(ctx, bound)
            return
        call.admission = self.scheduler
        try:
            await self.app(scope, receive, send)
        finally:
            call.end()  # a no-op where the answer's last byte already ended it

    def _unbind_if_never_ran(self, ctx: AgentContext, bound: bool) -> None:
        # A first request that never got a program leaves no owner behind: no released
        # program would ever free the id again.
        if bound and self.owners is not None and self.scheduler.program(ctx.program_id) is None:
            self.owners.forget(ctx.program_id)
