"""Reservation arithmetic: what a program holds on its backend, kept in step on both sides.

Every change of a program's footprint goes through `Ledger.reserve` / `unreserve`, which
move the backend's totals (reserved, running, pending release, shared prefixes) by the same
delta, and advance `room_epoch` whenever room may have appeared.
"""

from __future__ import annotations

from thunder_mw.policies._backend_state import BackendState
from thunder_mw.policies.program_table import Program, ProgramState
from thunder_mw.policies.shared_prefix import SharedPrefixes

__all__ = ["Ledger"]


class Ledger:
    """The programs' reservations on the backends, and how a footprint is sized."""

    __slots__ = (
        "acting_weight",
        "backends",
        "buffer_tokens",
        "dedupe_prefixes",
        "prefix_slots",
        "room_epoch",
    )

    def __init__(self, backends: dict[str, BackendState]) -> None:
        self.backends = backends
        # Footprint parameters; stages set them when bound (a `Footprint` decision).
        self.buffer_tokens = 0
        self.acting_weight = 1.0
        # Count a prefix shared by programs on one backend once (a stage turns it on).
        self.dedupe_prefixes = False
        self.prefix_slots: dict[str, tuple[SharedPrefixes, str, bool]] = {}
        # Room can only appear when a reservation shrinks, a backend changes or time passes.
        self.room_epoch = 0

    def footprint(self, program: Program, for_resume: bool = False) -> int:
        if program.in_flight > 0 or (for_resume and program.waiting > 0):
            return max(program.request_tokens, program.context_tokens + self.buffer_tokens)
        share = program.idle_share
        weight = self.acting_weight if share is None else share
        return int(weight * program.context_tokens) + self.buffer_tokens

    def admit_tokens(self, program: Program, backend: BackendState) -> int:
        """What placing `program` on `backend` would add there."""
        tokens = self.footprint(program, for_resume=True)
        if backend.shared is not None and program.program_id not in self.prefix_slots:
            # What the engine already holds of it: its prefix, if others here share it.
            running = program.in_flight > 0 or program.waiting > 0
            tokens -= backend.shared.credit_for(program.prefix_key, running)
        return tokens

    def reserve(self, program: Program, tokens: int) -> None:
        if program.state is not ProgramState.ACTIVE or program.backend is None:
            return
        backend = self.backends[program.backend]
        if tokens < program.reserved_tokens:
            self.room_epoch += 1
        backend.reserved += tokens - program.reserved_tokens
        context = max(tokens, program.context_tokens)
        backend.contexts += context - program.held_context
        program.held_context = context
        running = tokens if program.in_flight > 0 else 0
        backend.running_reserved += running - program.running_tokens
        if backend.running_reserved <= 0 < program.running_tokens:
            # Its last call in flight ended: the engine idles, which admission's idle-engine
            # rule counts as room (AdmissionParams.fill_idle_engine).
            self.room_epoch += 1
        program.running_tokens = running
        if self.dedupe_prefixes:
            self._hold_prefix(program, backend, running > 0)
        if program.pause_pending:
            backend.pending_release += tokens - program.pending_tokens
            program.pending_tokens = tokens
        program.reserved_tokens = tokens

    def unreserve(self, program: Program) -> None:
        if program.reserved_tokens:
            self.room_epoch += 1
        if program.backend is not None and program.state is ProgramState.ACTIVE:
            backend = self.backends[program.backend]
            backend.reserved -= program.reserved_tokens
            backend.contexts -= program.held_context
            backend.running_reserved -= program.running_tokens
            if program.pause_pending:
                backend.pending_release -= program.pending_tokens
                program.pending_tokens = 0
        program.reserved_tokens = 0
        program.running_tokens = 0
        program.held_context = 0
        program.pause_pending = False
        slot = self.prefix_slots.pop(program.program_id, None)
        if slot is not None:
            slot[0].remove(slot[1], slot[2])

    def mark_pending(self, program: Program, backend: BackendState) -> None:
        """`program` pauses once its call ends: count its tokens as about to be released."""
        program.pause_pending = True
        program.pending_tokens = program.reserved_tokens
        backend.pending_release += program.reserved_tokens

    def set_foreign(self, backend: BackendState, tokens: int) -> bool:
        """Other replicas now hold `tokens` on `backend`; True if that share shrank."""
        tokens = max(0, tokens)
        old = backend.foreign_reserved
        if tokens == old:
            return False
        backend.reserved += tokens - old
        backend.foreign_reserved = tokens
        return tokens < old

    def _hold_prefix(self, program: Program, backend: BackendState, running: bool) -> None:
        """Keep `program`'s entry among the prefixes its backend holds once up to date."""
        key = program.prefix_key if program.prefix_tokens > 0 else None
        slot = self.prefix_slots.get(program.program_id)
        if slot is not None:
            if slot[0] is backend.shared and slot[1] == key and slot[2] == running:
                return
            slot[0].remove(slot[1], slot[2])
            del self.prefix_slots[program.program_id]
        if key is None:
            return
        if backend.shared is None:
            backend.shared = SharedPrefixes(self.acting_weight)
        backend.shared.add(key, program.prefix_tokens, running)
        self.prefix_slots[program.program_id] = (backend.shared, key, running)
