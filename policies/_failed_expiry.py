"""Programs none of whose calls has succeeded, by when they expire: a client that gave up, or
whose every request an engine refused, must not stay listed (and counted) for the idle TTL.

Pure: the `gc_hooks` stage feeds it the core's events with their `now` and ends what it
returns. A program leaves the index by itself once a call of it succeeds (its `steps` grows)
or it ends; every other event of it (a new request, a failed call) pushes its deadline on.
"""

from __future__ import annotations

from thunder_mw.policies._lazy_heap import LazyHeap
from thunder_mw.policies.program_table import ProgramState
from thunder_mw.policies.views import ProgramView

__all__ = ["FailedExpiry"]


def _unanswered(program: ProgramView, last_active_at: float) -> bool:
    # An entry stands for the program's latest event only: a later one pushed a new entry.
    return (
        program.steps == 0
        and program.state is not ProgramState.TERMINATED
        and program.last_active_at == last_active_at
    )


class FailedExpiry:
    """Deadlines of programs with no successful call: `ttl_s` after their latest event."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._heap: LazyHeap[ProgramView] = LazyHeap(_unanswered)

    def __len__(self) -> int:
        return len(self._heap)

    def seen(self, program: ProgramView) -> None:
        """A request of `program` arrived or a call of it ended (at `last_active_at`)."""
        if program.steps == 0:
            self._heap.push(program.last_active_at + self.ttl_s, program, program.last_active_at)

    def due(self, now: float, live_bound: int) -> list[ProgramView]:
        """Programs whose deadline passed with nothing in flight or held: to be ended. One
        still busy is looked at again a TTL later (its calls may never be answered)."""
        due, busy = [], []
        while True:
            top = self._heap.peek()
            if top is None or top[0] > now:
                break
            program = top[1]
            self._heap.pop()
            if program.in_flight or program.waiting:
                busy.append(program)
            else:
                due.append(program)
        for program in busy:
            self._heap.push(now + self.ttl_s, program, program.last_active_at)
        self._heap.compact_if_sparse(live_bound)
        return due
