"""Placement without admission control: forward at once, but keep each program on one backend.

The foundation's scheduler until the program-aware pipeline lands, and the `sticky`
baseline's placement rule: a program stays on its home backend while that is healthy
(its prefix stays cached there); a new program goes to the backend with the fewest programs.
"""

from __future__ import annotations

from collections.abc import Sequence

from thunder_mw.policies.program_table import Program, ProgramTable, Usage
from thunder_mw.schemas.agent_context import AgentContext


class PassthroughPolicy:
    def __init__(self, table: ProgramTable) -> None:
        self.table = table

    def on_request(
        self, ctx: AgentContext, healthy: Sequence[str], now: float
    ) -> tuple[Program, str | None]:
        """The program and the backend to forward to (None when no backend is healthy)."""
        program = self.table.touch(ctx, now)
        self.table.start_call(program, now)
        if not healthy:
            return program, None
        if program.backend not in healthy:
            # min() over a handful of backends, not over programs: O(backends) per new program.
            self.table.place(program, min(healthy, key=self.table.programs_on))
        return program, program.backend

    def on_finished(
        self, program: Program, usage: Usage | None, ok: bool, final: bool, now: float
    ) -> bool:
        """Account a finished call; True when the program ended with it (and was removed)."""
        self.table.end_call(program, usage, ok, now)
        if program.in_flight == 0 and (program.ephemeral or final):
            self.table.remove(program.program_id)
            return True
        return False

    def release(self, program_id: str) -> Program | None:
        return self.table.remove(program_id)
